"""explr: exponential learning-rate schedules for scale-invariant networks.

Library of the executable book reproducing Li & Arora, "An Exponential Learning Rate Schedule for
Deep Learning" (ICLR 2020).  Modules:

* :mod:`explr.schedules` -- ordinary schedules and their exact weight-decay-free equivalents;
* :mod:`explr.lr_scheduler` -- ``PerStepLR``, a drop-in ``torch.optim`` scheduler playing any per-step schedule;
* :mod:`explr.sgd` -- SGD in the paper's convention and a trajectory recorder;
* :mod:`explr.invariance` -- making and checking scale invariance; the norm-equilibrium model of the effective LR;
* :mod:`explr.toy` -- the BN + WD counterexample of Section 3, vectorised over seeds;
* :mod:`explr.flow` -- gradient flow and modified flows with counter terms (Section 4, EoM paper);
* :mod:`explr.stats` -- the fits and levels the chapters measure (log-log slopes, returning levels);
* :mod:`explr.digits`, :mod:`explr.models` -- a small real dataset and networks (BN MLP, PreResNet);
* :mod:`explr.cifar10` -- the CIFAR-10 engine (a package) and its CLI ``python -m explr.cifar10``;
* :mod:`explr.report` -- the pre-registered analysis plan of the CIFAR-10 comparison and its verdicts;
* :mod:`explr.plotting` -- the book's figure style.
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
