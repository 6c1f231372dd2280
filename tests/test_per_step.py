"""The per-step input checks of explr.schedules: each check names the argument, the rule and the first step that breaks it, and
the same rule holds wherever it is used (schedules, PerStepLR, the relaxation times)."""
import numpy as np
import pytest

from explr.invariance import chained_effective_lr
from explr.schedules import (
    check_momentum,
    check_positive_int,
    check_real,
    per_step_array,
    plain_arrays,
    real_array,
)


def test_scalars_are_returned_checked_and_refused_with_their_name():
    assert check_real("lr", np.float32(0.5)) == 0.5 and type(check_real("lr", 1)) is float
    assert check_momentum(0) == 0.0 and check_positive_int("steps", np.int64(3)) == 3
    for bad in (True, "0.1", float("inf"), np.array([0.1])):
        with pytest.raises(ValueError, match="^lr must be a finite number"):
            check_real("lr", bad)
    for bad in (1.0, -0.1, True, "0.9"):
        with pytest.raises(ValueError, match=r"^momentum must be a number in \[0, 1\)"):
            check_momentum(bad)
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="^epochs must be a positive integer"):
            check_positive_int("epochs", bad)


def test_per_step_arrays_broadcast_scalars_and_name_the_first_bad_step():
    np.testing.assert_array_equal(per_step_array("wd", 0.5, 3, positive=False), [0.5, 0.5, 0.5])
    assert per_step_array("wd", [0.0, 1.0], 2, positive=False)[0] == 0.0   # wd = 0 is allowed
    with pytest.raises(ValueError, match=r"^lr must be finite and > 0 at every step; lr\[2\] = 0.0$"):
        per_step_array("lr", [0.1, 0.2, 0.0, -1.0], None, positive=True)
    with pytest.raises(ValueError, match=r"wd must be finite and >= 0 at every step; wd\[1\] = -0.1$"):
        per_step_array("wd", [0.0, -0.1], 2, positive=False)
    with pytest.raises(ValueError, match="wd has 3 entries but the schedule has 2 steps"):
        per_step_array("wd", [0.0, 0.1, 0.2], 2, positive=False)


def test_plain_arrays_allow_any_finite_wd_and_refuse_what_is_not_a_number():
    lr, wd = plain_arrays([0.1, 0.2], -0.5)
    assert lr.dtype == np.float64 and wd == -0.5
    with pytest.raises(ValueError, match=r"^wd must be finite real numbers at every step; wd\[1\] = nan"):
        plain_arrays([0.1, 0.2], [0.0, float("nan")])
    with pytest.raises(TypeError, match=r"lr\[1\] = True \(bool\) is not a real number"):
        real_array("lr", [0.1, True])


def test_the_norm_equilibrium_model_uses_the_same_momentum_rule():
    assert chained_effective_lr([0.1, 0.1], [5e-4, 5e-4], 0.9)[0] == pytest.approx(np.sqrt(0.1 * 5e-4))
    for bad in (True, 1.0):
        with pytest.raises(ValueError, match=r"^momentum must be a number in \[0, 1\)"):
            chained_effective_lr([0.1, 0.1], [5e-4, 5e-4], bad)
