"""How a run stands or ended: :class:`Status`, the words its manifest and the CLI's report say and the exit code
that the CLI and a worker process return for it; :class:`RunState`, what a run folder holds before a run starts.

A run's process exits with its ``Status.exit_code``: 0 when it finished (or stopped early as asked), 3 diverged,
4 its folder was taken by another process, 5 a worker or cluster job failed, 6 the disk filled up; a signal ends
it with 128 + the signal's number (:func:`explr.cifar10.lock.exit_code`).  :meth:`Status.from_exit_code` reads a
code back.  The CLI returns the largest of its runs' codes, and 2 for bad settings, data or run folders (argparse's
code for a usage error).
"""
from __future__ import annotations

import enum
import signal

__all__ = ["Status", "RunState", "RECORDED"]


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
        """The status a run's process said by exiting with ``code``: 0 FINISHED (finished, or stopped early as asked:
        its manifest says which), 3 DIVERGED, 4 LOCKED, 5 FAILED, 6 DISK_FULL; 128 + a signal's number INTERRUPTED
        (stopped from outside: :func:`explr.cifar10.lock.exit_code`); any other code, or a negative one (what
        ``multiprocessing`` reports for a process killed by a signal it did not catch), FAILED."""
        if code == 0:
            return cls.FINISHED
        said = next((s for s in cls if s.exit_code == code), None)
        if said is not None:
            return said
        return cls.INTERRUPTED if code - 128 in signal.valid_signals() else cls.FAILED


class RunState(enum.Enum):
    """What :func:`~explr.cifar10.runfolder.check_run` found in a run folder: no run yet (NEW), a run to continue
    from its checkpoint (RESUME), or a finished run (FINISHED).  Not a :class:`Status` (a folder's state before a
    run starts, not how a run ended), nor a ``str``: it is compared with its members only."""

    NEW = "new"
    RESUME = "resume"
    FINISHED = "finished"


#: the statuses a run's manifest records (the others are what a sweep reports of a run it could not train).
RECORDED = (Status.RUNNING, Status.FINISHED, Status.INTERRUPTED, Status.DIVERGED, Status.DISK_FULL)
