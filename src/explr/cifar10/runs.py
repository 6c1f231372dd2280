"""One run of the CIFAR-10 engine: train it into its folder, with resume, signals, divergence and a full disk;
:class:`RunResult`, what became of a run.

One run = one (schedule, seed) pair trained for ``epochs`` epochs into ``<out>/<schedule>/seed<seed>/``
(manifest.json, metrics.jsonl, checkpoint.pt, .lock: :mod:`explr.cifar10.runfolder`).  Metrics (one JSON object
per finished epoch: :meth:`~explr.cifar10.engine.Trainer.epoch_metrics`, then :data:`TIMING_KEYS`) report the
schedule's lr (``lr``; ``null`` beyond float64, where only ``log_lr`` = ln lr says it), the optimizer's
actual lr (``lr_opt``), the accumulated rescaling factor R = lr_opt/lr = 2^``log2_rescale`` (``rescale``),
‖θ‖ in the schedule's units (``weight_norm`` = ‖θ_opt‖/√R) and the effective lr, lr/‖θ‖² = lr_opt/‖θ_opt‖²
(Li & Arora 2020, Lemma 1.3).

Safety.  :func:`train_run` checks the folder (:func:`~explr.cifar10.runfolder.check_run`) and builds the
trainer before it creates anything, then takes the lock, removes temporary files a killed writer left,
checks again and trains.  Every epoch the checkpoint's sha256 is recorded in the manifest (first as
the one being written, then as the one written), so a resume notices a damaged checkpoint.  SIGINT or
SIGTERM (:func:`~explr.cifar10.lock.handle_signals`) ends a run with status "interrupted" and the checkpoint of
its last finished epoch intact, and a full disk (:class:`~explr.cifar10.lock.DiskFull`) with status "disk full"
(where the manifest can still be written) and that checkpoint intact; ``resume=True`` continues it exactly.

Outcome.  A run's result is one :class:`RunResult`, wherever it trained: :func:`train_run` returns it, a sweep
reads it from the folder of a run trained elsewhere (:meth:`RunResult.from_folder`), and
:meth:`RunResult.of_error` turns the error that stopped a run into its :class:`~explr.cifar10.status.Status`
(for the CLI, the local pool and submitit alike).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import files
from .arrays import CifarArrays
from .config import RESOLVED_KEYS, TrainConfig
from .engine import Trainer, TrainingDiverged
from .hardware import device_name, resolved_settings
from .lock import DiskFull, RunError, RunLock, RunLocked, signal_name
from .runfolder import (
    CHECKPOINT,
    FORMAT,
    MANIFEST,
    METRICS,
    check_run,
    config_record,
    load_checkpoint,
    read_manifest,
    read_metrics,
    serialize_checkpoint,
    write_file,
)
from .sources import load_cifar10
from .status import RunState, Status

__all__ = ["SWEEP_GOES_ON", "TIMING_KEYS", "RunResult", "git_commit", "train_run"]

#: metrics that depend on wall-clock time (everything else is reproducible bit for bit on a CPU).
TIMING_KEYS = ("seconds", "train_seconds", "eval_seconds", "images_per_s")


# ----------------------------------------------------------------------------- provenance
def git_commit() -> dict:
    """The commit of the source tree; a copy without ``.git`` may name it in ``EXPLR_GIT_COMMIT``."""
    here = Path(__file__).resolve().parent
    if os.environ.get("EXPLR_GIT_COMMIT"):
        return {"commit": os.environ["EXPLR_GIT_COMMIT"], "dirty": None, "from": "EXPLR_GIT_COMMIT"}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return {"commit": None, "dirty": None}
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "."],
                               cwd=here, capture_output=True, text=True, timeout=10)
        return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _manifest(previous: dict, config: TrainConfig, trainer: Trainer, arrays: CifarArrays, start: int,
              elapsed: float) -> dict:
    devices = list(previous.get("devices", []))
    if device_name(trainer.device) not in devices:
        devices.append(device_name(trainer.device))
    return {**previous,
            "format": FORMAT, "status": Status.RUNNING, "message": "", "config": config_record(config),
            "resolved": trainer.describe(),
            "devices": devices, "data": arrays.describe(),
            "environment": {
                "torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version(),
                "platform": platform.platform(), "git": git_commit(),
                "cuda": torch.version.cuda if trainer.device.type == "cuda" else None,
            },
            "started": previous.get("started", _now()), "updated": _now(), "epochs_done": start,
            "elapsed_seconds": elapsed}


# ----------------------------------------------------------------------------- a full run
@dataclass(frozen=True)
class RunResult:
    """What became of one run: its folder ``out``, :class:`~explr.cifar10.status.Status`, epochs done (``None``
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
        locked (a :class:`~explr.cifar10.lock.RunError`: another process took its folder after the sweep's checks)
        or disk full (:class:`~explr.cifar10.lock.DiskFull`)."""
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


def _write_metrics(path, rows) -> None:
    write_file(path, lambda f: f.write("".join(json.dumps(r) + "\n" for r in rows).encode()))


def _epoch_row(trainer: Trainer, epoch: int, sums, evaluation, times) -> dict:
    """The metrics of a finished epoch (:meth:`Trainer.epoch_metrics`, then the timings)."""
    t0, t1, t2 = times
    n = sums[2]
    timings = (time.perf_counter() - t0, t1 - t0, t2 - t1, n / (t1 - t0))
    return {**trainer.epoch_metrics(epoch, sums, evaluation), **dict(zip(TIMING_KEYS, timings))}


def train_run(config: TrainConfig, out, arrays: CifarArrays | None = None, *, resume: bool = False,
              progress: bool = True, position: int = 0, stop_after: int | None = None, model=None) -> RunResult:
    """Train one run into the folder ``out`` (created); see the module docstring for the files.

    ``resume=True`` continues from ``out/checkpoint.pt`` if there is one (a finished run is returned as
    is) and starts fresh otherwise.  Problems with the folder raise :class:`RunError` before anything
    is written, and the trainer is built before anything is created.  ``stop_after=k`` stops after epoch
    k (status "interrupted"; to test resuming); ``model`` trains that network instead of the config's PreResNet
    (:class:`~explr.cifar10.engine.Trainer`).  Raises :class:`TrainingDiverged` when the run diverges
    (:mod:`explr.cifar10.engine`), ``KeyboardInterrupt`` (or :class:`~explr.cifar10.lock.Terminated`) when
    interrupted and :class:`DiskFull` when the disk fills up; all keep the checkpoint of the last finished epoch and
    record the status in the manifest (a full disk: if the manifest can still be written).
    """
    config.validate()
    arrays = (load_cifar10(config.data, config.data_root, progress=progress, batch_size=config.batch_size)
              if arrays is None else arrays)
    resolved = resolved_settings(config)
    out = Path(out)
    trainer = None
    if check_run(config, out, arrays, resume, resolved).state is not RunState.FINISHED:  # before anything is created
        torch.set_num_threads(resolved["threads"])
        trainer = Trainer(config, arrays, model=model)
    with RunLock(out) as lock:  # creates the folder (and removes it again if the lock cannot be taken)
        files.remove_leftovers(out)
        check = check_run(config, out, arrays, resume, resolved, holding_lock=True)
        if lock.stale_pid:
            print(f"{out}: stale lock of process {lock.stale_pid} (killed?); continuing from its last checkpoint",
                  file=sys.stderr)
        if check.state is RunState.FINISHED:
            return _finished(out)
        trainer = trainer or Trainer(config, arrays, model=model)
        resuming = check.state is RunState.RESUME
        return _train(config, out, arrays, trainer, resuming, resolved, progress, position, stop_after)


def _finished(out: Path) -> RunResult:
    """A finished run as its checkpoint holds it; a deleted metrics.jsonl is rewritten from it, and so is one that
    holds only its first rows (killed between the last checkpoint and its metrics; ``check_run`` refused any other
    difference)."""
    manifest = read_manifest(out / MANIFEST) if (out / MANIFEST).exists() else {}
    saved = load_checkpoint(out, manifest)
    if not (out / METRICS).exists() or read_metrics(out / METRICS) != saved["metrics"]:
        _write_metrics(out / METRICS, saved["metrics"])
    return RunResult(out, Status.FINISHED, saved["epoch"], "already finished", saved["metrics"])


def _train(config, out: Path, arrays, trainer: Trainer, resume: bool, resolved: dict, progress, position,
           stop_after) -> RunResult:
    from tqdm import tqdm

    ckpt_path, manifest_path = out / CHECKPOINT, out / MANIFEST
    history, start, elapsed, previous = [], 0, 0.0, {}
    if resume:
        previous = read_manifest(manifest_path) if manifest_path.exists() else {}
        saved = load_checkpoint(out, previous)
        trainer.load_state_dict(saved)
        history, start, elapsed = list(saved["metrics"]), int(saved["epoch"]), float(saved.get("elapsed", 0.0))
        if trainer.initial_loss is None and history:  # checkpoints written before the explosion check
            trainer.initial_loss = history[0]["train_loss"]
    manifest = _manifest(previous, config, trainer, arrays, start, elapsed)
    S = trainer.steps_per_epoch
    bar = tqdm(total=config.epochs * S, initial=start * S, desc=f"{config.schedule} seed {config.seed}",
               disable=not progress, position=position, leave=True, dynamic_ncols=True, unit="step", file=sys.stderr)
    status, message, epoch = Status.FINISHED, "", start
    try:
        write_file(manifest_path, _json(manifest))
        _write_metrics(out / METRICS, history)  # the checkpoint's history is authoritative
        for epoch in range(start, config.epochs):
            t0 = time.perf_counter()
            sums = trainer.train_epoch(epoch, _progress(bar, epoch * S, history) if progress else None)
            t1 = time.perf_counter()
            evaluation = trainer.evaluate()
            row = _epoch_row(trainer, epoch, sums, evaluation, (t0, t1, time.perf_counter()))
            elapsed += time.perf_counter() - t0
            state = {**trainer.state_dict(), "epoch": epoch + 1, "metrics": history + [row],
                     "config": config_record(config), "resolved": {k: resolved[k] for k in RESOLVED_KEYS},
                     "data_sha256": arrays.sha256, "elapsed": elapsed, "format": FORMAT}
            digest = _save_checkpoint(out, manifest, state)
            history.append(row)
            _write_metrics(out / METRICS, history)  # a resume rewrites them from the checkpoint anyway
            manifest.update({"checkpoint_sha256": digest, "checkpoint_sha256_writing": None, "updated": _now(),
                             "epochs_done": epoch + 1, "elapsed_seconds": elapsed})
            write_file(manifest_path, _json(manifest))
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
        _finish(manifest_path, manifest, Status.DIVERGED, message, elapsed, history)
        raise TrainingDiverged(message) from None
    except KeyboardInterrupt as err:
        message = (f"interrupted by {signal_name(err)} in epoch {epoch + 1}; the checkpoint of epoch {len(history)} "
                   "is kept, --resume continues from it")
        _finish(manifest_path, manifest, Status.INTERRUPTED, message, elapsed, history)
        raise
    except DiskFull as err:
        kept = f"the checkpoint of epoch {len(history)} is intact" if history else "no epoch was saved yet"
        message = f"disk full while writing {err.path}; {kept}; free space and rerun with --resume"
        try:  # the manifest may not fit either: then it stays "running", which load_runs reads as interrupted
            _finish(manifest_path, manifest, Status.DISK_FULL, message, elapsed, history)
        except (DiskFull, OSError):
            pass
        raise DiskFull(err.path, message) from None
    finally:
        bar.close()
    _finish(manifest_path, manifest, status, message, elapsed, history)
    return RunResult(out, status, len(history), message, history)


def _save_checkpoint(out: Path, manifest: dict, state: dict) -> str:
    """Write ``state`` as the checkpoint; returns its sha256, which the manifest records first as the one being
    written: a process killed between the writes leaves a manifest that accepts whichever checkpoint is there."""
    data, digest = serialize_checkpoint(state)
    manifest["checkpoint_sha256_writing"] = digest
    write_file(out / MANIFEST, _json(manifest))
    write_file(out / CHECKPOINT, lambda f: f.write(data))
    return digest


def _json(obj):
    """A writer of ``obj`` as indented JSON, for :func:`write_file`."""
    return lambda f: f.write((json.dumps(obj, indent=2) + "\n").encode())


def _progress(bar, first_step: int, history: list):
    """The ``on_sync`` callback of an epoch: advance the bar, show running loss/accuracy and the last test acc."""
    def on_sync(steps, loss_sum, correct, n):
        bar.update(first_step + steps - bar.n)
        post = {"loss": f"{loss_sum / steps:.3f}", "acc": f"{correct / n:.3f}"}
        if history:
            post["test"] = f"{history[-1]['test_acc']:.3f}"
        bar.set_postfix(post, refresh=False)
    return on_sync


def _finish(path: Path, manifest: dict, status: Status, message: str, elapsed: float, history: list) -> None:
    manifest.update({"status": status, "message": message, "updated": _now(), "elapsed_seconds": elapsed,
                     "epochs_done": len(history)})
    if history:
        manifest["final"] = {k: history[-1][k] for k in ("epoch", "train_loss", "train_acc", "test_loss", "test_acc")}
    write_file(path, _json(manifest))
