"""A run's folder ``<out>/<schedule>/seed<seed>/``: atomic writes, its lock, the signals that end a run, its status,
its files (formats: docs/cifar10-engine.md, "A run folder"), :func:`check_run` and :func:`load_runs`."""
from __future__ import annotations

import contextlib
import datetime as _dt
import enum
import errno
import fcntl
import hashlib
import io
import json
import os
import platform
import re
import secrets
import signal
import stat
import subprocess
import tempfile
import time
from collections import namedtuple
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from .config import RESOLVED_KEYS, TRAJECTORY_KEYS, TrainConfig


#: which data a run trains on, without the images: its source's name, the arrays' sha256, the training images.
DataIdentity = namedtuple("DataIdentity", "source sha256 n_train")
#: the name :func:`atomic_write` gives a temporary file: ``.<target>.<pid>.<8 random characters>.tmp``
TMP_NAME = re.compile(r"\.(?P<target>.+)\.(?P<pid>[0-9]+)\.[a-z0-9_]{8}\.tmp")
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def atomic_write(path, write) -> None:
    """Call ``write(f)`` on a new binary file :data:`TMP_NAME` beside ``path``, fsync it and rename it over ``path``:
    readers see the old file or the whole new one; a killed writer leaves the ``.tmp``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:  # the mode any new file gets: 0o666 & ~umask
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_leftovers(folder, older_than_s: float = -float("inf")) -> list[str]:
    """Delete the temporary files (:data:`TMP_NAME` only) in ``folder`` untouched for over ``older_than_s``; names."""
    now, removed = time.time(), []
    for p in Path(folder).glob(".*.tmp"):
        with contextlib.suppress(OSError):
            if TMP_NAME.fullmatch(p.name) and p.is_file() and now - p.stat().st_mtime > older_than_s:
                p.unlink()
                removed.append(p.name)
    return removed


class DiskFull(Exception):
    """The disk (or the quota) filled up while writing a file; ``str()`` is the line to show."""


def write_file(path, write) -> None:
    """:func:`atomic_write`; a full disk (the error or its cause, as torch raises it) is :class:`DiskFull`."""
    try:
        atomic_write(path, write)
    except (OSError, RuntimeError) as err:
        if any(getattr(e, "errno", None) in DISK_FULL_ERRNOS for e in (err, err.__cause__, err.__context__)):
            raise DiskFull(f"disk full while writing {path}") from err
        raise


def read_run_file(path: Path, limit: int | None = None) -> bytes:
    """The bytes of ``path``; ``ValueError`` unless a regular file (opening a FIFO does not block) of ≤ ``limit``."""
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if limit is not None and st.st_size > limit:
            raise ValueError(f"larger than the {limit >> 20} MiB this engine ever writes there")
        return f.read()


class Status(str, enum.Enum):
    """A run's status: a ``str`` (its words, as the manifest records them) with an ``exit_code``."""

    RUNNING = "running", 0
    FINISHED = "finished", 0
    INTERRUPTED = "interrupted", 0
    SUBMITTED = "submitted", 0
    NOT_STARTED = "not started", 0
    DIVERGED = "diverged", 3
    LOCKED = "locked", 4
    FAILED = "failed", 5
    DISK_FULL = "disk full", 6

    def __new__(cls, words: str, exit_code: int):
        member = str.__new__(cls, words)
        member._value_ = words
        member.exit_code = exit_code
        return member

    def __str__(self) -> str:  # also what format() and f-strings show
        return self.value

    @classmethod
    def from_exit_code(cls, code: int) -> Status:
        """What exit ``code`` says: 0 FINISHED, 3 to 6 theirs, 128 + a signal's number INTERRUPTED, any other FAILED."""
        coded = {0: cls.FINISHED, **{s.exit_code: s for s in cls if s.exit_code}}
        return coded.get(code) or (cls.INTERRUPTED if code - 128 in signal.valid_signals() else cls.FAILED)


class RunState(enum.Enum):
    """What :func:`~explr.cifar10.runfolder.check_run` found in a run folder (not how a run ended)."""

    NEW = "new"
    RESUME = "resume"
    FINISHED = "finished"


LOCK = ".lock"


class RunError(ValueError):
    """A run folder cannot be used as asked (exists, corrupt, other settings or data); one line, says what to do."""


