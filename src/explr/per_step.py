"""The checks of per-step schedule inputs, written once for :mod:`explr.schedules`,
:mod:`explr.lr_scheduler` and :mod:`explr.invariance`.

Every check returns the checked value (a float, an int or a new float64 array) or raises an error that
names the argument, the rule and, for arrays, the first step that breaks it (``lr[3] = -0.1``).
Schedules take finite rates with lr > 0 and wd ≥ 0 (:func:`per_step_array`) and step decay's milestones in
[1, epochs − 1] (:func:`check_milestones`, also the engine's rule of ``--decay-epochs``); ``PerStepLR`` plays any
finite wd (:func:`plain_arrays`) and refuses what is not a real number with ``TypeError``
(:func:`real_array`: ``np.asarray`` would turn ``True`` into 1.0).
"""
from __future__ import annotations

import math

import numpy as np

from .params import is_int, is_real_type

__all__ = ["check_real", "check_momentum", "check_positive_int", "check_milestones", "per_step_array", "plain_arrays",
           "real_array", "RULES"]

#: What PerStepLR accepts, per argument (its errors quote these).
RULES = {"lr": "finite real numbers > 0", "wd": "finite real numbers"}


def check_real(name: str, value) -> float:
    """``value`` as a finite float; strings, booleans, arrays and NaN/inf are refused."""
    ok = is_real_type(type(value)) or (
        isinstance(value, np.ndarray) and value.ndim == 0 and np.issubdtype(value.dtype, np.floating))
    if not ok or not math.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite number; got {value!r}")
    return float(value)


def check_momentum(momentum) -> float:
    """The heavy-ball momentum γ as a float in [0, 1)."""
    if not is_real_type(type(momentum)) or not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be a number in [0, 1); got {momentum!r}")
    return float(momentum)


def check_positive_int(name: str, value) -> int:
    """``value`` as an int >= 1 (booleans refused)."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return int(value)


def check_milestones(milestones, epochs: int) -> np.ndarray:
    """``milestones`` as an int64 array: strictly increasing integer epochs in [1, epochs − 1] (a decay at epoch 0
    or at the end would change nothing); ``ValueError`` naming the rule otherwise."""
    try:
        ms = np.asarray([int(m) for m in milestones if int(m) == m], dtype=np.int64)
    except (TypeError, ValueError):
        ms = None
    if ms is None or len(ms) != len(list(milestones)):
        raise ValueError(f"milestones must be a sequence of integer epochs; got {milestones!r}")
    if ms.size and (np.any(np.diff(ms) <= 0) or ms[0] < 1 or ms[-1] >= epochs):
        raise ValueError(
            f"milestones must be strictly increasing epochs in [1, epochs-1] = [1, {epochs - 1}]; "
            f"got {list(milestones)!r}"
        )
    return ms


def per_step_array(name: str, value, steps: int | None, positive: bool) -> np.ndarray:
    """Return ``value`` as a finite float64 array of length ``steps`` (scalars are broadcast)."""
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim > 1:
        raise ValueError(f"{name} must be a scalar or a 1-D per-step array; got shape {arr.shape}")
    if arr.ndim == 1 and steps is not None and len(arr) != steps:
        raise ValueError(f"{name} has {len(arr)} entries but the schedule has {steps} steps")
    if arr.ndim == 0:
        if steps is None:
            raise ValueError(f"{name} must be a per-step array here; got a scalar")
        arr = np.full(steps, float(arr))
    if len(arr) == 0:
        raise ValueError(f"{name} is empty: a schedule needs at least one step")
    bad = ~np.isfinite(arr) | ((arr <= 0) if positive else (arr < 0))
    _refuse_first_bad_step(name, arr, bad, "finite and > 0" if positive else "finite and >= 0")
    return arr


def plain_arrays(lr, wd) -> tuple[np.ndarray, np.ndarray | float]:
    """Checked float64 copies: lr a (steps,) array, wd a float or a (steps,) array."""
    lr, wd = real_array("lr", lr), real_array("wd", wd)
    if lr.ndim != 1 or len(lr) == 0:
        raise ValueError(f"lr must be a non-empty 1-D array of finite values > 0 (or an EquivalentSchedule); got "
                         f"shape {lr.shape}")
    if wd.ndim > 1 or (wd.ndim == 1 and len(wd) != len(lr)):
        raise ValueError(f"wd must be a scalar or an array of {len(lr)} entries, one per step; got shape {wd.shape}")
    _refuse_first_bad_step("lr", lr, ~np.isfinite(lr) | (lr <= 0), RULES["lr"])
    _refuse_first_bad_step("wd", np.atleast_1d(wd), ~np.isfinite(np.atleast_1d(wd)), RULES["wd"])
    return lr, float(wd) if wd.ndim == 0 else wd



def real_array(name: str, value) -> np.ndarray:
    """``value`` as a new float64 array; anything but real numbers (bools, strings, None) raises ``TypeError``
    naming the first one.  Lists and tuples are checked item by item (``np.asarray`` would turn True into 1.0),
    arrays, tensors and scalars by their dtype."""
    if isinstance(value, (list, tuple)):
        items = value
    else:
        value = np.asarray(value)
        items = None if value.dtype.kind in "fiu" else value.ravel()
    if items is not None and not all(map(is_real_type, set(map(type, items)))):
        k, x = next((k, x) for k, x in enumerate(items) if not is_real_type(type(x)))
        x = x.item() if isinstance(x, np.generic) else x
        where = f"{name}[{k}]" if np.ndim(value) else name
        raise TypeError(f"{where} = {x!r} ({type(x).__name__}) is not a real number: {name} must be {RULES[name]} "
                        "(floats or ints; not bools or strings)")
    return np.array(value, dtype=np.float64)


def _refuse_first_bad_step(name: str, values: np.ndarray, bad: np.ndarray, rule: str) -> None:
    """ValueError naming the first step k where ``bad[k]``: "lr must be <rule> at every step; lr[3] = -0.1"."""
    if bad.any():
        k = int(np.argmax(bad))
        raise ValueError(f"{name} must be {rule} at every step; {name}[{k}] = {float(values[k])!r}")
