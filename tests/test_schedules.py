"""explr.schedules: the root α, the converters and the ordinary schedules."""
import math

import numpy as np
import pytest

from explr.schedules import alpha, cosine, exp_lr, step_decay, texp, texp_minus_minus, texp_plus_plus


def test_alpha_standard_values():
    a = alpha(0.1, 5e-4, 0.9)
    assert a == pytest.approx(0.9994977, abs=5e-8)
    assert 0.1 * 5e-4 / (1 - math.sqrt(0.9)) ** 2 == pytest.approx(0.019, abs=5e-4)
    assert a ** (-2 * 391) == pytest.approx(1.481, abs=1e-3)  # LR growth per CIFAR epoch


@pytest.mark.parametrize("lr,wd,gamma", [(0.1, 5e-4, 0.9), (0.3, 1e-3, 0.5), (1.0, 0.02, 0.0), (0.05, 1e-4, 0.99)])
def test_alpha_is_the_larger_root_and_obeys_the_appendix_bounds(lr, wd, gamma):
    a = alpha(lr, wd, gamma)
    assert a * a - (1 + gamma - lr * wd) * a + gamma == pytest.approx(0, abs=1e-15)
    other = gamma / a if a else 0.0
    assert a >= other
    assert math.sqrt(gamma) <= a <= 1
    # f(1 − t) = γ t² ≥ 0 with t = λη/(1−γ), so α ≤ 1 − t.  (Appendix A.1 of the paper states
    # the opposite-direction bound α ≥ 1/(1+t); it fails at second order in t, see chapter 2.)
    assert a <= 1 - lr * wd / (1 - gamma) + 1e-15
    if gamma == 0:
        assert a == pytest.approx(1 - lr * wd, abs=1e-15)


def test_alpha_at_the_boundary_is_sqrt_gamma():
    gamma = 0.81
    assert alpha(1.0, (1 - 0.9) ** 2, gamma) == pytest.approx(0.9, abs=1e-7)


@pytest.mark.parametrize(
    "kwargs,words",
    [
        (dict(lr=0.1, wd=0.1, momentum=0.9), ["lr*wd", "(1 - sqrt(momentum))^2", "no positive real root"]),
        (dict(lr=1.0, wd=1.0, momentum=0.0), ["lr*wd", "momentum=0"]),
        (dict(lr=0.0, wd=1e-4, momentum=0.9), ["lr must be > 0"]),
        (dict(lr=-0.1, wd=1e-4, momentum=0.9), ["lr must be > 0"]),
        (dict(lr=0.1, wd=-1e-4, momentum=0.9), ["wd must be >= 0"]),
        (dict(lr=0.1, wd=1e-4, momentum=1.0), ["momentum", "[0, 1)"]),
        (dict(lr=0.1, wd=1e-4, momentum=-0.1), ["momentum", "[0, 1)"]),
        (dict(lr=float("nan"), wd=1e-4, momentum=0.9), ["lr must be a finite number"]),
        (dict(lr=0.1, wd=1e-4, momentum=float("nan")), ["momentum"]),
        (dict(lr="0.1", wd=1e-4, momentum=0.9), ["lr must be a finite number", "'0.1'"]),
        (dict(lr=True, wd=1e-4, momentum=0.9), ["lr must be a finite number", "True"]),
        (dict(lr=0.1, wd="1e-4", momentum=0.9), ["wd must be a finite number"]),
        (dict(lr=0.1, wd=1e-4, momentum="0.9"), ["momentum must be a number in [0, 1)"]),
        (dict(lr=0.1, wd=1e-4, momentum=True), ["momentum must be a number in [0, 1)"]),
        (dict(lr=0.1, wd=1e-3, momentum=0.999999999), ["momentum=0.999999999", "lr*wd"]),
    ],
)
def test_alpha_rejects_bad_input_with_a_clear_message(kwargs, words):
    with pytest.raises(ValueError) as err:
        alpha(**kwargs)
    for w in words:
        assert w in str(err.value)
    assert "momentum=1:" not in str(err.value) and "momentum=1 " not in str(err.value)


def test_exp_lr_formulas():
    lr, wd, gamma, steps = 0.1, 5e-4, 0.9, 500
    s = exp_lr(lr, wd, gamma, steps)
    a = alpha(lr, wd, gamma)
    k = np.arange(steps)
    np.testing.assert_allclose(s.lr, lr * a ** (-2 * k - 1), rtol=1e-12)
    np.testing.assert_allclose(s.scale, a ** -np.arange(steps + 1), rtol=1e-12)
    c0 = (a - (1 - lr * wd)) / (s.lr[0] * a)
    assert s.wd[0] == pytest.approx(c0, rel=1e-12) and c0 < 0
    assert np.all(s.wd[1:] == 0)
    assert len(s) == steps and s.momentum == gamma


