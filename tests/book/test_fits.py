"""explr.book.fits: fits and levels of time series shaped (time, seeds) -- log-log slopes, returning levels, the
longest stretch at or below a level and the first time above it."""
import numpy as np
import pytest

from explr.book.fits import first_time_above, loglog_slope, longest_stretch_at_or_below, returning_level


def test_loglog_slope_recovers_a_power_law_and_rejects_non_positive_data():
    x = np.array([1.0, 4.0, 16.0, 64.0])
    assert abs(loglog_slope(x, 3 * x**-0.5) + 0.5) < 1e-12
    assert abs(loglog_slope([1e-3, 1e-2], [2e-6, 2e-4]) - 2) < 1e-12
    with pytest.raises(ValueError, match="positive"):
        loglog_slope(x, -x)
    with pytest.raises(ValueError, match="at least 2 points"):
        loglog_slope([1.0], [1.0])


def test_returning_level_and_longest_stretch():
    error = np.array([[0.5, 0.1], [0.1, 0.1], [0.1, 0.2], [0.4, 0.1], [0.1, 0.1]])
    np.testing.assert_allclose(returning_level(error, 3), [0.4, 0.2])
    np.testing.assert_allclose(returning_level(error, 1), [0.1, 0.1])
    np.testing.assert_allclose(returning_level(error, 5), error.max(axis=0))
    np.testing.assert_array_equal(longest_stretch_at_or_below(error, 0.1), [2, 2])
    np.testing.assert_array_equal(longest_stretch_at_or_below(error, [0.0, 0.2]), [0, 5])
    for bad in (0, 6, 2.5, True):
        with pytest.raises(ValueError, match="window must be an integer in"):
            returning_level(error, bad)
    with pytest.raises(ValueError, match=r"shape \(time, seeds\)"):
        returning_level(error[:, 0], 2)


def test_first_time_above():
    values = np.array([[0.0, 0.5, 0.0], [0.2, 0.5, 0.0], [0.3, 0.1, 0.0]])
    np.testing.assert_array_equal(first_time_above(values, 0.1), [1, 0, -1])
    np.testing.assert_array_equal(first_time_above(values, [0.25, 0.6, -1.0]), [2, -1, 0])
    with pytest.raises(ValueError, match="shape"):
        first_time_above(values[0], 0.1)