class RunLocked(RunError):
    """Another process holds the run folder's :class:`RunLock`."""


def _read_pid(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0))
    return None


def lock_holder(folder) -> tuple[int | None, bool]:
    """(pid written in ``folder/.lock``, whether a live process holds the lock); a link or folder is no lock."""
    path = Path(folder) / LOCK
    if path.is_symlink() or not path.is_file():
        return None, False
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released by the close
        return _read_pid(fd), False
    except BlockingIOError:
        return _read_pid(fd), True
    finally:
        os.close(fd)


def not_a_lock(path: Path) -> RunError:
    """The error for a ``.lock`` at ``path`` that is a symbolic link or a folder: never followed, written or deleted."""
    return RunError(f"{path} is a symbolic link or a folder, not the ordinary file a run's lock is; delete it")


def locked_message(folder: Path, pid: int | None) -> str:
    """The line for a run ``folder`` whose lock process ``pid`` holds."""
    return (f"{folder} is being trained by {f'process {pid}' if pid else 'another process'}, which holds "
            f"{folder / LOCK}; wait for it to finish or stop it, then use --resume")


class RunLock:
    """An exclusive ``fcntl.flock`` (the kernel releases it however its process dies) on ``folder/.lock``, created with
    the folder and never deleted; it holds the pid (one left unlocked: a stale lock, see :func:`check_folder`)."""

    def __init__(self, folder):
        self.path = Path(folder) / LOCK

    def __enter__(self) -> RunLock:
        fd = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
            for _ in range(20):  # a concurrent lock_holder holds a shared lock for microseconds
                with contextlib.suppress(BlockingIOError):
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                time.sleep(0.05)
            else:
                raise RunLocked(locked_message(self.path.parent, _read_pid(fd)))
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException as err:
            if fd is not None:
                os.close(fd)
            if isinstance(err, OSError) and err.errno in (errno.ELOOP, errno.EISDIR):
                raise not_a_lock(self.path) from None
            if isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS:
                raise DiskFull(f"disk full while writing {self.path}") from None
            raise
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        os.ftruncate(self.fd, 0)  # an empty lock file: released cleanly, not stale
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


#: the signals that end a run: ^C, SIGTERM, a closed terminal (SIGHUP), SLURM's preemption warning (SIGUSR2)
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2)


class Terminated(KeyboardInterrupt):
    """A signal of :data:`STOPPING` arrived (raised by :func:`handle_signals`); ``signum`` says which."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def handle_signals():
    """Each signal of :data:`STOPPING` raises :class:`Terminated` once (later ones are ignored); main thread only."""
    fired = []

    def handler(signum, frame):
        if not fired:
            fired.append(signum)
            raise Terminated(signum)

    old = {s: signal.signal(s, handler) for s in STOPPING}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def exit_code(err: KeyboardInterrupt | DiskFull) -> int:
    """The exit code of a process ``err`` ended: 6 for a full disk, else 128 + the signal's number (SIGINT: 130)."""
    return Status.DISK_FULL.exit_code if isinstance(err, DiskFull) else 128 + getattr(err, "signum", signal.SIGINT)


def signal_name(interrupt: KeyboardInterrupt) -> str:
    """The signal that raised ``interrupt`` (a plain ``KeyboardInterrupt``: SIGINT), such as "SIGTERM"."""
    return signal.Signals(exit_code(interrupt) - 128).name


#: the files of a run folder
CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
MANIFEST = "manifest.json"
#: the largest metrics.jsonl (more than 100000 epochs' rows, ~60 MiB) and manifest.json (a few KiB) read
MAX_METRICS_BYTES = 1 << 28
MAX_MANIFEST_BYTES = 1 << 24
#: the format of the run files (the checkpoint's and the manifest's ``format``)
FORMAT = "explr.cifar10/1"
_REMEDY = f"delete the file and rerun with --resume: it is rewritten from {CHECKPOINT}"

