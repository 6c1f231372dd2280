"""The hot loop of a CIFAR-10 run: model, optimizer, schedule and device data, one epoch at a time.

The exponential schedules run through :class:`explr.lr_scheduler.PerStepLR` with ``rescale_above``:
when the learning rate would exceed it, (θ, v, lr) → (cθ, v/c, c²lr) -- the same network function
(Li & Arora 2020, Definition 2.3 and Lemma 2.6) -- and, given ``model=``, the scheduler rescales the BN
running statistics with θ, so float32/bf16 never overflow.

Everything stays on the device (data, augmentation, metric sums); the loop synchronises with the
host only every ``log_every`` steps and at the end of an epoch.  At those syncs a run counts as
diverged (:class:`TrainingDiverged`) when its mean training loss is not finite or exceeds
:data:`EXPLODED` × the mean loss of its first ``log_every`` steps; after each epoch, also when the
weights are not finite.

A checkpoint holds :meth:`Trainer.state_dict` and the run's progress (:mod:`explr.cifar10.checkpoint`, which
also checks it); an epoch's numbers are :class:`~explr.cifar10.metrics.EpochMetrics`.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..invariance import flat_norm
from ..lr_scheduler import PerStepLR
from ..models import PreResNet
from ..schedules import Schedule
from .arrays import CifarArrays
from .config import TrainConfig
from .data import DeviceData, EpochPlan
from .hardware import param_dtype, resolve_device, resolve_precision
from .metrics import EpochMetrics
from .played import played_schedule, rescale_limit

__all__ = ["EXPLODED", "EpochState", "Trainer", "TrainingDiverged"]

#: a finite mean training loss above EXPLODED × the initial one counts as diverged.
EXPLODED = 100.0


class TrainingDiverged(RuntimeError):
    """The training loss became non-finite or exploded, or the weights non-finite; the last good checkpoint is kept."""


@dataclass
class EpochState:
    """One epoch in progress: its index, its plan (order, crops, flips) and the on-device metric sums."""

    epoch: int
    plan: EpochPlan
    loss_sum: torch.Tensor
    correct: torch.Tensor


def _exp(log_value: float) -> float | None:
    """e^x as a float, or None (JSON null) where it exceeds float64."""
    return math.exp(log_value) if log_value < 709.0 else None


def _ldexp(x: float, exponent: int) -> float | None:
    try:
        return math.ldexp(x, exponent)
    except OverflowError:
        return None


class Trainer:
    """Model, optimizer, scheduler and device data of one run; ``train_epoch`` is the hot loop.

    Built from a validated :class:`~explr.cifar10.config.TrainConfig` and in-memory
    :class:`~explr.cifar10.data.CifarArrays` (:func:`explr.cifar10.runs.train_prepared` adds the files,
    resume and progress bar).  ``device``, ``precision`` and ``schedule``: as the caller resolved and built them
    (:class:`~explr.cifar10.prepared.PreparedRun`), else from ``config`` here; ``model``: the network to train
    instead of ``config``'s PreResNet (e.g. a PreResNet whose outputs break, to test divergence); it must be scale
    invariant for the exponential schedules.
    """

    def __init__(self, config: TrainConfig, arrays: CifarArrays, device: torch.device | None = None, *,
                 precision: str | None = None, schedule: Schedule | None = None,
                 model: torch.nn.Module | None = None):
        self.config = c = config
        self.device = device if device is not None else resolve_device(c.device)
        self.precision = precision if precision is not None else resolve_precision(c.precision, self.device)
        dtype = param_dtype(self.precision)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed shapes: let cuDNN pick the fastest convolutions
        self.data = DeviceData(arrays, self.device, dtype=dtype, channels_last=c.channels_last, augment=c.augment)
        self.steps_per_epoch = self.data.steps_per_epoch(c.batch_size)
        #: what the scheduler plays (``.log_lr``: ln of the schedule's lr, beyond float64's range if need be)
        self.schedule = schedule if schedule is not None else played_schedule(c, self.steps_per_epoch)
        limit = rescale_limit(c)
        if model is None:
            model = PreResNet(c.depth, invariant=c.invariant, eps=c.bn_eps, seed=c.seed)
        self.model = model.to(dtype)
        if c.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.model.to(self.device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        kwargs = {"fused": True} if self.device.type == "cuda" else {}
        self.optimizer = torch.optim.SGD(self.params, lr=self.schedule.first_lr, momentum=c.momentum, **kwargs)
        # the network is scale invariant by construction (validate() refuses exponential + --no-invariant)
        self.scheduler = PerStepLR(self.optimizer, self.schedule, rescale_above=limit, model=self.model,
                                   check_invariance=False)
        self.initial_loss = None  # mean training loss of the first log_every steps (divergence reference)
        self.forward = self.model if c.compile == "none" else torch.compile(
            self.model, mode=None if c.compile == "default" else c.compile)
        if self.precision == "bf16":
            self.autocast = lambda: torch.autocast(self.device.type, dtype=torch.bfloat16)
        else:
            self.autocast = contextlib.nullcontext
        self.acc_dtype = torch.float64 if self.precision == "fp64" else torch.float32

    def train_epoch(self, epoch: int, on_sync=None):
        """Train one epoch; returns (loss_sum, correct, n) as host numbers.

        ``on_sync(done_steps, loss_sum, correct, n)`` is called every ``log_every`` steps (the only host
        syncs inside the epoch besides the last one); divergence raises :class:`TrainingDiverged`.
        """
        state = self.begin_epoch(epoch)
        self.run_steps(state, 0, state.plan.steps, on_sync)
        return self.end_epoch(state)

    def begin_epoch(self, epoch: int) -> EpochState:
        """The epoch's plan (order, crops, flips) and zeroed on-device metric sums."""
        self.model.train()
        return EpochState(epoch, self.data.epoch_plan(self.config.seed, epoch, self.config.batch_size),
                          torch.zeros((), dtype=self.acc_dtype, device=self.device),
                          torch.zeros((), dtype=torch.int64, device=self.device))

    def run_steps(self, state: EpochState, start: int, stop: int, on_sync=None) -> None:
        """Steps ``start..stop-1`` of the epoch in ``state``: the hot loop, no host sync except every log_every."""
        c, data, plan = self.config, self.data, state.plan
        loss_sum, correct = state.loss_sum, state.correct
        forward, opt, scheduler = self.forward, self.optimizer, self.scheduler
        for k in range(start, stop):
            x, y = data.train_batch(plan, k)
            with self.autocast():
                out = forward(x)
                loss = F.cross_entropy(out, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            scheduler.step()
            loss_sum += loss.detach()
            correct += (out.detach().argmax(1) == y).sum()
            if (k + 1) % c.log_every == 0 and k + 1 < plan.steps:
                loss_now = loss_sum.item()
                self.check_loss(loss_now / (k + 1), f"epoch {state.epoch + 1} (by step {k + 1} of {plan.steps})")
                if on_sync is not None:
                    on_sync(k + 1, loss_now, correct.item(), (k + 1) * c.batch_size)

    def check_loss(self, mean_loss: float, where: str) -> None:
        """Raise :class:`TrainingDiverged` if ``mean_loss`` is non-finite or > EXPLODED × the initial loss."""
        if not math.isfinite(mean_loss):
            raise TrainingDiverged(f"non-finite training loss in {where}")
        if self.initial_loss is None:
            self.initial_loss = mean_loss
        elif mean_loss > EXPLODED * self.initial_loss:
            raise TrainingDiverged(f"the training loss exploded in {where}: mean {mean_loss:.3g}, more than "
                                   f"{EXPLODED:g} x the initial {self.initial_loss:.3g}")

    def end_epoch(self, state: EpochState):
        """(loss_sum, correct, n) of the epoch: the one host sync at its end."""
        plan = state.plan
        loss_total, correct_total = state.loss_sum.item(), state.correct.item()
        self.check_loss(loss_total / plan.steps, f"epoch {state.epoch + 1}")
        return loss_total, correct_total, plan.steps * plan.batch_size

    @torch.no_grad()
    def evaluate(self):
        """(mean loss, accuracy) on the test set, eval mode (BN running statistics)."""
        self.model.eval()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        for x, y in self.data.test_batches(self.config.eval_batch_size):
            with self.autocast():
                out = self.forward(x)
            loss_sum += F.cross_entropy(out.to(self.acc_dtype), y, reduction="sum").to(torch.float64)
            correct += (out.argmax(1) == y).sum()
        self.model.train()
        n = self.data.n_test
        return loss_sum.item() / n, correct.item() / n

    def norms(self) -> float:
        """‖θ_opt‖: the norm of the trainable parameters as the optimizer holds them (after rescalings)."""
        return flat_norm(self.params).item()

    def epoch_metrics(self, epoch: int, sums, evaluation) -> EpochMetrics:
        """The numbers of a finished epoch (``sums`` from :meth:`train_epoch`, ``evaluation`` from :meth:`evaluate`):
        epoch, step, train/test loss and accuracy, the schedule's lr (``None`` beyond float64, where only
        ``log_lr`` says it), the optimizer's lr (lr · R, R = 2^``log2_rescale``), the rescaling, ‖θ‖ in the
        schedule's units (‖θ_opt‖/√R) and as the optimizer holds it, and the effective lr lr_opt/‖θ_opt‖².
        Non-finite weights or test loss raise :class:`TrainingDiverged`."""
        (loss_sum, correct, n), (test_loss, test_acc) = sums, evaluation
        S, sched = self.steps_per_epoch, self.scheduler
        norm_opt = self.norms()
        if not math.isfinite(norm_opt) or not math.isfinite(test_loss):
            raise TrainingDiverged(f"non-finite weights or test loss after epoch {epoch + 1}")
        log_lr = float(self.schedule.log_lr[(epoch + 1) * S - 1])
        lr_sched = _exp(log_lr)
        lr_opt = (math.ldexp(lr_sched, sched.log2_rescale) if lr_sched is not None
                  else math.exp(log_lr + sched.log2_rescale * math.log(2)))
        norm = _ldexp(norm_opt, -sched.log2_rescale // 2)  # log2_rescale is even: √R is exact
        return EpochMetrics(
            epoch=epoch + 1, step=(epoch + 1) * S, train_loss=loss_sum / S, train_acc=correct / n,
            test_loss=test_loss, test_acc=test_acc, lr=lr_sched, log_lr=log_lr, lr_opt=lr_opt,
            rescale=sched.rescale, log2_rescale=sched.log2_rescale, rescale_count=sched.rescale_count,
            weight_norm=norm, weight_norm_opt=norm_opt, effective_lr=lr_opt / norm_opt**2,
        )

    def describe(self) -> dict:
        """What this trainer resolved: device, precision, steps, milestones, CPU threads, the schedule's lr range
        (``None`` beyond float64; ``log_max`` its ln) and the data's normalisation."""
        c, S, log_lr = self.config, self.steps_per_epoch, self.schedule.log_lr
        return {
            "device": str(self.device), "precision": self.precision, "steps_per_epoch": S,
            "total_steps": S * c.epochs, "milestones": c.milestones(), "threads": torch.get_num_threads(),
            "lr_schedule": {"first": _exp(log_lr[0]), "last": _exp(log_lr[-1]), "max": _exp(log_lr.max()),
                            "log_max": float(log_lr.max())},
            "normalisation": {"mean": self.data.mean.tolist(), "std": self.data.std.tolist()},
        }

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "initial_loss": self.initial_loss}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.initial_loss = state.get("initial_loss")
