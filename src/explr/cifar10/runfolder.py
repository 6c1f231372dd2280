"""One run's folder on disk: its files, how they are read and written (a full disk is :class:`DiskFull`), and every
check made before the folder is used.  :mod:`explr.cifar10.lock` holds its lock, the signals and the errors;
:mod:`explr.cifar10.runs` trains into it.

A run lives in ``<out>/<schedule>/seed<seed>/``::

    manifest.json    full config, resolved device/precision/threads, data source (name,
                     kind, sha256), git commit, torch version, status (one of
                     :data:`~explr.cifar10.status.RECORDED`) and ``checkpoint_sha256``, the
                     sha256 of checkpoint.pt as last written (the digest of the one being
                     written, ``checkpoint_sha256_writing``, is recorded before it is written)
    metrics.jsonl    one JSON object per finished epoch; rewritten atomically
    checkpoint.pt    model, optimizer, scheduler and the metrics so far, after every epoch
                     (atomic)
    .lock            held (``fcntl.flock``) by the process training the run; holds its pid

Checks.  :func:`check_run` inspects a run folder without writing anything and raises :class:`RunError`
(one line, saying what to do) for: a path to it through a file, or too long to look up; a run folder that is a
symbolic link (its files, and the temporary files removed at the start, would be those of the folder it points
to); a ``.lock`` that is a link or not a file; a folder held by a live process (:class:`RunLocked`); a run that
exists without ``resume``; a manifest that is not a readable JSON object, or whose fields that the engine reads
(:data:`MANIFEST_FIELDS`) are not of the types it writes, or whose status is none it writes; a checkpoint that is unreadable, not this engine's,
or not the file the manifest recorded (sha256: torch's zip reader does not notice a flipped byte of tensor
data); a resume with other trajectory-defining settings (a setting the saved config lacks counts as its default), other *resolved*
device type, precision or CPU threads, or other data (sha256, also for finished runs); a checkpoint whose
epoch or tensors do not fit the run; a finished run whose metrics.jsonl does not parse.  The run files are
read only if they are regular files (a FIFO would block, ``/dev/zero`` never ends), and the manifest and metrics
only up to a size no run of this engine reaches (:data:`MAX_MANIFEST_BYTES`, :data:`MAX_METRICS_BYTES`); JSON
nested too deeply for Python's parser is a line naming the file, not a ``RecursionError``.

Writes (:func:`write_file`) are atomic; a full disk (``ENOSPC`` or ``EDQUOT`` anywhere in the error's
chain, as torch's zip writer hides it) is raised as :class:`DiskFull`, also when taking the lock
(:class:`~explr.cifar10.lock.RunLock`), which then leaves nothing behind.
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import stat
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch

from ..models import PreResNet
from ..params import is_int
from . import files
from .arrays import CifarArrays
from .config import TRAJECTORY_KEYS, TrainConfig
from .engine import check_checkpoint, check_metrics_file, check_progress
from .lock import LOCK, DiskFull, RunError, RunLocked, _disk_full, _locked_message, lock_holder, lock_is_a_link
from .status import RECORDED, RunState, Status

__all__ = [
    "FORMAT",
    "CHECKPOINT",
    "METRICS",
    "MANIFEST",
    "RunCheck",
    "check_folder",
    "check_run",
    "check_writable",
    "config_record",
    "load_checkpoint",
    "load_runs",
    "read_manifest",
    "read_metrics",
    "run_dir",
    "serialize_checkpoint",
    "write_file",
]

FORMAT = "explr.cifar10/1"
CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
MANIFEST = "manifest.json"
CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "epoch", "metrics", "config", "data_sha256")
_DEFAULTS = {f.name: f.default for f in fields(TrainConfig)}
#: larger than any manifest this engine writes (a few KiB) and than the metrics of 100000 epochs (~60 MiB).
MAX_MANIFEST_BYTES, MAX_METRICS_BYTES = 1 << 24, 1 << 28
#: the manifest's fields that the engine reads: the JSON types it writes them with, and their description (a status
#: must moreover be one it writes, :data:`~explr.cifar10.status.RECORDED`).
MANIFEST_FIELDS = {
    "status": ((str,), "a string"), "message": ((str,), "a string"), "config": ((dict,), "an object"),
    "resolved": ((dict,), "an object"), "devices": ((list,), "a list of strings"),
    "epochs_done": ((int,), "an integer"),
    "checkpoint_sha256": ((str, type(None)), "a string or null"), "started": ((str,), "a string"),
    "checkpoint_sha256_writing": ((str, type(None)), "a string or null"),
}
_JSON_TYPES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list",
               dict: "an object", type(None): "null"}
_METRICS_REMEDY = f"delete the file and rerun with --resume: it is rewritten from {CHECKPOINT}"


# ----------------------------------------------------------------------------- reading runs
def run_dir(out, schedule: str, seed: int) -> Path:
    """Where a run lives: ``<out>/<schedule>/seed<seed>``."""
    return Path(out) / schedule / f"seed{seed}"


def _read_run_file(path: Path, limit: int | None = None) -> bytes:
    """The bytes of the run file ``path``; ``ValueError`` unless it is a regular file (checked on the open file,
    which a FIFO does not block) of at most ``limit`` bytes."""
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            kinds = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
                     stat.S_IFDIR: "a folder", stat.S_IFSOCK: "a socket"}
            raise ValueError(f"not a regular file but {kinds.get(stat.S_IFMT(st.st_mode), 'a special file')}")
        if limit is not None and st.st_size > limit:
            raise ValueError(f"larger than the {limit >> 20} MiB this engine ever writes there")
        return f.read()


def _manifest_field_error(manifest: dict) -> str | None:
    """What is wrong with the first field of :data:`MANIFEST_FIELDS` that ``manifest`` holds with another type."""
    for key, (types, expected) in MANIFEST_FIELDS.items():
        if key not in manifest:
            continue
        value = manifest[key]
        if type(value) not in types:
            return f"{key} is {_JSON_TYPES[type(value)]}, expected {expected}"
        wrong = [_JSON_TYPES[type(d)] for d in value if type(d) is not str] if key == "devices" else []
        if wrong:
            return f"{key} holds {wrong[0]}, expected {expected}"
        if key == "status" and value not in RECORDED:
            return f"status is {value!r}, not one of {', '.join(RECORDED)}"
    return None


def read_manifest(path) -> dict:
    """The manifest at ``path`` (a JSON object whose fields the engine reads have its types, a regular file of at most
    :data:`MAX_MANIFEST_BYTES`); :class:`RunError` naming the file and what to delete otherwise."""
    path = Path(path)
    remedy = (f"delete it (--resume rebuilds it from {CHECKPOINT})" if (path.parent / CHECKPOINT).exists()
              else f"delete the folder {path.parent}")
    try:
        manifest = json.loads(_read_run_file(path, MAX_MANIFEST_BYTES))
    except RecursionError:
        raise RunError(f"{path} is unreadable (nested too deeply to parse; hand-edited?); {remedy}") from None
    except (ValueError, OSError) as err:
        raise RunError(f"{path} is unreadable ({err}); {remedy}") from None
    if not isinstance(manifest, dict):
        raise RunError(f"{path} is not a JSON object (it holds a {type(manifest).__name__}; hand-edited?); {remedy}")
    wrong = _manifest_field_error(manifest)
    if wrong:
        raise RunError(f"{path}: {wrong} (hand-edited?); {remedy}")
    return manifest


def read_metrics(path, *, drop_partial_last: bool = False) -> list[dict]:
    """The per-epoch rows of a run (``path``: its directory or its metrics.jsonl).

    A line that is not a JSON object is a :class:`RunError` naming the file and the line, and so is a file that
    is not a regular UTF-8 file of at most :data:`MAX_METRICS_BYTES`; a missing file is ``FileNotFoundError``.
    ``drop_partial_last``: an unparsable last line is dropped instead (the partial write of a killed epoch).
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS
    try:
        lines = _read_run_file(path, MAX_METRICS_BYTES).decode().splitlines()
    except FileNotFoundError:
        raise
    except (ValueError, OSError) as err:
        raise RunError(f"{path} is unreadable ({err}); {_METRICS_REMEDY}") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            if drop_partial_last and number == len(lines):
                break
            row = None
        if not isinstance(row, dict):
            raise RunError(f"{path} line {number} is not a JSON object (truncated or hand-edited?); {_METRICS_REMEDY}")
        rows.append(row)
    return rows


