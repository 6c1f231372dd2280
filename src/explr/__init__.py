"""explr: exponential learning-rate schedules for scale-invariant networks (Li & Arora, ICLR 2020).

Three floors, each importing only from those below it: the maths (:mod:`explr.schedules`, :mod:`explr.lr_scheduler`,
:mod:`explr.sgd`, :mod:`explr.invariance`, :mod:`explr.models`, :mod:`explr.params`); the book's simulations,
:mod:`explr.book`; the CIFAR-10 engine, :mod:`explr.cifar10`, and its CLI ``python -m explr.cifar10``.
"""
from .schedules import (
    EquivalentSchedule,
    alpha,
    cosine,
    exp_lr,
    step_decay,
    texp,
    texp_minus_minus,
    texp_plus_plus,
)
from .lr_scheduler import PerStepLR

__version__ = "0.1.0"
__all__ = [
    "EquivalentSchedule",
    "PerStepLR",
    "alpha",
    "cosine",
    "exp_lr",
    "step_decay",
    "texp",
    "texp_minus_minus",
    "texp_plus_plus",
]
