"""explr: exponential learning-rate schedules for scale-invariant networks.

Library of the executable book reproducing Li & Arora, "An Exponential Learning Rate Schedule for Deep Learning"
(ICLR 2020), in three floors, each importing only from the floors below it:

* the paper's maths and its torch glue: :mod:`explr.schedules` (ordinary schedules, their exact weight-decay-free
  equivalents, the checks of per-step inputs), :mod:`explr.lr_scheduler` (``PerStepLR``, a drop-in ``torch.optim``
  scheduler), :mod:`explr.scheduler_state` (its state), :mod:`explr.sgd` (SGD in the paper's convention),
  :mod:`explr.invariance` (scale invariance, the norm equilibrium), :mod:`explr.models` (BN MLP, PreResNet) and
  :mod:`explr.params` (one rule vocabulary for the CLI, the engine's config and the chapters);
* the book's simulations, :mod:`explr.book`;
* the CIFAR-10 engine, :mod:`explr.cifar10`, and its CLI ``python -m explr.cifar10``.
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
