"""Every run of a sweep checked before anything starts.

:func:`prepare` checks every run of a sweep before the first one starts, and creates nothing: the
settings, the device, the output folder, the data (loaded once: readable, trainable), then prepares every run
(:func:`~explr.cifar10.prepared.prepare_run`: enough images for the batch, its schedule built once for the real
number of steps, an exponential one starting below ``rescale_above``, and its folder checked: lock, existing run,
corrupt files, resume compatibility; a file where a run's folder would go).  What needs no data is checked before
the data is loaded (:func:`check_before_data`: the settings, the device, the folders and the manifests), so that a
bad flag or run folder never waits for a download or a decode.  Any failure is one ``ValueError`` line.  A run folder that another process takes after these checks is reported as
"locked" (exit code 4), the other runs go on.
"""
from __future__ import annotations

from .arrays import CifarArrays
from .config import JOBS, TrainConfig
from .hardware import resolved_settings
from .lock import RunLocked
from .prepared import prepare_run
from .runfolder import check_folder, check_writable, run_dir
from .sources import load_cifar10

__all__ = ["check_before_data", "prepare"]


# ----------------------------------------------------------------------------- checks before anything starts
def check_before_data(configs: list[TrainConfig], out, *, resume: bool = False, jobs: int = 1,
                      skip_locked: bool = False, here: bool = True) -> list[dict]:
    """The checks of :func:`prepare` that need no data, made before it is loaded (or downloaded): ``jobs``
    (``explr.cifar10.config.JOBS``), every config's settings, one folder per run, the device, that folders can
    be created in ``out``, and every run folder that exists (:func:`~explr.cifar10.runfolder.check_folder`: a file
    where a folder goes, its lock, a run there without ``resume``, its manifest; with ``skip_locked`` a folder that
    a live process holds is left to :func:`prepare`).  Returns each config's resolved settings
    (:func:`~explr.cifar10.hardware.resolved_settings` for ``jobs`` at a time; with ``here=False`` the runs train
    elsewhere, which resolves them: the device is not checked here).  Creates nothing."""
    if not configs:
        raise ValueError("no runs: give at least one --schedule and --seed")
    if not JOBS.ok(jobs):
        raise ValueError(f"jobs (--jobs) must be {JOBS.rule()}; got {jobs!r}")
    for c in configs:
        c.validate()
    dirs = [run_dir(out, c.schedule, c.seed) for c in configs]
    if len(set(dirs)) != len(dirs):
        raise ValueError("two runs would share a folder: give each (schedule, seed) once")
    resolved = [resolved_settings(c, jobs, here=here) for c in configs]  # --device cuda without CUDA fails here
    check_writable(out)
    for d in dirs:
        try:
            check_folder(d, resume)
        except RunLocked:
            if not skip_locked:
                raise
    return resolved


def prepare(configs: list[TrainConfig], out, *, arrays: CifarArrays | None = None, resume: bool = False,
            jobs: int = 1, skip_locked: bool = False, progress: bool = True, here: bool = True):
    """Check every run of the sweep (module docstring); returns ``(arrays, runs, notes)``.  Creates nothing.

    ``arrays``: the data already in memory (else every config's ``data`` is loaded, once per source, with a
    decoding bar if ``progress``, and the largest batch checked against its size before anything is cached).
    ``runs``: per config, its :class:`~explr.cifar10.prepared.PreparedRun` (built and checked once: what its folder
    holds is its ``state``); with ``skip_locked``, a run that a live process holds gets its :class:`RunLocked` error
    there instead of raising it.  ``notes`` are lines worth showing (stale locks).  ``here=False``: the runs train on
    another machine, which resolves device, precision and threads (:func:`check_before_data`).
    """
    sources = {(c.data, c.data_root) for c in configs}
    if arrays is None and len(sources) > 1:
        raise ValueError("the runs of one sweep must use the same --data")
    resolved = check_before_data(configs, out, resume=resume, jobs=jobs, skip_locked=skip_locked, here=here)
    if arrays is None:
        data, root = sources.pop()
        arrays = load_cifar10(data, root, progress=progress, batch_size=max(c.batch_size for c in configs))
    arrays.channel_stats  # noqa: B018  (constant images raise DataError)
    runs = []
    for c, r in zip(configs, resolved):
        try:
            runs.append(prepare_run(c, run_dir(out, c.schedule, c.seed), arrays, resume=resume, resolved=r))
        except RunLocked as err:
            if not skip_locked:
                raise
            runs.append(err)
    return arrays, runs, [r.note for r in runs if not isinstance(r, RunLocked) and r.note]
