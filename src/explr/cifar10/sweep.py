"""Many runs: everything checked before anything starts, then trained here, in worker processes, or on a cluster.

:func:`prepare` checks every run of a sweep before the first one starts, and creates nothing: the
settings, the device, the output folder, the data (loaded once: readable, trainable, enough images for
the batch), every run's schedule (built for the real number of steps; an exponential one must start
below ``rescale_above``) and every run folder (:func:`explr.cifar10.runs.check_run`: lock, existing run,
corrupt files, resume compatibility).  Any failure is one ``ValueError`` line.

:func:`run_many` then trains the runs one after the other (``jobs=1``) or ``jobs`` at a time as
separate processes.  Workers get the data the parent loaded through shared memory (when ``/dev/shm``
has room), worker i gets GPU i mod G (``CUDA_VISIBLE_DEVICES``), and a worker dies with its parent
(``PR_SET_PDEATHSIG``); SIGINT/SIGTERM of the parent stop the workers, whose runs record "interrupted".

:func:`submit` sends each run as its own job through submitit (``cluster="slurm"`` or ``"local"``),
into the same folders with the same manifests.  A job always trains with the run lock and resumes
from the run's checkpoint when SLURM preempts or times it out and requeues it (``checkpoint``), so
submitting the same sweep again with ``--resume`` is idempotent.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import torch

from ..lr_scheduler import PerStepLR
from .config import TrainConfig, played_schedule
from .data import CifarArrays, load_cifar10
from .engine import TrainingDiverged
from .hardware import worker_gpus
from .runs import (
    RunLocked,
    check_run,
    check_writable,
    exit_code,
    handle_signals,
    resolved_settings,
    run_dir,
    summary,
    summary_from_folder,
    train_run,
)

__all__ = ["prepare", "run_many", "submit", "share_arrays", "attach_arrays"]


# ----------------------------------------------------------------------------- checks before anything starts
def _check_schedule(config: TrainConfig, arrays: CifarArrays) -> None:
    n = len(arrays.y_train)
    if config.batch_size > n:
        raise ValueError(f"batch_size (--batch-size) {config.batch_size} exceeds the {n} training images of "
                         f"{arrays.source}")
    where = f"schedule {config.schedule} (seed {config.seed}; --lr {config.lr:g}, --wd {config.wd:g}, --momentum " \
            f"{config.momentum:g}, --epochs {config.epochs})"
    try:
        played, exponential = played_schedule(config, n // config.batch_size)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    first = float(np.exp(played.log_lr[0])) if exponential else float(played[0][0])
    if exponential and not config.rescale_above > first:
        raise ValueError(f"rescale_above (--rescale-above) must exceed the first lr {first:g} of {where}; got "
                         f"{config.rescale_above:g}")
    dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0, momentum=config.momentum)
    try:
        if exponential:
            PerStepLR(dummy, played, rescale_above=config.rescale_above)
        else:
            PerStepLR(dummy, *played)
    except ValueError as err:
        raise ValueError(f"{where} cannot be played: {err}") from None


def prepare(configs: list[TrainConfig], out, *, arrays: CifarArrays | None = None, resume: bool = False,
            jobs: int = 1, load: bool = True):
    """Check every run of the sweep (module docstring); returns ``(arrays, notes)``.  Creates nothing.

    ``arrays``: the data already in memory (else every config's ``data`` is loaded, once per source).
    ``notes`` are lines worth showing (stale locks).
    """
    if not configs:
        raise ValueError("no runs: give at least one --schedule and --seed")
    for c in configs:
        c.validate()
    dirs = [run_dir(out, c.schedule, c.seed) for c in configs]
    if len(set(dirs)) != len(dirs):
        raise ValueError("two runs would share a folder: give each (schedule, seed) once")
    sources = {(c.data, c.data_root) for c in configs}
    if arrays is None and len(sources) > 1:
        raise ValueError("the runs of one sweep must use the same --data")
    resolved = [resolved_settings(c, jobs) for c in configs]  # --device cuda without CUDA fails here
    check_writable(out)
    if arrays is None:
        data, root = sources.pop()
        arrays = load_cifar10(data, root)
    arrays.channel_stats  # noqa: B018  (constant images raise DataError)
    for c in configs:
        _check_schedule(c, arrays)
    notes = [check_run(c, d, arrays, resume, r).note for c, d, r in zip(configs, dirs, resolved)]
    return arrays, [n for n in notes if n]


# ----------------------------------------------------------------------------- several runs on this machine
def run_many(configs: list[TrainConfig], out, *, arrays: CifarArrays | None = None, jobs: int = 1,
             resume: bool = False, progress: bool = True) -> list[dict]:
    """Train every config into ``run_dir(out, schedule, seed)``; ``jobs > 1`` trains that many at once.

    Everything is checked first (:func:`prepare`).  A diverged run is reported and the others go on;
    ``KeyboardInterrupt`` (SIGINT, or :class:`~explr.cifar10.runs.Terminated` for SIGTERM under
    :func:`~explr.cifar10.runs.handle_signals`) stops the sweep after the running runs recorded it.
    Returns one summary dict per run (out, status, epochs_done, message, final metrics), in order.
    """
    arrays, notes = prepare(configs, out, arrays=arrays, resume=resume, jobs=jobs)
    for note in notes:
        print(note, file=sys.stderr)
    dirs = [run_dir(out, c.schedule, c.seed) for c in configs]
    if jobs <= 1 or len(configs) == 1:
        return [_run_here(c, d, arrays, resume, progress) for c, d in zip(configs, dirs)]
    configs = [dataclasses.replace(c, threads=resolved_settings(c, jobs)["threads"]) for c in configs]
    return _run_processes(configs, dirs, arrays, jobs, resume, progress)


def _run_here(config, folder, arrays, resume, progress) -> dict:
    try:
        return summary(train_run(config, folder, arrays, resume=resume, progress=progress))
    except TrainingDiverged as err:
        return {"out": str(folder), "status": "diverged", "epochs_done": None, "message": str(err), "final": None}
    except RunLocked as err:
        return {"out": str(folder), "status": "locked", "epochs_done": None, "message": str(err), "final": None}


#: exit codes of a worker process (and of the CLI).
EXIT_DIVERGED, EXIT_LOCKED = 3, 4


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel sends SIGTERM to this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(128 + signal.SIGTERM)


def _worker(config: TrainConfig, folder: str, resume: bool, progress: bool, position: int, gpu: str | None,
            shared: dict | None, parent: int) -> None:
    _die_with_parent(parent)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu  # before CUDA is initialised in this process
    with handle_signals():
        try:
            arrays, shm = attach_arrays(shared) if shared else (None, None)
            train_run(config, folder, arrays, resume=resume, progress=progress, position=position)
        except TrainingDiverged as err:
            print(err, file=sys.stderr)
            sys.exit(EXIT_DIVERGED)
        except RunLocked as err:
            print(err, file=sys.stderr)
            sys.exit(EXIT_LOCKED)
        except KeyboardInterrupt as err:
            sys.exit(exit_code(err))


def _run_processes(configs, dirs, arrays, jobs, resume, progress) -> list[dict]:
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    uses_cuda = any(torch.device(resolved_settings(c)["device"]).type == "cuda" and c.device in ("auto", "cuda")
                    for c in configs)
    gpus = worker_gpus(jobs) if uses_cuda else [None] * jobs
    shm, shared = share_arrays(arrays)
    pending, running, codes, free = list(range(len(configs))), {}, {}, list(range(jobs))
    try:
        while pending or running:
            while pending and free:
                slot, i = free.pop(0), pending.pop(0)
                p = ctx.Process(target=_worker, args=(configs[i], str(dirs[i]), resume, progress, slot, gpus[slot],
                                                      shared, os.getpid()), daemon=False)
                p.start()
                running[p.sentinel] = (p, i, slot)
            for sentinel in wait(list(running)):
                p, i, slot = running.pop(sentinel)
                p.join()
                codes[i] = p.exitcode
                free.append(slot)
    except KeyboardInterrupt:
        for p, _, _ in running.values():
            p.terminate()  # SIGTERM: each worker records "interrupted" and exits
        for p, _, _ in running.values():
            p.join(timeout=120)
        raise
    finally:
        if shm is not None:
            shm.close()
            shm.unlink()
    results = []
    for i, d in enumerate(dirs):
        r = summary_from_folder(d)
        if codes.get(i) == EXIT_LOCKED:
            r.update(status="locked", message=f"{d} is being trained by another process")
        elif codes.get(i) not in (0, EXIT_DIVERGED):
            r.update(status="failed", message=f"worker exited with code {codes.get(i)}; see its output above")
        results.append(r)
    return results


# ----------------------------------------------------------------------------- the data in shared memory
_ARRAYS = ("x_train", "y_train", "x_test", "y_test")


def share_arrays(arrays: CifarArrays):
    """Copy the four arrays into one shared-memory block: ``(shm, handle)`` for :func:`attach_arrays`.

    ``(None, None)`` when ``/dev/shm`` has no room (a container's default is 64 MB): workers then load
    the data themselves.
    """
    from multiprocessing import shared_memory

    parts = [np.ascontiguousarray(getattr(arrays, k)) for k in _ARRAYS]
    size = sum(a.nbytes for a in parts)
    try:
        if shutil.disk_usage("/dev/shm").free < 2 * size:
            return None, None
    except OSError:
        return None, None
    shm = shared_memory.SharedMemory(create=True, size=size)
    layout, offset = {}, 0
    for k, a in zip(_ARRAYS, parts):
        np.ndarray(a.shape, a.dtype, buffer=shm.buf, offset=offset)[...] = a
        layout[k] = (offset, a.shape, a.dtype.str)
        offset += a.nbytes
    meta = {"source": arrays.source, "kind": arrays.kind, "files": dict(arrays.files), "sha256": arrays.sha256}
    return shm, {"name": shm.name, "layout": layout, "meta": meta}


def attach_arrays(handle: dict):
    """The :class:`CifarArrays` of :func:`share_arrays`' block (no copy); keep the returned ``shm`` open while used."""
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(name=handle["name"])
    views = {k: np.ndarray(shape, np.dtype(dtype), buffer=shm.buf, offset=offset)
             for k, (offset, shape, dtype) in handle["layout"].items()}
    return CifarArrays(**views, **handle["meta"]), shm


# ----------------------------------------------------------------------------- a cluster, through submitit
class RunJob:
    """One run as a submitit job: trains (or resumes) it; ``checkpoint`` requeues it with ``resume=True``."""

    def __init__(self, config: TrainConfig, folder: str, resume: bool):
        self.config, self.folder, self.resume = config, folder, resume

    def __call__(self) -> dict:
        try:
            return summary(train_run(self.config, self.folder, resume=self.resume, progress=False))
        except TrainingDiverged as err:
            return {"out": self.folder, "status": "diverged", "epochs_done": None, "message": str(err), "final": None}

    def checkpoint(self, *args, **kwargs):
        """Called by submitit on preemption or timeout: the same run again, resuming from its last checkpoint."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(RunJob(self.config, self.folder, resume=True))


def submit(configs: list[TrainConfig], out, *, cluster: str = "slurm", resume: bool = False, wait: bool = True,
           folder=None, timeout_min: int = 60, gpus_per_run: int = 0, partition: str | None = None,
           account: str | None = None, cpus_per_run: int | None = None) -> list[dict]:
    """Check the sweep (:func:`prepare`), then submit each run as one job of a submitit job array.

    ``cluster``: ``"slurm"`` or ``"local"`` (submitit's local executor: subprocesses of this machine).
    ``folder``: submitit's logs and pickles (default ``<out>/.submitit``).  ``wait=True`` waits for
    every job and returns their summaries; otherwise returns ``{"job_id": ...}`` per run.
    """
    try:
        import submitit
    except ImportError:
        raise ValueError("--launcher submitit needs the submitit package (pip install submitit, pinned in "
                         "requirements.txt)") from None
    arrays, notes = prepare(configs, out, resume=resume)
    for note in notes:
        print(note, file=sys.stderr)
    try:
        executor = submitit.AutoExecutor(folder=Path(folder or Path(out) / ".submitit") / "%j", cluster=cluster)
    except RuntimeError as err:  # e.g. no srun/sbatch: not on a SLURM cluster
        raise ValueError(f"--cluster {cluster}: {err}") from None
    params = {"timeout_min": timeout_min, "gpus_per_node": gpus_per_run, "name": "explr-cifar10"}
    if cpus_per_run:
        params["cpus_per_task"] = cpus_per_run
    if cluster == "slurm":
        params.update({k: v for k, v in (("slurm_partition", partition), ("slurm_account", account)) if v})
    executor.update_parameters(**params)
    with executor.batch():
        jobs = [executor.submit(RunJob(c, str(run_dir(out, c.schedule, c.seed)), resume)) for c in configs]
    if not wait:
        return [{"out": str(run_dir(out, c.schedule, c.seed)), "job_id": j.job_id} for c, j in zip(configs, jobs)]
    results = []
    for c, j in zip(configs, jobs):
        try:
            results.append(j.result())
        except Exception as err:  # the job failed: submitit re-raises its error with the job's traceback
            last = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            results.append({"out": str(run_dir(out, c.schedule, c.seed)), "status": "failed", "epochs_done": None,
                            "message": f"job {j.job_id}: {last}", "final": None})
    return results
