"""One run trained into its folder: :func:`prepare_run` (a :class:`PreparedRun`: the config validated, its schedule
built, its folder checked, nothing written), :func:`train_prepared` and :func:`train_run`, and :class:`RunResult`.

Training takes the run's lock, removes the temporary files of a killed writer, checks the folder again if it changed
since it was prepared, then writes a checkpoint, its sha256 in the manifest and the metrics after every epoch.
SIGINT/SIGTERM/SIGHUP/SIGUSR2 end a run "interrupted", a full disk "disk full", divergence "diverged", each with the
checkpoint of the last finished epoch intact; ``resume=True`` continues it to identical metrics.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..lr_scheduler import check_rescale_above
from ..schedules import Schedule
from .config import TrainConfig, device_name, param_dtype, played_schedule, rescale_limit, resolved_settings
from .data import CifarArrays, DataIdentity, load_cifar10
from .engine import Trainer, TrainingDiverged
from .files import DiskFull, RunError, RunLock, RunLocked, RunState, Status, remove_leftovers, signal_name, write_file
from .runfolder import (
    CHECKPOINT, Checkpoint, MANIFEST, METRICS, Manifest, MetricsRow, RunCheck, TIMING_KEYS, check_run,
    checkpoint_of, checkpoint_state, config_record, new_manifest, read_manifest, read_metrics, record_end,
    record_epoch, serialize_checkpoint, write_manifest, write_metrics,
)

__all__ = ["PreparedRun", "RunResult", "SWEEP_GOES_ON", "prepare_run", "train_prepared", "train_run"]


#: the run files as checked: (name, inode, size, mtime in ns) of each that exists (an atomic rewrite: a new inode)
FolderFiles = tuple


@dataclass(frozen=True)
class PreparedRun:
    """A run ready to train: its ``config`` (validated), ``folder``, ``resume``, ``resolved`` settings
    (:data:`~explr.cifar10.config.RESOLVED_KEYS`), the identity of its ``data``, the ``schedule`` it plays, what
    ``check`` found in its folder and the folder's files as they were checked (``seen``)."""

    config: TrainConfig
    folder: Path
    resume: bool
    resolved: dict
    data: DataIdentity
    schedule: Schedule
    check: RunCheck
    seen: FolderFiles

    @property
    def state(self) -> RunState:
        """The folder's :class:`~explr.cifar10.files.RunState`: a new run, one to resume, or a finished one."""
        return self.check.state

    @property
    def note(self) -> str:
        """A line worth showing (a stale lock), or ``""``."""
        return self.check.note

    def check_data(self, arrays: CifarArrays) -> None:
        """:class:`RunError` unless ``arrays`` are the data this run was prepared with (a worker that loaded its own)."""
        if arrays.sha256 != self.data.sha256:
            raise RunError(f"{self.folder}: the run was prepared for the data {self.data.source} (sha256 "
                           f"{self.data.sha256[:12]}…), not {arrays.source} ({arrays.sha256[:12]}…); prepare it again")

    def resolved_here(self) -> PreparedRun:
        """This run with its device, precision and CPU threads resolved on this machine (it was prepared on another:
        a cluster job's submitter), checked against them: playable in that precision, and a resume with the same
        ones (:func:`~explr.cifar10.runfolder.check_run`).  ``ValueError`` or :class:`RunError` otherwise."""
        resolved = resolved_settings(self.config)
        if resolved == self.resolved:
            return self
        _check_playable(self.config, self.schedule, resolved, _describe(self.config))
        seen = folder_files(self.folder)
        check = check_run(self.config, self.folder, self.data, self.resume, resolved, schedule=self.schedule)
        return dataclasses.replace(self, resolved=resolved, check=check, seen=seen)

    def confirmed(self) -> PreparedRun:
        """This run, its folder checked again (:func:`~explr.cifar10.runfolder.check_run`, by a caller holding its
        lock) only if the folder's files differ from those checked.  :class:`RunError` if they no longer pass."""
        now = folder_files(self.folder)
        if now == self.seen:
            return self
        check = check_run(self.config, self.folder, self.data, self.resume, self.resolved, holding_lock=True,
                          schedule=self.schedule)
        return dataclasses.replace(self, check=check, seen=now)


