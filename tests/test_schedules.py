"""explr.schedules: the root α, the converters and the ordinary schedules, the per-step input checks, and the
converters' function-space equivalence on a real network."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import explr.sgd as sgd_module
from explr.lr_scheduler import PerStepLR
from explr.models import invariant_bn_mlp
from explr.schedules import (
    alpha,
    cosine,
    exp_lr,
    per_step_array,
    step_decay,
    texp,
    texp_minus_minus,
    texp_plus_plus,
)
from explr.sgd import output_deviation, prediction_agreement, train_sgd

from digits_helpers import digit_batches


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
        (dict(lr=0.0, wd=1e-4, momentum=0.9), ["lr = 0.0: must be a finite number in (0, "]),
        (dict(lr=-0.1, wd=1e-4, momentum=0.9), ["lr = -0.1: must be a finite number in (0, "]),
        (dict(lr=0.1, wd=-1e-4, momentum=0.9), ["wd = -0.0001: must be a finite number in [0, "]),
        (dict(lr=0.1, wd=1e-4, momentum=1.0), ["momentum", "[0, 1)"]),
        (dict(lr=0.1, wd=1e-4, momentum=-0.1), ["momentum", "[0, 1)"]),
        (dict(lr=float("nan"), wd=1e-4, momentum=0.9), ["lr = nan: must be a finite number"]),
        (dict(lr=0.1, wd=1e-4, momentum=float("nan")), ["momentum"]),
        (dict(lr="0.1", wd=1e-4, momentum=0.9), ["lr = '0.1': must be a finite number"]),
        (dict(lr=True, wd=1e-4, momentum=0.9), ["lr = True: must be a finite number"]),
        (dict(lr=0.1, wd="1e-4", momentum=0.9), ["wd = '1e-4': must be a finite number"]),
        (dict(lr=0.1, wd=1e-4, momentum="0.9"), ["momentum = '0.9': must be a finite number in [0, 1)"]),
        (dict(lr=0.1, wd=1e-4, momentum=True), ["momentum = True: must be a finite number in [0, 1)"]),
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
    with pytest.raises(ValueError, match="lr must be finite real numbers > 0.*lr\\[3\\]"):
        texp_plus_plus([0.1, 0.1, 0.1, 0.0], 1e-4, 0.9)
    with pytest.raises(ValueError, match=r"wd must be a per-step array of 3 entries or a scalar; got shape \(2,\)"):
        texp([0.1, 0.1, 0.1], [1e-4, 1e-4], 0.9)
    with pytest.raises(ValueError, match="phase starting at step 2.*lr\\*wd"):
        texp([0.1, 0.1, 1.0, 1.0], [1e-4, 1e-4, 0.1, 0.1], 0.9)
    with pytest.raises(ValueError, match="corrections must be one of"):
        texp([0.1], 0.0, 0.9, corrections="some")
    with pytest.raises(ValueError, match="momentum"):
        texp_plus_plus([0.1], 0.0, 1.5)
    with pytest.raises(ValueError, match="weight-shrink factor of step 0"):
        texp_plus_plus([2.0], 0.6, 0.0)
    with pytest.raises(ValueError, match=r"^steps = 0: must be an integer >= 1$"):
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
    with pytest.raises(ValueError, match=r"^factor = 2.0: must be a finite number in \(0, 1\]$"):
        step_decay(0.1, 10, 3, [5], factor=2.0)
    with pytest.raises(ValueError, match=r"^epochs = 0: must be an integer >= 1$"):
        step_decay(0.1, 0, 3)
    with pytest.raises(ValueError, match=r"^lr = '0.1': must be a finite number in \(0, "):
        step_decay("0.1", 10, 3)
    with pytest.raises(ValueError, match=r"^steps_per_epoch = True: must be an integer >= 1$"):
        cosine(0.1, 10, True)


def test_cosine():
    per_epoch = cosine(0.1, 4, 5)
    np.testing.assert_allclose(per_epoch[::5], 0.1 * (1 + np.cos(np.pi * np.arange(4) / 4)) / 2)
    assert np.all(per_epoch[:5] == 0.1) and np.all(per_epoch > 0)
    per_step = cosine(0.1, 4, 5, per="step")
    assert len(np.unique(per_step)) == 20 and per_step[-1] > 0
    with pytest.raises(ValueError, match="per must be"):
        cosine(0.1, 4, 5, per="batch")


# ----------------------------------------------------------------------------- the per-step input checks
def test_scalars_are_refused_with_their_name_and_rule():
    """The converters and schedules check their numbers with the book's rules (explr.params), as one line."""
    for bad in (True, "0.1", float("inf"), np.array([0.1])):
        with pytest.raises(ValueError, match=r"^lr = .*: must be a finite number in \(0, "):
            cosine(bad, 2, 1)
    for bad in (1.0, -0.1, True, "0.9"):
        with pytest.raises(ValueError, match=r"^momentum = .*: must be a finite number in \[0, 1\)$"):
            texp([0.1], 0.0, bad)
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match=r"^epochs = .*: must be an integer >= 1$"):
            step_decay(0.1, bad, 3)


