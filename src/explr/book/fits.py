"""Fits and levels of recorded time series, shaped (time, seeds): per-seed results for chapters 4 and 5.

:func:`loglog_slope` (orders of convergence, chapter 5), :func:`returning_level`, :func:`longest_stretch_at_or_below`
and :func:`first_time_above` (chapter 4, the BN + WD counterexample's statistics).
"""
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
    """Least-squares slope p of ln y = p ln x + c: the exponent of a power law y ∝ x^p.

    ``x`` and ``y``: positive arrays of one shape with at least 2 points.  An order-p method's global
    error against the step size, for instance, has slope p.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.size < 2 or not (x > 0).all() or not (y > 0).all():
        raise ValueError("x and y must be positive arrays of the same shape with at least 2 points")
    return float(np.polyfit(np.log(x.ravel()), np.log(y.ravel()), 1)[0])


def returning_level(values, window: int) -> np.ndarray:
    """The largest level that ``values`` exceeds (or reaches) in *every* ``window`` consecutive steps, per seed:

        min over t of max(values[t : t + window]),      ``values`` (time, seeds) → (seeds,).

    A series that converges has a returning level that falls to its limit as the run goes on; one that
    keeps fluctuating (Li & Arora's Thm 3.1 for BN + WD) keeps a returning level bounded away from 0.
    """
    values = _time_series("values", values)
    if not (is_int(window) and 1 <= window <= values.shape[0]):
        raise ValueError(f"window must be an integer in [1, {values.shape[0]}] (the recorded steps); got {window!r}")
    view = np.lib.stride_tricks.sliding_window_view(values, int(window), axis=0)
    return view.max(axis=-1).min(axis=0)


def longest_stretch_at_or_below(values, level) -> np.ndarray:
    """The longest run of consecutive steps with ``values`` <= ``level``, per seed (int array of shape (seeds,)).

    ``values`` (time, seeds); ``level`` a number or an array that broadcasts against (seeds,).
    """
    below = _time_series("values", values) <= level
    best = np.zeros(below.shape[1], dtype=int)
    run = np.zeros(below.shape[1], dtype=int)
    for row in below:  # a loop over time on (seeds,) vectors: cheap
        run = np.where(row, run + 1, 0)
        best = np.maximum(best, run)
    return best


def first_time_above(values, level) -> np.ndarray:
    """The first index t with ``values[t]`` > ``level``, per seed; −1 where the series never exceeds it.

    ``values`` (time, seeds); ``level`` a number or an array that broadcasts against (seeds,).  With
    ``values`` an error and ``level`` = ε/π this is the first exit time from the ε-cone of Li & Arora's
    Thm 3.1.
    """
    above = _time_series("values", values) > level
    return np.where(above.any(axis=0), above.argmax(axis=0), -1)
