"""Who holds a run folder, and what ends a run: the lock (an exclusive ``fcntl.flock`` on ``<run>/.lock``,
released by the kernel however its process dies; a pid left without the lock is a stale lock), SIGINT,
SIGTERM, SIGHUP (a closed terminal) and SIGUSR2 (SLURM's preemption signal) (:func:`handle_signals`,
:func:`exit_code`, also that of a full disk) and the errors of a run folder (:class:`RunError`, :class:`RunLocked`,
:class:`Terminated`).  How a run file is read and written: :mod:`explr.cifar10.files`.

The lock is never followed through a link (``O_NOFOLLOW``): a ``.lock`` that is a symbolic link is refused, as
opening it for writing would truncate the file it points to.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import time
from pathlib import Path

from .files import DiskFull, disk_full, pid_alive
from .status import Status

__all__ = ["LOCK", "RunError", "RunLocked", "Terminated", "RunLock", "exit_code", "handle_signals", "lock_holder",
           "signal_name"]

LOCK = ".lock"
#: the signals that end a run as SIGTERM does (:class:`Terminated`): a closed terminal, SLURM's preemption signal.
TERMINATING = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2)


class RunError(ValueError):
    """A run folder cannot be used as asked (exists, corrupt, other settings or data); one line, says what to do."""


class RunLocked(RunError):
    """Another process holds the run folder's lock, or took the folder after it was checked."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, SIGHUP or SIGUSR2 arrived (raised by the handler of :func:`handle_signals`); ``signum`` says which."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(signum)
        self.signum = signum


# ----------------------------------------------------------------------------- the lock
def _read_pid(fd: int) -> int | None:
    """The pid written in the open lock file ``fd`` (its first 32 bytes), or None."""
    try:
        text = os.pread(fd, 32, 0).decode().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def lock_holder(folder) -> tuple[int | None, bool]:
    """(pid written in ``folder/.lock``, whether a live process holds the lock); writes nothing.  A ``.lock``
    that is a link or not a regular file is no lock (:func:`~explr.cifar10.runfolder.check_run` refuses it)."""
    path = Path(folder) / LOCK
    if path.is_symlink() or not path.is_file():
        return None, False
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    pid = _read_pid(fd)
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
    no lock held is a stale lock of a process that was killed: ``stale_pid`` reports it.  The folder
    is created if it is missing.  If the lock cannot be taken (another holder: :class:`RunLocked`; a full
    disk: :class:`DiskFull`; a ``.lock`` that is a link: :class:`RunError`), the ``.lock`` and the folders
    this call created are removed again: nothing is left behind.
    """

    def __init__(self, folder):
        self.path = Path(folder) / LOCK
        self.fd = None
        self.stale_pid = None

    def __enter__(self) -> "RunLock":
        folder = self.path.parent
        created = [p for p in (folder, *folder.parents) if not p.exists()]
        fd, made, held = None, False, False
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, made = self._open()
            self._acquire(fd)
            held = True
            previous = _read_pid(fd)
            self.stale_pid = previous if previous not in (None, os.getpid()) else None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException as err:
            if made and held:  # no other process can have taken a lock file this call made and holds
                self.path.unlink(missing_ok=True)
            if fd is not None:
                os.close(fd)
            for p in created:  # the deepest first; one that is not empty (someone else's now) stays
                with contextlib.suppress(OSError):
                    p.rmdir()
            if isinstance(err, OSError) and disk_full(err):
                raise DiskFull(self.path) from None
            raise
        self.fd = fd
        return self

    def _open(self) -> tuple[int, bool]:
        """The lock file, opened for writing without following a link; and whether this call created it."""
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666), True
        except FileExistsError:
            pass
        try:
            return os.open(self.path, os.O_RDWR | os.O_NOFOLLOW), False
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise lock_is_a_link(self.path) from None
            raise

    def _acquire(self, fd: int) -> None:
        """Take the exclusive lock on ``fd`` within a second (:class:`RunLocked` otherwise), and check that
        ``fd`` is still the folder's ``.lock`` (not one a failed start of another process unlinked meanwhile)."""
        for attempt in range(20):  # a concurrent check_run holds a shared lock for microseconds
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == 19:
                    raise RunLocked(_locked_message(self.path.parent, _read_pid(fd))) from None
                time.sleep(0.05)
        try:
            same = os.lstat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            raise RunLocked(f"{self.path.parent} is being started by another process; wait for it, then use --resume")

    def __exit__(self, *exc) -> None:
        os.ftruncate(self.fd, 0)  # an empty lock file: released cleanly, not stale
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None


def lock_is_a_link(path: Path) -> RunError:
    """The error for a ``.lock`` at ``path`` that is a symbolic link."""
    return RunError(f"{path} is a symbolic link, not a file (the run's lock is an ordinary file, and writing through "
                    "a link would change the file it points to); delete it")


def _locked_message(folder: Path, pid: int | None) -> str:
    who = f"process {pid}" if pid else "another process"
    alive = "" if pid is None or pid_alive(pid) else " (on another machine?)"
    return (f"{folder} is being trained by {who}{alive}, which holds {folder / LOCK}; wait for it to finish or stop "
            "it, then use --resume")


# ----------------------------------------------------------------------------- signals
@contextlib.contextmanager
def handle_signals():
    """SIGINT raises ``KeyboardInterrupt`` and SIGTERM, SIGHUP or SIGUSR2 (:data:`TERMINATING`) :class:`Terminated`,
    once: later signals are ignored, so that the interrupted run can record its status.  Main thread only;
    restores the handlers.  (A submitit job does not use it: submitit's own SIGUSR2 handler requeues the job.)"""
    fired = []

    def handler(signum, frame):
        if fired:
            return
        fired.append(signum)
        raise Terminated(signum) if signum in TERMINATING else KeyboardInterrupt()

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, *TERMINATING)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _signal(interrupt: KeyboardInterrupt) -> signal.Signals:
    return signal.Signals(interrupt.signum if isinstance(interrupt, Terminated) else signal.SIGINT)


def exit_code(err: KeyboardInterrupt | DiskFull) -> int:
    """The exit code of a process that ``err`` ended: a full disk's :attr:`Status.DISK_FULL` code (6); for an
    interrupt 128 + the signal number: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP, 140 for SIGUSR2."""
    return Status.DISK_FULL.exit_code if isinstance(err, DiskFull) else 128 + _signal(err)


def signal_name(interrupt: KeyboardInterrupt) -> str:
    """The signal that raised ``interrupt``: "SIGINT", "SIGTERM", "SIGHUP" or "SIGUSR2"."""
    return _signal(interrupt).name
