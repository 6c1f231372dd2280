"""Atomic file writes for run folders and the data cache: a reader never sees a torn file; whether a writer lives;
how a run file is read (:func:`read_run_file`: a regular file of a bounded size) and written (:func:`write_file`:
atomic, a full disk raised as :class:`DiskFull`).

A file is written to ``.<name>.<pid>@<host>.<random>.tmp`` in the same folder, flushed, fsync'ed and renamed over
the target (``os.replace`` is atomic on POSIX).  The temporary file gets the mode an ordinary
``open(..., "w")`` would give (``0o666`` minus the umask), not ``mkstemp``'s private ``0600``, so
run files and caches are as readable as anything else the user writes.  A process killed between
the two steps (SIGKILL) leaves the ``.tmp`` file behind: :func:`remove_leftovers` clears them when
a folder only one process writes (a locked run folder) is next used, and :func:`remove_stale_leftovers`
those whose writer is gone in a folder several processes, on one machine or several, may write at once (the data
cache).  Only names of exactly that form (:data:`TMP_NAME`: ``mkstemp``'s 8 random characters) are the engine's: a
user's ``.notes.tmp`` beside them is never touched.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import socket
import stat
import tempfile
import time
from pathlib import Path

__all__ = ["DiskFull", "atomic_write", "default_file_mode", "disk_full", "pid_alive", "read_run_file",
           "remove_leftovers", "remove_stale_leftovers", "write_file"]

TMP_SUFFIX = ".tmp"
#: the name :func:`atomic_write` gives a temporary file: ``.<target>.<pid>@<host>.<8 random characters of
#: mkstemp>.tmp`` (:data:`HOST`); older versions wrote no ``@<host>``.
TMP_NAME = re.compile(r"\.(?P<target>.+)\.(?P<pid>[0-9]+)(?:@(?P<host>[0-9a-f]{8}))?\.[a-z0-9_]{8}"
                      + re.escape(TMP_SUFFIX))
#: a temporary file untouched for this long is stale even if a process with its writer's pid is alive
#: (the pid was reused, or the file was written on another machine sharing the folder).
STALE_AFTER_S = 3600


def _pid_space() -> str:
    """8 hex digits of the sha256 of the host name, the kernel's boot id and the pid namespace: what makes a pid
    mean one process (two machines, two boots of one, or two containers that share a host name, differ)."""
    parts = [socket.gethostname()]
    for read in (lambda: Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
                 lambda: os.readlink("/proc/self/ns/pid")):
        try:
            parts.append(read())
        except OSError:  # not Linux: the host name alone
            parts.append("")
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogateescape")).hexdigest()[:8]


#: the machine (strictly: the pid space) this process runs in, as :data:`TMP_NAME` records it.
HOST = _pid_space()


def default_file_mode() -> int:
    """``0o666 & ~umask``: the mode ``open(path, "w")`` gives a new file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(path, write) -> None:
    """Call ``write(f)`` on a binary file object that becomes ``path`` only once it is complete."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}@{HOST}.", suffix=TMP_SUFFIX)
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


def remove_leftovers(folder) -> list[str]:
    """Delete the temporary files of writes that never finished in ``folder`` (names :data:`TMP_NAME`, nothing
    else); returns their names."""
    removed = []
    for p in Path(folder).glob(f".*{TMP_SUFFIX}"):
        if TMP_NAME.fullmatch(p.name) and p.is_file():
            p.unlink(missing_ok=True)
            removed.append(p.name)
    return removed


def _writer_here(name: str) -> int | None:
    """The pid in the temporary file name :data:`TMP_NAME` if it was written on this machine (:data:`HOST`); None
    for another machine's name or one without a host or pid."""
    match = TMP_NAME.fullmatch(name)
    return int(match["pid"]) if match and match["host"] == HOST else None


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


def remove_stale_leftovers(folder) -> list[str]:
    """Delete the temporary files in ``folder`` whose writer is gone; returns their names.

    For a folder several processes may write at once, on this machine or others sharing it: a temporary file
    written here (:data:`HOST` in its name) is removed when no process with the pid in its name is alive, and any
    temporary file when it has not been modified for :data:`STALE_AFTER_S` seconds (the only rule for another
    machine's files, whose pids mean nothing here, and for names without a host, which older versions wrote).
    Files that vanish or cannot be removed meanwhile are left to the next call.
    """
    now, removed = time.time(), []
    for p in Path(folder).glob(f".*{TMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            pid = _writer_here(p.name)
            if p.is_file() and ((pid is not None and not pid_alive(pid)) or now - p.stat().st_mtime > STALE_AFTER_S):
                p.unlink()
                removed.append(p.name)
    return removed


# ----------------------------------------------------------------------------- run files
class DiskFull(Exception):
    """The disk (or the quota) filled up while writing ``path``; ``str()`` is the line to show."""

    def __init__(self, path, message: str = ""):
        self.path = Path(path)
        super().__init__(message or f"disk full while writing {path}")


def disk_full(err: BaseException | None) -> bool:
    """Whether ``ENOSPC`` or ``EDQUOT`` is anywhere in the chain of ``err`` (causes and contexts)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        err = err.__cause__ or err.__context__
    return False


def write_file(path, write) -> None:
    """:func:`atomic_write`; a full disk is raised as :class:`DiskFull` naming ``path``."""
    try:
        atomic_write(path, write)
    except (OSError, RuntimeError) as err:
        if disk_full(err):
            raise DiskFull(path) from err
        raise


def read_run_file(path: Path, limit: int | None = None) -> bytes:
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
