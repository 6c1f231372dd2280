"""Many runs: everything checked before anything starts, then trained here, in worker processes, or on a cluster.

:func:`prepare` checks every run of a sweep before the first one starts, and creates nothing: the
settings, the device, the output folder, the data (loaded once: readable, trainable, enough images for
the batch), every run's schedule (built for the real number of steps; an exponential one must start
below ``rescale_above``) and every run folder (:func:`explr.cifar10.runs.check_run`: lock, existing run,
corrupt files, resume compatibility; a file where a run's folder would go).  Any failure is one
``ValueError`` line.  A run folder that another process takes after these checks is reported as
"locked" (exit code 4), the other runs go on.

:func:`run_many` then trains the runs one after the other (``jobs=1``) or ``jobs`` at a time as
separate processes.  Workers get the data the parent loaded through shared memory (when ``/dev/shm``
has room), worker i gets GPU i mod G (``CUDA_VISIBLE_DEVICES``), and a worker dies with its parent
(``PR_SET_PDEATHSIG``); SIGINT/SIGTERM of the parent stop the workers, whose runs record "interrupted".

:func:`submit` sends each run as its own job through submitit (``cluster="slurm"`` or ``"local"``),
into the same folders with the same manifests.  A job always trains with the run lock and resumes
from the run's checkpoint when SLURM preempts or times it out and requeues it (``checkpoint``), so
submitting the same sweep again with ``--resume`` is idempotent: finished runs are skipped and runs
that jobs still hold are reported "locked", neither submitted again.  SLURM is asked first whether it
would run the jobs at all (:func:`check_slurm`), and :func:`check_launcher` refuses options that the
chosen launcher would ignore.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ..lr_scheduler import PerStepLR
from .config import TrainConfig, played_schedule, rescale_limit
from .data import CifarArrays, load_cifar10
from .engine import TrainingDiverged
from .hardware import worker_gpus
from .runs import (
    EXIT_DISK_FULL,
    DiskFull,
    RunError,
    RunLocked,
    RunSummary,
    check_run,
    check_writable,
    exit_code,
    handle_signals,
    resolved_settings,
    run_dir,
    summary,
    train_run,
)

__all__ = ["prepare", "run_many", "submit", "share_arrays", "attach_arrays"]


# ----------------------------------------------------------------------------- checks before anything starts
def _check_schedule(config: TrainConfig, arrays: CifarArrays) -> None:
    """Build ``config``'s schedule for the real number of steps, once (:func:`~explr.cifar10.config.played_schedule`
    checks it), and play it into a dummy optimizer; one ``ValueError`` line naming the run otherwise."""
    n = len(arrays.y_train)
    if config.batch_size > n:
        raise ValueError(f"batch_size (--batch-size) {config.batch_size} exceeds the {n} training images of "
                         f"{arrays.source}")
    where = f"schedule {config.schedule} (seed {config.seed}; --lr {config.lr:g}, --wd {config.wd:g}, --momentum " \
            f"{config.momentum:g}, --epochs {config.epochs})"
    try:
        played = played_schedule(config, n // config.batch_size)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0, momentum=config.momentum)
    try:
        PerStepLR(dummy, played, rescale_above=rescale_limit(config))
    except ValueError as err:
        raise ValueError(f"{where} cannot be played: {err}") from None


def prepare(configs: list[TrainConfig], out, *, arrays: CifarArrays | None = None, resume: bool = False,
            jobs: int = 1, skip_locked: bool = False, progress: bool = True):
    """Check every run of the sweep (module docstring); returns ``(arrays, checks, notes)``.  Creates nothing.

    ``arrays``: the data already in memory (else every config's ``data`` is loaded, once per source, with a
    decoding bar if ``progress``, and the largest batch checked against its size before anything is cached).
    ``checks``: per config, what :func:`~explr.cifar10.runs.check_run` found (``state`` "new", "resume" or
    "finished"); with ``skip_locked``, a run that a live process holds gets its :class:`RunLocked` error
    there instead of raising it.  ``notes`` are lines worth showing (stale locks).
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
        arrays = load_cifar10(data, root, progress=progress, batch_size=max(c.batch_size for c in configs))
    arrays.channel_stats  # noqa: B018  (constant images raise DataError)
    for c in configs:
        _check_schedule(c, arrays)
    checks = []
    for c, d, r in zip(configs, dirs, resolved):
        try:
            checks.append(check_run(c, d, arrays, resume, r))
        except RunLocked as err:
            if not skip_locked:
                raise
            checks.append(err)
    return arrays, checks, [c.note for c in checks if not isinstance(c, RunLocked) and c.note]


