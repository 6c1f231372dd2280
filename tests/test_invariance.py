"""explr.invariance: freezing what breaks scale invariance, and the checker."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from explr.invariance import (
    angular_identity_gap,
    check_scale_invariance,
    effective_lr,
    equilibrium_step_angle,
    flat_norm,
    make_scale_invariant,
    step_angle,
)
from explr.models import bn_mlp



@pytest.fixture()
def batch(digits64):
    return digits64.x_train[:128], digits64.y_train[:128]


def trained_ordinary(batch):
    model = bn_mlp(eps=1e-300, seed=0).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(10):
        opt.zero_grad()
        F.cross_entropy(model(batch[0]), batch[1]).backward()
        opt.step()
    return model


def rows(model, batch, **kw):
    return {r.group: r for r in check_scale_invariance(model, F.cross_entropy, *batch, **kw)}


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
        check_scale_invariance(model, F.cross_entropy, *batch, scales=(0.0,))
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        check_scale_invariance(model, F.cross_entropy, *batch)
    with pytest.raises(ValueError, match="no nn.Linear"):
        make_scale_invariant(nn.Sequential(nn.Conv2d(1, 1, 3)))


def test_effective_lr():
    params = [torch.ones(3), 2 * torch.ones(1)]
    assert flat_norm(params).item() == pytest.approx(7**0.5)
    assert effective_lr(0.7, params) == pytest.approx(0.1)


def test_step_angle_is_accurate_for_tiny_and_large_angles():
    a = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    for theta in (1e-9, 1e-4, 0.5, 3.0):
        b = 3.0 * torch.tensor([[math.cos(theta), math.sin(theta), 0.0]], dtype=torch.float64)
        assert abs(step_angle(a, b).item() - theta) < 1e-15 + 1e-12 * theta
    # flat vectors give a 0-d tensor; an orthogonal step of length s from a norm-r point turns by atan(s/r)
    r, s = 2.0, 0.3
    turned = step_angle(torch.tensor([r, 0.0], dtype=torch.float64), torch.tensor([r, s], dtype=torch.float64))
    assert turned.ndim == 0 and abs(turned.item() - math.atan(s / r)) < 1e-15 and turned.item() < s / r


def test_equilibrium_step_angle_formula_and_validation():
    assert equilibrium_step_angle(0.1, 0.05) == pytest.approx(0.1, abs=1e-15)
    assert equilibrium_step_angle(0.5, 0.01, 0.9) == pytest.approx(math.sqrt(0.01 / 1.9))
    for kw, name in (({"wd": 0.0}, "wd"), ({"lr": -1.0}, "lr"), ({"momentum": 1.0}, "momentum"),
                     ({"lr": "0.1"}, "lr"), ({"wd": True}, "wd")):
        args = {"lr": 0.1, "wd": 5e-4, "momentum": 0.0} | kw
        with pytest.raises(ValueError, match=name):
            equilibrium_step_angle(**args)


def test_angular_identity_holds_exactly_for_gd_with_wd_on_an_invariant_loss():
    """cos∠(θ_t, θ_{t+1}) = (1 − ηλ)‖θ_t‖/‖θ_{t+1}‖ on a scale-invariant loss: the gap is rounding only."""
    lr, wd = 0.2, 0.01
    gen = torch.Generator().manual_seed(0)
    target = torch.randn(6, generator=gen, dtype=torch.float64)
    theta = torch.randn(6, generator=gen, dtype=torch.float64)
    thetas = [theta]
    for _ in range(200):
        t = theta.clone().requires_grad_(True)
        loss = -torch.dot(t / t.norm(), target)  # scale invariant
        (g,) = torch.autograd.grad(loss, t)
        theta = theta - lr * (g + wd * theta)
        thetas.append(theta)
    thetas = torch.stack(thetas)
    angles = step_angle(thetas[:-1], thetas[1:]).numpy()[:, None]
    norms = thetas.norm(dim=-1).numpy()[:, None]
    assert abs(angular_identity_gap(angles, norms, lr=lr, wd=wd)).max() < 1e-12
    assert abs(angular_identity_gap(angles, norms, lr=lr, wd=2 * wd)).max() > 1e-3
    with pytest.raises(ValueError, match="one more row"):
        angular_identity_gap(angles, norms[1:], lr=lr, wd=wd)
