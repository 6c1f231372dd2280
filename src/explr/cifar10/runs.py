"""One run: the on-device sampler (:class:`DeviceData`), the hot loop (:class:`Trainer`; the exponential schedules
play through :class:`~explr.lr_scheduler.PerStepLR`, Li & Arora 2020, Lemma 2.6) and the run trained into its folder
(:func:`prepare_run`, :func:`train_prepared`, :func:`train_run`)."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from collections import namedtuple
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..invariance import flat_norm
from ..lr_scheduler import PerStepLR, check_rescale_above
from ..models import PreResNet
from ..params import is_int
from ..schedules import Schedule
from .config import (TrainConfig, param_dtype, played_schedule, rescale_limit, resolve_device,
                     resolve_precision, resolved_settings)
from .data import CifarArrays, check_batch_size, load_cifar10
from .runfolder import (CHECKPOINT, MANIFEST, METRICS, TIMING_KEYS, DataIdentity, DiskFull, RunCheck, RunError, RunLock,
                        RunState, Status, check_run, checkpoint_of, checkpoint_state, config_record, new_manifest,
                        read_manifest, read_metrics, record_end, remove_leftovers, serialize_checkpoint, signal_name,
                        write_file, write_manifest, write_metrics)


#: one epoch's randomness on the device, n = ``steps·batch_size``: the example ids in the order used (``index``, (n,)),
#: the pixel offset of each crop window in the padded uint8 store (``base``, (n,)) and the flips (``flip``, (n, 1) bool)
EpochPlan = namedtuple("EpochPlan", "epoch index base flip steps batch_size")


class DeviceData:
    """The dataset on ``device`` as uint8; a batch is ``(crop_flip(x) / 255 − mean) / std``, ``(B, 3, H, W)``: a random
    crop of the zero-padded image, flipped with probability ½ (He et al. 2016), drawn from ``(seed, epoch)``."""

    def __init__(self, arrays: CifarArrays, device="cpu", dtype=torch.float32, channels_last=True,
                 pad: int = 4, augment: bool = True):
        self.device = torch.device(device)
        self.dtype, self.channels_last, self.pad, self.augment = dtype, channels_last, pad, augment
        x = arrays.x_train
        self.n_train, self.h, self.w, self.c = x.shape
        self.n_test = len(arrays.y_test)
        self.mean, self.std = arrays.channel_stats  # constant images: DataError
        # (x/255 − mean)/std = x·scale + shift
        self._scale = torch.tensor(1.0 / (255.0 * self.std), dtype=dtype, device=self.device)
        self._shift = torch.tensor(-self.mean / self.std, dtype=dtype, device=self.device)
        self.hp, self.wp = self.h + 2 * pad, self.w + 2 * pad
        padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))  # zeros around each image
        self._train = torch.from_numpy(padded).to(self.device).reshape(-1, self.c)  # one row per padded pixel
        self._y_train = torch.from_numpy(arrays.y_train).to(self.device)
        self._test = torch.from_numpy(np.ascontiguousarray(arrays.x_test)).to(self.device)
        self._y_test = torch.from_numpy(arrays.y_test).to(self.device)
        # pixel offsets inside one crop window of the padded store: rows (1, H, 1), columns (1, W)
        self._rows = (torch.arange(self.h, device=self.device) * self.wp).view(1, self.h, 1)
        self._cols = torch.arange(self.w, device=self.device).view(1, self.w)
        self._cols_flipped = self._cols.flip(1)

    def steps_per_epoch(self, batch_size: int) -> int:
        if not (is_int(batch_size) and 1 <= batch_size <= self.n_train):
            raise ValueError(f"batch_size must be an integer in [1, n_train = {self.n_train}]; got {batch_size!r}")
        return self.n_train // batch_size

    def epoch_plan(self, seed: int, epoch: int, batch_size: int) -> EpochPlan:
        """The permutation, crop offsets and flips of ``epoch``, drawn on the CPU from ``(seed, epoch)``."""
        steps = self.steps_per_epoch(batch_size)
        n = self.n_train
        seq = np.random.SeedSequence([int(seed), int(epoch), 0xC1FA])
        g = torch.Generator().manual_seed(int(seq.generate_state(1, np.uint64)[0] >> 1))
        index = torch.randperm(n, generator=g)
        low, high = (0, 2 * self.pad + 1) if self.augment else (self.pad, self.pad + 1)  # else: centred, not flipped
        oy, ox = (torch.randint(low, high, (n,), generator=g) for _ in range(2))
        flip = torch.randint(0, 1 + self.augment, (n,), generator=g).bool()
        base = index * (self.hp * self.wp) + oy * self.wp + ox
        dev = self.device
        return EpochPlan(epoch, index.to(dev), base.to(dev), flip.view(n, 1).to(dev), steps, batch_size)

    def _normalise(self, x_uint8: torch.Tensor) -> torch.Tensor:
        x = torch.addcmul(self._shift, x_uint8.to(self.dtype), self._scale)  # (B, H, W, C)
        x = x.permute(0, 3, 1, 2)  # NCHW view with channels_last strides
        return x if self.channels_last else x.contiguous()

    def train_batch(self, plan: EpochPlan, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch ``step`` of ``plan``: augmented, normalised images and their labels (one pixel gather)."""
        s = slice(step * plan.batch_size, (step + 1) * plan.batch_size)
        cols = torch.where(plan.flip[s], self._cols_flipped, self._cols)  # (B, W), reversed where flipped
        idx = plan.base[s].view(-1, 1, 1) + self._rows + cols.view(-1, 1, self.w)  # (B, H, W) pixel ids
        x = self._train.index_select(0, idx.view(-1)).view(-1, self.h, self.w, self.c)
        return self._normalise(x), self._y_train[plan.index[s]]

    def test_batches(self, batch_size: int = 1000):
        """The test set in order, normalised, no augmentation."""
        for i in range(0, self.n_test, batch_size):
            yield self._normalise(self._test[i:i + batch_size]), self._y_test[i:i + batch_size]


