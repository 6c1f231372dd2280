"""The state of :class:`~explr.lr_scheduler.PerStepLR`: the schedule as it is played, the keys of its
``state_dict()``, the trajectory a state names, and the checks a state passes before it is loaded.

:func:`check_loadable` holds the rules of ``PerStepLR.load_state_dict``; ``PerStepLR.check_state_dict`` applies them
without an optimizer (a checkpoint checked before its network is built).
"""
from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from .params import is_int, is_real
from .schedules import EquivalentSchedule, PlainSchedule, plain_arrays

__all__ = ["GROUP_LR_RULE", "PROGRESS_KEYS", "STATE_KEYS", "check_loadable", "fingerprint", "is_group_lr", "log2_at",
           "played_arrays", "trajectory"]

#: What PerStepLR accepts as a param group's lr (and ``state_dict()['base_lrs']`` holds, one per group).
GROUP_LR_RULE = "a finite number > 0"
#: the keys of ``state_dict()`` that hold the progress, which ``load_state_dict`` restores.
PROGRESS_KEYS = ("last_epoch", "_step_count", "_last_lr", "_own_weight_decay", "log2_rescale", "rescale_count")
#: ``state_dict()``'s keys: the progress (:data:`PROGRESS_KEYS`), then the settings, which ``load_state_dict`` checks.
STATE_KEYS = PROGRESS_KEYS + ("steps", "fingerprint", "momentum", "rescale_above", "base_lrs")


def played_arrays(lr, wd):
    """(momentum, lr, wd, exponents) as :class:`PerStepLR` plays ``lr`` and ``wd``: an ``EquivalentSchedule``'s
    mantissas and exponents and its momentum, or plain arrays (exponents and momentum ``None``)."""
    if isinstance(lr, (PlainSchedule, EquivalentSchedule)) and wd is not None:
        raise ValueError(f"wd must be omitted when lr is a {type(lr).__name__}: its weight decay is part of it")
    if isinstance(lr, PlainSchedule):
        lr, wd = lr.lr, lr.wd
    if isinstance(lr, EquivalentSchedule):
        m_lr, e_lr, m_wd, e_wd = lr.parts()
        return float(lr.momentum), m_lr, m_wd, (e_lr, e_wd)
    return (None, *plain_arrays(lr, 0.0 if wd is None else wd), None)


def fingerprint(lr, wd, exponents) -> str:
    """The first 16 hex digits of the sha256 of the played arrays (a state records it to name its schedule)."""
    digest = hashlib.sha256()
    for array in (lr, wd, *(exponents or ())):
        digest.update(np.ascontiguousarray(array))
    return digest.hexdigest()[:16]


def log2_at(lr, exponents, k: int) -> float:
    """log2 of the schedule's lr at step k, from its mantissa and exponent (never overflows)."""
    m, e = (float(lr[k]), int(exponents[0][k])) if exponents is not None else math.frexp(float(lr[k]))
    return math.log2(m) + e


def trajectory(state: dict) -> dict:
    """The settings of a state that define the trajectory (the groups' lrs enter only through their ratios)."""
    bases = [float(base) for base in state["base_lrs"]]
    return {"steps": state["steps"], "fingerprint": state["fingerprint"], "momentum": state["momentum"],
            "rescale_above": state["rescale_above"], "param groups": len(bases),
            "lr ratios of the param groups": [base / bases[0] for base in bases]}


def check_loadable(state: dict, ours: dict, lr, exponents, rescale_above: float | None) -> None:
    """``ValueError`` (the scheduler's line) unless ``state`` is a PerStepLR state (its keys, and the types of its
    settings, :func:`_check_settings`) of the trajectory ``ours`` (:func:`trajectory`) at a progress that
    the schedule ``lr`` (mantissas, ``exponents``) with ``rescale_above`` reaches (:func:`_check_progress`)."""
    if not isinstance(state, dict):
        raise ValueError(f"PerStepLR.load_state_dict: not a PerStepLR state: a {type(state).__name__}")
    keys, expected = set(state), set(STATE_KEYS)
    if keys != expected:
        raise ValueError(f"PerStepLR.load_state_dict: not a PerStepLR state: missing {sorted(expected - keys)}, "
                         f"unexpected {sorted(keys - expected)}")
    _check_settings(state)
    saved = trajectory(state)
    for name, value in ours.items():
        if saved[name] != value:
            raise ValueError(
                f"PerStepLR.load_state_dict: the saved state has {name} = {saved[name]!r}, this scheduler "
                f"{value!r}: it belongs to a different schedule or setup; build the scheduler as the saved "
                "one was built before resuming")
    _check_progress(state, lr, exponents, rescale_above, ours["param groups"])


