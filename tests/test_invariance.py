"""explr.invariance: freezing what breaks scale invariance, and the checker; the norm-equilibrium model of an LR or
WD cut, single and chained over a schedule."""
import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from explr.invariance import (
    angular_identity_gap,
    chained_effective_lr,
    check_scale_invariance,
    effective_lr,
    effective_lr_relaxation,
    equilibrium_step_angle,
    flat_norm,
    make_scale_invariant,
    norm_relaxation_time,
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


# ----------------------------------------------------------------------------- the norm-equilibrium model of a cut
def simulate(lr0, wd0, lr, wd, momentum, steps):
    """The model's own recursion, x ← (1 − 2ηλ/(1−γ)) x + K η²/x, started at the (η₀, λ₀) equilibrium."""
    shrink = lambda e, l: 2 * e * l / (1 - momentum)  # noqa: E731
    K = 1.0
    x = math.sqrt(K * lr0**2 / shrink(lr0, wd0))  # fixed point of the old recursion (to first order)
    eff0, out = lr0 / x, []
    for _ in range(steps):
        x = (1 - shrink(lr, wd)) * x + K * lr**2 / x
        out.append(lr / x / eff0)
    return np.array(out)


@pytest.mark.parametrize("r_lr, r_wd", [(0.1, 1.0), (1.0, 0.1), (0.5, 2.0)])
def test_formula_follows_the_norm_recursion(r_lr, r_wd):
    lr0, wd0, gamma, steps = 0.1, 5e-4, 0.9, 20_000
    lr, wd = r_lr * lr0, r_wd * wd0
    sim = simulate(lr0, wd0, lr, wd, gamma, steps)
    model = effective_lr_relaxation(np.arange(1, steps + 1), lr_ratio=r_lr, wd_ratio=r_wd, lr=lr, wd=wd,
                                    momentum=gamma)
    assert np.max(np.abs(sim / model - 1)) < 0.01


def test_limits_and_the_shared_asymptote_of_step_decay_and_texp_minus_minus():
    step = effective_lr_relaxation([0, 1e9], lr_ratio=0.1, wd_ratio=1, lr=0.01, wd=5e-4, momentum=0.9)
    texp_mm = effective_lr_relaxation([0, 1e9], lr_ratio=1, wd_ratio=0.1, lr=0.1, wd=5e-5, momentum=0.9)
    assert step[0] == pytest.approx(0.1) and texp_mm[0] == pytest.approx(1.0)
    assert step[1] == pytest.approx(10**-0.5) and texp_mm[1] == pytest.approx(10**-0.5)


def test_bad_input_names_the_parameter():
    with pytest.raises(ValueError, match="wd_ratio"):
        effective_lr_relaxation([1], lr_ratio=1, wd_ratio=0, lr=0.1, wd=5e-4)
    with pytest.raises(ValueError, match="momentum"):
        effective_lr_relaxation([1], lr_ratio=1, wd_ratio=1, lr=0.1, wd=5e-4, momentum=1.0)


# ----------------------------------------------------------------------------- the model chained over a schedule
def phases(epochs, steps_per_epoch, milestones):
    k = np.arange(epochs * steps_per_epoch)
    return sum((k >= m * steps_per_epoch).astype(int) for m in milestones)


def test_chained_model_is_the_single_cut_formula_phase_by_phase():
    """One cut after a long first phase: the chained model is effective_lr_relaxation, to rounding."""
    lr0, wd0, gamma = 0.1, 5e-4, 0.9
    lr = np.where(np.arange(4000) < 1000, lr0, 0.1 * lr0)
    chained = chained_effective_lr(lr, wd0, gamma)
    np.testing.assert_allclose(chained[:1000], np.sqrt(lr0 * wd0), rtol=1e-12)  # starts in equilibrium
    single = effective_lr_relaxation(np.arange(1, 3001), lr_ratio=0.1, wd_ratio=1.0, lr=0.1 * lr0, wd=wd0,
                                     momentum=gamma)
    np.testing.assert_allclose(chained[1000:] / chained[999], single, rtol=1e-12)


def test_chained_model_follows_the_norm_recursion_over_three_phases():
    """The recursion x ← (1 − 2ηλ/(1−γ))x + Kη²/x run through Step Decay's three phases (16 epochs of 390
    steps, cuts at 8 and 12): the chained model tracks it within 2 %, where assuming that the norm
    reaches each new equilibrium (the error of chapter 6's first extrapolation) is off by more than a factor 3 at the
    end."""
    gamma, lr = 0.9, 0.1 * 0.1 ** phases(16, 390, [8, 12])
    x = math.sqrt(lr[0] ** 2 / (2 * lr[0] * 5e-4 / (1 - gamma)))
    recursion = []
    for eta in lr:
        x = (1 - 2 * eta * 5e-4 / (1 - gamma)) * x + eta ** 2 / x
        recursion.append(eta / x)
    recursion = np.array(recursion) / recursion[0]
    chained = chained_effective_lr(lr, 5e-4, gamma)
    chained = chained / chained[0]
    assert np.max(np.abs(recursion / chained - 1)) < 0.02
    equilibrium = np.sqrt(lr * 5e-4) / np.sqrt(lr[0] * 5e-4)
    assert equilibrium[-1] / recursion[-1] > 3


def test_chained_prediction_of_texp_minus_minus_against_step_decay():
    """TEXP-- ≡ constant η with λ cut (Li & Arora Sec. 5). Its effective LR ends far above Step Decay's in
    short runs and approaches it in long ones: 34× at 16 epochs, 4.6× at the paper's 200 epochs."""
    def final_ratio(epochs, steps, milestones):
        p = phases(epochs, steps, milestones)
        step = chained_effective_lr(0.1 * 0.1 ** p, 5e-4, 0.9)
        texp_mm = chained_effective_lr(np.full(len(p), 0.1), 5e-4 * 0.1 ** p, 0.9)
        return texp_mm[-1] / step[-1]

    assert 30 < final_ratio(16, 390, [8, 12]) < 38
    assert 4 < final_ratio(200, 391, [100, 150]) < 5.2


def test_chained_model_refuses_bad_schedules():
    with pytest.raises(ValueError, match=r"lr must be finite real numbers > 0 at every step; lr\[1\] = -0.1"):
        chained_effective_lr([0.1, -0.1], 5e-4)
    with pytest.raises(ValueError, match=r"lr must be a per-step array of one or more entries"):
        chained_effective_lr(0.1, 5e-4)
    with pytest.raises(ValueError, match="momentum"):
        chained_effective_lr([0.1], 5e-4, momentum=1.0)
    assert norm_relaxation_time(0.1, 5e-4, 0.9) == pytest.approx(500)


def test_the_norm_equilibrium_model_uses_the_same_momentum_rule():
    assert chained_effective_lr([0.1, 0.1], [5e-4, 5e-4], 0.9)[0] == pytest.approx(np.sqrt(0.1 * 5e-4))
    for bad in (True, 1.0):
        with pytest.raises(ValueError, match=r"^momentum = .*: must be a finite number in \[0, 1\)$"):
            chained_effective_lr([0.1, 0.1], [5e-4, 5e-4], bad)
