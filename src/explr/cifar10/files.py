"""Atomic file writes for run folders and the data cache: a reader never sees a torn file.

A file is written to ``.<name>.<random>.tmp`` in the same folder, flushed, fsync'ed and renamed over
the target (``os.replace`` is atomic on POSIX).  The temporary file gets the mode an ordinary
``open(..., "w")`` would give (``0o666`` minus the umask), not ``mkstemp``'s private ``0600``, so
run files and caches are as readable as anything else the user writes.  A process killed between
the two steps (SIGKILL) leaves the ``.tmp`` file behind: :func:`remove_leftovers` clears them when
the folder is next used.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write", "write_json", "remove_leftovers", "default_file_mode"]

TMP_SUFFIX = ".tmp"


def default_file_mode() -> int:
    """``0o666 & ~umask``: the mode ``open(path, "w")`` gives a new file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(path, write) -> None:
    """Call ``write(f)`` on a binary file object that becomes ``path`` only once it is complete."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        os.fchmod(fd, default_file_mode())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path, obj) -> None:
    atomic_write(path, lambda f: f.write((json.dumps(obj, indent=2) + "\n").encode()))


def remove_leftovers(folder) -> list[str]:
    """Delete the temporary files of writes that never finished in ``folder``; returns their names."""
    removed = []
    for p in Path(folder).glob(f".*{TMP_SUFFIX}"):
        if p.is_file():
            p.unlink(missing_ok=True)
            removed.append(p.name)
    return removed
