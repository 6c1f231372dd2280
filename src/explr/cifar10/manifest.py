"""A run's ``manifest.json``: :class:`Manifest`, made when a run starts (:func:`new_manifest`), rewritten
atomically after every epoch and at its end (:func:`write_manifest`, :func:`record_end`), read and checked
(:func:`read_manifest`: the fields the engine reads, :data:`MANIFEST_FIELDS`), and the checkpoint it recorded
(:func:`checkpoint_of`: the sha256 of checkpoint.pt as last written, or of the one being written, recorded before
it is written; torch's zip reader does not notice a flipped byte of tensor data).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Optional, TypedDict

import numpy as np
import torch

from .checkpoint import CHECKPOINT, FORMAT, Checkpoint, load_checkpoint
from .files import read_run_file, write_file
from .lock import RunError
from .metrics import FINAL_KEYS
from .status import RECORDED, Status

__all__ = ["MANIFEST", "MANIFEST_FIELDS", "Manifest", "checkpoint_of", "git_commit", "new_manifest", "read_manifest",
           "record_end", "record_epoch", "write_manifest"]

#: the manifest's name in a run folder
MANIFEST = "manifest.json"
#: larger than any manifest this engine writes (a few KiB).
MAX_MANIFEST_BYTES = 1 << 24


#: what manifest.json holds: :data:`~explr.cifar10.checkpoint.FORMAT`, the status (one of
#: :data:`~explr.cifar10.status.RECORDED`) and its message, the config as recorded, the resolved
#: device/precision/threads, the devices it ran on, the data (name, kind, sha256), the environment (versions, git
#: commit), when it started and was updated, the epochs done, the seconds trained, the checkpoint's sha256 (as written
#: and as being written) and the last row's :data:`~explr.cifar10.metrics.FINAL_KEYS` (``final``)
Manifest = TypedDict("Manifest", {
    "format": str, "status": str, "message": str, "config": dict, "resolved": dict, "devices": list, "data": dict,
    "environment": dict, "started": str, "updated": str, "epochs_done": int, "elapsed_seconds": float,
    "checkpoint_sha256": Optional[str], "checkpoint_sha256_writing": Optional[str], "final": dict,
}, total=False)


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


def new_manifest(previous: dict, config: dict, resolved: dict, device: torch.device, device_name: str, data: dict,
                 epochs_done: int, elapsed: float) -> Manifest:
    """The manifest of a run starting (or resuming, ``previous`` its manifest) at ``epochs_done``, status running:
    ``config`` as recorded, ``resolved`` what the trainer resolved, ``data`` the data's description."""
    devices = list(previous.get("devices", []))
    if device_name not in devices:
        devices.append(device_name)
    return {**previous,
            "format": FORMAT, "status": Status.RUNNING, "message": "", "config": config, "resolved": resolved,
            "devices": devices, "data": data,
            "environment": {
                "torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version(),
                "platform": platform.platform(), "git": git_commit(),
                "cuda": torch.version.cuda if device.type == "cuda" else None,
            },
            "started": previous.get("started", _now()), "updated": _now(), "epochs_done": epochs_done,
            "elapsed_seconds": elapsed}


def write_manifest(path, manifest: Manifest) -> None:
    """Write ``manifest`` as indented JSON at ``path``, atomically (:func:`~explr.cifar10.files.write_file`)."""
    write_file(path, lambda f: f.write((json.dumps(manifest, indent=2) + "\n").encode()))


def record_epoch(path, manifest: Manifest, digest: str, epochs_done: int, elapsed: float) -> None:
    """Record in ``manifest`` (and write at ``path``) an epoch whose checkpoint, of sha256 ``digest``, is written."""
    manifest.update({"checkpoint_sha256": digest, "checkpoint_sha256_writing": None, "updated": _now(),
                     "epochs_done": epochs_done, "elapsed_seconds": elapsed})
    write_manifest(path, manifest)


def record_end(path, manifest: Manifest, status: Status, message: str, elapsed: float, history: list) -> None:
    """Record in ``manifest`` (and write at ``path``) how the run ended, and its last row's :data:`FINAL_KEYS`."""
    manifest.update({"status": status, "message": message, "updated": _now(), "elapsed_seconds": elapsed,
                     "epochs_done": len(history)})
    if history:
        manifest["final"] = {k: history[-1][k] for k in FINAL_KEYS}
    write_manifest(path, manifest)


def _field_error(manifest: dict) -> str | None:
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


def read_manifest(path) -> Manifest:
    """The manifest at ``path`` (a JSON object whose fields the engine reads have its types, a regular file of at most
    :data:`MAX_MANIFEST_BYTES`); :class:`RunError` naming the file and what to delete otherwise."""
    path = Path(path)
    remedy = (f"delete it (--resume rebuilds it from {CHECKPOINT})" if (path.parent / CHECKPOINT).exists()
              else f"delete the folder {path.parent}")
    try:
        manifest = json.loads(read_run_file(path, MAX_MANIFEST_BYTES))
    except RecursionError:
        raise RunError(f"{path} is unreadable (nested too deeply to parse; hand-edited?); {remedy}") from None
    except (ValueError, OSError) as err:
        raise RunError(f"{path} is unreadable ({err}); {remedy}") from None
    if not isinstance(manifest, dict):
        raise RunError(f"{path} is not a JSON object (it holds a {type(manifest).__name__}; hand-edited?); {remedy}")
    wrong = _field_error(manifest)
    if wrong:
        raise RunError(f"{path}: {wrong} (hand-edited?); {remedy}")
    return manifest


def checkpoint_of(folder, manifest: Manifest) -> Checkpoint:
    """``folder/checkpoint.pt`` (:func:`~explr.cifar10.checkpoint.load_checkpoint`), and the file ``manifest``
    recorded (its sha256, when the manifest holds one).  :class:`RunError` saying what to do otherwise."""
    folder = Path(folder)
    saved, digest = load_checkpoint(folder)
    recorded = {manifest.get("checkpoint_sha256"), manifest.get("checkpoint_sha256_writing")} - {None}
    if recorded and digest not in recorded:
        raise RunError(f"{folder / CHECKPOINT} is not the file {folder / MANIFEST} recorded (its sha256 differs: "
                       "damaged or changed since it was written); restore it from a backup, or delete it to train "
                       "this run again from the start")
    return saved