def folder_files(folder: Path) -> FolderFiles:
    """The run files of ``folder`` as (name, inode, size, mtime in ns); those missing are left out."""
    seen = []
    for name in (MANIFEST, CHECKPOINT, METRICS):
        try:
            st = os.stat(folder / name)
        except OSError:
            continue
        seen.append((name, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(seen)


def prepare_run(config: TrainConfig, folder, arrays: CifarArrays, *, resume: bool = False, jobs: int = 1,
                resolved: dict | None = None) -> PreparedRun:
    """Make ``config``'s run into ``folder`` ready (module docstring); writes nothing.

    ``resolved``: the settings of one run of ``jobs`` at a time (:func:`~explr.cifar10.config.resolved_settings`),
    where the caller resolved them already.  Raises ``ValueError`` (one line naming the flag) for a schedule that
    cannot be played and :class:`RunError` for a folder it cannot train into."""
    config.validate()
    resolved = resolved if resolved is not None else resolved_settings(config, jobs)
    folder, data = Path(folder), arrays.identity
    where = _describe(config)
    schedule = _built_schedule(config, data, where)
    seen = folder_files(folder)  # before the check: a change during it is seen under the lock
    check = check_run(config, folder, data, resume, resolved, schedule=schedule)  # a resume's other settings first
    _check_playable(config, schedule, resolved, where)
    return PreparedRun(config, folder, resume, resolved, data, schedule, check, seen)


def _describe(config: TrainConfig) -> str:
    """The run and its schedule's flags, for the lines that refuse them."""
    limit = rescale_limit(config)
    rescaled = "" if limit is None else f", --rescale-above {limit:g}"
    return (f"schedule {config.schedule} (seed {config.seed}; --lr {config.lr:g}, --wd {config.wd:g}, --momentum "
            f"{config.momentum:g}, --epochs {config.epochs}{rescaled})")


def _built_schedule(config: TrainConfig, data: DataIdentity, where: str) -> Schedule:
    """``config``'s schedule built for the real number of steps, once; one ``ValueError`` line otherwise."""
    if config.batch_size > data.n_train:
        raise ValueError(f"batch_size (--batch-size) {config.batch_size} exceeds the {data.n_train} training images "
                         f"of {data.source}")
    try:
        return played_schedule(config, data.n_train // config.batch_size)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def _check_playable(config: TrainConfig, schedule: Schedule, resolved: dict, where: str) -> None:
    """An exponential schedule's ``rescale_above`` against its first lr and the weights' dtype (PerStepLR's rule)."""
    limit = rescale_limit(config)
    if limit is None:
        return
    try:  # lr[0] is exactly what PerStepLR plays (np.ldexp of its mantissa and exponent)
        check_rescale_above(limit, float(schedule.lr[0]), param_dtype(resolved["precision"]))
    except ValueError as err:
        raise ValueError(f"{where} cannot be played: {err}") from None


# ----------------------------------------------------------------------------- a full run
@dataclass(frozen=True)
class RunResult:
    """What became of one run: its folder ``out``, :class:`~explr.cifar10.files.Status`, epochs done (``None``
    where the run's process did not say), a message, its metrics rows and, for a run submitted without waiting,
    its submitit ``job_id``; :attr:`final` is its last metrics row."""

    out: Path
    status: Status
    epochs_done: int | None = None
    message: str = ""
    metrics: list = field(default_factory=list, repr=False)
    job_id: str | None = None

    @property
    def final(self) -> dict | None:
        """The last metrics row (``None`` before the first epoch finished)."""
        return self.metrics[-1] if self.metrics else None

    @classmethod
    def of_error(cls, folder, err: BaseException) -> "RunResult":
        """The result of a run that ``err`` stopped: diverged (:class:`~explr.cifar10.engine.TrainingDiverged`),
        locked (a :class:`~explr.cifar10.files.RunError`: another process took its folder after the sweep's checks)
        or disk full (:class:`~explr.cifar10.files.DiskFull`)."""
        if isinstance(err, TrainingDiverged):
            return cls(Path(folder), Status.DIVERGED, None, str(err))
        if isinstance(err, RunError):
            message = str(err) if isinstance(err, RunLocked) else f"taken meanwhile by another process: {err}"
            return cls(Path(folder), Status.LOCKED, None, message)
        if isinstance(err, DiskFull):
            return cls(Path(folder), Status.DISK_FULL, None, str(err))
        raise TypeError(f"no run status for {type(err).__name__}: {err}") from err

    @classmethod
    def from_folder(cls, folder) -> "RunResult":
        """The result of a run as its manifest and metrics tell it (for runs trained by other processes)."""
        folder = Path(folder)
        try:
            m = read_manifest(folder / MANIFEST)
            rows = read_metrics(folder, drop_partial_last=True) if (folder / METRICS).exists() else []
        except (OSError, RunError):
            return cls(folder, Status.NOT_STARTED, 0)
        return cls(folder, Status(m.get("status", Status.RUNNING)), m.get("epochs_done", len(rows)),
                   m.get("message", ""), rows)


#: the errors after which a sweep goes on with its other runs (:meth:`RunResult.of_error` says what became of one).
SWEEP_GOES_ON = (TrainingDiverged, RunError)


def _epoch_row(trainer: Trainer, epoch: int, sums, evaluation, times) -> MetricsRow:
    """The metrics of a finished epoch (:meth:`Trainer.epoch_metrics`, then the timings)."""
    t0, t1, t2 = times
    n = sums[2]
    timings = (time.perf_counter() - t0, t1 - t0, t2 - t1, n / (t1 - t0))
    return MetricsRow(**trainer.epoch_metrics(epoch, sums, evaluation), **dict(zip(TIMING_KEYS, timings)))


def train_run(config: TrainConfig, out, arrays: CifarArrays | None = None, *, resume: bool = False,
              progress: bool = True, position: int = 0, stop_after: int | None = None, model=None) -> RunResult:
    """Train one run into the folder ``out`` (created); see the module docstring for the files.

    ``resume=True`` continues from ``out/checkpoint.pt`` if there is one (a finished run is returned as
    is) and starts fresh otherwise.  The run is prepared first (:func:`~explr.cifar10.runs.prepare_run`:
    problems with the folder raise :class:`RunError` before anything is written), then trained
    (:func:`train_prepared`, which takes the other arguments).
    """
    config.validate()
    arrays = (load_cifar10(config.data, config.data_root, progress=progress, batch_size=config.batch_size)
              if arrays is None else arrays)
    run = prepare_run(config, out, arrays, resume=resume)
    return train_prepared(run, arrays, progress=progress, position=position, stop_after=stop_after, model=model)


def train_prepared(run: PreparedRun, arrays: CifarArrays | None = None, *, progress: bool = True, position: int = 0,
                   stop_after: int | None = None, model=None) -> RunResult:
    """Train the prepared ``run`` (:class:`~explr.cifar10.runs.PreparedRun`) on ``arrays`` (loaded here if
    ``None``: they must be the data it was prepared with).

    The trainer is built before anything is created; then the run's lock is taken, temporary files a killed writer
    left are removed, and the folder is checked again only if its files changed since the run was prepared
    (:meth:`~explr.cifar10.runs.PreparedRun.confirmed`).  ``stop_after=k`` stops after epoch k (status
    "interrupted"; to test resuming); ``model`` trains that network instead of the config's PreResNet
    (:class:`~explr.cifar10.engine.Trainer`).  Raises :class:`TrainingDiverged` when the run diverges
    (:mod:`explr.cifar10.engine`), ``KeyboardInterrupt`` (or :class:`~explr.cifar10.files.Terminated`) when
    interrupted and :class:`DiskFull` when the disk fills up; all keep the checkpoint of the last finished epoch and
    record the status in the manifest (a full disk: if the manifest can still be written).
    """
    c = run.config
    if arrays is None:
        arrays = load_cifar10(c.data, c.data_root, progress=progress, batch_size=c.batch_size)
    run.check_data(arrays)
    trainer = None
    if run.state is not RunState.FINISHED:  # before anything is created
        torch.set_num_threads(run.resolved["threads"])
        trainer = _trainer(run, arrays, model)
    with RunLock(run.folder) as lock:  # creates the folder (and removes it again if the lock cannot be taken)
        remove_leftovers(run.folder)
        run = run.confirmed()
        if lock.stale_pid:
            print(f"{run.folder}: stale lock of process {lock.stale_pid} (killed?); continuing from its last "
                  "checkpoint", file=sys.stderr)
        if run.state is RunState.FINISHED:
            return _finished(run.folder)
        trainer = trainer or _trainer(run, arrays, model)
        return _train(run, arrays, trainer, progress, position, stop_after)


def _trainer(run: PreparedRun, arrays: CifarArrays, model) -> Trainer:
    """The run's trainer, on the device, in the precision and with the schedule the run resolved and built."""
    resolved = run.resolved
    return Trainer(run.config, arrays, torch.device(resolved["device"]), precision=resolved["precision"],
                   schedule=run.schedule, model=model)


def _finished(out: Path) -> RunResult:
    """A finished run as its checkpoint holds it; a deleted metrics.jsonl is rewritten from it, and so is one that
    holds only its first rows (killed between the last checkpoint and its metrics; ``check_run`` refused any other
    difference)."""
    manifest = read_manifest(out / MANIFEST) if (out / MANIFEST).exists() else {}
    saved = checkpoint_of(out, manifest)
    if not (out / METRICS).exists() or read_metrics(out / METRICS) != saved["metrics"]:
        write_metrics(out / METRICS, saved["metrics"])
    return RunResult(out, Status.FINISHED, saved["epoch"], "already finished", saved["metrics"])


def _train(run: PreparedRun, arrays, trainer: Trainer, progress, position, stop_after) -> RunResult:
    from tqdm import tqdm

    config, out, resolved = run.config, run.folder, run.resolved
    ckpt_path, manifest_path = out / CHECKPOINT, out / MANIFEST
    history, start, elapsed, previous = [], 0, 0.0, {}
    if run.state is RunState.RESUME:
        previous = read_manifest(manifest_path) if manifest_path.exists() else {}
        saved = checkpoint_of(out, previous)
        trainer.load_state_dict(saved)
        history, start, elapsed = list(saved["metrics"]), int(saved["epoch"]), float(saved.get("elapsed", 0.0))
        if trainer.initial_loss is None and history:  # checkpoints written before the explosion check
            trainer.initial_loss = history[0]["train_loss"]
    record = config_record(config)
    manifest = new_manifest(previous, record, trainer.describe(), trainer.device,
                            device_name(trainer.device), arrays.describe(), start, elapsed)
    S = trainer.steps_per_epoch
    bar = tqdm(total=config.epochs * S, initial=start * S, desc=f"{config.schedule} seed {config.seed}",
               disable=not progress, position=position, leave=True, dynamic_ncols=True, unit="step", file=sys.stderr)
    status, message, epoch = Status.FINISHED, "", start
    try:
        write_manifest(manifest_path, manifest)
        write_metrics(out / METRICS, history)  # the checkpoint's history is authoritative
        for epoch in range(start, config.epochs):
            t0 = time.perf_counter()
            sums = trainer.train_epoch(epoch, _progress(bar, epoch * S, history) if progress else None)
            t1 = time.perf_counter()
            evaluation = trainer.evaluate()
            row = _epoch_row(trainer, epoch, sums, evaluation, (t0, t1, time.perf_counter()))
            elapsed += time.perf_counter() - t0
            state = checkpoint_state(trainer.state_dict(), epoch + 1, history + [row], record,
                                     resolved, arrays.sha256, elapsed)
            digest = _save_checkpoint(out, manifest, state)
            history.append(row)
            write_metrics(out / METRICS, history)  # a resume rewrites them from the checkpoint anyway
            record_epoch(manifest_path, manifest, digest, epoch + 1, elapsed)
            bar.update((epoch + 1) * S - bar.n)
            bar.set_postfix({"loss": f"{row['train_loss']:.3f}", "acc": f"{row['train_acc']:.3f}",
                             "test": f"{row['test_acc']:.3f}"})
            if stop_after is not None and epoch + 1 >= stop_after and epoch + 1 < config.epochs:
                status, message = Status.INTERRUPTED, f"stopped after epoch {epoch + 1} (stop_after)"
                break
    except TrainingDiverged as err:
        done = len(history)
        kept = f"epoch {done}) is kept in {ckpt_path}" if done else f"none: no epoch finished) is kept in {out}"
        message = f"{err}; stopped. The last good checkpoint ({kept}. Lower --lr or check the data."
        record_end(manifest_path, manifest, Status.DIVERGED, message, elapsed, history)
        raise TrainingDiverged(message) from None
    except KeyboardInterrupt as err:
        message = (f"interrupted by {signal_name(err)} in epoch {epoch + 1}; the checkpoint of epoch {len(history)} "
                   "is kept, --resume continues from it")
        record_end(manifest_path, manifest, Status.INTERRUPTED, message, elapsed, history)
        raise
    except DiskFull as err:
        kept = f"the checkpoint of epoch {len(history)} is intact" if history else "no epoch was saved yet"
        message = f"disk full while writing {err.path}; {kept}; free space and rerun with --resume"
        try:  # the manifest may not fit either: then it stays "running", which load_runs reads as interrupted
            record_end(manifest_path, manifest, Status.DISK_FULL, message, elapsed, history)
        except (DiskFull, OSError):
            pass
        raise DiskFull(err.path, message) from None
    finally:
        bar.close()
    record_end(manifest_path, manifest, status, message, elapsed, history)
    return RunResult(out, status, len(history), message, history)


def _save_checkpoint(out: Path, manifest: Manifest, state: Checkpoint) -> str:
    """Write ``state`` as the checkpoint; returns its sha256, which the manifest records first as the one being
    written: a process killed between the writes leaves a manifest that accepts whichever checkpoint is there."""
    data, digest = serialize_checkpoint(state)
    manifest["checkpoint_sha256_writing"] = digest
    write_manifest(out / MANIFEST, manifest)
    write_file(out / CHECKPOINT, lambda f: f.write(data))
    return digest


def _progress(bar, first_step: int, history: list):
    """The ``on_sync`` callback of an epoch: advance the bar, show running loss/accuracy and the last test acc."""
    def on_sync(steps, loss_sum, correct, n):
        bar.update(first_step + steps - bar.n)
        post = {"loss": f"{loss_sum / steps:.3f}", "acc": f"{correct / n:.3f}"}
        if history:
            post["test"] = f"{history[-1]['test_acc']:.3f}"
        bar.set_postfix(post, refresh=False)
    return on_sync
