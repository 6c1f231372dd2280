"""One run's folder on disk: where it lives (:func:`run_dir`), the runs under a folder (:func:`load_runs`), and every
check made before the folder is used.  Each of its files has its module: :mod:`~explr.cifar10.manifest`,
:mod:`~explr.cifar10.metrics`, :mod:`~explr.cifar10.checkpoint`; :mod:`explr.cifar10.lock` holds its lock, the
signals and the errors, :mod:`explr.cifar10.files` the guarded reads and atomic writes of its files;
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
(:data:`~explr.cifar10.manifest.MANIFEST_FIELDS`) are not of the types it writes, or whose status is none it
writes; a checkpoint that is unreadable, not this engine's, or not the file the manifest recorded; a resume with
other trajectory-defining settings (a setting the saved config lacks counts as its default), other *resolved*
device type, precision or CPU threads, or other data (sha256, also for finished runs); a checkpoint whose
epoch or tensors do not fit the run; a finished run whose metrics.jsonl does not parse.  The run files are
read only if they are regular files (a FIFO would block, ``/dev/zero`` never ends), and the manifest and metrics
only up to a size no run of this engine reaches; JSON nested too deeply for Python's parser is a line naming the
file, not a ``RecursionError``.
"""
from __future__ import annotations

import errno
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch

from ..params import is_int
from .arrays import DataIdentity
from .checkpoint import CHECKPOINT, check_checkpoint, check_epoch, check_progress, check_states
from .config import TRAJECTORY_KEYS, TrainConfig
from .lock import LOCK, RunError, RunLocked, _locked_message, lock_holder, lock_is_a_link
from .manifest import MANIFEST, checkpoint_of, read_manifest
from .metrics import METRICS, check_metrics_file, check_rows, read_metrics
from .status import RunState, Status

__all__ = ["RunCheck", "check_folder", "check_run", "check_writable", "config_record", "load_runs", "run_dir"]

_DEFAULTS = {f.name: f.default for f in fields(TrainConfig)}


# ----------------------------------------------------------------------------- reading runs
def run_dir(out, schedule: str, seed: int) -> Path:
    """Where a run lives: ``<out>/<schedule>/seed<seed>``."""
    return Path(out) / schedule / f"seed{seed}"


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
    """The resolved settings that differ; one still unresolved (``auto``, ``None``: resolved by the node that trains
    the run, which checks it again) is not compared."""
    diff, device = [], now["device"]
    if saved.get("device") and device != "auto" and torch.device(saved["device"]).type != torch.device(device).type:
        diff.append(f"device={saved['device']!r} (now {device!r})")
    if saved.get("precision") and now["precision"] != "auto" and saved["precision"] != now["precision"]:
        diff.append(f"precision={saved['precision']!r} (now {now['precision']!r})")
    on_cpu = device != "auto" and torch.device(device).type == "cpu"
    if on_cpu and now["threads"] is not None and saved.get("threads") and saved["threads"] != now["threads"]:
        diff.append(f"threads={saved['threads']!r} (now {now['threads']!r}; CPU results depend on it: pass "
                    f"--threads {saved['threads']})")
    return diff


def _settings_mismatch(saved: dict, config: TrainConfig) -> list[str]:
    """The trajectory settings that differ; one the saved config lacks (added later) counts as its default."""
    now = config_record(config)
    return [f"{k}={saved.get(k, _DEFAULTS[k])!r} (now {now[k]!r})" for k in TRAJECTORY_KEYS
            if saved.get(k, _DEFAULTS[k]) != now[k]]


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


def check_run(config: TrainConfig, folder, data: DataIdentity, resume: bool, resolved: dict, *, schedule,
              holding_lock: bool = False) -> RunCheck:
    """Can ``config`` train on ``data`` into ``folder``?  Raises :class:`RunError` (module docstring); writes
    nothing.  ``schedule``: ``config``'s played schedule (:func:`~explr.cifar10.checkpoint.check_progress`);
    ``holding_lock``: the caller holds the folder's :class:`~explr.cifar10.lock.RunLock` (skip the lock check)."""
    folder = Path(folder)
    place = check_folder(folder, resume, holding_lock)
    if place is None:
        return RunCheck(RunState.NEW)
    note, saved_manifest = place
    ckpt, metrics = folder / CHECKPOINT, folder / METRICS
    if not ckpt.exists():
        return RunCheck(RunState.NEW, note=note)
    saved = checkpoint_of(folder, saved_manifest)
    check_checkpoint(saved, ckpt)
    check_rows(saved["metrics"], ckpt)
    diff = _settings_mismatch(saved["config"], config)
    diff += _resolved_mismatch(saved.get("resolved") or saved_manifest.get("resolved", {}), resolved)
    if diff:
        raise RunError(f"--resume: the run in {folder} was made with other settings: {', '.join(diff)}")
    if saved["data_sha256"] != data.sha256:
        raise RunError(f"--resume: the run in {folder} was trained on other data (sha256 {saved['data_sha256'][:12]}…, "
                       f"now {data.sha256[:12]}… from {data.source}); pass the same --data or another --out")
    check_epoch(saved, config, ckpt)
    check_states(saved, config, ckpt)
    check_progress(saved, config, data.n_train // config.batch_size, ckpt, schedule=schedule)
    done = saved["epoch"]
    if done >= config.epochs and metrics.exists():  # a finished run's metrics (an unfinished run's are rewritten)
        check_metrics_file(read_metrics(metrics), saved["metrics"], metrics, ckpt)
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
