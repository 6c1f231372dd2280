"""A drop-in PyTorch scheduler that plays a per-step (lr, weight decay) schedule into ``torch.optim.SGD``.

Typical use with any schedule of :mod:`explr.schedules`::

    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = PerStepLR.from_schedule(opt, texp(step_decay(0.1, 200, 391, [100, 150]), 5e-4, 0.9))
    for x, y in batches:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step(); sched.step()

Equivalent rescaling (Li & Arora, Definition 2.3, momentum form of Lemma 2.6): for a scale-invariant
loss the SGD state (θ, v, lr) and (cθ, v/c, c²·lr) have the same future in function space, and the
weight decay must become wd/c² so that lr·wd is unchanged.  Exponential schedules grow like
exp(2ηλk/(1−γ)) and leave float32's range in long runs; ``rescale_above`` applies this rescaling
whenever the optimizer's learning rate would exceed it, so the numbers stay bounded and the
function trajectory does not change.  All parameters of the optimizer must then be (jointly)
scale invariant -- see :func:`explr.invariance.make_scale_invariant`.
"""
from __future__ import annotations

import hashlib
import math

import numpy as np
import torch
from torch.optim.lr_scheduler import LRScheduler

__all__ = ["PerStepLR"]


class PerStepLR(LRScheduler):
    """Set ``lr`` and ``weight_decay`` of every param group from per-step arrays.

    Parameters
    ----------
    optimizer : torch.optim.SGD (any optimizer whose groups read ``lr`` and ``weight_decay``).
    lr : (steps,) array of learning rates, > 0.
    wd : scalar or (steps,) array of weight decays; negative values are allowed (the momentum
        corrections of :func:`explr.schedules.texp`), which ``torch.optim.SGD`` accepts once built.
    rescale_above : optional float.  Whenever lr_k·R would exceed it, rescale the parameters and
        momentum buffers (θ, v) → (cθ, v/c) and the running factor R → c²R, with c² chosen so that
        the lr becomes ``lr[0]`` again.  The optimizer then sees lr_k·R and wd_k/R.

    ``step()`` is called once after every ``optimizer.step()``; after ``steps`` calls the schedule
    is used up and a further call raises ``IndexError``.  ``state_dict()`` holds the position, the
    running factor R and a fingerprint of the arrays (not the arrays), so resuming needs the same
    schedule.
    """

    def __init__(self, optimizer, lr, wd=0.0, *, rescale_above: float | None = None, last_epoch: int = -1):
        lr = np.asarray(lr, dtype=np.float64)
        if lr.ndim != 1 or len(lr) == 0 or not np.all(np.isfinite(lr)) or np.any(lr <= 0):
            raise ValueError("lr must be a non-empty 1-D array of finite values > 0")
        wd = np.broadcast_to(np.asarray(wd, dtype=np.float64), lr.shape).copy()
        if not np.all(np.isfinite(wd)):
            raise ValueError("wd must be finite at every step")
        if rescale_above is not None and not (math.isfinite(rescale_above) and rescale_above > lr[0]):
            raise ValueError(f"rescale_above must be a finite number > lr[0] = {lr[0]:g}; got {rescale_above!r}")
        self._lr, self._wd = lr, wd
        self.rescale_above = rescale_above
        self.rescale = 1.0  # R: the optimizer runs with lr_k R and wd_k / R
        self.rescale_count = 0
        self.fingerprint = hashlib.sha256(lr.tobytes() + wd.tobytes()).hexdigest()[:16]
        super().__init__(optimizer, last_epoch)

    @classmethod
    def from_schedule(cls, optimizer, schedule, **kwargs) -> "PerStepLR":
        """Build from any object with per-step ``.lr`` and ``.wd`` (e.g. an ``EquivalentSchedule``)."""
        return cls(optimizer, schedule.lr, schedule.wd, **kwargs)

    @property
    def steps(self) -> int:
        return len(self._lr)

    def get_lr(self):
        return [float(self._lr[self._position()] * self.rescale)] * len(self.optimizer.param_groups)

    def _position(self) -> int:
        """Index of the step the optimizer takes next; the final value is kept once used up."""
        return min(self.last_epoch, self.steps - 1)

    def step(self, epoch=None):
        if epoch is not None:
            raise TypeError("PerStepLR.step() takes no epoch argument: call it once per optimizer step")
        if self.last_epoch >= self.steps:
            raise IndexError(f"PerStepLR: the schedule has {self.steps} steps and step() was called more often")
        k = self.last_epoch + 1
        if (
            self.rescale_above is not None
            and k < self.steps
            and self._lr[k] * self.rescale > self.rescale_above
        ):
            self._apply_rescaling(float(self._lr[0] / (self._lr[k] * self.rescale)))
        super().step()
        for group in self.optimizer.param_groups:
            group["weight_decay"] = float(self._wd[self._position()] / self.rescale)

    @torch.no_grad()
    def _apply_rescaling(self, c2: float) -> None:
        """(θ, v, lr) → (cθ, v/c, c²·lr) on every parameter of the optimizer (equivalent scaling)."""
        c = math.sqrt(c2)
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                p.mul_(c)
                buf = self.optimizer.state.get(p, {}).get("momentum_buffer")
                if buf is not None:
                    buf.div_(c)
        self.rescale *= c2
        self.rescale_count += 1

    def state_dict(self):
        state = super().state_dict()
        del state["_lr"], state["_wd"]
        return state

    def load_state_dict(self, state_dict):
        if state_dict.get("fingerprint") != self.fingerprint:
            raise ValueError(
                "PerStepLR.load_state_dict: the saved state belongs to a different schedule "
                f"(fingerprint {state_dict.get('fingerprint')} != {self.fingerprint}); build the scheduler "
                "with the same lr and wd arrays before resuming"
            )
        super().load_state_dict(state_dict)