# ----------------------------------------------------------------------------- several runs on this machine
def run_many(configs: list[TrainConfig], out, *, arrays: CifarArrays | None = None, jobs: int = 1,
             resume: bool = False, progress: bool = True) -> list[dict]:
    """Train every config into ``run_dir(out, schedule, seed)``; ``jobs > 1`` trains that many at once.

    Everything is checked first (:func:`prepare`).  A diverged run is reported and the others go on, and
    so is a run whose folder another process took after the check (status "locked");
    ``KeyboardInterrupt`` (SIGINT, or :class:`~explr.cifar10.runs.Terminated` for SIGTERM under
    :func:`~explr.cifar10.runs.handle_signals`) stops the sweep after the running runs recorded it.
    Returns one summary dict per run (out, status, epochs_done, message, final metrics), in order.
    """
    arrays, _, notes = prepare(configs, out, arrays=arrays, resume=resume, jobs=jobs, progress=progress)
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
        return RunSummary(str(folder), "diverged", None, str(err)).as_dict()
    except RunError as err:
        return _taken(folder, err)


def _taken(folder, err: RunError) -> dict:
    """The summary of a run whose folder another process took (locked, or trained) after :func:`prepare`."""
    message = str(err) if isinstance(err, RunLocked) else f"taken meanwhile by another process: {err}"
    return RunSummary(str(folder), "locked", None, message).as_dict()


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
        except RunError as err:  # the folder was taken by another process after the parent's check
            print(_taken(folder, err)["message"], file=sys.stderr)
            sys.exit(EXIT_LOCKED)
        except DiskFull as err:
            print(err, file=sys.stderr)
            sys.exit(EXIT_DISK_FULL)
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
        r = RunSummary.from_folder(d)
        if codes.get(i) == EXIT_LOCKED:
            r = r.but(status="locked", message=f"{d} was taken by another process meanwhile; see the worker's line "
                                               "above")
        elif codes.get(i) == EXIT_DISK_FULL:
            r = r.but(status="disk full", message=f"{d}: the disk filled up; see the worker's line above")
        elif codes.get(i) not in (0, EXIT_DIVERGED):
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


# ----------------------------------------------------------------------------- a cluster, through submitit
def check_launcher(launcher: str, *, jobs: int = 1, cluster: str = "slurm", partition: str | None = None,
                   account: str | None = None, gpus_per_run: int = 0, cpus_per_run: int | None = None,
                   wait: bool = True) -> None:
    """Refuse, in one ``ValueError`` line, options that the chosen launcher would silently ignore."""
    if launcher == "submitit":
        if jobs != 1:
            raise ValueError("--jobs is for --launcher local: with --launcher submitit every run is its own job, "
                             "and the cluster decides how many run at once")
        if cluster == "local" and (partition or account):
            raise ValueError("--partition and --account are SLURM's: they mean nothing with --cluster local")
        return
    given = [flag for flag, value in (("--partition", partition), ("--account", account),
                                      ("--gpus-per-run", gpus_per_run), ("--cpus-per-run", cpus_per_run),
                                      ("--no-wait", not wait)) if value]
    if given:
        raise ValueError(f"{', '.join(given)} only apply to --launcher submitit (this sweep trains here)")