def load_runs(out) -> list[dict]:
    """Every run under ``out``: dicts with ``schedule, seed, dir, manifest`` and ``metrics`` (key → np.array).

    A manifest that says "running" while no process holds the run's lock belongs to a process that was
    killed (SIGKILL, a crash, a lost node): it is reported as "interrupted", and a partial last line of
    its metrics is dropped.  A manifest or metrics line that does not parse is a :class:`RunError`.
    """
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
        cfg = manifest.get("config")
        if not isinstance(cfg, dict) or type(cfg.get("schedule")) is not str or not is_int(cfg.get("seed")):
            raise RunError(f"{manifest_path} has no config with schedule and seed (hand-edited?); delete the folder "
                           f"{manifest_path.parent}")
        runs.append({"schedule": cfg["schedule"], "seed": cfg["seed"], "dir": manifest_path.parent,
                     "manifest": manifest, "metrics": metrics})
    return runs


# ----------------------------------------------------------------------------- writing
def write_file(path, write) -> None:
    """:func:`explr.cifar10.files.atomic_write`; a full disk is raised as :class:`DiskFull` naming ``path``."""
    try:
        files.atomic_write(path, write)
    except (OSError, RuntimeError) as err:
        if _disk_full(err):
            raise DiskFull(path) from err
        raise