def _check_settings(state: dict) -> None:
    """The types of a state's settings, so that comparing them with this scheduler's cannot fail."""
    _require(state, "steps", is_int(state["steps"]), "an integer")
    _require(state, "fingerprint", isinstance(state["fingerprint"], str), "a string")
    for key in ("momentum", "rescale_above"):
        _require(state, key, state[key] is None or is_real(state[key]), "None or a finite number")
    bases = state["base_lrs"]  # one per param group: their number is compared with this scheduler's next
    _require(state, "base_lrs", isinstance(bases, (list, tuple)) and len(bases) >= 1
             and all(map(is_group_lr, bases)), f"a list of {GROUP_LR_RULE}, one per param group")


def _check_progress(state: dict, lr, exponents, rescale_above: float | None, groups: int) -> None:
    """The progress of a state of the schedule ``lr`` (mantissas, ``exponents``) is one a scheduler with
    ``rescale_above`` and ``groups`` param groups reaches (module docstring):

    * ``last_epoch`` an integer in [−1, steps], ``_step_count`` and ``rescale_count`` integers ≥ 0;
    * ``log2_rescale`` an even integer ≤ 0 (0 without ``rescale_above``), at which the played lr of the
      current step is at most ``rescale_above`` (a higher one would have been rescaled) and at least
      lr₀/4 · 2^(−2) over the largest lr so far (a rescaling sets the lr into (lr₀/4, lr₀]; one more
      factor 4 for rounding);
    * one rescaling at least per factor 4 of ``log2_rescale``, and none if it is 0;
    * ``_last_lr`` and ``_own_weight_decay``: one number (or, for the latter, None) per param group."""
    steps = len(lr)
    last = state["last_epoch"]
    _require(state, "last_epoch", is_int(last) and -1 <= last <= steps, f"an integer in [-1, {steps}]")
    _require(state, "_step_count", is_int(state["_step_count"]) and state["_step_count"] >= 0, "an integer >= 0")
    _require(state, "_last_lr", isinstance(state["_last_lr"], (list, tuple)) and len(state["_last_lr"]) == groups
             and all(is_real(x) or (isinstance(x, torch.Tensor) and x.numel() == 1) for x in state["_last_lr"]),
             f"a list of {groups} numbers")
    _require(state, "_own_weight_decay", isinstance(state["_own_weight_decay"], (list, tuple))
             and len(state["_own_weight_decay"]) == groups
             and all(x is None or is_real(x) for x in state["_own_weight_decay"]),
             f"a list of {groups} numbers or None")
    log2 = state["log2_rescale"]
    _require(state, "log2_rescale", is_int(log2) and log2 % 2 == 0 and log2 <= 0, "an even integer <= 0")
    if rescale_above is None:
        _require(state, "log2_rescale", log2 == 0, "0 (this scheduler has no rescale_above)")
    else:
        p = min(max(last, 0), steps - 1)
        highest = float(np.max(np.log2(lr[:p + 1]) + (exponents[0][:p + 1] if exponents is not None else 0)))
        log2_p, log2_limit = log2_at(lr, exponents, p), math.log2(rescale_above)
        low, high = log2_at(lr, exponents, 0) - 4 - highest, log2_limit - log2_p
        _require(state, "log2_rescale", low <= log2 and not log2_p + log2 > log2_limit,
                 f"an even integer in [{math.ceil(low)}, {math.floor(high)}] at step {p} (where the played lr is "
                 "between a quarter of lr[0] over the largest lr so far and rescale_above)")
    count = state["rescale_count"]
    _require(state, "rescale_count", is_int(count) and (count == 0 if log2 == 0 else 1 <= count <= -log2 // 2),
             "0 with log2_rescale 0" if log2 == 0 else f"an integer in [1, {-log2 // 2}] with log2_rescale {log2}")


def _require(state: dict, key: str, ok: bool, rule: str) -> None:
    """``ValueError`` naming ``key``, its value (shortened to one line) and ``rule`` unless ``ok``."""
    if not ok:
        shown = " ".join(repr(state[key]).split())
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise ValueError(f"PerStepLR.load_state_dict: {key} = {shown} must be {rule}; the state was not written by "
                         "this scheduler (hand-edited?)")


def is_group_lr(value) -> bool:
    """A param group's lr as PerStepLR accepts it (:data:`GROUP_LR_RULE`)."""
    return is_real(value) and value > 0