def test_per_step_arrays_broadcast_scalars_and_name_the_first_bad_step():
    np.testing.assert_array_equal(per_step_array("wd", 0.5, 3, ">= 0"), [0.5, 0.5, 0.5])
    assert per_step_array("wd", [0.0, 1.0], 2, ">= 0")[0] == 0.0   # wd = 0 is allowed
    with pytest.raises(ValueError, match=r"^lr must be finite real numbers > 0 at every step; lr\[2\] = 0.0$"):
        per_step_array("lr", [0.1, 0.2, 0.0, -1.0], None, "> 0")
    with pytest.raises(ValueError, match=r"wd must be finite real numbers >= 0 at every step; wd\[1\] = -0.1$"):
        per_step_array("wd", [0.0, -0.1], 2, ">= 0")
    with pytest.raises(ValueError, match=r"wd must be a per-step array of 2 entries or a scalar; got shape \(3,\)"):
        per_step_array("wd", [0.0, 0.1, 0.2], 2, ">= 0")
    with pytest.raises(ValueError, match=r"lr must be a per-step array of one or more entries; got shape \(\)"):
        per_step_array("lr", 0.1, None, "> 0")


def test_per_step_lr_takes_any_finite_wd_and_refuses_what_is_not_a_number():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    assert PerStepLR(opt, [0.1, 0.2], -0.5)._wd == -0.5
    with pytest.raises(ValueError, match=r"^wd must be finite real numbers at every step; wd\[1\] = nan"):
        PerStepLR(opt, [0.1, 0.2], [0.0, float("nan")])
    with pytest.raises(TypeError, match=r"lr\[1\] = True \(bool\) is not a real number: lr must be finite real"):
        per_step_array("lr", [0.1, True], None, "> 0")


# ----------------------------------------------------------------------------- function-space equivalence
STEPS = 400  # ten epochs of 40 steps: two decays and a cosine, every correction exercised


@pytest.fixture(scope="module")
def setup(digits64):
    return digit_batches(digits64, STEPS), digits64.x_test[:256]


def run(setup, lr, wd, momentum, **kw):
    batches, probe = setup
    return train_sgd(invariant_bn_mlp(), F.cross_entropy, batches, lr, wd, momentum, probe=probe, record_every=10, **kw)


def assert_equivalent(original, twin, schedule, tol=1e-9):
    dev = output_deviation(original, twin)
    assert dev.max() <= tol, f"max relative deviation {dev.max():.2e}"
    assert prediction_agreement(original, twin).min() == 1.0
    np.testing.assert_allclose(twin.norms, schedule.scale[original.steps] * original.norms, rtol=1e-9)


FLOAT32_EPS = float(np.finfo(np.float32).eps)