def serialize_checkpoint(state: dict) -> tuple[bytes, str]:
    """The bytes ``torch.save`` makes of ``state``, and their sha256 (recorded in the manifest)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- checking a run folder
@dataclass
class RunCheck:
    """What :func:`check_run` found: its :class:`~explr.cifar10.status.RunState`; ``note`` a line to show."""

    state: RunState
    epochs_done: int = 0
    note: str = ""


def config_record(config: TrainConfig) -> dict:
    """The config as recorded: resolved milestones, and no path of this machine (the data is identified by
    name, kind and sha256 in the manifest's ``data``)."""
    d = asdict(config)
    d["decay_epochs"] = config.milestones()
    if d["data"] not in ("auto", "synthetic"):
        d["data"] = Path(d["data"]).name
    d["data_root"] = None
    return d


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


def _settings_mismatch(saved: dict, config: TrainConfig) -> list[str]:
    """The trajectory settings that differ; one the saved config lacks (added later) counts as its default."""
    now = config_record(config)
    return [f"{k}={saved.get(k, _DEFAULTS[k])!r} (now {now[k]!r})" for k in TRAJECTORY_KEYS
            if saved.get(k, _DEFAULTS[k]) != now[k]]


def load_checkpoint(folder, manifest: dict) -> dict:
    """``folder/checkpoint.pt``, checked: readable, this engine's keys, and the file ``manifest`` recorded
    (its sha256, when the manifest holds one).  :class:`RunError` saying what to do otherwise."""
    folder = Path(folder)
    path = folder / CHECKPOINT
    try:
        data = _read_run_file(path)
        saved = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, empty, not a torch file, or a pickle with foreign objects
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'empty'}"
        raise RunError(f"{path} is not a readable checkpoint ({reason[:160]}); delete the folder {folder} to train "
                       "this run again from the start") from None
    if (not isinstance(saved, dict) or any(k not in saved for k in CHECKPOINT_KEYS)
            or not isinstance(saved["config"], dict) or not isinstance(saved["metrics"], list)):
        raise RunError(f"{path} is not a checkpoint of this engine (expected the keys {', '.join(CHECKPOINT_KEYS)}); "
                       f"delete the folder {folder} to train this run again from the start")
    recorded = {manifest.get("checkpoint_sha256"), manifest.get("checkpoint_sha256_writing")} - {None}
    if recorded and hashlib.sha256(data).hexdigest() not in recorded:
        raise RunError(f"{path} is not the file {folder / MANIFEST} recorded (its sha256 differs: damaged or changed "
                       f"since it was written); restore it from a backup, or delete it to train this run again from "
                       "the start")
    return saved


def _check_epoch(saved: dict, config: TrainConfig, path: Path) -> None:
    """The checkpoint's epoch is an integer in [1, epochs] with one metrics row per epoch."""
    epoch, rows = saved["epoch"], len(saved["metrics"])
    if not (is_int(epoch) and 1 <= epoch <= config.epochs and rows == epoch):
        raise RunError(f"{path} records epoch {epoch!r} with {rows} metrics rows, not an epoch in [1, "
                       f"{config.epochs}] with one row each (hand-edited?); restore it, or delete the folder "
                       f"{path.parent} to train this run again from the start")


def _check_states(saved: dict, config: TrainConfig, path: Path) -> None:
    """The model and optimizer states load into this run's network (built on the meta device, then given the
    saved tensors themselves: nothing is allocated or copied)."""
    try:
        with torch.device("meta"):
            model = PreResNet(config.depth, invariant=config.invariant, eps=config.bn_eps)
        model.load_state_dict(saved["model"], assign=True)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(params, lr=1.0, momentum=config.momentum)
        optimizer.load_state_dict(saved["optimizer"])
        for p in params:
            buf = optimizer.state.get(p, {}).get("momentum_buffer")
            if buf is not None and buf.shape != p.shape:
                raise ValueError(f"a momentum buffer of shape {tuple(buf.shape)} for a weight of shape {tuple(p.shape)}")
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as err:
        reason = " ".join(str(err).split())[:160]
        raise RunError(f"{path} does not fit this run's PreResNet{config.depth} ({reason}); restore it, or delete "
                       f"the folder {path.parent} to train this run again from the start") from None


def _first_existing(path: Path) -> Path:
    """``path`` or its nearest parent that exists; :class:`RunError` naming ``--out`` when the path cannot even be
    looked up (``ENAMETOOLONG``: a folder name or the whole path longer than the file system allows)."""
    try:
        return next(p for p in (path, *path.parents) if p.exists())
    except OSError as err:
        raise RunError(f"--out: cannot use {path} ({err.strerror}); choose another --out") from None


