"""explr: exponential learning-rate schedules for scale-invariant networks.

Library of the executable book reproducing Li & Arora, "An Exponential Learning Rate Schedule for
Deep Learning" (ICLR 2020).  Modules:

* :mod:`explr.schedules` -- ordinary schedules and their exact weight-decay-free equivalents;
* :mod:`explr.scheduler` -- a drop-in ``torch.optim`` scheduler playing any per-step schedule;
* :mod:`explr.sgd` -- SGD in the paper's convention and a trajectory recorder;
* :mod:`explr.invariance` -- making and checking scale invariance;
* :mod:`explr.digits`, :mod:`explr.models` -- a small real dataset and networks.
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
from .scheduler import PerStepLR

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