def test_exp_lr_without_momentum_needs_no_correction():
    s = exp_lr(0.1, 1e-3, 0.0, 100)
    assert np.all(s.wd == 0)
    np.testing.assert_allclose(s.lr, 0.1 * (1 - 1e-4) ** (-2 * np.arange(100) - 1), rtol=1e-12)


def test_exp_lr_start_correction_can_be_dropped():
    assert np.all(exp_lr(0.1, 5e-4, 0.9, 10, start_correction=False).wd == 0)


def test_texp_of_a_constant_schedule_is_exp_lr():
    a, b = exp_lr(0.1, 5e-4, 0.9, 300), texp(np.full(300, 0.1), 5e-4, 0.9)
    np.testing.assert_allclose(a.lr, b.lr, rtol=1e-13)
    np.testing.assert_allclose(a.wd, b.wd, rtol=1e-13)


def test_texp_phase_boundary_formulas():
    lr = step_decay(0.1, 30, 10, [10, 20])
    gamma, wd = 0.9, 5e-4
    s = texp(lr, wd, gamma)
    a = [alpha(0.1 * 0.1**i, wd, gamma) for i in range(3)]
    assert s.lr[0] == pytest.approx(0.1 / a[0], rel=1e-13)
    ratio = s.lr[1:] / s.lr[:-1]
    np.testing.assert_allclose(ratio[:99], a[0] ** -2, rtol=1e-12)
    assert ratio[99] == pytest.approx(0.1 / (a[0] * a[1]), rel=1e-12)  # step 100 starts phase 1
    np.testing.assert_allclose(ratio[100:199], a[1] ** -2, rtol=1e-12)
    assert ratio[199] == pytest.approx(0.1 / (a[1] * a[2]), rel=1e-12)
    assert np.count_nonzero(s.wd) == 3 and s.wd[0] != 0 and s.wd[100] != 0 and s.wd[200] != 0
    assert np.count_nonzero(texp(lr, wd, gamma, corrections="start").wd) == 1
    assert np.count_nonzero(texp(lr, wd, gamma, corrections="none").wd) == 0


def test_texp_plus_plus_recursion():
    rng = np.random.default_rng(0)
    lr = rng.uniform(0.01, 0.2, 200)
    wd = rng.uniform(0, 1e-3, 200)
    gamma = 0.9
    s = texp_plus_plus(lr, wd, gamma)
    alphas, a_prev = [], 1.0
    for k in range(200):
        a = 1 - lr[k] * wd[k] + (gamma * lr[k] / lr[k - 1] * (1 - 1 / a_prev) if k else 0)
        alphas.append(a)
        a_prev = a
    p = np.concatenate([[1.0], np.cumprod(1 / np.array(alphas))])
    np.testing.assert_allclose(s.scale, p, rtol=1e-12)
    np.testing.assert_allclose(s.lr, p[:-1] * p[1:] * lr, rtol=1e-12)
    assert np.all(s.wd == 0)


def test_texp_and_texp_plus_plus_growth_agree_within_the_papers_bound():
    """Appendix A.1: TEXP and TEXP++ per-step growth agree within 1 ± 0.0015·0.9^(k−T_I) (λ=5e-4, lr ≤ 0.1, γ=0.9)."""
    lr = step_decay(0.1, 30, 100, [10, 20])
    a, b = texp(lr, 5e-4, 0.9), texp_plus_plus(lr, 5e-4, 0.9)
    growth_ratio = (b.lr[1:] / b.lr[:-1]) / (a.lr[1:] / a.lr[:-1])
    k = np.arange(1, len(lr))
    phase_start = np.array([0, 1000, 2000])[np.searchsorted([1000, 2000], k, side="right")]
    bound = 0.0015 * 0.9 ** (k - phase_start)
    assert np.all(np.abs(growth_ratio - 1) <= bound + 1e-12)
    assert np.abs(growth_ratio - 1).max() > 1e-5  # the bound is not vacuous: the two do differ


def test_texp_minus_minus_is_texp_of_constant_lr_with_cut_wd():
    lr = step_decay(0.1, 30, 10, [10, 20])
    s = texp_minus_minus(lr, 5e-4, 0.9)
    ref = texp(np.full(300, 0.1), 5e-4 * lr / 0.1, 0.9)
    np.testing.assert_allclose(s.lr, ref.lr, rtol=1e-13)
    a = [alpha(0.1 * 0.1**i, 5e-4, 0.9) for i in range(3)]
    ratio = s.lr[1:] / s.lr[:-1]
    assert ratio[50] == pytest.approx(a[0] ** -2) and ratio[150] == pytest.approx(a[1] ** -2)
    assert ratio[99] == pytest.approx(1 / (a[0] * a[1]), rel=1e-12)  # no instant drop


