"""Many runs: everything checked before anything starts, then trained here, in worker processes, or on a cluster.

:func:`prepare` (:mod:`~explr.cifar10.preflight`) checks every run of a sweep before the first one starts.

:func:`run_many` then trains the runs one after the other (``jobs=1``) or ``jobs`` at a time as
separate processes.  Workers get the data the parent loaded through shared memory (when ``/dev/shm``
has room), worker i gets GPU i mod G (``CUDA_VISIBLE_DEVICES``), and a worker dies with its parent
(``PR_SET_PDEATHSIG``); SIGINT/SIGTERM of the parent stop the workers, whose runs record "interrupted".

:func:`run_plan` trains a plan of several experiments (:mod:`~explr.cifar10.plans`) in one pool.  :func:`submit`
(:mod:`~explr.cifar10.cluster`) sends each run as its own submitit job instead.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

from .config import TrainConfig
from .data import CifarArrays
from .engine import TrainingDiverged
from .hardware import worker_gpus
from .cluster import RunJob, check_launcher, check_slurm, submit
from .preflight import prepare
from .runs import (
    EXIT_DISK_FULL,
    DiskFull,
    RunError,
    RunSummary,
    exit_code,
    handle_signals,
    resolved_settings,
    run_dir,
    summary,
    train_run,
)

__all__ = ["prepare", "run_many", "run_plan", "submit", "share_arrays", "attach_arrays", "check_launcher", "check_slurm",
           "RunJob"]


# ----------------------------------------------------------------------------- several runs on this machine
def run_many(configs: list[TrainConfig], out, *, arrays: CifarArrays | None = None, jobs: int = 1,
             resume: bool = False, progress: bool = True, deadline: float | None = None,
             log_file: str | None = None) -> list[dict]:
    """Train every config into ``run_dir(out, schedule, seed)``; ``jobs > 1`` trains that many at once.

    Everything is checked first (:func:`prepare`).  A diverged run is reported and the others go on, and
    so is a run whose folder another process took after the check (status "locked");
    ``KeyboardInterrupt`` (SIGINT, or :class:`~explr.cifar10.runs.Terminated` for SIGTERM under
    :func:`~explr.cifar10.runs.handle_signals`) stops the sweep after the running runs recorded it.
    Returns one summary dict per run (:class:`~explr.cifar10.runs.RunSummary`), in order.

    ``deadline`` (a ``time.time()``): then the runs still training are stopped (SIGTERM: they record
    "interrupted" and keep the checkpoint of their last epoch, ``resume=True`` continues them) and no further
    run starts (those stay "not started").  ``log_file``: each run's output goes to that file in its folder
    instead of this process's.  Either trains every run in a worker process, also with ``jobs=1``.
    """
    return run_plan({"": configs}, out, arrays=arrays, jobs=jobs, resume=resume, progress=progress,
                    deadline=deadline, log_file=log_file)


def run_plan(plan: dict[str, list[TrainConfig]], out, *, arrays: CifarArrays | None = None, jobs: int = 1,
             resume: bool = False, progress: bool = True, deadline: float | None = None,
             log_file: str | None = None) -> list[dict]:
    """:func:`run_many` of a plan (:mod:`explr.cifar10.plans`): experiment ``name``'s runs train into
    ``<out>/<name>/``, every experiment checked (:func:`prepare`, the data loaded once) before any run starts,
    and all trained in one pool of ``jobs`` processes.  Returns one summary dict per run, in plan order."""
    configs, dirs = [], []
    for name, group in plan.items():
        folder = Path(out) / name if name else out
        arrays, _, notes = prepare(group, folder, arrays=arrays, resume=resume, jobs=jobs, progress=progress)
        for note in notes:
            print(note, file=sys.stderr)
        configs += group
        dirs += [run_dir(folder, c.schedule, c.seed) for c in group]
    if (jobs <= 1 or len(configs) == 1) and deadline is None and log_file is None:
        return [_run_here(c, d, arrays, resume, progress) for c, d in zip(configs, dirs)]
    configs = [dataclasses.replace(c, threads=resolved_settings(c, jobs)["threads"]) for c in configs]
    return _run_processes(configs, dirs, arrays, max(jobs, 1), resume, progress, deadline, log_file)


def _run_here(config, folder, arrays, resume, progress) -> dict:
    try:
        return summary(train_run(config, folder, arrays, resume=resume, progress=progress))
    except TrainingDiverged as err:
        return RunSummary(str(folder), "diverged", None, str(err)).as_dict()
    except RunError as err:
        return RunSummary.taken(folder, err).as_dict()


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
            shared: dict | None, parent: int, log_file: str | None = None) -> None:
    _die_with_parent(parent)
    if log_file is not None:  # this run's output into its folder
        Path(folder).mkdir(parents=True, exist_ok=True)
        fd = os.open(Path(folder) / log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu  # before CUDA is initialised in this process
    with handle_signals():
        try:
            arrays, shm = attach_arrays(shared) if shared else (None, None)
            train_run(config, folder, arrays, resume=resume, progress=progress, position=position)
        except TrainingDiverged as err:
            print(err, file=sys.stderr)
            sys.exit(EXIT_DIVERGED)
        except RunError as err:  # the folder was taken by another process after the parent's check
            print(RunSummary.taken(folder, err).message, file=sys.stderr)
            sys.exit(EXIT_LOCKED)
        except DiskFull as err:
            print(err, file=sys.stderr)
            sys.exit(EXIT_DISK_FULL)
        except KeyboardInterrupt as err:
            sys.exit(exit_code(err))


def _run_processes(configs, dirs, arrays, jobs, resume, progress, deadline=None, log_file=None) -> list[dict]:
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    uses_cuda = any(torch.device(resolved_settings(c)["device"]).type == "cuda" and c.device in ("auto", "cuda")
                    for c in configs)
    gpus = worker_gpus(jobs) if uses_cuda else [None] * jobs
    shm, shared = share_arrays(arrays)
    pending, running, codes, free, stopped = list(range(len(configs))), {}, {}, list(range(jobs)), set()
    try:
        while pending or running:
            if deadline is not None and time.time() >= deadline:
                pending = []
                for p, i, _ in running.values():
                    if i not in stopped:
                        stopped.add(i)
                        p.terminate()  # SIGTERM: the worker records "interrupted" and exits
            while pending and free:
                slot, i = free.pop(0), pending.pop(0)
                p = ctx.Process(target=_worker, args=(configs[i], str(dirs[i]), resume, progress, slot, gpus[slot],
                                                      shared, os.getpid(), log_file), daemon=False)
                p.start()
                running[p.sentinel] = (p, i, slot)
            left = None if deadline is None or stopped else max(0.0, deadline - time.time())
            for sentinel in wait(list(running), timeout=left):
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
        r = RunSummary.from_folder(d)
        if codes.get(i) == EXIT_LOCKED:
            r = r.but(status="locked", message=f"{d} was taken by another process meanwhile; see the worker's line "
                                               "above")
        elif codes.get(i) == EXIT_DISK_FULL:
            r = r.but(status="disk full", message=f"{d}: the disk filled up; see the worker's line above")
        elif codes.get(i) not in (0, EXIT_DIVERGED) and i not in stopped and i in codes:
            r = r.but(status="failed", message=f"worker exited with code {codes.get(i)}; see its output above")
        results.append(r.as_dict())
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
