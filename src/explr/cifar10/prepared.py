"""One run made ready to train: built and checked once, then handed to whatever trains it.

:func:`prepare_run` makes a :class:`PreparedRun` from a :class:`~explr.cifar10.config.TrainConfig`, a run folder
and the data: the settings resolved on this machine, the data's identity, the played schedule (built once, and
checked playable: :func:`~explr.cifar10.played.played_schedule`,
:func:`~explr.lr_scheduler.check_rescale_above`) and what the folder holds (checked once:
:func:`~explr.cifar10.runfolder.check_run`).  The preflight of a sweep, the local pool, submitit's jobs, the CLI
and :func:`explr.cifar10.runs.train_prepared` take it and never rebuild what it holds.

Between the check and the training another process may change the folder (it trained the run meanwhile, or a
requeued job resumes its own run): under the run's lock :meth:`PreparedRun.confirmed` compares the folder's files
with those that were checked and checks again only where they differ.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import os
from pathlib import Path

from ..lr_scheduler import check_rescale_above
from ..schedules import Schedule
from .arrays import CifarArrays, DataIdentity
from .checkpoint import CHECKPOINT
from .config import TrainConfig
from .hardware import param_dtype, resolved_settings
from .lock import RunError
from .manifest import MANIFEST
from .metrics import METRICS
from .played import played_schedule, rescale_limit
from .runfolder import RunCheck, check_run
from .status import RunState

__all__ = ["PreparedRun", "prepare_run"]

#: the run files as checked: (name, inode, size, mtime in ns) of each that exists (an atomic rewrite: a new inode)
FolderFiles = tuple


@dataclass(frozen=True)
class PreparedRun:
    """A run ready to train: its ``config`` (validated), ``folder``, ``resume``, ``resolved`` settings
    (:data:`~explr.cifar10.config.RESOLVED_KEYS`), the identity of its ``data``, the ``schedule`` it plays, what
    ``check`` found in its folder and the folder's files as they were checked (``seen``)."""

    config: TrainConfig
    folder: Path
    resume: bool
    resolved: dict
    data: DataIdentity
    schedule: Schedule
    check: RunCheck
    seen: FolderFiles

    @property
    def state(self) -> RunState:
        """The folder's :class:`~explr.cifar10.status.RunState`: a new run, one to resume, or a finished one."""
        return self.check.state

    @property
    def note(self) -> str:
        """A line worth showing (a stale lock), or ``""``."""
        return self.check.note

    def check_data(self, arrays: CifarArrays) -> None:
        """:class:`RunError` unless ``arrays`` are the data this run was prepared with (a worker that loaded its own)."""
        if arrays.sha256 != self.data.sha256:
            raise RunError(f"{self.folder}: the run was prepared for the data {self.data.source} (sha256 "
                           f"{self.data.sha256[:12]}…), not {arrays.source} ({arrays.sha256[:12]}…); prepare it again")

    def resolved_here(self) -> PreparedRun:
        """This run with its device, precision and CPU threads resolved on this machine (it was prepared on another:
        a cluster job's submitter), checked against them: playable in that precision, and a resume with the same
        ones (:func:`~explr.cifar10.runfolder.check_run`).  ``ValueError`` or :class:`RunError` otherwise."""
        resolved = resolved_settings(self.config)
        if resolved == self.resolved:
            return self
        _check_playable(self.config, self.schedule, resolved, _describe(self.config))
        seen = folder_files(self.folder)
        check = check_run(self.config, self.folder, self.data, self.resume, resolved, schedule=self.schedule)
        return dataclasses.replace(self, resolved=resolved, check=check, seen=seen)

    def confirmed(self) -> PreparedRun:
        """This run, its folder checked again (:func:`~explr.cifar10.runfolder.check_run`, by a caller holding its
        lock) only if the folder's files differ from those checked.  :class:`RunError` if they no longer pass."""
        now = folder_files(self.folder)
        if now == self.seen:
            return self
        check = check_run(self.config, self.folder, self.data, self.resume, self.resolved, holding_lock=True,
                          schedule=self.schedule)
        return dataclasses.replace(self, check=check, seen=now)


def folder_files(folder: Path) -> FolderFiles:
    """The run files of ``folder`` as (name, inode, size, mtime in ns); those missing are left out."""
    seen = []
    for name in (MANIFEST, CHECKPOINT, METRICS):
        try:
            st = os.stat(folder / name)
        except OSError:
            continue
        seen.append((name, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(seen)


def prepare_run(config: TrainConfig, folder, arrays: CifarArrays, *, resume: bool = False, jobs: int = 1,
                resolved: dict | None = None) -> PreparedRun:
    """Make ``config``'s run into ``folder`` ready (module docstring); writes nothing.

    ``resolved``: the settings of one run of ``jobs`` at a time (:func:`~explr.cifar10.hardware.resolved_settings`),
    where the caller resolved them already.  Raises ``ValueError`` (one line naming the flag) for a schedule that
    cannot be played and :class:`RunError` for a folder it cannot train into."""
    config.validate()
    resolved = resolved if resolved is not None else resolved_settings(config, jobs)
    folder, data = Path(folder), arrays.identity
    where = _describe(config)
    schedule = _built_schedule(config, data, where)
    seen = folder_files(folder)  # before the check: a change during it is seen under the lock
    check = check_run(config, folder, data, resume, resolved, schedule=schedule)  # a resume's other settings first
    _check_playable(config, schedule, resolved, where)
    return PreparedRun(config, folder, resume, resolved, data, schedule, check, seen)


def _describe(config: TrainConfig) -> str:
    """The run and its schedule's flags, for the lines that refuse them."""
    limit = rescale_limit(config)
    rescaled = "" if limit is None else f", --rescale-above {limit:g}"
    return (f"schedule {config.schedule} (seed {config.seed}; --lr {config.lr:g}, --wd {config.wd:g}, --momentum "
            f"{config.momentum:g}, --epochs {config.epochs}{rescaled})")


def _built_schedule(config: TrainConfig, data: DataIdentity, where: str) -> Schedule:
    """``config``'s schedule built for the real number of steps, once; one ``ValueError`` line otherwise."""
    if config.batch_size > data.n_train:
        raise ValueError(f"batch_size (--batch-size) {config.batch_size} exceeds the {data.n_train} training images "
                         f"of {data.source}")
    try:
        return played_schedule(config, data.n_train // config.batch_size)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def _check_playable(config: TrainConfig, schedule: Schedule, resolved: dict, where: str) -> None:
    """An exponential schedule's ``rescale_above`` against its first lr and the weights' dtype (PerStepLR's rule)."""
    limit = rescale_limit(config)
    if limit is None:
        return
    try:  # lr[0] is exactly what PerStepLR plays (np.ldexp of its mantissa and exponent)
        check_rescale_above(limit, float(schedule.lr[0]), param_dtype(resolved["precision"]))
    except ValueError as err:
        raise ValueError(f"{where} cannot be played: {err}") from None
