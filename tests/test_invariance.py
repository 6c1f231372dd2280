"""explr.invariance: freezing what breaks scale invariance, and the checker."""
import copy

import pytest
import torch
from torch import nn

from explr.invariance import check_scale_invariance, effective_lr, flat_norm, make_scale_invariant
from explr.models import bn_mlp

from digits_helpers import loss_fn


@pytest.fixture()
def batch(digits64):
    return digits64.x_train[:128], digits64.y_train[:128]


def trained_ordinary(batch):
    model = bn_mlp(eps=1e-300, seed=0).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(10):
        opt.zero_grad()
        loss_fn(model(batch[0]), batch[1]).backward()
        opt.step()
    return model


def rows(model, batch, **kw):
    return {r.group: r for r in check_scale_invariance(model, loss_fn, *batch, **kw)}


def test_checker_flags_what_breaks_invariance_in_an_ordinary_network(batch):
    r = rows(trained_ordinary(batch), batch)
    assert r["0.weight"].invariant and r["3.weight"].invariant  # weights in front of BN
    assert r["0.bias"].invariant  # a bias in front of BN is cancelled by the mean subtraction
    for name in ["1.weight", "1.bias", "4.weight", "4.bias", "6.weight", "6.bias", "all trainable"]:
        assert not r[name].invariant, name
    assert r["0.weight"].grad_alignment < 1e-12 and r["6.weight"].grad_alignment > 1e-3


def test_make_scale_invariant_freezes_and_zeroes_what_it_should(batch):
    model = trained_ordinary(batch)
    before = copy.deepcopy(model)
    frozen = make_scale_invariant(model)
    assert frozen == ["0.bias", "1.weight", "1.bias", "3.bias", "4.weight", "4.bias", "6.weight", "6.bias"]
    assert torch.equal(model[0].bias, torch.zeros_like(model[0].bias))  # biases zeroed
    assert torch.equal(model[1].weight, before[1].weight)  # BN affine frozen at its value
    assert torch.equal(model[6].weight, before[6].weight)
    r = rows(model, batch)
    assert set(r) == {"0.weight", "3.weight", "all trainable"}
    assert all(row.invariant for row in r.values())
    assert r["all trainable"].loss_change < 1e-12 and r["all trainable"].grad_alignment < 1e-12


def test_checker_finds_bn_eps_and_running_statistics(batch):
    model = bn_mlp(eps=1e-5, seed=0).double()
    make_scale_invariant(model)
    assert not rows(model, batch, scales=(1e-3,))["all trainable"].invariant
    assert rows(model, batch, scales=(10.0,), rtol=1e-4)["all trainable"].invariant
    running = bn_mlp(eps=1e-300, running_stats=True, seed=0).double()
    make_scale_invariant(running)
    with torch.no_grad():
        running(batch[0])
    running.eval()
    assert not rows(running, batch)["all trainable"].invariant


def test_checker_and_freezer_bad_input(batch):
    model = bn_mlp(seed=0).double()
    with pytest.raises(ValueError, match="scales"):
        check_scale_invariance(model, loss_fn, *batch, scales=(0.0,))
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        check_scale_invariance(model, loss_fn, *batch)
    with pytest.raises(ValueError, match="no nn.Linear"):
        make_scale_invariant(nn.Sequential(nn.Conv2d(1, 1, 3)))


def test_effective_lr():
    params = [torch.ones(3), 2 * torch.ones(1)]
    assert flat_norm(params).item() == pytest.approx(7**0.5)
    assert effective_lr(0.7, params) == pytest.approx(0.1)