#: a finite mean training loss above EXPLODED × the initial one counts as diverged.
EXPLODED = 100.0


class TrainingDiverged(RuntimeError):
    """The training loss became non-finite or exploded, or the weights non-finite; the last good checkpoint is kept."""


def _finite(fn, *args) -> float | None:
    """``fn(*args)``, or None (JSON null) where it exceeds float64."""
    try:
        return fn(*args)
    except OverflowError:
        return None


class Trainer:
    """Model, optimizer, scheduler and device data of one run; ``train_epoch`` is the hot loop.  ``device``,
    ``precision``, ``schedule``: a :class:`PreparedRun`'s, else from ``config``; ``model``: instead of its PreResNet."""

    def __init__(self, config: TrainConfig, arrays: CifarArrays, device: torch.device | None = None, *,
                 precision: str | None = None, schedule: Schedule | None = None,
                 model: torch.nn.Module | None = None):
        self.config = c = config
        self.device = device if device is not None else resolve_device(c.device)
        self.precision = precision if precision is not None else resolve_precision(c.precision, self.device)
        dtype = param_dtype(self.precision)
        torch.backends.cudnn.benchmark |= self.device.type == "cuda"  # fixed shapes: cuDNN picks the fastest kernels
        self.data = DeviceData(arrays, self.device, dtype=dtype, channels_last=c.channels_last, augment=c.augment)
        self.steps_per_epoch = self.data.steps_per_epoch(c.batch_size)
        #: what the scheduler plays (``.log_lr``: ln of the schedule's lr, beyond float64's range if need be)
        self.schedule = schedule if schedule is not None else played_schedule(c, self.steps_per_epoch)
        model = model if model is not None else PreResNet(c.depth, invariant=c.invariant, eps=c.bn_eps, seed=c.seed)
        layout = torch.channels_last if c.channels_last else torch.preserve_format
        self.model = model.to(self.device, dtype, memory_format=layout)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.SGD(self.params, lr=self.schedule.first_lr, momentum=c.momentum,
                                         fused=self.device.type == "cuda")
        self.scheduler = PerStepLR(self.optimizer, self.schedule, rescale_above=rescale_limit(c), model=self.model,
                                   check_invariance=False)  # invariant by construction (validate() sees to it)
        self.initial_loss = None  # mean training loss of the first log_every steps (divergence reference)
        self.forward = self.model if c.compile == "none" else torch.compile(
            self.model, mode=None if c.compile == "default" else c.compile)
        bf16 = partial(torch.autocast, self.device.type, dtype=torch.bfloat16)
        self.autocast = bf16 if self.precision == "bf16" else contextlib.nullcontext
        self.acc_dtype = torch.float64 if self.precision == "fp64" else torch.float32

    def train_epoch(self, epoch: int, on_sync=None):
        """Train one epoch (its pieces apart: for benchmarks); returns (loss_sum, correct, n).  ``on_sync(steps,
        loss_sum, correct, n)``: every ``log_every`` steps (the only host syncs but the last)."""
        plan = self.begin_epoch(epoch)
        self.run_steps(plan, 0, plan.steps, on_sync)
        return self.end_epoch(plan)

    def begin_epoch(self, epoch: int) -> EpochPlan:
        """The epoch's plan; the on-device metric sums zeroed."""
        self.model.train()
        self._loss_sum = torch.zeros((), dtype=self.acc_dtype, device=self.device)
        self._correct = torch.zeros((), dtype=torch.int64, device=self.device)
        return self.data.epoch_plan(self.config.seed, epoch, self.config.batch_size)

    def run_steps(self, plan: EpochPlan, start: int, stop: int, on_sync=None) -> None:
        """Steps ``start..stop-1`` of ``plan``'s epoch: the hot loop, no host sync but every ``log_every`` steps."""
        c, data, loss_sum, correct = self.config, self.data, self._loss_sum, self._correct
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
                self.check_loss(loss_now / (k + 1), f"epoch {plan.epoch + 1} (by step {k + 1} of {plan.steps})")
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

    def end_epoch(self, plan: EpochPlan):
        """(loss_sum, correct, n) of the epoch: the one host sync at its end."""
        loss_total, correct_total = self._loss_sum.item(), self._correct.item()
        self.check_loss(loss_total / plan.steps, f"epoch {plan.epoch + 1}")
        return loss_total, correct_total, plan.steps * plan.batch_size

    @torch.no_grad()
    def evaluate(self):
        """(mean loss, accuracy) on the test set, in eval mode (BN running statistics; ``begin_epoch`` leaves it)."""
        self.model.eval()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        for x, y in self.data.test_batches(self.config.eval_batch_size):
            with self.autocast():
                out = self.forward(x)
            loss_sum += F.cross_entropy(out.to(self.acc_dtype), y, reduction="sum").to(torch.float64)
            correct += (out.argmax(1) == y).sum()
        n = self.data.n_test
        return loss_sum.item() / n, correct.item() / n

    def epoch_metrics(self, epoch: int, sums, evaluation) -> dict:
        """A finished epoch's numbers: losses, accuracies, the schedule's lr (``None`` beyond float64; ``log_lr``),
        the optimizer's lr_opt = lr · R (R = 2^``log2_rescale``), ‖θ‖ = ‖θ_opt‖/√R, the effective lr lr_opt/‖θ_opt‖².
        Non-finite weights or test loss raise :class:`TrainingDiverged`."""
        (loss_sum, correct, n), (test_loss, test_acc) = sums, evaluation
        S, sched = self.steps_per_epoch, self.scheduler
        norm_opt = flat_norm(self.params).item()  # ‖θ_opt‖: the weights as the optimizer holds them
        if not math.isfinite(norm_opt) or not math.isfinite(test_loss):
            raise TrainingDiverged(f"non-finite weights or test loss after epoch {epoch + 1}")
        log_lr = float(self.schedule.log_lr[(epoch + 1) * S - 1])
        lr_sched = _finite(math.exp, log_lr)
        lr_opt = (math.ldexp(lr_sched, sched.log2_rescale) if lr_sched is not None
                  else math.exp(log_lr + sched.log2_rescale * math.log(2)))
        norm = _finite(math.ldexp, norm_opt, -sched.log2_rescale // 2)  # log2_rescale is even: √R is exact
        return dict(
            epoch=epoch + 1, step=(epoch + 1) * S, train_loss=loss_sum / S, train_acc=correct / n,
            test_loss=test_loss, test_acc=test_acc, lr=lr_sched, log_lr=log_lr, lr_opt=lr_opt,
            rescale=sched.rescale, log2_rescale=sched.log2_rescale, rescale_count=sched.rescale_count,
            weight_norm=norm, weight_norm_opt=norm_opt, effective_lr=lr_opt / norm_opt**2,
        )

    def describe(self) -> dict:
        """What this trainer resolved, as the manifest records it (an lr beyond float64: ``None``)."""
        c, S, log_lr = self.config, self.steps_per_epoch, self.schedule.log_lr
        first, last, top = (_finite(math.exp, float(v)) for v in (log_lr[0], log_lr[-1], log_lr.max()))
        return {
            "device": str(self.device), "precision": self.precision, "steps_per_epoch": S,
            "total_steps": S * c.epochs, "milestones": c.milestones(), "threads": torch.get_num_threads(),
            "lr_schedule": {"first": first, "last": last, "max": top, "log_max": float(log_lr.max())},
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


@dataclass(frozen=True)
class PreparedRun:
    """A run ready to train (:func:`prepare_run`): what it plays on which data, and what ``check`` found there."""

    config: TrainConfig
    folder: Path
    resume: bool
    resolved: dict
    data: DataIdentity
    schedule: Schedule
    check: RunCheck


def prepare_run(config: TrainConfig, folder, arrays: CifarArrays, *, resume: bool = False, jobs: int = 1,
                resolved: dict | None = None) -> PreparedRun:
    """``config``'s run into ``folder``: validated, its schedule built, its folder checked, its settings ``resolved``
    (for ``jobs`` runs at a time, if not given); writes nothing.  ``ValueError`` or :class:`RunError` in one line."""
    config.validate()
    resolved = resolved if resolved is not None else resolved_settings(config, jobs)
    folder, data, limit = Path(folder), arrays.identity, rescale_limit(config)
    check_batch_size(data.n_train, config.batch_size, data.source)
    where = (f"schedule {config.schedule} (seed {config.seed}; --lr {config.lr:g}, --wd {config.wd:g}, --momentum "
             f"{config.momentum:g}, --epochs {config.epochs}{'' if limit is None else f', --rescale-above {limit:g}'})")
    try:
        schedule = played_schedule(config, data.n_train // config.batch_size)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    check = check_run(config, folder, data, resume, resolved)  # a resume's other settings first
    try:  # lr[0] is exactly what PerStepLR plays (np.ldexp of its mantissa and exponent)
        if limit is not None:
            check_rescale_above(limit, float(schedule.lr[0]), param_dtype(resolved["precision"]))
    except ValueError as err:
        raise ValueError(f"{where} cannot be played: {err}") from None
    return PreparedRun(config, folder, resume, resolved, data, schedule, check)


@dataclass(frozen=True)
class RunResult:
    """What became of one run (``epochs_done``: ``None`` if not said; ``job_id``: a job submitted without waiting)."""

    out: Path
    status: Status
    epochs_done: int | None = None
    message: str = ""
    metrics: list = field(default_factory=list, repr=False)
    job_id: str | None = None

    @property
    def final(self) -> dict | None:
        return self.metrics[-1] if self.metrics else None


def train_run(config: TrainConfig, out, arrays: CifarArrays | None = None, *, resume: bool = False,
              progress: bool = True, position: int = 0, stop_after: int | None = None, model=None) -> RunResult:
    """Train one run into the folder ``out`` (``resume``: from its checkpoint): prepare it, then train it."""
    config.validate()
    arrays = (load_cifar10(config.data, config.data_root, progress=progress, batch_size=config.batch_size)
              if arrays is None else arrays)
    run = prepare_run(config, out, arrays, resume=resume)
    return train_prepared(run, arrays, progress=progress, position=position, stop_after=stop_after, model=model)


def train_prepared(run: PreparedRun, arrays: CifarArrays | None = None, *, progress: bool = True, position: int = 0,
                   stop_after: int | None = None, model=None) -> RunResult:
    """Train the prepared ``run`` on ``arrays`` (loaded if ``None``) under its lock, its folder checked again there;
    ``stop_after=k``: stop after epoch k ("interrupted").  Divergence, a signal, a full disk: recorded, then raised."""
    c = run.config
    if arrays is None:
        arrays = load_cifar10(c.data, c.data_root, progress=progress, batch_size=c.batch_size)
    if arrays.sha256 != run.data.sha256:
        raise RunError(f"{run.folder}: the run was prepared for the data {run.data.source} (sha256 "
                       f"{run.data.sha256[:12]}…), not {arrays.source} ({arrays.sha256[:12]}…); prepare it again")
    trainer = None if run.check.state is RunState.FINISHED else _trainer(run, arrays, model)  # before the lock
    with RunLock(run.folder):  # creates the folder
        remove_leftovers(run.folder)
        check = check_run(c, run.folder, run.data, run.resume, run.resolved, holding_lock=True)
        if run.check.note:  # a stale lock, seen when the run was prepared
            print(run.check.note, file=sys.stderr)
        if check.state is RunState.FINISHED:
            return _finished(run.folder)
        trainer = trainer or _trainer(run, arrays, model)
        return _train(dataclasses.replace(run, check=check), arrays, trainer, progress, position, stop_after)


def _trainer(run: PreparedRun, arrays: CifarArrays, model) -> Trainer:
    """The run's trainer, with the threads, device, precision and schedule the run resolved and built."""
    torch.set_num_threads(run.resolved["threads"])
    return Trainer(run.config, arrays, torch.device(run.resolved["device"]), precision=run.resolved["precision"],
                   schedule=run.schedule, model=model)


def _finished(out: Path) -> RunResult:
    """A finished run as its checkpoint holds it (a metrics.jsonl that differs is rewritten from it)."""
    manifest = read_manifest(out / MANIFEST) if (out / MANIFEST).exists() else {}
    saved = checkpoint_of(out, manifest)
    if not (out / METRICS).exists() or read_metrics(out / METRICS) != saved["metrics"]:
        write_metrics(out / METRICS, saved["metrics"])
    return RunResult(out, Status.FINISHED, saved["epoch"], "already finished", saved["metrics"])


#: what ends a run early: its status in the manifest and the remedy its message ends with
_STOPPED = ((TrainingDiverged, Status.DIVERGED, "Lower --lr or check the data"),
            (KeyboardInterrupt, Status.INTERRUPTED, "--resume continues the run"),
            (DiskFull, Status.DISK_FULL, "free space and rerun with --resume"))


def _train(run: PreparedRun, arrays, trainer: Trainer, progress, position, stop_after) -> RunResult:
    config, out = run.config, run.folder
    history, start, elapsed, previous = [], 0, 0.0, {}
    if run.check.state is RunState.RESUME:
        previous = read_manifest(out / MANIFEST) if (out / MANIFEST).exists() else {}
        saved = checkpoint_of(out, previous)
        trainer.load_state_dict(saved)
        history, start, elapsed = list(saved["metrics"]), int(saved["epoch"]), float(saved.get("elapsed", 0.0))
    record = config_record(config)
    manifest = new_manifest(previous, record, trainer.describe(), trainer.device, arrays.describe(), start, elapsed)
    S = trainer.steps_per_epoch
    bar = tqdm(total=config.epochs * S, initial=start * S, desc=f"{config.schedule} seed {config.seed}",
               disable=not progress, position=position, dynamic_ncols=True, unit="step", file=sys.stderr)
    status, message, epoch = Status.FINISHED, "", start
    try:
        write_manifest(out / MANIFEST, manifest)
        write_metrics(out / METRICS, history)  # the checkpoint's history is authoritative
        for epoch in range(start, config.epochs):
            t0, shown = time.perf_counter(), partial(_progress, bar, epoch * S, history)
            sums = trainer.train_epoch(epoch, shown if progress else None)
            t1 = time.perf_counter()
            evaluation = trainer.evaluate()
            t2 = time.perf_counter()
            timings = (t2 - t0, t1 - t0, t2 - t1, sums[2] / (t1 - t0))
            row = {**trainer.epoch_metrics(epoch, sums, evaluation), **dict(zip(TIMING_KEYS, timings))}
            elapsed += time.perf_counter() - t0
            state = checkpoint_state(trainer.state_dict(), epoch + 1, history + [row], record, run.resolved,
                                     arrays.sha256, elapsed)
            data, digest = serialize_checkpoint(state)
            # first: a kill between the two writes leaves either checkpoint accepted
            write_manifest(out / MANIFEST, manifest, checkpoint_sha256_writing=digest)
            write_file(out / CHECKPOINT, lambda f, data=data: f.write(data))
            history.append(row)
            write_metrics(out / METRICS, history)  # a resume rewrites them from the checkpoint anyway
            write_manifest(out / MANIFEST, manifest, checkpoint_sha256=digest, checkpoint_sha256_writing=None,
                           epochs_done=epoch + 1, elapsed_seconds=elapsed)
            shown(S, *sums)  # the epoch's loss and accuracies
            if stop_after is not None and epoch + 1 >= stop_after and epoch + 1 < config.epochs:
                status, message = Status.INTERRUPTED, f"stopped after epoch {epoch + 1} (stop_after)"
                break
    except (TrainingDiverged, KeyboardInterrupt, DiskFull) as err:  # the message says what stopped it, what is kept
        status, remedy = next((s, r) for kind, s, r in _STOPPED if isinstance(err, kind))
        why = f"interrupted by {signal_name(err)} in epoch {epoch + 1}" if status is Status.INTERRUPTED else str(err)
        kept = f"the checkpoint of epoch {len(history)} is kept" if history else "no epoch was saved yet"
        err.args = (f"{why}; {kept}; {remedy}",)
        with contextlib.suppress(DiskFull, OSError):  # a full disk may refuse the manifest too: it stays "running"
            record_end(out / MANIFEST, manifest, status, str(err), elapsed, history)
        raise
    finally:
        bar.close()
    record_end(out / MANIFEST, manifest, status, message, elapsed, history)
    return RunResult(out, status, len(history), message, history)


def _progress(bar, first_step: int, history: list, steps: int, loss_sum: float, correct: int, n: int) -> None:
    """An epoch's ``on_sync`` (its first three arguments bound): the bar, the loss and accuracy so far, the test's."""
    bar.update(first_step + steps - bar.n)
    test = {"test": f"{history[-1]['test_acc']:.3f}"} if history else {}
    bar.set_postfix({"loss": f"{loss_sum / steps:.3f}", "acc": f"{correct / n:.3f}", **test}, refresh=False)