def test_converters_validate_their_input():
    with pytest.raises(ValueError, match="lr must be finite and > 0.*lr\\[3\\]"):
        texp_plus_plus([0.1, 0.1, 0.1, 0.0], 1e-4, 0.9)
    with pytest.raises(ValueError, match="wd has 2 entries but the schedule has 3 steps"):
        texp([0.1, 0.1, 0.1], [1e-4, 1e-4], 0.9)
    with pytest.raises(ValueError, match="phase starting at step 2.*lr\\*wd"):
        texp([0.1, 0.1, 1.0, 1.0], [1e-4, 1e-4, 0.1, 0.1], 0.9)
    with pytest.raises(ValueError, match="corrections must be one of"):
        texp([0.1], 0.0, 0.9, corrections="some")
    with pytest.raises(ValueError, match="momentum"):
        texp_plus_plus([0.1], 0.0, 1.5)
    with pytest.raises(ValueError, match="weight-shrink factor of step 0"):
        texp_plus_plus([2.0], 0.6, 0.0)
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        exp_lr(0.1, 1e-4, 0.9, 0)


def test_long_schedules_are_built_in_log_space_without_overflow():
    """Step decay at λ = 1e-2 over 200 CIFAR epochs: lr̃ passes float64's range (the old build raised a bare
    OverflowError), ln lr̃ and the corrections lr̃·c stay finite and follow Theorem 2.12 exactly."""
    lr = step_decay(0.1, 200, 391, [100, 150])
    s = texp(lr, 1e-2, 0.9)
    assert np.isfinite(s.log_lr).all() and np.isfinite(s.log_scale).all() and np.isfinite(s.lr_wd).all()
    assert np.isinf(s.lr).any() and s.scale[-1] > 1e199 and np.isfinite(s.wd).all()
    a = [alpha(0.1 * 0.1**i, 1e-2, 0.9) for i in range(3)]
    growth = np.diff(s.log_lr)
    np.testing.assert_allclose(growth[:39099], -2 * math.log(a[0]), rtol=1e-9)
    assert growth[39099] == pytest.approx(math.log(0.1) - math.log(a[0] * a[1]), rel=1e-9)  # phase 1 starts
    np.testing.assert_allclose(growth[39100:58649], -2 * math.log(a[1]), rtol=1e-9)
    assert s.log_lr[0] == pytest.approx(math.log(0.1 / a[0]), rel=1e-15)
    np.testing.assert_allclose(s.log_scale[1:], np.cumsum(-np.log(np.repeat(a, [39100, 19550, 19550]))), rtol=1e-12)
    assert np.flatnonzero(s.lr_wd).tolist() == [0, 39100, 58650]
    assert s.lr_wd[0] == pytest.approx((a[0] - (1 - 0.1 * 1e-2)) / a[0], rel=1e-12)
    finite = np.isfinite(s.lr)
    np.testing.assert_allclose(s.lr[finite] * s.wd[finite], s.lr_wd[finite], rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(np.log(s.lr[finite]), s.log_lr[finite], rtol=1e-14)
    assert len(exp_lr(0.1, 2e-3, 0.9, 200_000)) == 200_000  # lr̃ ~ e^{3,900} at the end: fine in log space


def test_step_decay():
    lr = step_decay(0.1, 10, 3, [4, 7])
    assert lr.shape == (30,)
    np.testing.assert_allclose(lr[:12], 0.1)
    np.testing.assert_allclose(lr[12:21], 0.01)
    np.testing.assert_allclose(lr[21:], 0.001)
    with pytest.raises(ValueError, match="milestones must be strictly increasing"):
        step_decay(0.1, 10, 3, [7, 4])
    with pytest.raises(ValueError, match="milestones"):
        step_decay(0.1, 10, 3, [10])
    with pytest.raises(ValueError, match="sequence of integer epochs"):
        step_decay(0.1, 10, 3, "(4, 7)")
    with pytest.raises(ValueError, match="sequence of integer epochs"):
        step_decay(0.1, 10, 3, [4.5])
    with pytest.raises(ValueError, match="factor"):
        step_decay(0.1, 10, 3, [5], factor=2.0)
    with pytest.raises(ValueError, match="epochs must be a positive integer"):
        step_decay(0.1, 0, 3)
    with pytest.raises(ValueError, match="lr must be a finite number"):
        step_decay("0.1", 10, 3)
    with pytest.raises(ValueError, match="steps_per_epoch must be a positive integer"):
        cosine(0.1, 10, True)


def test_cosine():
    per_epoch = cosine(0.1, 4, 5)
    np.testing.assert_allclose(per_epoch[::5], 0.1 * (1 + np.cos(np.pi * np.arange(4) / 4)) / 2)
    assert np.all(per_epoch[:5] == 0.1) and np.all(per_epoch > 0)
    per_step = cosine(0.1, 4, 5, per="step")
    assert len(np.unique(per_step)) == 20 and per_step[-1] > 0
    with pytest.raises(ValueError, match="per must be"):
        cosine(0.1, 4, 5, per="batch")