class RunJob:
    """One run as a submitit job: trains (or resumes) it; ``checkpoint`` requeues it with ``resume=True``."""

    def __init__(self, config: TrainConfig, folder: str, resume: bool):
        self.config, self.folder, self.resume = config, folder, resume

    def __call__(self) -> dict:
        try:
            return summary(train_run(self.config, self.folder, resume=self.resume, progress=False))
        except TrainingDiverged as err:
            return RunSummary(self.folder, "diverged", None, str(err)).as_dict()
        except RunError as err:
            return _taken(self.folder, err)

    def checkpoint(self, *args, **kwargs):
        """Called by submitit on preemption or timeout: the same run again, resuming from its last checkpoint."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(RunJob(self.config, self.folder, resume=True))


def _slurm_flags(partition, account, timeout_min, gpus_per_run, cpus_per_run) -> list[str]:
    flags = [f"--time={timeout_min}"]
    for name, value in (("partition", partition), ("account", account), ("gpus-per-node", gpus_per_run),
                        ("cpus-per-task", cpus_per_run)):
        if value:
            flags.append(f"--{name}={value}")
    return flags


def check_slurm(flags: list[str]) -> None:
    """Ask SLURM whether it would run a job with ``flags`` (``sbatch --test-only``: nothing is submitted).

    A missing ``sbatch``, an unknown partition or account, GPUs or CPUs the cluster does not have, or an
    unreachable controller is one ``ValueError`` line.
    """
    if not shutil.which("sbatch"):
        raise ValueError("--cluster slurm: there is no sbatch on this machine (not a SLURM cluster?); "
                         "--cluster local runs the jobs here")
    try:
        r = subprocess.run(["sbatch", "--test-only", *flags, "--wrap=true"], capture_output=True, text=True,
                           timeout=60)
    except subprocess.TimeoutExpired:
        raise ValueError("--cluster slurm: sbatch --test-only did not answer within 60 s") from None
    if r.returncode != 0:
        lines = [line.strip() for line in (r.stderr + r.stdout).splitlines() if line.strip()]
        errors = [line.split("error:", 1)[1].strip() for line in lines if "error:" in line]
        reason = (errors or lines or [f"exit code {r.returncode}"])[0]
        raise ValueError(f"--cluster slurm: SLURM refuses these jobs ({' '.join(flags)}): {reason}")


def submit(configs: list[TrainConfig], out, *, cluster: str = "slurm", resume: bool = False, wait: bool = True,
           folder=None, timeout_min: int = 60, gpus_per_run: int = 0, partition: str | None = None,
           account: str | None = None, cpus_per_run: int | None = None) -> list[dict]:
    """Check the sweep (:func:`prepare`), then submit each run as one job of a submitit job array.

    ``cluster``: ``"slurm"`` or ``"local"`` (submitit's local executor: subprocesses of this machine).  On
    SLURM the request (partition, account, GPUs, CPUs, time) is checked first (:func:`check_slurm`).
    ``folder``: submitit's logs and pickles (default ``<out>/.submitit``; files ``<job id>_...``).
    With ``resume``, finished runs are skipped and runs held by a live process (a job still running) are
    reported "locked"; neither is submitted.  ``wait=True`` waits for every job and returns one summary
    per run; otherwise returns at once, with ``job_id`` (None for a run not submitted) in each.  SIGINT
    or SIGTERM while waiting cancels the jobs of ``cluster="local"`` (they end with this process);
    SLURM jobs keep running.
    """
    try:
        import submitit
    except ImportError:
        raise ValueError("--launcher submitit needs the submitit package (pip install submitit, pinned in "
                         "requirements.txt)") from None
    check_launcher("submitit", cluster=cluster, partition=partition, account=account)
    _, checks, notes = prepare(configs, out, resume=resume, skip_locked=True, progress=False)
    for note in notes:
        print(note, file=sys.stderr)
    dirs = [str(run_dir(out, c.schedule, c.seed)) for c in configs]
    results = [_skipped(d, check) for d, check in zip(dirs, checks)]
    todo = [i for i, r in enumerate(results) if r is None]
    jobs = {}
    if todo:
        if cluster == "slurm":
            check_slurm(_slurm_flags(partition, account, timeout_min, gpus_per_run, cpus_per_run))
        try:  # a plain folder: submitit puts %j in file names (a "%j" folder would stay literal for local jobs)
            executor = submitit.AutoExecutor(folder=Path(folder or Path(out) / ".submitit"), cluster=cluster)
        except RuntimeError as err:  # e.g. no srun: not on a SLURM cluster
            raise ValueError(f"--cluster {cluster}: {err}") from None
        params = {"timeout_min": timeout_min, "gpus_per_node": gpus_per_run, "name": "explr-cifar10"}
        if cpus_per_run:
            params["cpus_per_task"] = cpus_per_run
        if cluster == "slurm":
            params.update({k: v for k, v in (("slurm_partition", partition), ("slurm_account", account)) if v})
        executor.update_parameters(**params)
        with executor.batch():
            submitted = [executor.submit(RunJob(configs[i], dirs[i], resume)) for i in todo]
        jobs = dict(zip(todo, submitted))
    if not wait:
        return [{**(r or RunSummary(dirs[i], "submitted").as_dict()),
                 "job_id": jobs[i].job_id if i in jobs else None} for i, r in enumerate(results)]
    for i, r in _wait_for(jobs, dirs, cluster).items():
        results[i] = r
    return results


def _skipped(folder: str, check) -> dict | None:
    """The summary of a run that :func:`submit` does not submit (finished, or held by a live process), else None."""
    if isinstance(check, RunLocked):
        return RunSummary(folder, "locked", None, str(check)).as_dict()
    return RunSummary.from_folder(folder).but(status="finished").as_dict() if check.state == "finished" else None


#: SLURM job states (``squeue -o %T``) of a job that may still produce a result.
_RUNNING = {"CONFIGURING", "COMPLETING", "PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "RUNNING",
            "SIGNALING", "STAGE_OUT", "SUSPENDED", "STOPPED", "RESV_DEL_HOLD"}


def _wait_for(jobs: dict, dirs: list[str], cluster: str) -> dict:
    """{index: summary} of every job, when all have ended; a job that failed is status "failed" with its error.

    A SLURM job has ended when its result file is there, or when ``squeue`` has said for 10 s that it ended
    without one (cancelled, killed).  (submitit would ask ``sacct``, which clusters without accounting, such
    as ``.ci/slurm-up``'s, do not have.)
    """
    pending, results, ended_since = dict(jobs), {}, {}
    try:
        while pending:
            for i, job in list(pending.items()):
                if job.paths.result_pickle.exists() if cluster == "slurm" else job.done():
                    results[i] = _outcome(dirs[i], job)
                    del pending[i]
            if cluster == "slurm" and pending:
                states = _squeue_states([job.job_id for job in pending.values()])
                for i, job in list(pending.items()):
                    state = states.get(job.job_id, "gone from squeue")
                    if state != "UNKNOWN" and state.split()[0] not in _RUNNING:
                        if time.monotonic() - ended_since.setdefault(i, time.monotonic()) > 10:  # and no result came
                            results[i] = _failed(dirs[i], job, f"ended ({state}) without a result; see "
                                                               f"{job.paths.stderr}")
                            del pending[i]
                    else:
                        ended_since.pop(i, None)
            time.sleep(1 if pending else 0)
    except KeyboardInterrupt:
        if cluster == "local":  # the jobs are processes of this machine: they end with this one
            for job in pending.values():
                job.cancel(check=False)
            deadline = time.monotonic() + 60
            while any(not job.done() for job in pending.values()) and time.monotonic() < deadline:
                time.sleep(0.2)
        else:
            print(f"the SLURM jobs keep running; scancel {' '.join(j.job_id for j in pending.values())} stops them",
                  file=sys.stderr)
        raise
    return results


def _squeue_states(job_ids: list[str]) -> dict:
    """{job id: state} of the jobs ``squeue`` still lists; every state is "UNKNOWN" if it does not answer."""
    try:
        r = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T", "-j", ",".join(job_ids)], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        r = None
    if r is None or r.returncode != 0:
        return dict.fromkeys(job_ids, "UNKNOWN")
    return dict(line.split(None, 1) for line in r.stdout.splitlines() if line.strip())


def _outcome(folder: str, job) -> dict:
    try:
        return job.result()
    except Exception as err:  # the job failed: submitit re-raises its error with the job's traceback
        return _failed(folder, job, _last_error_line(str(err)) or type(err).__name__)


def _failed(folder: str, job, message: str) -> dict:
    return RunSummary(folder, "failed", None, f"job {job.job_id}: {message}").as_dict()


def _last_error_line(text: str) -> str:
    """The last line of the job's traceback inside submitit's error message (which ends with log paths)."""
    parts = text.split("-" * 22)
    trace = parts[1] if len(parts) >= 3 else text
    lines = [line.strip() for line in trace.splitlines() if line.strip()]
    return lines[-1] if lines else ""
