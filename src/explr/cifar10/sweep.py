"""Many runs: everything checked before anything starts, then trained here, in worker processes, or on a cluster.

:func:`~explr.cifar10.preflight.prepare` checks every run of a sweep before the first one starts.

:func:`run_many` then trains the runs one after the other (``jobs=1``) or ``jobs`` at a time as
separate processes (at most one per run, and on the CPU one per CPU: :func:`~explr.cifar10.hardware.workers`).  Workers get the data the parent loaded through shared memory (when ``/dev/shm``
has room), worker i gets GPU i mod G (``CUDA_VISIBLE_DEVICES``), and a worker dies with its parent
(``PR_SET_PDEATHSIG``); SIGINT/SIGTERM of the parent stop the workers, whose runs record "interrupted".

:func:`run_plan` trains a plan of several experiments (:mod:`~explr.cifar10.plans`) in one pool.
:func:`explr.cifar10.cluster.submit` sends each run as its own submitit job instead.
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

from .arrays import CifarArrays
from .config import TrainConfig
from .hardware import worker_gpus, workers
from .files import DiskFull
from .lock import exit_code, handle_signals
from .preflight import prepare
from .prepared import PreparedRun
from .runs import SWEEP_GOES_ON, RunResult, train_prepared
from .status import Status

__all__ = ["run_many", "run_plan", "share_arrays", "attach_arrays"]


# ----------------------------------------------------------------------------- several runs on this machine
def run_many(configs: list[TrainConfig], out, *, arrays: CifarArrays | None = None, jobs: int = 1,
             resume: bool = False, progress: bool = True, deadline: float | None = None,
             log_file: str | None = None) -> list[RunResult]:
    """Train every config into ``run_dir(out, schedule, seed)``; ``jobs > 1`` trains up to that many at once.

    Everything is checked first (:func:`~explr.cifar10.preflight.prepare`).  A diverged run is reported and the
    others go on, and so is a run whose folder another process took after the check (status "locked");
    ``KeyboardInterrupt`` (SIGINT, or :class:`~explr.cifar10.lock.Terminated` for SIGTERM under
    :func:`~explr.cifar10.lock.handle_signals`) stops the sweep after the running runs recorded it.
    Returns one :class:`~explr.cifar10.runs.RunResult` per run, in order.

    ``deadline`` (a ``time.time()``): then the runs still training are stopped (SIGTERM: they record
    "interrupted" and keep the checkpoint of their last epoch, ``resume=True`` continues them) and no further
    run starts (those stay "not started").  ``log_file``: each run's output goes to that file in its folder
    instead of this process's.  Either trains every run in a worker process, also with ``jobs=1``.
    """
    arrays, runs = _prepare(configs, out, arrays, resume, jobs, progress)
    return _train_all(runs, arrays, jobs, progress, deadline, log_file)


def run_plan(plan: dict[str, list[TrainConfig]], out, *, arrays: CifarArrays | None = None, jobs: int = 1,
             resume: bool = False, progress: bool = True, deadline: float | None = None,
             log_file: str | None = None) -> list[RunResult]:
    """:func:`run_many` of a plan (:mod:`explr.cifar10.plans`): experiment ``name``'s runs train into
    ``<out>/<name>/``, every experiment checked (:func:`~explr.cifar10.preflight.prepare`, the data loaded once)
    before any run starts, and all trained in one pool of ``jobs`` processes.  Returns one
    :class:`~explr.cifar10.runs.RunResult` per run, in plan order."""
    runs = []
    for name, group in plan.items():
        arrays, prepared = _prepare(group, Path(out) / name, arrays, resume, jobs, progress)
        runs += prepared
    return _train_all(runs, arrays, jobs, progress, deadline, log_file)


def _prepare(configs, out, arrays, resume, jobs, progress) -> tuple[CifarArrays, list[PreparedRun]]:
    """:func:`~explr.cifar10.preflight.prepare` the runs into ``out``, showing its notes; returns the data and the
    prepared runs."""
    arrays, runs, notes = prepare(configs, out, arrays=arrays, resume=resume, jobs=jobs, progress=progress)
    for note in notes:
        print(note, file=sys.stderr)
    return arrays, runs


def _train_all(runs: list[PreparedRun], arrays, jobs, progress, deadline, log_file) -> list[RunResult]:
    """Train the prepared runs: here, one after the other, or in a pool of worker processes
    (:func:`~explr.cifar10.hardware.workers`: no more than the runs, nor on the CPU than the CPUs).  Every run's
    threads are those of ``jobs`` runs at a time, as :func:`~explr.cifar10.preflight.prepare` resolved them, however
    many runs the sweep holds: a run trained alone resumes in a larger sweep with the same ``jobs``."""
    if not runs:
        return []
    devices = [torch.device(run.resolved["device"]) for run in runs]
    pool = workers(jobs, len(runs), next((d for d in devices if d.type == "cpu"), devices[0]))
    if pool < min(jobs, len(runs)):
        print(f"--jobs {jobs}: {pool} runs at a time, as many as the CPUs this process may use (each run on the CPU "
              "needs one)", file=sys.stderr)
    if pool == 1 and deadline is None and log_file is None:
        return [_run_here(run, arrays, progress) for run in runs]
    return _run_processes(runs, arrays, pool, progress, deadline, log_file)


def _run_here(run: PreparedRun, arrays, progress) -> RunResult:
    try:
        return train_prepared(run, arrays, progress=progress)
    except SWEEP_GOES_ON as err:
        return RunResult.of_error(run.folder, err)


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel sends SIGTERM to this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(128 + signal.SIGTERM)


def _worker(run: PreparedRun, progress: bool, position: int, gpu: str | None, shared: dict | None, parent: int,
            log_file: str | None = None) -> None:
    _die_with_parent(parent)
    folder = run.folder
    if log_file is not None:  # this run's output into its folder
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
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
            train_prepared(run, arrays, progress=progress, position=position)
        except (*SWEEP_GOES_ON, DiskFull) as err:  # the parent reads the status from the exit code
            result = RunResult.of_error(folder, err)
            print(result.message, file=sys.stderr)
            sys.exit(result.status.exit_code)
        except KeyboardInterrupt as err:
            sys.exit(exit_code(err))


def _run_processes(runs, arrays, jobs, progress, deadline=None, log_file=None) -> list[RunResult]:
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    uses_cuda = any(torch.device(run.resolved["device"]).type == "cuda" and run.config.device in ("auto", "cuda")
                    for run in runs)
    gpus = worker_gpus(jobs) if uses_cuda else [None] * jobs
    shm, shared = share_arrays(arrays)
    pending, running, codes, free, stopped = list(range(len(runs))), {}, {}, list(range(jobs)), set()
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
                p = ctx.Process(target=_worker, args=(runs[i], progress, slot, gpus[slot], shared, os.getpid(),
                                                      log_file), daemon=False)
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
    return [_pool_result(run.folder, codes[i] if i in codes and i not in stopped else None)
            for i, run in enumerate(runs)]


#: what a worker's exit code says where its run folder cannot tell (:meth:`Status.from_exit_code`); any other
#: status is the one its manifest records.
_POOL_SAYS = {Status.LOCKED: "{folder} was taken by another process meanwhile; see the worker's line above",
              Status.DISK_FULL: "{folder}: the disk filled up; see the worker's line above",
              Status.FAILED: "worker exited with code {code}; see its output above"}


def _pool_result(folder, code: int | None) -> RunResult:
    """The result of the run a worker trained into ``folder``: as its folder tells it, unless the worker's exit
    ``code`` says LOCKED, DISK_FULL or FAILED and the folder says otherwise (another process's run, a manifest the
    full disk kept from being written, a worker that died before recording anything).  ``code`` is ``None`` for a
    worker that never started or that the pool stopped itself."""
    r = RunResult.from_folder(folder)
    said = None if code is None else Status.from_exit_code(code)
    if said in _POOL_SAYS and said is not r.status:
        r = dataclasses.replace(r, status=said, message=_POOL_SAYS[said].format(folder=folder, code=code))
    return r


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
