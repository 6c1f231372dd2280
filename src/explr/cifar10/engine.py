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

A checkpoint holds :meth:`Trainer.state_dict` and the run's progress (:mod:`explr.cifar10.runs`).
:func:`check_checkpoint` and :func:`check_progress` check every field of it that a resume reads, beyond the
shapes of the model's and optimizer's tensors (:mod:`explr.cifar10.runfolder`), and :func:`check_metrics_file`
a finished run's metrics against it; each refusal is one :class:`~explr.cifar10.lock.RunError` line naming the
file, raised before anything is written.
"""
from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..invariance import flat_norm
from ..lr_scheduler import PerStepLR
from ..models import PreResNet
from ..params import Float, Text, is_int, is_real_type
from .arrays import CifarArrays
from .config import TrainConfig
from .data import DeviceData, EpochPlan
from .hardware import param_dtype, resolve_device, resolve_precision
from .lock import RunError
from .played import played_schedule, rescale_limit

__all__ = ["EXPLODED", "EpochState", "Trainer", "TrainingDiverged", "check_checkpoint", "check_metrics_file",
           "check_progress"]

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
    :class:`~explr.cifar10.data.CifarArrays` (:func:`explr.cifar10.runs.train_run` adds the files,
    resume and progress bar).  ``model``: the network to train instead of ``config``'s PreResNet (e.g. a
    PreResNet whose outputs break, to test divergence); it must be scale invariant for the exponential schedules.
    """

    def __init__(self, config: TrainConfig, arrays: CifarArrays, device: torch.device | None = None, *,
                 model: torch.nn.Module | None = None):
        self.config = c = config
        self.device = device if device is not None else resolve_device(c.device)
        self.precision = resolve_precision(c.precision, self.device)
        dtype = param_dtype(self.precision)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed shapes: let cuDNN pick the fastest convolutions
        self.data = DeviceData(arrays, self.device, dtype=dtype, channels_last=c.channels_last, augment=c.augment)
        self.steps_per_epoch = self.data.steps_per_epoch(c.batch_size)
        #: what the scheduler plays (``.log_lr``: ln of the schedule's lr, beyond float64's range if need be)
        limit = rescale_limit(c)
        self.schedule = played_schedule(c, self.steps_per_epoch)
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

    def epoch_metrics(self, epoch: int, sums, evaluation) -> dict:
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
        return {
            "epoch": epoch + 1, "step": (epoch + 1) * S, "train_loss": loss_sum / S, "train_acc": correct / n,
            "test_loss": test_loss, "test_acc": test_acc, "lr": lr_sched, "log_lr": log_lr, "lr_opt": lr_opt,
            "rescale": sched.rescale, "log2_rescale": sched.log2_rescale, "rescale_count": sched.rescale_count,
            "weight_norm": norm, "weight_norm_opt": norm_opt, "effective_lr": lr_opt / norm_opt**2,
        }

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


# ----------------------------------------------------------------------------- what a resume reads of a checkpoint
#: the rules of the checkpoint's own fields (the settings are compared with the run's by runfolder.check_run)
_SAVED = {"data_sha256": Text("the data's sha256 (a string)"), "elapsed": Float(0, lo_open=False),
          "initial_loss": Float(0, lo_open=False)}
#: the numbers of a metrics row that a resume shows and reports (the progress bar, the manifest's "final")
_SHOWN = {"train_loss": Float(0, lo_open=False), "train_acc": Float(0, 1, lo_open=False, hi_open=False),
          "test_loss": Float(0, lo_open=False), "test_acc": Float(0, 1, lo_open=False, hi_open=False)}


def _refuse(path, what: str):
    return RunError(f"{path} {what} (hand-edited?); restore it, or delete the folder {path.parent} to train this run "
                    "again from the start")


def _shown(value) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= 40 else text[:37] + "..."


