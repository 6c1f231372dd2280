"""Fits and levels of recorded time series shaped (time, seeds), per seed: slopes (chapter 5) and the BN + WD
counterexample's statistics (chapter 4)."""
from __future__ import annotations

import numpy as np

from ..params import is_int

__all__ = ["loglog_slope", "returning_level", "longest_stretch_at_or_below", "first_time_above"]


def _time_series(name, values):
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[0] == 0:
        raise ValueError(f"{name} must be an array of shape (time, seeds); got shape {values.shape}")
    return values


def loglog_slope(x, y) -> float:
    """Least-squares slope p of ln y = p ln x + c (y ∝ x^p), ``x`` and ``y`` positive, of one shape, >= 2 points."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.size < 2 or not (x > 0).all() or not (y > 0).all():
        raise ValueError("x and y must be positive arrays of the same shape with at least 2 points")
    return float(np.polyfit(np.log(x.ravel()), np.log(y.ravel()), 1)[0])


def returning_level(values, window: int) -> np.ndarray:
    """min_t max(values[t : t + window]) per seed: the largest level reached in *every* ``window`` consecutive steps
    (bounded away from 0 for a series that keeps fluctuating, Li & Arora's Thm 3.1)."""
    values = _time_series("values", values)
    if not (is_int(window) and 1 <= window <= values.shape[0]):
        raise ValueError(f"window must be an integer in [1, {values.shape[0]}] (the recorded steps); got {window!r}")
    view = np.lib.stride_tricks.sliding_window_view(values, int(window), axis=0)
    return view.max(axis=-1).min(axis=0)


def longest_stretch_at_or_below(values, level) -> np.ndarray:
    """The longest run of consecutive steps with ``values`` <= ``level`` (broadcast against (seeds,)), per seed."""
    below = _time_series("values", values) <= level
    best = np.zeros(below.shape[1], dtype=int)
    run = np.zeros(below.shape[1], dtype=int)
    for row in below:  # a loop over time on (seeds,) vectors: cheap
        run = np.where(row, run + 1, 0)
        best = np.maximum(best, run)
    return best


def first_time_above(values, level) -> np.ndarray:
    """The first t with ``values[t]`` > ``level`` per seed, −1 if never (the exit time from Thm 3.1's ε-cone)."""
    above = _time_series("values", values) > level
    return np.where(above.any(axis=0), above.argmax(axis=0), -1)
