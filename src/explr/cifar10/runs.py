"""One run of the CIFAR-10 engine on disk: its folder, lock, manifest, metrics, checkpoint, resume and signals.

One run = one (schedule, seed) pair trained for ``epochs`` epochs, written to ``<out>/<schedule>/seed<seed>/``::

    manifest.json    full config, resolved device/precision/threads, data source (name, kind, sha256), git
                     commit, torch version, status ("running", "finished", "diverged", "interrupted")
    metrics.jsonl    one JSON object per finished epoch (see ``METRIC_KEYS``); rewritten atomically
    checkpoint.pt    model, optimizer, scheduler and the metrics so far, after every epoch (atomic)
    .lock            held (``fcntl.flock``) by the process training the run; holds its pid

Metrics report the schedule's lr (``lr``; ``null`` beyond float64, where only ``log_lr`` = ln lr says it),
the optimizer's actual lr (``lr_opt``), the accumulated rescaling factor R = lr_opt/lr = 2^``log2_rescale``
(``rescale``), ‖θ‖ in the schedule's units (``weight_norm`` = ‖θ_opt‖/√R) and the effective lr,
lr/‖θ‖² = lr_opt/‖θ_opt‖² (Li & Arora 2020, Lemma 1.3).

Safety.  :func:`check_run` inspects a run folder without writing anything: a folder held by a live
process, a run that exists without ``resume``, a corrupt manifest or checkpoint (the message says
what to delete), or a resume with other trajectory-defining settings, other *resolved* device type,
precision or CPU threads, or other data (sha256, also for finished runs) is a :class:`RunError`.
:func:`train_run` takes the lock, removes temporary files a killed writer left, checks again and
trains.  SIGINT or SIGTERM (:func:`handle_signals`) ends a run with status "interrupted" and the
checkpoint of its last finished epoch intact; ``resume=True`` continues it exactly.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from .config import RESOLVED_KEYS, TRAJECTORY_KEYS, TrainConfig
from .data import CifarArrays, load_cifar10
from .engine import Trainer, TrainingDiverged
from .files import atomic_write, remove_leftovers, write_json
from .hardware import device_name, resolve_device, resolve_precision, resolve_threads

__all__ = [
    "FORMAT",
    "METRIC_KEYS",
    "TIMING_KEYS",
    "RunError",
    "RunLocked",
    "Terminated",
    "RunResult",
    "RunLock",
    "check_run",
    "handle_signals",
    "lock_holder",
    "load_runs",
    "read_metrics",
    "run_dir",
    "train_run",
]

FORMAT = "explr.cifar10/1"
METRIC_KEYS = (
    "epoch", "step", "train_loss", "train_acc", "test_loss", "test_acc", "lr", "log_lr", "lr_opt", "rescale",
    "log2_rescale", "rescale_count", "weight_norm", "weight_norm_opt", "effective_lr", "seconds", "train_seconds",
    "eval_seconds", "images_per_s",
)
#: metrics that depend on wall-clock time (everything else is reproducible bit for bit on a CPU).
TIMING_KEYS = ("seconds", "train_seconds", "eval_seconds", "images_per_s")
CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
MANIFEST = "manifest.json"
LOCK = ".lock"
CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "epoch", "metrics", "config", "data_sha256")


class RunError(ValueError):
    """A run folder cannot be used as asked (exists, corrupt, other settings or data); one line, says what to do."""


class RunLocked(RunError):
    """Another live process holds the run folder's lock."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (raised by the handler of :func:`handle_signals`)."""


# ----------------------------------------------------------------------------- reading runs
def run_dir(out, schedule: str, seed: int) -> Path:
    """Where a run lives: ``<out>/<schedule>/seed<seed>``."""
    return Path(out) / schedule / f"seed{seed}"