@pytest.mark.slow  # each test trains the network for seconds: `make test` runs them, `make unit` not
class TestFunctionSpaceEquivalence:
    """On a real, truly scale-invariant network (float64, BN eps ≈ 0, batch statistics): each test trains the
    digits BN MLP twice on the same batches -- once with SGD + weight decay, once with the converted schedule and no
    weight decay -- and compares the logits on fixed probe inputs."""

    @pytest.mark.parametrize("momentum", [0.0, 0.9])
    def test_constant_lr_with_wd_equals_exponential_lr(self, setup, momentum):
        original = run(setup, np.full(STEPS, 0.1), 5e-4, momentum)
        s = exp_lr(0.1, 5e-4, momentum, STEPS)
        assert_equivalent(original, run(setup, s.lr, s.wd, momentum), s)

    def test_without_the_start_correction_the_runs_separate(self, setup):
        original = run(setup, np.full(STEPS, 0.1), 5e-4, 0.9)
        s = exp_lr(0.1, 5e-4, 0.9, STEPS, start_correction=False)
        assert output_deviation(original, run(setup, s.lr, s.wd, 0.9)).max() > 1e-3

    def test_step_decay_equals_texp_with_corrections(self, setup):
        lr = step_decay(0.1, 10, 40, [4, 7])
        original = run(setup, lr, 5e-4, 0.9)
        s = texp(lr, 5e-4, 0.9)
        assert_equivalent(original, run(setup, s.lr, s.wd, 0.9), s)
        no_phase = texp(lr, 5e-4, 0.9, corrections="start")
        dev = output_deviation(original, run(setup, no_phase.lr, no_phase.wd, 0.9))
        assert 1e-9 < dev.max() < 0.05  # the phase corrections are small but real

    @pytest.mark.parametrize("kind", ["cosine-per-step", "warmup-then-cosine", "random"])
    def test_texp_plus_plus_is_exact_for_any_schedule(self, setup, kind):
        if kind == "cosine-per-step":
            lr = cosine(0.1, 10, 40, per="step")
        elif kind == "warmup-then-cosine":
            lr = np.concatenate([np.linspace(0.01, 0.1, 40), cosine(0.1, 9, 40, per="step")])
        else:
            lr = np.random.default_rng(0).uniform(0.01, 0.2, STEPS)
        wd = np.linspace(5e-4, 1e-4, STEPS)
        original = run(setup, lr, wd, 0.9)
        s = texp_plus_plus(lr, wd, 0.9)
        assert_equivalent(original, run(setup, s.lr, s.wd, 0.9), s)

    def test_texp_minus_minus_equals_constant_lr_with_the_wd_cut(self, setup):
        lr = step_decay(0.1, 10, 40, [4, 7])
        original = run(setup, np.full(STEPS, 0.1), 5e-4 * lr / 0.1, 0.9)
        s = texp_minus_minus(lr, 5e-4, 0.9)
        assert_equivalent(original, run(setup, s.lr, s.wd, 0.9), s)

    def test_cosine_hybrid_is_exact_with_per_epoch_corrections(self, setup):
        lr = cosine(0.1, 10, 40, per="epoch")
        original = run(setup, lr, 5e-4, 0.9)
        s = texp(lr, 5e-4, 0.9)
        assert_equivalent(original, run(setup, s.lr, s.wd, 0.9), s)

    def test_equivalent_rescaling_keeps_the_trajectory_in_float64(self, setup):
        s = exp_lr(0.1, 5e-4, 0.9, STEPS)
        plain = run(setup, s.lr, s.wd, 0.9)
        rescaled = run(setup, s.lr, s.wd, 0.9, rescale_above=0.11)  # the lr grows 0.1 → 0.15
        assert rescaled.rescale < 1  # rescaling happened
        assert output_deviation(plain, rescaled).max() < 1e-9

    def test_rescaling_keeps_an_overflowing_float32_run_finite_and_exact_in_float64(self, digits64):
        """λη = 2.5e-3, γ = 0.9: α = 0.96, and the equivalent LR passes float32's maximum (3.4e38) at step
        1,115.  Without rescaling float32 overflows there; with it the float32 run stays finite.  The
        rescaling itself is tested where it is exact: in float64 the same run with and without it gives the
        same outputs to rounding (a power-of-two c scales θ, v and lr exactly), although this λη is chaotic
        enough to amplify any inexactness to O(1) within a few hundred steps.  Nothing is asserted on *when*
        two chaotic float32 trajectories part, which depends on the BLAS kernels and the thread count."""
        steps, lr, wd = 1400, 0.1, 0.025
        s = exp_lr(lr, wd, 0.9, steps)
        assert s.lr.max() > np.finfo(np.float32).max
        batches64 = digit_batches(digits64, steps)
        batches32 = [(x.float(), y) for x, y in batches64]
        probe = digits64.x_test[:256]

        def run32(**kw):
            model = invariant_bn_mlp(eps=1e-30, dtype=torch.float32)
            return train_sgd(model, F.cross_entropy, batches32, s.lr, s.wd, 0.9, probe=probe.float(), record_every=50, **kw)

        with pytest.raises(OverflowError, match="step 1115 .*float32|step 1115 .*3.4"):  # without rescaling
            run32()
        safe = run32(rescale_above=1e3)
        assert np.isfinite(safe.outputs).all() and np.isfinite(safe.norms).all()
        assert safe.lrs.max() <= 1e3 and safe.rescale < 1e-40
        plain64 = train_sgd(invariant_bn_mlp(), F.cross_entropy, batches64, s.lr, s.wd, 0.9, probe=probe, record_every=50)
        rescaled64 = train_sgd(invariant_bn_mlp(), F.cross_entropy, batches64, s.lr, s.wd, 0.9, probe=probe, record_every=50,
                               rescale_above=1e3)
        assert rescaled64.rescale < 1e-40
        assert output_deviation(plain64, rescaled64).max() <= 1e-12

    def test_rescaled_float32_run_agrees_with_float64_sgd_while_not_chaotic(self, digits64, monkeypatch):
        """At the paper's λη = 5e-5 nothing amplifies rounding over 300 steps, so a float32 run of the
        equivalent exponential LR, rescaled on the way (c = 1/2 here), stays within float32 rounding of the
        float64 SGD + WD run: asserted below 100 ε₃₂ (ε₃₂ = 1.2e-7), also with the arithmetic perturbed
        (tests/notebooks/roundoff_guard.py).  Not longer: past about 350 steps float32 chaos starts, which is no
        claim to assert.  The negative control undoes v → v/c at each rescaling (the mistake of rescaling θ and lr but
        not the momentum buffer): it must fail a thousand times the tolerance."""
        steps, lr, wd = 300, 0.1, 5e-4
        s = exp_lr(lr, wd, 0.9, steps)
        batches64 = digit_batches(digits64, steps)
        probe = digits64.x_test[:256]
        reference = train_sgd(invariant_bn_mlp(), F.cross_entropy, batches64, np.full(steps, lr), wd, 0.9, probe=probe,
                              record_every=50)

        def run32():
            model = invariant_bn_mlp(eps=1e-30, dtype=torch.float32)
            return train_sgd(model, F.cross_entropy, [(x.float(), y) for x, y in batches64], s.lr, s.wd, 0.9,
                             probe=probe.float(), record_every=50, rescale_above=0.101)

        rescaled = run32()
        assert rescaled.rescale < 1  # the rescaling happened
        assert output_deviation(reference, rescaled).max() < 100 * FLOAT32_EPS

        class MomentumNotRescaled(PerStepLR):  # negative control: θ and lr rescaled, v left as it was
            def __init__(self, optimizer, *args, **kwargs):
                def undo_momentum(c):
                    for buffer in (st.get("momentum_buffer") for st in optimizer.state.values()):
                        if buffer is not None:
                            buffer.mul_(c)
                super().__init__(optimizer, *args, on_rescale=undo_momentum, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(sgd_module, "PerStepLR", MomentumNotRescaled)
            wrong = run32()
        assert output_deviation(reference, wrong).max() > 1000 * FLOAT32_EPS