#: a metrics.jsonl row's last keys, after :meth:`~explr.cifar10.runs.Trainer.epoch_metrics`'s: an epoch's wall-clock
#: seconds (all, training, evaluation) and its images per second, the only values not reproducible bit for bit
TIMING_KEYS = ("seconds", "train_seconds", "eval_seconds", "images_per_s")
#: the manifest's ``final``: the last row's epoch and the numbers a resume shows
FINAL_KEYS = ("epoch", "train_loss", "train_acc", "test_loss", "test_acc")
#: the keys every checkpoint of this engine holds (older ones lack initial_loss, resolved, elapsed and format)
CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "epoch", "metrics", "config", "data_sha256")


def write_metrics(path, rows) -> None:
    """Write ``rows`` as ``path`` (one JSON object a line), atomically."""
    write_file(path, lambda f: f.write("".join(json.dumps(r) + "\n" for r in rows).encode()))


def read_metrics(path, *, drop_partial_last: bool = False) -> list[dict]:
    """The rows of metrics.jsonl (``path``: it or its folder); a line that is no JSON object (``drop_partial_last``: but
    the last, dropped) or a file that :func:`~explr.cifar10.runfolder.read_run_file` refuses is a :class:`RunError`."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS
    try:
        lines = read_run_file(path, MAX_METRICS_BYTES).decode().splitlines()
    except (ValueError, OSError) as err:
        raise RunError(f"{path} is unreadable ({err}); {_REMEDY}") from None
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif not (drop_partial_last and number == len(lines)):
            raise RunError(f"{path} line {number} is not a JSON object (truncated or hand-edited?); {_REMEDY}")
    return rows


def checkpoint_state(trainer_state: dict, epoch: int, metrics: list, config: dict, resolved: dict, data_sha256: str,
                     elapsed: float) -> dict:
    """The checkpoint after ``epoch`` epochs (``config`` as recorded; of ``resolved``, :data:`RESOLVED_KEYS`)."""
    resolved = {k: resolved[k] for k in RESOLVED_KEYS}
    return {**trainer_state, "epoch": epoch, "metrics": metrics, "config": config, "resolved": resolved,
            "data_sha256": data_sha256, "elapsed": elapsed, "format": FORMAT}


def serialize_checkpoint(state: dict) -> tuple[bytes, str]:
    """The bytes ``torch.save`` makes of ``state``, and their sha256 (recorded in the manifest)."""
    torch.save(state, buffer := io.BytesIO())
    return buffer.getvalue(), hashlib.sha256(buffer.getvalue()).hexdigest()


def checkpoint_of(folder, manifest: dict) -> dict:
    """``folder/checkpoint.pt`` if readable, this engine's and the file ``manifest`` recorded; else a RunError."""
    path = Path(folder) / CHECKPOINT
    again = f"delete the folder {path.parent} to train this run again from the start"
    try:
        data = read_run_file(path)
        saved = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, empty, not a torch file, or a pickle with foreign objects
        reason = f"{type(err).__name__}: {' '.join(str(err).split())}"[:160]
        raise RunError(f"{path} is not a readable checkpoint ({reason}); {again}") from None
    if not isinstance(saved, dict) or any(k not in saved for k in CHECKPOINT_KEYS):
        raise RunError(f"{path} is not a checkpoint of this engine (expected the keys {', '.join(CHECKPOINT_KEYS)}); "
                       + again)
    recorded = {manifest.get("checkpoint_sha256"), manifest.get("checkpoint_sha256_writing")} - {None}
    if recorded and hashlib.sha256(data).hexdigest() not in recorded:
        raise RunError(f"{path} is not the file {path.parent / MANIFEST} recorded (its sha256 differs: damaged or "
                       f"changed since it was written); restore it from a backup, or {again}")
    return saved


def git_commit() -> dict:
    """The source's git commit and if this package changed; a copy without ``.git`` names it in EXPLR_GIT_COMMIT."""
    if os.environ.get("EXPLR_GIT_COMMIT"):
        return {"commit": os.environ["EXPLR_GIT_COMMIT"], "dirty": None, "from": "EXPLR_GIT_COMMIT"}
    git = {"cwd": Path(__file__).resolve().parent, "capture_output": True, "text": True, "timeout": 10, "check": True}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], **git).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "."], **git).stdout
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(dirty.strip())}


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def new_manifest(previous: dict, config: dict, resolved: dict, device: torch.device, data: dict, epochs_done: int,
                 elapsed: float) -> dict:
    """The manifest of a run starting (or resuming, ``previous`` its manifest) at ``epochs_done``, status running."""
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else (
        f"{device.type} ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)")
    return {**previous, "format": FORMAT, "status": Status.RUNNING, "message": "", "config": config,
            "resolved": resolved, "devices": list(dict.fromkeys([*previous.get("devices", []), device_name])),
            "data": data, "environment": {
                "torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version(),
                "platform": platform.platform(), "git": git_commit(),
                "cuda": torch.version.cuda if device.type == "cuda" else None},
            "started": previous.get("started", _now()), "updated": _now(), "epochs_done": epochs_done,
            "elapsed_seconds": elapsed}