def read_metrics(path) -> list[dict]:
    """The per-epoch rows of a run (``path``: its directory or its metrics.jsonl)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_runs(out) -> list[dict]:
    """Every run under ``out``: dicts with ``schedule, seed, dir, manifest`` and ``metrics`` (key → np.array).

    A manifest that says "running" while no process holds the run's lock belongs to a process that was
    killed (SIGKILL, a crash, a lost node): it is reported as "interrupted".
    """
    runs = []
    for manifest_path in sorted(Path(out).glob(f"*/seed*/{MANIFEST}")):
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("status") == "running" and not lock_holder(manifest_path.parent)[1]:
            manifest.update(status="interrupted", message="its process died without recording it (killed?); "
                            "--resume continues from the last checkpoint")
        rows = read_metrics(manifest_path.parent) if (manifest_path.parent / METRICS).exists() else []
        metrics = {k: np.array([r[k] for r in rows]) for k in (rows[0] if rows else {})}
        cfg = manifest["config"]
        runs.append({"schedule": cfg["schedule"], "seed": cfg["seed"], "dir": manifest_path.parent,
                     "manifest": manifest, "metrics": metrics})
    return runs


# ----------------------------------------------------------------------------- the lock
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def lock_holder(folder) -> tuple[int | None, bool]:
    """(pid written in ``folder/.lock``, whether a live process holds the lock); writes nothing."""
    path = Path(folder) / LOCK
    if not path.is_file():
        return None, False
    pid = _read_pid(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return pid, False
    except BlockingIOError:
        return pid, True
    finally:
        os.close(fd)


class RunLock:
    """An exclusive ``fcntl.flock`` on ``folder/.lock`` for the whole run; the file holds the holder's pid.

    The kernel releases the lock when its process dies, however it dies.  A pid left in the file with
    no lock held is a stale lock of a process that was killed: :attr:`stale_pid` reports it.
    """

    def __init__(self, folder):
        self.path = Path(folder) / LOCK
        self.fd = None
        self.stale_pid = None

    def __enter__(self) -> "RunLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        for attempt in range(20):  # a concurrent check_run holds a shared lock for microseconds
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == 19:
                    pid = _read_pid(self.path)
                    os.close(fd)
                    raise RunLocked(_locked_message(self.path.parent, pid)) from None
                time.sleep(0.05)
        previous = _read_pid(self.path)
        self.stale_pid = previous if previous not in (None, os.getpid()) else None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        os.ftruncate(self.fd, 0)  # an empty lock file: released cleanly, not stale
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None


def _locked_message(folder: Path, pid: int | None) -> str:
    who = f"process {pid}" if pid else "another process"
    alive = "" if pid is None or _pid_alive(pid) else " (on another machine?)"
    return (f"{folder} is being trained by {who}{alive}, which holds {folder / LOCK}; wait for it to finish or stop "
            "it, then use --resume")


# ----------------------------------------------------------------------------- signals
@contextlib.contextmanager
def handle_signals():
    """SIGINT raises ``KeyboardInterrupt`` and SIGTERM :class:`Terminated`, each once: later signals are
    ignored, so that the interrupted run can record its status.  Main thread only; restores the handlers."""
    fired = []

    def handler(signum, frame):
        if fired:
            return
        fired.append(signum)
        raise (Terminated if signum == signal.SIGTERM else KeyboardInterrupt)()

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal number: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + (signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT)


# ----------------------------------------------------------------------------- checking a run folder
@dataclass
class RunCheck:
    """What :func:`check_run` found: ``state`` is "new", "resume" or "finished"; ``note`` a line to show."""

    state: str
    epochs_done: int = 0
    note: str = ""


def _config_dict(config: TrainConfig) -> dict:
    """The config as recorded: resolved milestones, and no path of this machine (the data is identified by
    name, kind and sha256 in the manifest's ``data``)."""
    d = asdict(config)
    d["decay_epochs"] = config.milestones()
    if d["data"] not in ("auto", "synthetic"):
        d["data"] = Path(d["data"]).name
    d["data_root"] = None
    return d


def resolved_settings(config: TrainConfig, jobs: int = 1) -> dict:
    """The values of :data:`RESOLVED_KEYS` on this machine (device, precision, CPU threads)."""
    device = resolve_device(config.device)
    return {"device": str(device), "precision": resolve_precision(config.precision, device),
            "threads": resolve_threads(config.threads, device, jobs)}


def _resolved_mismatch(saved: dict, now: dict) -> list[str]:
    diff = []
    if saved.get("device") and torch.device(saved["device"]).type != torch.device(now["device"]).type:
        diff.append(f"device={saved['device']!r} (now {now['device']!r})")
    if saved.get("precision") and saved["precision"] != now["precision"]:
        diff.append(f"precision={saved['precision']!r} (now {now['precision']!r})")
    if torch.device(now["device"]).type == "cpu" and saved.get("threads") and saved["threads"] != now["threads"]:
        diff.append(f"threads={saved['threads']!r} (now {now['threads']!r}; CPU results depend on it: pass "
                    f"--threads {saved['threads']})")
    return diff


def _load_checkpoint(path: Path) -> dict:
    folder = path.parent
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, empty, not a torch file, or a pickle with foreign objects
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'empty'}"
        raise RunError(f"{path} is not a readable checkpoint ({reason[:160]}); delete the folder {folder} to train "
                       "this run again from the start") from None
    if not isinstance(saved, dict) or any(k not in saved for k in CHECKPOINT_KEYS):
        raise RunError(f"{path} is not a checkpoint of this engine (expected the keys {', '.join(CHECKPOINT_KEYS)}); "
                       f"delete the folder {folder} to train this run again from the start")
    return saved