def check_checkpoint(saved: dict, path) -> None:
    """The fields of the checkpoint at ``path`` that a resume reads and that need no run to check: ``data_sha256``
    (a string), ``elapsed`` (seconds >= 0, if present), ``initial_loss`` (None or a finite loss >= 0, if present),
    ``resolved`` (None or a dict, if present) and the metrics rows: the JSON objects that :meth:`Trainer.epoch_metrics`
    makes, of epochs 1, 2, ... in order, holding only numbers or null, with finite losses and accuracies.
    Anything else is a :class:`RunError` naming ``path``."""
    path = Path(path)
    for key, rule in _SAVED.items():
        if key in saved and not (key == "initial_loss" and saved[key] is None) and not rule.ok(saved[key]):
            raise _refuse(path, f"holds {key} = {_shown(saved[key])}, not {rule.rule()}")
    if saved.get("resolved") is not None and not isinstance(saved["resolved"], dict):
        raise _refuse(path, f"holds resolved = {_shown(saved['resolved'])}, not a dict of settings")
    for number, row in enumerate(saved["metrics"], 1):
        where = f"holds a metrics row {number} = {_shown(row)}"
        if not isinstance(row, dict):
            raise _refuse(path, f"{where}, not a JSON object")
        bad = next((k for k, v in row.items() if not isinstance(k, str) or not (v is None or is_real_type(type(v)))),
                   None)
        if bad is not None:
            raise _refuse(path, f"holds a metrics row {number} whose {_shown(bad)} = {_shown(row[bad])} is not a number "
                          "or null")
        if not is_int(row.get("epoch")) or row.get("epoch") != number:
            raise _refuse(path, f"holds a metrics row {number} of epoch {_shown(row.get('epoch'))}, not of epoch {number}")
        for key, rule in _SHOWN.items():
            if not rule.ok(row.get(key)):
                raise _refuse(path, f"holds a metrics row {number} whose {key} = {_shown(row.get(key))} is not "
                              f"{rule.rule()}")


def check_progress(saved: dict, config: TrainConfig, steps_per_epoch: int, precision: str, path) -> None:
    """The scheduler state of the checkpoint at ``path`` (of a run whose settings, epoch and tensors were checked)
    is one that ``config``'s scheduler loads (:meth:`PerStepLR.load_state_dict`'s checks, played into a stand-in
    optimizer of the run's weight dtype) at the checkpoint's epoch: ``last_epoch`` = epoch × ``steps_per_epoch``.
    Otherwise a :class:`RunError` naming ``path``."""
    path = Path(path)
    state = saved["scheduler"]
    schedule = played_schedule(config, steps_per_epoch)
    weight = torch.zeros(1, dtype=param_dtype(precision), requires_grad=True)
    stand_in = torch.optim.SGD([weight], lr=schedule.first_lr, momentum=config.momentum)
    scheduler = PerStepLR(stand_in, schedule, rescale_above=rescale_limit(config))  # a bad setting: its own line
    try:
        scheduler.load_state_dict(state)
    except (ValueError, TypeError, OverflowError) as err:
        reason = " ".join(str(err).split())[:200]
        raise _refuse(path, f"holds a scheduler state this run's schedule cannot resume from ({reason})") from None
    steps = saved["epoch"] * steps_per_epoch
    if state["last_epoch"] != steps:
        raise _refuse(path, f"holds a scheduler at step last_epoch = {state['last_epoch']}, not at the {steps} steps of "
                      f"its {saved['epoch']} epochs")


def check_metrics_file(rows: list, saved: dict, path, checkpoint) -> None:
    """The rows of a finished run's metrics file at ``path`` must be those of its ``checkpoint`` (``saved``), or the
    first of them (a process killed between the last checkpoint and its metrics:
    :func:`~explr.cifar10.runs.train_run` rewrites them from the checkpoint); other rows (a duplicated or edited
    line) are a :class:`RunError` naming both files."""
    rows, expected = [json.dumps(r) for r in rows], [json.dumps(r) for r in saved["metrics"]]  # as written (NaN = NaN)
    if rows != expected[:len(rows)]:
        first = next((i for i, (a, b) in enumerate(zip(rows, expected)) if a != b), len(expected))
        raise RunError(f"{path} is not the {len(expected)} metrics rows of {checkpoint} (its row {first + 1} of "
                       f"{len(rows)} differs: hand-edited?); delete it and rerun with --resume: it is rewritten from "
                       "the checkpoint")