def write_manifest(path, manifest: dict, **changes) -> None:
    """Update ``manifest`` with ``changes`` and the time, and write it as indented JSON at ``path``, atomically."""
    manifest.update(changes, updated=_now())
    write_file(path, lambda f: f.write((json.dumps(manifest, indent=2) + "\n").encode()))


def record_end(path, manifest: dict, status: Status, message: str, elapsed: float, history: list) -> None:
    """Record in ``manifest`` (and write at ``path``) how the run ended, and its last row's :data:`FINAL_KEYS`."""
    final = {"final": {k: history[-1][k] for k in FINAL_KEYS}} if history else {}
    write_manifest(path, manifest, status=status, message=message, elapsed_seconds=elapsed,
                   epochs_done=len(history), **final)


def read_manifest(path) -> dict:
    """The JSON object at ``path`` (a regular file of ≤ :data:`MAX_MANIFEST_BYTES`), else a :class:`RunError`."""
    remedy = f"delete it: --resume rebuilds it (from {CHECKPOINT}, if any)"
    try:
        manifest = json.loads(read_run_file(Path(path), MAX_MANIFEST_BYTES))
    except (ValueError, OSError, RecursionError) as err:
        raise RunError(f"{path} is unreadable ({err}); {remedy}") from None
    if not isinstance(manifest, dict):
        raise RunError(f"{path} is not a JSON object (it holds a {type(manifest).__name__}); {remedy}")
    return manifest


def run_dir(out, schedule: str, seed: int) -> Path:
    """Where a run lives: ``<out>/<schedule>/seed<seed>``."""
    return Path(out) / schedule / f"seed{seed}"


def load_runs(out) -> list[dict]:
    """Every run under ``out``: dicts of ``schedule, seed, dir, manifest, metrics`` (key → np.array); "running" with
    no process holding the lock is reported "interrupted" (killed), its partial last metrics line dropped."""
    runs = []
    for manifest_path in sorted(Path(out).glob(f"*/seed*/{MANIFEST}")):
        manifest = read_manifest(manifest_path)
        if manifest.get("status") == Status.RUNNING and not lock_holder(manifest_path.parent)[1]:
            manifest.update(status=Status.INTERRUPTED.value, message="its process died without recording it (killed?); "
                            "--resume continues from the last checkpoint")
        metrics_path = manifest_path.parent / METRICS
        rows = (read_metrics(metrics_path, drop_partial_last=manifest.get("status") != Status.FINISHED)
                if metrics_path.exists() else [])
        metrics = {k: np.array([r[k] for r in rows]) for k in (rows[0] if rows else {})}
        cfg = manifest["config"]
        runs.append({"schedule": cfg["schedule"], "seed": cfg["seed"], "dir": manifest_path.parent,
                     "manifest": manifest, "metrics": metrics})
    return runs


#: what :func:`check_run` found: its :class:`RunState`, the epochs done and a ``note`` to show
RunCheck = namedtuple("RunCheck", "state epochs_done note", defaults=(0, ""))


def config_record(config: TrainConfig) -> dict:
    """The config as recorded: resolved milestones, no path of this machine (the manifest's ``data`` names the data)."""
    data = config.data if config.data in ("auto", "synthetic") else Path(config.data).name
    return {**asdict(config), "decay_epochs": config.milestones(), "data": data, "data_root": None}


