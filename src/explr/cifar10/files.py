"""A run folder's safety: atomic writes (:func:`atomic_write`, :func:`write_file`: a full disk is :class:`DiskFull`),
guarded reads, its lock (:class:`RunLock`: one writer per folder), the signals that end a run
(:func:`handle_signals`) and how a run stands or ended (:class:`Status`, with its exit code).

A file is written to ``.<name>.<pid>.<random>.tmp`` beside it, fsync'ed and renamed over it (``os.replace``);
a process killed between the two leaves the ``.tmp``, removed when the folder is next used.
"""
from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import os
import re
import signal
import stat
import tempfile
import time
from pathlib import Path


TMP_SUFFIX = ".tmp"
#: the name :func:`atomic_write` gives a temporary file: ``.<target>.<pid>.<8 random characters of mkstemp>.tmp``
#: (earlier versions put ``@<8 hex digits>`` after the pid).
TMP_NAME = re.compile(r"\.(?P<target>.+)\.(?P<pid>[0-9]+)(?:@[0-9a-f]{8})?\.[a-z0-9_]{8}" + re.escape(TMP_SUFFIX))
#: a temporary file in a folder several processes write (the data cache) untouched for this long is a leftover.
STALE_AFTER_S = 3600


def default_file_mode() -> int:
    """``0o666 & ~umask``: the mode ``open(path, "w")`` gives a new file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(path, write) -> None:
    """Call ``write(f)`` on a binary file object that becomes ``path`` only once it is complete."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=TMP_SUFFIX)
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
    """Delete the temporary files (:data:`TMP_NAME`) in ``folder``, one several processes may write at once, that
    are untouched for :data:`STALE_AFTER_S` seconds; returns their names (files that vanish meanwhile are left)."""
    now, removed = time.time(), []
    for p in Path(folder).glob(f".*{TMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            if TMP_NAME.fullmatch(p.name) and p.is_file() and now - p.stat().st_mtime > STALE_AFTER_S:
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
    """The bytes of the run file ``path``; ``ValueError`` unless a regular file (checked on the open file, which a
    FIFO does not block) of at most ``limit`` bytes."""
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            kinds = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
                     stat.S_IFDIR: "a folder", stat.S_IFSOCK: "a socket"}
            raise ValueError(f"not a regular file but {kinds.get(stat.S_IFMT(st.st_mode), 'a special file')}")
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

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def from_exit_code(cls, code: int) -> "Status":
        """The status a run's process exited with: 0 FINISHED, 3 DIVERGED, 4 LOCKED, 5 FAILED, 6 DISK_FULL;
        128 + a signal's number INTERRUPTED (:func:`exit_code`); any other code (negative: killed) FAILED."""
        if code == 0:
            return cls.FINISHED
        said = next((s for s in cls if s.exit_code == code), None)
        if said is not None:
            return said
        return cls.INTERRUPTED if code - 128 in signal.valid_signals() else cls.FAILED


class RunState(enum.Enum):
    """What :func:`~explr.cifar10.runfolder.check_run` found in a run folder (not how a run ended)."""

    NEW = "new"
    RESUME = "resume"
    FINISHED = "finished"


#: the statuses a run's manifest records (the others are what a sweep reports of a run it could not train).
RECORDED = (Status.RUNNING, Status.FINISHED, Status.INTERRUPTED, Status.DIVERGED, Status.DISK_FULL)


LOCK = ".lock"
#: the signals that end a run as SIGTERM does (:class:`Terminated`): a closed terminal, SLURM's preemption signal.
TERMINATING = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2)


class RunError(ValueError):
    """A run folder cannot be used as asked (exists, corrupt, other settings or data); one line, says what to do."""


class RunLocked(RunError):
    """An exclusive ``fcntl.flock`` on ``folder/.lock`` (created with its folder if missing) for the whole run,
    the holder's pid in it; the kernel releases it however its process dies (a pid left unlocked: ``stale_pid``).
    If it cannot be taken (:class:`RunLocked`, :class:`DiskFull`, a linked ``.lock``), nothing it created is left."""


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
                    raise RunLocked(locked_message(self.path.parent, _read_pid(fd))) from None
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


def locked_message(folder: Path, pid: int | None) -> str:
    who = f"process {pid}" if pid else "another process"
    alive = "" if pid is None or pid_alive(pid) else " (on another machine?)"
    return (f"{folder} is being trained by {who}{alive}, which holds {folder / LOCK}; wait for it to finish or stop "
            "it, then use --resume")


# ----------------------------------------------------------------------------- signals
@contextlib.contextmanager
def handle_signals():
    """SIGINT raises ``KeyboardInterrupt``, SIGTERM, SIGHUP or SIGUSR2 :class:`Terminated`, once (later ones are
    ignored while the run records its status); main thread only; restores the handlers."""
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
