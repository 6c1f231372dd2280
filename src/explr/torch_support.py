"""What :class:`~explr.lr_scheduler.PerStepLR` needs of torch's private scheduler machinery, tried when
:mod:`explr.lr_scheduler` is imported: a torch without it is refused there, in one line naming the tested versions,
instead of playing a wrong schedule later.  ``make compat`` runs the scheduler's tests at the oldest of them.
"""
from __future__ import annotations

import sys
import warnings

import torch
from torch.optim.lr_scheduler import ChainedScheduler, LRScheduler, SequentialLR

__all__ = ["TORCH_TESTED", "check_torch", "missing_torch_internals"]

#: The torch versions PerStepLR is tested with: the floor (``make compat`` runs the scheduler's tests there) and
#: the pin of requirements.txt (a test keeps the two equal).
TORCH_TESTED = ("2.13.0", "2.14.1")


def missing_torch_internals(base=LRScheduler, sequential=SequentialLR, chained=ChainedScheduler) -> list[str]:
    """What PerStepLR needs of torch's private scheduler machinery, each tried on a throwaway subclass of ``base``
    (one tensor, no training): the descriptions of those that this torch does not do.

    PerStepLR overrides ``_update_lr`` (torch's ``step()`` and its initial step go through it, and ``SequentialLR``
    switches to a scheduler with ``_update_lr(0)``), reads ``_is_initial`` (set during the initial step), keeps
    ``_step_count`` and ``_last_lr`` (``get_last_lr()`` returns it), and refuses ``ChainedScheduler`` by the code
    object of the frame that reads its ``optimizer`` (``ChainedScheduler.__init__``)."""
    calls, readers = [], []

    class Probe(base):
        @property
        def optimizer(self):
            readers.append(sys._getframe(1).f_code)
            return self._probed

        @optimizer.setter
        def optimizer(self, optimizer):
            self._probed = optimizer

        def get_lr(self):
            return [0.5]

        def _update_lr(self, epoch=None):
            calls.append((epoch, self._is_initial))
            self._last_lr = [0.5]

    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)
    missing = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            probe = Probe(opt)
            if calls != [(None, True)]:
                missing.append("the initial step calls _update_lr() with _is_initial set")
            opt.step()
            probe.step()
            if calls[-1:] != [(None, False)] or probe._step_count != 2:
                missing.append("step() counts _step_count and calls _update_lr()")
            if probe.get_last_lr() is not probe._last_lr:
                missing.append("get_last_lr() returns _last_lr")
            later = Probe(opt)
            calls.clear()
            sequence = sequential(opt, [torch.optim.lr_scheduler.ConstantLR(opt, 1.0, 1), later], milestones=[1])
            sequence.step()
            if (0, False) not in calls:
                missing.append("SequentialLR switches to a scheduler with _update_lr(0)")
            del readers[:]
            chained([probe])
            if chained.__init__.__code__ not in readers:
                missing.append("ChainedScheduler.__init__ reads each scheduler's optimizer itself")
        except (AttributeError, TypeError, ValueError, RuntimeError) as err:  # a changed signature or attribute
            missing.append(f"the probe scheduler failed: {type(err).__name__}: {err}".split("\n")[0])
    return missing


def check_torch(missing: list[str]) -> None:
    """``ImportError`` in one line naming what this torch lacks and the tested versions."""
    if missing:
        raise ImportError(f"explr.lr_scheduler: PerStepLR relies on private scheduler internals of torch "
                          f"{' and '.join(TORCH_TESTED)} (the tested versions) that torch {torch.__version__} does not "
                          f"have: {'; '.join(missing)}. Install a tested one: "
                          f"pip install 'torch>={TORCH_TESTED[0]},<={TORCH_TESTED[-1]}'")
