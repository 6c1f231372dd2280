"""Who holds a run folder, and what ends a run: the lock (an exclusive ``fcntl.flock`` on ``<run>/.lock``,
released by the kernel however its process dies; a pid left without the lock is a stale lock), SIGINT and
SIGTERM (:func:`handle_signals`, :func:`exit_code`) and the errors of a run folder (:class:`RunError`,
:class:`RunLocked`, :class:`Terminated`).  :mod:`explr.cifar10.runfolder` and :mod:`explr.cifar10.runs`
re-export the public names.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from pathlib import Path

__all__ = ["LOCK", "RunError", "RunLocked", "Terminated", "RunLock", "exit_code", "handle_signals", "lock_holder"]

LOCK = ".lock"


class RunError(ValueError):
    """A run folder cannot be used as asked (exists, corrupt, other settings or data); one line, says what to do."""


class RunLocked(RunError):
    """Another process holds the run folder's lock, or took the folder after it was checked."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (raised by the handler of :func:`handle_signals`)."""


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
