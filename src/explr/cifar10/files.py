"""A run folder's safety: atomic writes, guarded reads, its lock (:class:`RunLock`: one writer per folder), the
signals that end a run (:func:`handle_signals`) and how a run stands or ended (:class:`Status`, with its exit code)."""
from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import os
import re
import secrets
import signal
import stat
import time
from pathlib import Path


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


def remove_stale_leftovers(folder) -> list[str]:
    """:func:`remove_leftovers` of a folder several processes write at once (the data cache): untouched for an hour."""
    return remove_leftovers(folder, 3600)


class DiskFull(Exception):
    """The disk (or the quota) filled up while writing ``path``; ``str()`` is the line to show."""

    def __init__(self, path, message: str = ""):
        self.path = Path(path)
        super().__init__(message or f"disk full while writing {path}")


def write_file(path, write) -> None:
    """:func:`atomic_write`; a full disk (the error or its cause, as torch raises it) is :class:`DiskFull`."""
    try:
        atomic_write(path, write)
    except (OSError, RuntimeError) as err:
        if any(getattr(e, "errno", None) in DISK_FULL_ERRNOS for e in (err, err.__cause__, err.__context__)):
            raise DiskFull(path) from err
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
    """The pid written in the open lock file ``fd``, or None."""
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
    the folder and never deleted; it holds the pid (one left unlocked: ``stale_pid``)."""

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
            previous = _read_pid(fd)
            self.stale_pid = previous if previous != os.getpid() else None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException as err:
            if fd is not None:
                os.close(fd)
            if isinstance(err, OSError) and err.errno in (errno.ELOOP, errno.EISDIR):
                raise not_a_lock(self.path) from None
            if isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS:
                raise DiskFull(self.path) from None
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
    if isinstance(err, DiskFull):
        return Status.DISK_FULL.exit_code
    return 128 + getattr(err, "signum", signal.SIGINT)  # a plain KeyboardInterrupt: ^C


def signal_name(interrupt: KeyboardInterrupt) -> str:
    """The signal that raised ``interrupt`` (a plain ``KeyboardInterrupt``: SIGINT), such as "SIGTERM"."""
    return signal.Signals(exit_code(interrupt) - 128).name
