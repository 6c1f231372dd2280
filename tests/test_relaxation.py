"""explr.invariance.effective_lr_relaxation: the norm-equilibrium model of an LR or WD cut."""
import math

import numpy as np
import pytest

from explr.invariance import effective_lr_relaxation


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
