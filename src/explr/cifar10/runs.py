"""One run of the CIFAR-10 engine: train it into its folder, with resume, signals, divergence and a full disk.

One run = one (schedule, seed) pair trained for ``epochs`` epochs into ``<out>/<schedule>/seed<seed>/``
(manifest.json, metrics.jsonl, checkpoint.pt, .lock: :mod:`explr.cifar10.runfolder`, whose public names
are importable from here too).  Metrics (``METRIC_KEYS``, one JSON object per finished epoch) report the
schedule's lr (``lr``; ``null`` beyond float64, where only ``log_lr`` = ln lr says it), the optimizer's
actual lr (``lr_opt``), the accumulated rescaling factor R = lr_opt/lr = 2^``log2_rescale`` (``rescale``),
‖θ‖ in the schedule's units (``weight_norm`` = ‖θ_opt‖/√R) and the effective lr, lr/‖θ‖² = lr_opt/‖θ_opt‖²
(Li & Arora 2020, Lemma 1.3).

Safety.  :func:`train_run` checks the folder (:func:`~explr.cifar10.runfolder.check_run`) and builds the
trainer before it creates anything, then takes the lock, removes temporary files a killed writer left,
checks again and trains.  Every epoch the checkpoint's sha256 is recorded in the manifest (first as
the one being written, then as the one written), so a resume notices a damaged checkpoint.  SIGINT or
SIGTERM (:func:`handle_signals`) ends a run with status "interrupted" and the checkpoint of its last
finished epoch intact, as does a full disk (:class:`DiskFull`); ``resume=True`` continues it exactly.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from . import files
from .config import RESOLVED_KEYS, TrainConfig
from .data import CifarArrays, load_cifar10
from .engine import Trainer, TrainingDiverged
from .hardware import device_name
from .runfolder import (
    CHECKPOINT,
    FORMAT,
    MANIFEST,
    METRICS,
    EXIT_DISK_FULL,
    DiskFull,
    RunError,
    RunLock,
    RunLocked,
    Terminated,
    check_run,
    check_writable,
    config_record,
    exit_code,
    handle_signals,
    load_checkpoint,
    load_runs,
    lock_holder,
    read_manifest,
    read_metrics,
    resolved_settings,
    run_dir,
    serialize_checkpoint,
    signal_name,
    write_file,
)

__all__ = [
    "FORMAT",
    "METRIC_KEYS",
    "TIMING_KEYS",
    "DiskFull",
    "EXIT_DISK_FULL",
    "RunError",
    "RunLocked",
    "Terminated",
    "RunResult",
    "RunSummary",
    "RunLock",
    "check_run",
    "check_writable",
    "exit_code",
    "handle_signals",
    "lock_holder",
    "load_runs",
    "read_metrics",
    "resolved_settings",
    "run_dir",
    "summary",
    "summary_from_folder",
    "train_run",
]

METRIC_KEYS = (
    "epoch", "step", "train_loss", "train_acc", "test_loss", "test_acc", "lr", "log_lr", "lr_opt", "rescale",
    "log2_rescale", "rescale_count", "weight_norm", "weight_norm_opt", "effective_lr", "seconds", "train_seconds",
    "eval_seconds", "images_per_s",
)
#: metrics that depend on wall-clock time (everything else is reproducible bit for bit on a CPU).
TIMING_KEYS = ("seconds", "train_seconds", "eval_seconds", "images_per_s")


# ----------------------------------------------------------------------------- provenance
def _git_commit() -> dict:
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
            "format": FORMAT, "status": "running", "message": "", "config": config_record(config),
            "resolved": trainer.describe(),
            "devices": devices, "data": arrays.describe(),
            "environment": {
                "torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version(),
                "platform": platform.platform(), "git": _git_commit(),
                "cuda": torch.version.cuda if trainer.device.type == "cuda" else None,
            },
            "started": previous.get("started", _now()), "updated": _now(), "epochs_done": start,
            "elapsed_seconds": elapsed}


# ----------------------------------------------------------------------------- a full run
@dataclass
class RunResult:
    """What :func:`train_run` returns: ``status`` is finished, diverged or interrupted."""

    out: Path
    status: str
    epochs_done: int
    metrics: list = field(default_factory=list)
    message: str = ""


def _write_metrics(path, rows) -> None:
    write_file(path, lambda f: f.write("".join(json.dumps(r) + "\n" for r in rows).encode()))


def _epoch_row(trainer: Trainer, epoch: int, sums, evaluation, times) -> dict:
    """The metrics of a finished epoch (:meth:`Trainer.epoch_metrics`, then the timings)."""
    t0, t1, t2 = times
    n = sums[2]
    return {**trainer.epoch_metrics(epoch, sums, evaluation), "seconds": time.perf_counter() - t0,
            "train_seconds": t1 - t0, "eval_seconds": t2 - t1, "images_per_s": n / (t1 - t0)}


def train_run(config: TrainConfig, out, arrays: CifarArrays | None = None, *, resume: bool = False,
              progress: bool = True, position: int = 0, stop_after: int | None = None, model=None) -> RunResult:
    """Train one run into the folder ``out`` (created); see the module docstring for the files.

    ``resume=True`` continues from ``out/checkpoint.pt`` if there is one (a finished run is returned as
    is) and starts fresh otherwise.  Problems with the folder raise :class:`RunError` before anything
    is written, and the trainer is built before anything is created.  ``stop_after=k`` stops after epoch
    k (status "interrupted"; to test resuming); ``model`` trains that network instead of the config's PreResNet
    (:class:`~explr.cifar10.engine.Trainer`).  Raises :class:`TrainingDiverged` when the run diverges
    (:mod:`explr.cifar10.engine`), ``KeyboardInterrupt`` (or :class:`Terminated`) when interrupted and
    :class:`DiskFull` when the disk fills up; all keep the checkpoint of the last finished epoch and record
    the status in the manifest (a full disk: if the manifest can still be written).
    """
    config.validate()
    arrays = (load_cifar10(config.data, config.data_root, progress=progress, batch_size=config.batch_size)
              if arrays is None else arrays)
    resolved = resolved_settings(config)
    out = Path(out)
    trainer = None
    if check_run(config, out, arrays, resume, resolved).state != "finished":  # before anything is created
        torch.set_num_threads(resolved["threads"])
        trainer = Trainer(config, arrays, model=model)
    with RunLock(out) as lock:  # creates the folder (and removes it again if the lock cannot be taken)
        files.remove_leftovers(out)
        check = check_run(config, out, arrays, resume, resolved, holding_lock=True)
        if lock.stale_pid:
            print(f"{out}: stale lock of process {lock.stale_pid} (killed?); continuing from its last checkpoint",
                  file=sys.stderr)
        if check.state == "finished":
            return _finished(out)
        trainer = trainer or Trainer(config, arrays, model=model)
        return _train(config, out, arrays, trainer, check.state == "resume", resolved, progress, position, stop_after)


def _finished(out: Path) -> RunResult:
    """A finished run as its checkpoint holds it; a deleted metrics.jsonl is rewritten from it, and so is one that
    holds only its first rows (killed between the last checkpoint and its metrics; ``check_run`` refused any other
    difference)."""
    manifest = read_manifest(out / MANIFEST) if (out / MANIFEST).exists() else {}
    saved = load_checkpoint(out, manifest)
    if not (out / METRICS).exists() or read_metrics(out / METRICS) != saved["metrics"]:
        _write_metrics(out / METRICS, saved["metrics"])
    return RunResult(out, "finished", saved["epoch"], saved["metrics"], "already finished")


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
    status, message, epoch = "finished", "", start
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
                status, message = "interrupted", f"stopped after epoch {epoch + 1} (stop_after)"
                break
    except TrainingDiverged as err:
        done = len(history)
        kept = f"epoch {done}) is kept in {ckpt_path}" if done else f"none: no epoch finished) is kept in {out}"
        message = f"{err}; stopped. The last good checkpoint ({kept}. Lower --lr or check the data."
        _finish(manifest_path, manifest, "diverged", message, elapsed, history)
        raise TrainingDiverged(message) from None
    except KeyboardInterrupt as err:
        message = (f"interrupted by {signal_name(err)} in epoch {epoch + 1}; the checkpoint of epoch {len(history)} "
                   "is kept, --resume continues from it")
        _finish(manifest_path, manifest, "interrupted", message, elapsed, history)
        raise
    except DiskFull as err:
        kept = f"the checkpoint of epoch {len(history)} is intact" if history else "no epoch was saved yet"
        message = f"disk full while writing {err.path}; {kept}; free space and rerun with --resume"
        try:  # the manifest may not fit either: then it stays "running", which load_runs reads as interrupted
            _finish(manifest_path, manifest, "interrupted", message, elapsed, history)
        except (DiskFull, OSError):
            pass
        raise DiskFull(err.path, message) from None
    finally:
        bar.close()
    _finish(manifest_path, manifest, status, message, elapsed, history)
    return RunResult(out, status, len(history), history, message)


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


def _finish(path: Path, manifest: dict, status: str, message: str, elapsed: float, history: list) -> None:
    manifest.update({"status": status, "message": message, "updated": _now(), "elapsed_seconds": elapsed,
                     "epochs_done": len(history)})
    if history:
        manifest["final"] = {k: history[-1][k] for k in ("epoch", "train_loss", "train_acc", "test_loss", "test_acc")}
    write_file(path, _json(manifest))


@dataclass(frozen=True)
class RunSummary:
    """What a sweep reports of one run: its folder, status, epochs done, a message and the last metrics row.

    ``status``: finished, interrupted, diverged, locked, failed, disk full, submitted or not started;
    ``epochs_done`` is ``None`` where the run's process did not say.  :meth:`as_dict` is the JSON-able form
    that :func:`~explr.cifar10.sweep.run_many`, :func:`~explr.cifar10.sweep.submit` and the CLI report."""

    out: str
    status: str
    epochs_done: int | None = None
    message: str = ""
    final: dict | None = None

    def as_dict(self) -> dict:
        """The summary as a JSON-able ``dict``."""
        return asdict(self)

    def but(self, **changes) -> "RunSummary":
        """This summary with ``changes`` (status, message, ...)."""
        return replace(self, **changes)

    @classmethod
    def of(cls, result: RunResult) -> "RunSummary":
        return cls(str(result.out), result.status, result.epochs_done, result.message,
                   result.metrics[-1] if result.metrics else None)

    @classmethod
    def taken(cls, folder, err: RunError) -> "RunSummary":
        """A run whose folder another process took (locked, or trained) after the sweep's checks: "locked"."""
        message = str(err) if isinstance(err, RunLocked) else f"taken meanwhile by another process: {err}"
        return cls(str(folder), "locked", None, message)

    @classmethod
    def from_folder(cls, folder) -> "RunSummary":
        """The summary of a run as its manifest tells it (for runs trained by other processes)."""
        folder = Path(folder)
        try:
            m = read_manifest(folder / MANIFEST)
            rows = read_metrics(folder, drop_partial_last=True) if (folder / METRICS).exists() else []
        except (OSError, RunError):
            return cls(str(folder), "not started", 0)
        return cls(str(folder), m.get("status"), m.get("epochs_done", len(rows)), m.get("message", ""),
                   rows[-1] if rows else None)


def summary(result: RunResult) -> dict:
    """A JSON-able summary of a run (:class:`RunSummary`): out, status, epochs_done, message, last metrics row."""
    return RunSummary.of(result).as_dict()


def summary_from_folder(folder) -> dict:
    """The summary of a run as its manifest tells it (:meth:`RunSummary.from_folder`), as a dict."""
    return RunSummary.from_folder(folder).as_dict()
