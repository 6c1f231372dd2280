"""The schedule a CIFAR-10 run plays: built from its :class:`~explr.cifar10.config.TrainConfig` and checked, once.

The five schedules (:data:`~explr.cifar10.config.SCHEDULES`), for base lr η₀, weight decay λ, momentum γ, E epochs
of S steps (:func:`played_schedule`):

* ``step``        -- step decay (η₀, ×``decay_factor`` at ``decay_epochs``) with weight decay λ;
* ``texp``        -- its exact weight-decay-free equivalent, TEXP (Li & Arora 2020, Theorem 2.12, with
                     the momentum corrections of :func:`explr.schedules.texp`), no weight decay;
* ``texp--``      -- TEXP-- (Sec. 5): TEXP without the instant LR drops, no weight decay;
* ``cosine``      -- cosine annealing per epoch, η_e = η₀(1 + cos(πe/E))/2, with weight decay λ;
* ``cosine-texp`` -- TEXP of that per-epoch cosine (one phase per epoch, corrections on): the
                     paper's cosine/exponential hybrid, no weight decay.

An exponential schedule is an :class:`~explr.schedules.EquivalentSchedule` (log space: its ``.lr`` is ``inf``
where it exceeds float64, a long run at a large weight decay, while training plays it from its mantissas and
exponents), ``step`` and ``cosine`` a :class:`~explr.schedules.PlainSchedule`; both have ``.lr``, ``.wd``,
``.log_lr`` and ``.first_lr``.  The exponential ones are played with ``rescale_above`` (:func:`rescale_limit`),
whose rule (it must exceed the schedule's first lr) is :class:`~explr.lr_scheduler.PerStepLR`'s.
"""
from __future__ import annotations

import math

import numpy as np

from ..schedules import PlainSchedule, Schedule, cosine, step_decay, texp, texp_minus_minus
from . import hardware
from .config import EXPONENTIAL, LR_MIN, TrainConfig

__all__ = ["SCHEDULE_BYTES_PER_STEP", "check_lr_range", "check_schedule_memory", "played_schedule", "rescale_limit"]

#: bytes per step of building and playing a schedule, at its peak: a bound above every schedule's.
SCHEDULE_BYTES_PER_STEP = 256


def played_schedule(config: TrainConfig, steps_per_epoch: int) -> Schedule:
    """What :class:`~explr.lr_scheduler.PerStepLR` plays for ``config`` (module docstring), built and checked here:
    the :class:`~explr.schedules.EquivalentSchedule` of an exponential schedule (log space, never overflows), or the
    :class:`~explr.schedules.PlainSchedule` of ``step`` and ``cosine``.

    Raises ``ValueError`` naming the flag for a schedule that does not fit in memory
    (:func:`check_schedule_memory`) or an lr the optimizer would play below float32's normal range
    (:func:`check_lr_range`)."""
    c = config
    E, S = c.epochs, steps_per_epoch
    check_schedule_memory(c, S)
    milestones = c.milestones()  # the config's, resolved before the maths floor is called
    if c.schedule in ("step", "texp", "texp--"):
        base = step_decay(c.lr, E, S, milestones, c.decay_factor)
    else:
        base = cosine(c.lr, E, S, per="epoch")
    if c.schedule in ("step", "cosine"):
        played = PlainSchedule(base, np.full(len(base), float(c.wd)), name=c.schedule)
    elif c.schedule == "texp--":
        played = texp_minus_minus(base, c.wd, c.momentum, corrections=c.corrections)
    else:
        played = texp(base, c.wd, c.momentum, corrections=c.corrections)
    check_lr_range(c, played, S)
    return played


def rescale_limit(config: TrainConfig) -> float | None:
    """The ``rescale_above`` that :class:`~explr.lr_scheduler.PerStepLR` plays ``config``'s schedule with:
    ``config.rescale_above`` for the exponential schedules, ``None`` for ``step`` and ``cosine`` (which never
    rise above ``lr`` and are never rescaled)."""
    return config.rescale_above if config.schedule in EXPONENTIAL else None


def check_schedule_memory(config: TrainConfig, steps_per_epoch: int) -> None:
    """Raise ``ValueError`` naming ``--epochs`` if the per-step schedule of ``config`` (epochs × steps per
    epoch × :data:`SCHEDULE_BYTES_PER_STEP`) exceeds the memory available (:func:`hardware.available_memory`)."""
    need, available = config.epochs * steps_per_epoch * SCHEDULE_BYTES_PER_STEP, hardware.available_memory()
    if available is not None and need > available:
        raise ValueError(f"epochs (--epochs) {config.epochs}: the per-step schedule of {config.epochs} epochs x "
                         f"{steps_per_epoch} steps needs {need / 2**30:.3g} GiB of memory, more than the "
                         f"{available / 2**30:.3g} GiB available here; lower --epochs or raise --batch-size")


def check_lr_range(config: TrainConfig, played: Schedule, steps_per_epoch: int) -> None:
    """Raise ``ValueError`` naming ``--lr`` if an lr the optimizer plays can fall below
    :data:`~explr.cifar10.config.LR_MIN`.

    ``step`` and ``cosine`` play their lr as it is; they never rise above ``lr`` (≤ ``LR_MAX``).  An
    exponential schedule is played as lr_k·R_k, R the rescaling factor: a rescaling at step j sets
    lr_j·R into (lr_0/4, lr_0], so R_k ≥ min(1, lr_0 / (4 max_{j≤k} lr_j)), which bounds the played lr from
    below; from above, ``rescale_above`` ≤ ``RESCALE_ABOVE_MAX`` bounds it."""
    rescaled = rescale_limit(config) is not None
    log_lr = played.log_lr  # -inf where an lr underflowed to 0 (decay factors of 1e-300)
    if rescaled:
        log_low = log_lr + np.minimum(0.0, log_lr[0] - math.log(4.0) - np.maximum.accumulate(log_lr))
    else:
        log_low = log_lr
    k = int(np.argmin(log_low))
    if log_low[k] < math.log(LR_MIN):
        played_as = "lr as the optimizer plays it (rescaled)" if rescaled else "lr"
        raise ValueError(f"lr (--lr) {config.lr:g}: the {config.schedule} schedule's {played_as} falls to "
                         f"{math.exp(log_low[k]):.3g} in epoch {k // steps_per_epoch + 1}, below float32's smallest "
                         f"normal number {LR_MIN:.3g}; raise --lr or --decay-factor")