def _nearest_folder(path: Path, what: str) -> Path:
    """The first existing path of ``path`` (itself or a parent), which must be a folder, not a file: :class:`RunError`
    naming ``--out`` and ``what`` cannot be created otherwise."""
    p = _first_existing(path)
    if not p.is_dir():
        raise RunError(f"--out: {p} is a file, not a folder: cannot create {what}")
    return p


def check_folder(folder, resume: bool, holding_lock: bool = False) -> tuple[str, dict] | None:
    """The checks of :func:`check_run` that need neither the data nor the checkpoint (made before the data is
    loaded): the path to ``folder``, the folder itself and its lock, an existing run without ``resume``, its manifest.
    Returns ``None`` where no folder exists yet, else ``(note, manifest)``: a stale lock's note and the manifest
    (``{}`` if none); raises :class:`RunError` (module docstring); writes nothing."""
    folder = Path(folder)
    _nearest_folder(folder, f"the run folder {folder}")
    if folder.is_symlink():
        raise RunError(f"{folder} is a symbolic link; a run folder must be a folder of its own (the run would write, "
                       "and remove temporary files, in the folder it points to): remove the link or choose another "
                       "--out")
    if not folder.is_dir():
        return None
    if (folder / LOCK).is_symlink():
        raise lock_is_a_link(folder / LOCK)
    if (folder / LOCK).exists() and not (folder / LOCK).is_file():
        raise RunError(f"{folder / LOCK} is not a file (the run's lock is an ordinary file); delete it")
    pid, held = lock_holder(folder) if not holding_lock else (None, False)
    if held:
        raise RunLocked(_locked_message(folder, pid))
    note = (f"{folder}: stale lock: {folder / LOCK} names process {pid}, which does not hold it (its run was "
            "killed?); its last checkpoint is kept") if pid and not held else ""
    if not resume and ((folder / CHECKPOINT).exists() or (folder / METRICS).exists()):
        raise RunError(f"{folder} already holds a run; pass --resume to continue it or choose another --out"
                       + (f" ({note})" if note else ""))
    return note, read_manifest(folder / MANIFEST) if (folder / MANIFEST).exists() else {}


def check_run(config: TrainConfig, folder, arrays: CifarArrays, resume: bool, resolved: dict,
              holding_lock: bool = False) -> RunCheck:
    """Can ``config`` train into ``folder``?  Raises :class:`RunError` (module docstring); writes nothing.

    ``holding_lock``: the caller holds the folder's :class:`~explr.cifar10.lock.RunLock` (skip the lock check)."""
    folder = Path(folder)
    place = check_folder(folder, resume, holding_lock)
    if place is None:
        return RunCheck(RunState.NEW)
    note, saved_manifest = place
    ckpt, metrics = folder / CHECKPOINT, folder / METRICS
    if not ckpt.exists():
        return RunCheck(RunState.NEW, note=note)
    saved = load_checkpoint(folder, saved_manifest)
    check_checkpoint(saved, ckpt)
    diff = _settings_mismatch(saved["config"], config)
    diff += _resolved_mismatch(saved.get("resolved") or saved_manifest.get("resolved", {}), resolved)
    if diff:
        raise RunError(f"--resume: the run in {folder} was made with other settings: {', '.join(diff)}")
    if saved["data_sha256"] != arrays.sha256:
        raise RunError(f"--resume: the run in {folder} was trained on other data (sha256 {saved['data_sha256'][:12]}…, "
                       f"now {arrays.sha256[:12]}… from {arrays.source}); pass the same --data or another --out")
    _check_epoch(saved, config, ckpt)
    _check_states(saved, config, ckpt)
    check_progress(saved, config, len(arrays.y_train) // config.batch_size, resolved["precision"], ckpt)
    done = saved["epoch"]
    if done >= config.epochs and metrics.exists():  # a finished run's metrics (an unfinished run's are rewritten)
        check_metrics_file(read_metrics(metrics), saved, metrics, ckpt)
    return RunCheck(RunState.FINISHED if done >= config.epochs else RunState.RESUME, done, note)


def check_writable(path) -> None:
    """Raise :class:`RunError` unless folders can be created at ``path`` (tried and removed: nothing is left)."""
    import tempfile

    path = Path(path).expanduser()
    probe = _nearest_folder(path, str(path))
    try:
        os.rmdir(tempfile.mkdtemp(dir=probe, prefix=".explr-write-test-"))
    except OSError as err:
        reason = errno.errorcode.get(err.errno, "") or str(err)
        raise RunError(f"--out: cannot create folders in {probe} ({reason}: {err.strerror}); choose another --out") from None