def check_run(config: TrainConfig, folder, arrays: CifarArrays, resume: bool, resolved: dict,
              holding_lock: bool = False) -> RunCheck:
    """Can ``config`` train into ``folder``?  Raises :class:`RunError` (module docstring); writes nothing.

    ``holding_lock``: the caller holds the folder's :class:`RunLock` (skip the lock check)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise RunError(f"--out: {folder} exists and is not a folder")
    if not folder.is_dir():
        return RunCheck("new")
    pid, held = lock_holder(folder) if not holding_lock else (None, False)
    if held:
        raise RunLocked(_locked_message(folder, pid))
    note = (f"{folder}: stale lock of process {pid}, which is no longer running (killed?); its last checkpoint "
            "is kept") if pid and not held else ""
    ckpt, manifest, metrics = folder / CHECKPOINT, folder / MANIFEST, folder / METRICS
    if not resume and (ckpt.exists() or metrics.exists()):
        raise RunError(f"{folder} already holds a run; pass --resume to continue it or choose another --out"
                       + (f" ({note})" if note else ""))
    saved_manifest = {}
    if manifest.exists():
        try:
            saved_manifest = json.loads(manifest.read_text())
        except (ValueError, OSError) as err:
            raise RunError(f"{manifest} is unreadable ({err}); delete it (--resume rebuilds it from {CHECKPOINT})"
                           if ckpt.exists() else f"{manifest} is unreadable ({err}); delete the folder {folder}")
    if not ckpt.exists():
        return RunCheck("new", note=note)
    saved = _load_checkpoint(ckpt)
    cfg = _config_dict(config)
    diff = [f"{k}={saved['config'].get(k)!r} (now {cfg.get(k)!r})" for k in TRAJECTORY_KEYS
            if saved["config"].get(k) != cfg.get(k)]
    diff += _resolved_mismatch(saved.get("resolved") or saved_manifest.get("resolved", {}), resolved)
    if diff:
        raise RunError(f"--resume: the run in {folder} was made with other settings: {', '.join(diff)}")
    if saved["data_sha256"] != arrays.sha256:
        raise RunError(f"--resume: the run in {folder} was trained on other data (sha256 {saved['data_sha256'][:12]}…, "
                       f"now {arrays.sha256[:12]}… from {arrays.source}); pass the same --data or another --out")
    done = int(saved["epoch"])
    return RunCheck("finished" if done >= config.epochs else "resume", done, note)


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
    c, S = config, trainer.steps_per_epoch
    devices = list(previous.get("devices", []))
    if device_name(trainer.device) not in devices:
        devices.append(device_name(trainer.device))
    return {**previous,
            "format": FORMAT, "status": "running", "message": "", "config": _config_dict(c),
            "resolved": {
                "device": str(trainer.device), "precision": trainer.precision, "steps_per_epoch": S,
                "total_steps": S * c.epochs, "milestones": c.milestones(), "threads": torch.get_num_threads(),
                "lr_schedule": {"first": _exp(trainer.schedule_log_lr[0]), "last": _exp(trainer.schedule_log_lr[-1]),
                                "max": _exp(trainer.schedule_log_lr.max()),
                                "log_max": float(trainer.schedule_log_lr.max())},
                "normalisation": {"mean": trainer.data.mean.tolist(), "std": trainer.data.std.tolist()},
            },
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
    atomic_write(path, lambda f: f.write("".join(json.dumps(r) + "\n" for r in rows).encode()))


def _exp(log_value: float) -> float | None:
    """e^x as a float, or None (JSON null) where it exceeds float64."""
    return math.exp(log_value) if log_value < 709.0 else None


def _ldexp(x: float, exponent: int) -> float | None:
    try:
        return math.ldexp(x, exponent)
    except OverflowError:
        return None


def _epoch_row(trainer: Trainer, epoch: int, sums, evaluation, times) -> dict:
    """The metrics of a finished epoch (module docstring); non-finite weights or test loss → diverged."""
    (loss_sum, correct, n), (test_loss, test_acc), (t0, t1, t2) = sums, evaluation, times
    S, sched = trainer.steps_per_epoch, trainer.scheduler
    norm_opt = trainer.norms()
    if not math.isfinite(norm_opt) or not math.isfinite(test_loss):
        raise TrainingDiverged(f"non-finite weights or test loss after epoch {epoch + 1}")
    log_lr = float(trainer.schedule_log_lr[(epoch + 1) * S - 1])
    lr_sched = _exp(log_lr)  # the schedule's lr, None beyond float64 (then only log_lr says it)
    lr_opt = (math.ldexp(lr_sched, sched.log2_rescale) if lr_sched is not None  # lr · R, R = 2^log2_rescale
              else math.exp(log_lr + sched.log2_rescale * math.log(2)))
    norm = _ldexp(norm_opt, -sched.log2_rescale // 2)  # ‖θ‖ in schedule units: log2_rescale is even, √R exact
    return {
        "epoch": epoch + 1, "step": (epoch + 1) * S, "train_loss": loss_sum / S, "train_acc": correct / n,
        "test_loss": test_loss, "test_acc": test_acc, "lr": lr_sched, "log_lr": log_lr, "lr_opt": lr_opt,
        "rescale": sched.rescale, "log2_rescale": sched.log2_rescale,
        "rescale_count": sched.rescale_count, "weight_norm": norm,
        "weight_norm_opt": norm_opt, "effective_lr": lr_opt / norm_opt**2, "seconds": time.perf_counter() - t0,
        "train_seconds": t1 - t0, "eval_seconds": t2 - t1, "images_per_s": n / (t1 - t0),
    }


def train_run(config: TrainConfig, out, arrays: CifarArrays | None = None, *, resume: bool = False,
              progress: bool = True, position: int = 0, stop_after: int | None = None) -> RunResult:
    """Train one run into the folder ``out`` (created); see the module docstring for the files.

    ``resume=True`` continues from ``out/checkpoint.pt`` if there is one (a finished run is returned as
    is) and starts fresh otherwise.  Problems with the folder raise :class:`RunError` before anything
    is written.  ``stop_after=k`` stops after epoch k (status "interrupted"; to test resuming).
    Raises :class:`TrainingDiverged` when the run diverges (:mod:`explr.cifar10.engine`) and
    ``KeyboardInterrupt`` (or :class:`Terminated`) when interrupted; both keep the checkpoint of the
    last finished epoch and record the status in the manifest.
    """
    config.validate()
    arrays = load_cifar10(config.data, config.data_root) if arrays is None else arrays
    resolved = resolved_settings(config)
    out = Path(out)
    check_run(config, out, arrays, resume, resolved)  # before anything is created
    out.mkdir(parents=True, exist_ok=True)
    with RunLock(out) as lock:
        remove_leftovers(out)
        check = check_run(config, out, arrays, resume, resolved, holding_lock=True)
        if lock.stale_pid:
            print(f"{out}: stale lock of process {lock.stale_pid} (killed?); continuing from its last checkpoint",
                  file=sys.stderr)
        if check.state == "finished":
            saved = torch.load(out / CHECKPOINT, map_location="cpu", weights_only=True)
            return RunResult(out, "finished", saved["epoch"], saved["metrics"], "already finished")
        torch.set_num_threads(resolved["threads"])
        return _train(config, out, arrays, check.state == "resume", resolved, progress, position, stop_after)


def _train(config, out: Path, arrays, resume: bool, resolved: dict, progress, position, stop_after) -> RunResult:
    from tqdm import tqdm

    ckpt_path, manifest_path = out / CHECKPOINT, out / MANIFEST
    trainer = Trainer(config, arrays)
    history, start, elapsed, previous = [], 0, 0.0, {}
    if resume:
        saved = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        trainer.load_state_dict(saved)
        history, start, elapsed = list(saved["metrics"]), int(saved["epoch"]), float(saved.get("elapsed", 0.0))
        if trainer.initial_loss is None and history:  # checkpoints written before the explosion check
            trainer.initial_loss = history[0]["train_loss"]
        if manifest_path.exists():
            previous = json.loads(manifest_path.read_text())
    manifest = _manifest(previous, config, trainer, arrays, start, elapsed)
    write_json(manifest_path, manifest)
    _write_metrics(out / METRICS, history)  # the checkpoint's history is authoritative
    S = trainer.steps_per_epoch
    bar = tqdm(total=config.epochs * S, initial=start * S, desc=f"{config.schedule} seed {config.seed}",
               disable=not progress, position=position, leave=True, dynamic_ncols=True, unit="step", file=sys.stderr)
    status, message, epoch = "finished", "", start
    try:
        for epoch in range(start, config.epochs):
            t0 = time.perf_counter()
            sums = trainer.train_epoch(epoch, _progress(bar, epoch * S, history) if progress else None)
            t1 = time.perf_counter()
            evaluation = trainer.evaluate()
            row = _epoch_row(trainer, epoch, sums, evaluation, (t0, t1, time.perf_counter()))
            elapsed += time.perf_counter() - t0
            history.append(row)
            state = {**trainer.state_dict(), "epoch": epoch + 1, "metrics": history, "config": _config_dict(config),
                     "resolved": {k: resolved[k] for k in RESOLVED_KEYS}, "data_sha256": arrays.sha256,
                     "elapsed": elapsed, "format": FORMAT}
            atomic_write(ckpt_path, lambda f: torch.save(state, f))  # first the checkpoint, then the metrics:
            _write_metrics(out / METRICS, history)  # a resume rewrites them from the checkpoint anyway
            manifest.update({"updated": _now(), "epochs_done": epoch + 1, "elapsed_seconds": elapsed})
            write_json(manifest_path, manifest)
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
        name = "SIGTERM" if isinstance(err, Terminated) else "SIGINT"
        message = (f"interrupted by {name} in epoch {epoch + 1}; the checkpoint of epoch {len(history)} is kept, "
                   "--resume continues from it")
        _finish(manifest_path, manifest, "interrupted", message, elapsed, history)
        raise
    finally:
        bar.close()
    _finish(manifest_path, manifest, status, message, elapsed, history)
    return RunResult(out, status, len(history), history, message)


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
    write_json(path, manifest)


def summary(result: RunResult) -> dict:
    """A JSON-able summary of a run: out, status, epochs_done, message and the last metrics row."""
    return {"out": str(result.out), "status": result.status, "epochs_done": result.epochs_done,
            "message": result.message, "final": result.metrics[-1] if result.metrics else None}


def summary_from_folder(folder) -> dict:
    """The summary of a run as its manifest tells it (for runs trained by other processes)."""
    folder = Path(folder)
    try:
        m = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return {"out": str(folder), "status": "not started", "epochs_done": 0, "message": "", "final": None}
    rows = read_metrics(folder) if (folder / METRICS).exists() else []
    return {"out": str(folder), "status": m.get("status"), "epochs_done": m.get("epochs_done", len(rows)),
            "message": m.get("message", ""), "final": rows[-1] if rows else None}


def check_writable(path) -> None:
    """Raise :class:`RunError` unless folders can be created at ``path`` (tried and removed: nothing is left)."""
    import tempfile

    path = Path(path).expanduser()
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise RunError(f"--out: {probe} is a file, not a folder: cannot create {path}")
    try:
        os.rmdir(tempfile.mkdtemp(dir=probe, prefix=".explr-write-test-"))
    except OSError as err:
        reason = errno.errorcode.get(err.errno, "") or str(err)
        raise RunError(f"--out: cannot create folders in {probe} ({reason}: {err.strerror}); choose another --out") from None
