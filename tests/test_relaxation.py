"""explr.invariance: the norm-equilibrium model of an LR or WD cut, single and chained over a schedule."""
import math

import numpy as np
import pytest

from explr.invariance import chained_effective_lr, effective_lr_relaxation, norm_relaxation_time


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
    with pytest.raises(ValueError, match="lr and wd"):
        chained_effective_lr([0.1, -0.1], 5e-4)
    with pytest.raises(ValueError, match="momentum"):
        chained_effective_lr([0.1], 5e-4, momentum=1.0)
    assert norm_relaxation_time(0.1, 5e-4, 0.9) == pytest.approx(500)