def _resolved_mismatch(saved: dict, now: dict) -> list[str]:
    """The resolved settings that differ: device type, precision, threads on a CPU (not ``auto`` nor ``None``)."""
    def kind(resolved):
        return resolved.get("device") not in (None, "auto") and torch.device(resolved["device"]).type

    differ = {"device": kind(saved) != kind(now), "precision": saved.get("precision") != now["precision"],
              "threads": kind(now) == "cpu" and saved.get("threads") != now["threads"]}
    return [f"{k}={saved[k]!r} (now {now[k]!r}; pass --{k} {saved[k]})" for k, differs in differ.items()
            if differs and saved.get(k) and now[k] not in (None, "auto")]


def _nearest_folder(path: Path, what: str) -> Path:
    """``path`` or its nearest existing parent, which must be a folder (and looked up: ENAMETOOLONG), else RunError."""
    try:
        p = next(p for p in (path, *path.parents) if p.exists())
    except OSError as err:
        raise RunError(f"--out: cannot use {path} ({err.strerror}); choose another --out") from None
    if not p.is_dir():
        raise RunError(f"--out: {p} is a file, not a folder: cannot create {what}")
    return p


def check_writable(path) -> None:
    """Raise :class:`RunError` unless folders can be created at ``path`` (tried and removed: nothing is left)."""
    probe = _nearest_folder(Path(path).expanduser(), str(path))
    try:
        os.rmdir(tempfile.mkdtemp(dir=probe, prefix=".explr-write-test-"))
    except OSError as err:
        raise RunError(f"--out: cannot create folders in {probe} ({err.strerror}); choose another --out") from None


def check_folder(folder, resume: bool, holding_lock: bool = False) -> tuple[str, dict] | None:
    """:func:`check_run`'s checks that need no data; ``None`` without a folder, else (a stale lock's note, manifest)."""
    folder = Path(folder)
    _nearest_folder(folder, f"the run folder {folder}")
    if folder.is_symlink():
        raise RunError(f"{folder} is a symbolic link, not a folder of its own: remove it or choose another --out")
    if not folder.is_dir():
        return None
    lock = folder / LOCK
    if lock.is_symlink() or lock.exists() and not lock.is_file():
        raise not_a_lock(lock)
    pid, held = lock_holder(folder) if not holding_lock else (None, False)
    if held:
        raise RunLocked(locked_message(folder, pid))
    note = (f"{folder}: stale lock: {lock} names process {pid}, which does not hold it (its run was killed?); its "
            "last checkpoint is kept") if pid else ""
    if not resume and ((folder / CHECKPOINT).exists() or (folder / METRICS).exists()):
        raise RunError(f"{folder} already holds a run; pass --resume to continue it or choose another --out")
    return note, read_manifest(folder / MANIFEST) if (folder / MANIFEST).exists() else {}


def check_run(config: TrainConfig, folder, data: DataIdentity, resume: bool, resolved: dict, *,
              holding_lock: bool = False) -> RunCheck:
    """Can ``config`` train on ``data`` into ``folder``: a resume with the same trajectory settings (one a checkpoint
    lacks counts as its default), resolved settings and data?  :class:`RunError` if not; writes nothing."""
    folder = Path(folder)
    note, manifest = check_folder(folder, resume, holding_lock) or ("", {})
    if not (folder / CHECKPOINT).exists():
        return RunCheck(RunState.NEW, note=note)
    saved = checkpoint_of(folder, manifest)
    old = {k: saved["config"].get(k, getattr(TrainConfig, k)) for k in TRAJECTORY_KEYS}
    now = config_record(config)
    diff = [f"{k}={old[k]!r} (now {now[k]!r})" for k in TRAJECTORY_KEYS if old[k] != now[k]]
    diff += _resolved_mismatch(saved.get("resolved") or manifest.get("resolved", {}), resolved)
    if diff:
        raise RunError(f"--resume: the run in {folder} was made with other settings: {', '.join(diff)}")
    if saved["data_sha256"] != data.sha256:
        raise RunError(f"--resume: the run in {folder} was trained on other data (sha256 {saved['data_sha256'][:12]}…, "
                       f"now {data.sha256[:12]}… from {data.source}); pass the same --data or another --out")
    done = saved["epoch"]
    if done >= config.epochs and (folder / METRICS).exists():  # a line that does not parse is refused
        read_metrics(folder / METRICS)
    return RunCheck(RunState.FINISHED if done >= config.epochs else RunState.RESUME, done, note)
