"""explr: exponential learning-rate schedules for scale-invariant networks.

Library of the executable book reproducing Li & Arora, "An Exponential Learning Rate Schedule for
Deep Learning" (ICLR 2020).  Three floors, each importing only from the floors below it:

The paper's maths and its torch glue:

* :mod:`explr.schedules` -- ordinary schedules and their exact weight-decay-free equivalents, and the checks of
  per-step inputs (and of step decay's milestones) that every module of this floor uses;
* :mod:`explr.lr_scheduler` -- ``PerStepLR``, a drop-in ``torch.optim`` scheduler playing any schedule;
* :mod:`explr.sgd` -- SGD in the paper's convention and a trajectory recorder;
* :mod:`explr.invariance` -- making and checking scale invariance; the norm-equilibrium model;
* :mod:`explr.models` -- the networks (BN MLP, PreResNet);
* :mod:`explr.params` -- one rule vocabulary for the CLI, the engine's config and the chapters (and what a real
  number or an integer is, not a bool, for every check of this floor).

The book's simulations, :mod:`explr.book` (toy model, flows, sharpness, statistics, the digits data,
figure style, chapter 6's registered analysis and the exact-twin test).

The CIFAR-10 engine, :mod:`explr.cifar10` (a package) and its CLI ``python -m explr.cifar10``.
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
