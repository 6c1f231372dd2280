"""Many runs: every run checked before any starts (:func:`prepare`), then trained here (:func:`run_many`,
:func:`run_plan`: worker i on GPU i mod G) or as submitit jobs on their own nodes (:func:`submit`)."""
from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing.connection
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from .config import JOBS, TrainConfig, resolved_settings, worker_gpus, workers
from .data import CifarArrays, load_cifar10
from .runfolder import (MANIFEST, METRICS, DiskFull, RunError, RunLocked, RunState, Status, check_folder,
                        check_writable, exit_code, handle_signals, read_manifest, read_metrics, run_dir)
from .runs import PreparedRun, RunResult, TrainingDiverged, prepare_run, train_prepared


def check_before_data(configs: list[TrainConfig], out, *, resume: bool = False, jobs: int = 1,
                      skip_locked: bool = False, here: bool = True) -> list[dict]:
    """:func:`prepare`'s checks that need no data; each config's resolved settings (``here=False``: as given)."""
    if not configs:
        raise ValueError("no runs: give at least one --schedule and --seed")
    if not JOBS.ok(jobs):
        raise ValueError(f"jobs (--jobs) must be {JOBS.rule()}; got {jobs!r}")
    dirs = [run_dir(out, c.validate().schedule, c.seed) for c in configs]
    if len(set(dirs)) != len(dirs):
        raise ValueError("two runs would share a folder: give each (schedule, seed) once")
    resolved = [resolved_settings(c, jobs, here=here) for c in configs]  # --device cuda without CUDA fails here
    check_writable(out)
    for d in dirs:
        with contextlib.suppress(*([RunLocked] if skip_locked else [])):
            check_folder(d, resume)
    return resolved


def prepare(configs: list[TrainConfig], out, *, arrays: CifarArrays | None = None, resume: bool = False,
            jobs: int = 1, skip_locked: bool = False, progress: bool = True, here: bool = True):
    """Check every run of the sweep; creates nothing.  ``(arrays, runs)``: the data (loaded once if
    not given), each config's :class:`~explr.cifar10.runs.PreparedRun` (``skip_locked``: or its :class:`RunLocked`)."""
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
    return arrays, runs


def run_many(configs: list[TrainConfig], out, *, arrays: CifarArrays | None = None, jobs: int = 1,
             resume: bool = False, progress: bool = True, deadline: float | None = None,
             log_file: str | None = None) -> list[RunResult]:
    """Train every config into ``run_dir(out, schedule, seed)``, up to ``jobs`` at once, all checked first; one
    :class:`~explr.cifar10.runs.RunResult` per run, in order (``deadline``, ``log_file``: docs/cifar10-engine.md)."""
    return run_plan({"": configs}, out, arrays=arrays, jobs=jobs, resume=resume, progress=progress,
                    deadline=deadline, log_file=log_file)


def run_plan(plan: dict[str, list[TrainConfig]], out, *, arrays: CifarArrays | None = None, jobs: int = 1,
             resume: bool = False, progress: bool = True, deadline: float | None = None,
             log_file: str | None = None) -> list[RunResult]:
    """:func:`run_many` of a plan (:func:`~explr.cifar10.config.experiment_plan`): ``name``'s runs in ``out/name``."""
    runs = []
    for name, group in plan.items():
        arrays, prepared = prepare(group, Path(out) / name, arrays=arrays, resume=resume, jobs=jobs, progress=progress)
        runs += prepared
    if not runs:
        return []
    devices = [torch.device(run.resolved["device"]) for run in runs]
    pool = workers(jobs, len(runs), next((d for d in devices if d.type == "cpu"), devices[0]))
    if pool < min(jobs, len(runs)):
        print(f"--jobs {jobs}: {pool} runs at a time, as many as the CPUs this process may use (each run on the CPU "
              "needs one)", file=sys.stderr)
    if pool > 1 or deadline is not None or log_file is not None:
        return _run_processes(runs, arrays, pool, progress, deadline, log_file)
    return [_trained(run, arrays, progress=progress) for run in runs]  # DiskFull stops the sweep


def _trained(run: PreparedRun, arrays, stops_run=(TrainingDiverged, RunError), **kwargs) -> RunResult:
    """:func:`train_prepared`'s result, or that of an error in ``stops_run``: diverged, disk full, "locked" (taken)."""
    try:
        return train_prepared(run, arrays, **kwargs)
    except stops_run as err:
        kinds = ((TrainingDiverged, Status.DIVERGED), (DiskFull, Status.DISK_FULL), (RunError, Status.LOCKED))
        return RunResult(run.folder, next(s for kind, s in kinds if isinstance(err, kind)), None, str(err))


def _worker(run: PreparedRun, progress: bool, position: int, gpu: str | None, shared: tuple | None, parent: int,
            log_file: str | None = None) -> None:
    if sys.platform.startswith("linux"):  # the kernel sends SIGTERM to this process when its parent dies
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(128 + signal.SIGTERM)
    if log_file is not None:  # this run's output, the C libraries' too, into its folder
        run.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(run.folder / log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu  # before CUDA is initialised in this process
    with handle_signals():
        try:
            arrays = CifarArrays(**{k: t.numpy() for k, t in shared[0].items()}, **shared[1]) if shared else None
            result = _trained(run, arrays, (TrainingDiverged, RunError, DiskFull), progress=progress, position=position)
        except KeyboardInterrupt as err:
            sys.exit(exit_code(err))
    if result.status.exit_code:  # the parent reads the status from the exit code, its line from here
        print(result.message, file=sys.stderr)
        sys.exit(result.status.exit_code)


def _run_processes(runs, arrays, jobs, progress, deadline=None, log_file=None) -> list[RunResult]:
    """Train ``runs`` in ``jobs`` spawned workers, stopped (SIGTERM: "interrupted") at ``deadline`` or a Ctrl-C."""
    ctx = multiprocessing.get_context("spawn")
    uses_cuda = any(torch.device(run.resolved["device"]).type == "cuda" and run.config.device in ("auto", "cuda")
                    for run in runs)
    gpus = worker_gpus(jobs) if uses_cuda else [None] * jobs
    shared = share_arrays(arrays)
    pending, running, codes, free, stopped = list(range(len(runs))), {}, {}, list(range(jobs)), set()
    try:
        while pending or running:
            if deadline is not None and time.time() >= deadline and not stopped:
                pending, stopped = [], {i for _, i, _ in running.values()}
                for p, _, _ in running.values():
                    p.terminate()
            while pending and free:
                slot, i = free.pop(0), pending.pop(0)
                p = ctx.Process(target=_worker, args=(runs[i], progress, slot, gpus[slot], shared, os.getpid(),
                                                      log_file))
                p.start()
                running[p.sentinel] = (p, i, slot)
            left = None if deadline is None or stopped else max(0.0, deadline - time.time())
            for sentinel in multiprocessing.connection.wait(list(running), timeout=left):
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
    return [_folder_result(run.folder, codes[i] if i in codes and i not in stopped else None)
            for i, run in enumerate(runs)]


def _folder_result(folder, code: int | None = None) -> RunResult:
    """A run another process trained, as its files tell it, unless its worker's exit ``code`` says otherwise."""
    folder = Path(folder)
    try:
        m = read_manifest(folder / MANIFEST)
        rows = read_metrics(folder, drop_partial_last=True) if (folder / METRICS).exists() else []
        r = RunResult(folder, Status(m.get("status", Status.RUNNING)), m.get("epochs_done", len(rows)),
                      m.get("message", ""), rows)
    except (OSError, RunError):
        r = RunResult(folder, Status.NOT_STARTED, 0)
    said = None if code is None else Status.from_exit_code(code)
    if said in (Status.LOCKED, Status.DISK_FULL, Status.FAILED) and said is not r.status:
        return dataclasses.replace(r, status=said, message=f"{folder}: its worker exited with code {code} ({said}); "
                                   "see its output above")
    return r


def share_arrays(arrays: CifarArrays) -> tuple[dict, dict] | None:
    """``arrays`` as shared-memory tensors and the rest, for spawned workers; ``None`` where ``/dev/shm`` is full."""
    names = ("x_train", "y_train", "x_test", "y_test")
    with contextlib.suppress(OSError):
        if shutil.disk_usage("/dev/shm").free > 2 * sum(getattr(arrays, k).nbytes for k in names):
            meta = {"source": arrays.source, "kind": arrays.kind, "files": dict(arrays.files), "sha256": arrays.sha256}
            return {k: torch.tensor(getattr(arrays, k)).share_memory_() for k in names}, meta
    return None


def check_launcher(launcher: str, *, jobs: int = 1, cluster: str | None = None, partition: str | None = None,
                   account: str | None = None, gpus_per_run: int = 0, cpus_per_run: int | None = None,
                   wait: bool = True, timeout_min: int | None = None) -> None:
    """Refuse, in one ``ValueError`` line, options the chosen launcher would ignore (``None``: not given)."""
    if launcher == "submitit" and jobs != 1:
        raise ValueError("--jobs is for --launcher local: with --launcher submitit every run is its own job, and the "
                         "cluster decides how many run at once")
    if launcher == "submitit" and cluster == "local" and (partition or account):
        raise ValueError("--partition and --account are SLURM's: they mean nothing with --cluster local")
    given = {"--cluster": cluster is not None, "--partition": partition, "--account": account,
             "--gpus-per-run": gpus_per_run, "--cpus-per-run": cpus_per_run, "--time": timeout_min is not None,
             "--no-wait": not wait}
    if launcher != "submitit" and any(given.values()):
        raise ValueError(f"{', '.join(f for f, v in given.items() if v)} only apply to --launcher submitit (this "
                         "sweep trains here)")


def check_gpus(configs: list[TrainConfig], gpus_per_run: int) -> None:
    """``--device cuda[:N]`` needs ``gpus_per_run`` > N (a job sees only the GPUs it asks for); else a ValueError."""
    for c in configs:
        if c.validate().device.startswith("cuda") and int(c.device[5:] or 0) >= gpus_per_run:
            raise ValueError(f"device (--device) {c.device!r}: the jobs ask for {gpus_per_run} GPU(s) "
                             f"(--gpus-per-run); give --gpus-per-run {int(c.device[5:] or 0) + 1} or more")


@dataclasses.dataclass
class RunJob:
    """A prepared run as a submitit job: its data, device, precision and threads resolved on its node."""

    run: PreparedRun

    def __call__(self) -> RunResult:
        c = self.run.config
        arrays = load_cifar10(c.data, c.data_root, progress=False, batch_size=c.batch_size)
        here = dataclasses.replace(self.run, resolved=resolved_settings(c))  # checked again under the lock
        return _trained(here, arrays, (TrainingDiverged, RunError, DiskFull), progress=False)

    def checkpoint(self, *args, **kwargs):
        """Called by submitit on preemption or timeout: the same run again, resuming from its last checkpoint."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(RunJob(dataclasses.replace(self.run, resume=True)))


def submit(configs: list[TrainConfig], out, *, cluster: str = "slurm", resume: bool = False, wait: bool = True,
           timeout_min: int = 60, gpus_per_run: int = 0, partition: str | None = None,
           account: str | None = None, cpus_per_run: int | None = None) -> list[RunResult]:
    """Check the sweep (but for what the node resolves), then submit each run but the finished and "locked" ones as a
    job of a submitit array on ``cluster`` (``"slurm"``, or ``"local"``: processes here); one :class:`RunResult` per
    run once every job ended, or (``wait=False``) at once with its ``job_id``.  Ctrl-C cancels local jobs."""
    try:
        import submitit
    except ImportError:
        raise ValueError("--launcher submitit needs the submitit package (pip install submitit, pinned in "
                         "requirements.txt)") from None
    check_launcher("submitit", cluster=cluster, partition=partition, account=account)
    check_gpus(configs, gpus_per_run)
    _, runs = prepare(configs, out, resume=resume, skip_locked=True, progress=False, here=False)
    dirs = [run_dir(out, c.schedule, c.seed) for c in configs]
    results = [None] * len(runs)  # those of the runs not submitted: held by a live process, or finished
    for i, (d, r) in enumerate(zip(dirs, runs)):
        if isinstance(r, RunLocked):
            results[i] = RunResult(d, Status.LOCKED, None, str(r))
        elif r.check.state is RunState.FINISHED:
            results[i] = dataclasses.replace(_folder_result(d), status=Status.FINISHED)
    todo = [i for i, r in enumerate(results) if r is None]
    if not todo:
        return results
    if cluster == "slurm":
        asked = {"time": timeout_min, "partition": partition, "account": account, "gpus-per-node": gpus_per_run,
                 "cpus-per-task": cpus_per_run}
        flags = [f"--{name}={value}" for name, value in asked.items() if value]
        try:  # would SLURM run these jobs? (--test-only submits nothing)
            r = subprocess.run(["sbatch", "--test-only", *flags, "--wrap=true"], capture_output=True, text=True,
                               timeout=60)
        except (OSError, subprocess.TimeoutExpired) as err:  # no sbatch (not a SLURM cluster?), or no answer
            raise ValueError(f"--cluster slurm: sbatch failed ({err}); --cluster local runs the jobs here") from None
        if r.returncode != 0:
            lines = [line.strip() for line in (r.stderr + r.stdout).splitlines() if line.strip()]
            lines = lines or [f"exit code {r.returncode}"]
            reason = next((line.split("error:", 1)[1].strip() for line in lines if "error:" in line), lines[0])
            raise ValueError(f"--cluster slurm: SLURM refuses these jobs ({' '.join(flags)}): {reason}")
    try:  # a plain folder: submitit puts %j in file names (a "%j" folder would stay literal for local jobs)
        executor = submitit.AutoExecutor(folder=Path(out) / ".submitit", cluster=cluster)
    except RuntimeError as err:  # e.g. no srun: not on a SLURM cluster
        raise ValueError(f"--cluster {cluster}: {err}") from None
    slurm = {"slurm_partition": partition, "slurm_account": account} if cluster == "slurm" else {}
    executor.update_parameters(timeout_min=timeout_min, gpus_per_node=gpus_per_run, name="explr-cifar10", **slurm,
                               **({"cpus_per_task": cpus_per_run} if cpus_per_run else {}))
    with executor.batch():
        jobs = dict(zip(todo, [executor.submit(RunJob(runs[i])) for i in todo]))
    if not wait:
        return [r or RunResult(dirs[i], Status.SUBMITTED, job_id=jobs[i].job_id) for i, r in enumerate(results)]
    ended = _wait_for(jobs, dirs, cluster)
    return [r or ended[i] for i, r in enumerate(results)]


def _wait_for(jobs: dict, dirs: list, cluster: str) -> dict:
    """{index: result} of every job once each wrote its result or (``sacct`` answering) ended without one."""
    pending, results, why = dict(jobs), {}, ""
    if cluster == "slurm":  # does SLURM's accounting answer for the jobs?
        try:
            r = subprocess.run(["sacct", "-n", "-X", "-j", jobs[min(jobs)].job_id], capture_output=True, text=True,
                               timeout=60)
            why = "" if r.returncode == 0 else (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[0]
        except (OSError, subprocess.TimeoutExpired) as err:
            why = str(err)
    if why:
        print(f"sacct does not answer ({why}): a job killed before it writes its result (scancel, a node failure) "
              "is not seen, and the wait ends when every job has written one (Ctrl-C stops waiting)", file=sys.stderr)
    try:
        while pending:
            for i, job in list(pending.items()):
                if job.paths.result_pickle.exists() or (not why and job.done()):
                    results[i] = _outcome(dirs[i], pending.pop(i))
            time.sleep(1 if pending else 0)
    except KeyboardInterrupt:
        if cluster != "local":
            print(f"the SLURM jobs keep running; scancel {' '.join(j.job_id for j in pending.values())} stops them",
                  file=sys.stderr)
            raise
        for job in pending.values():  # the jobs are processes of this machine: they end with this one
            job.cancel(check=False)
        deadline = time.monotonic() + 60
        while any(not job.done() for job in pending.values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        raise
    return results


def _outcome(folder, job) -> RunResult:
    """The job's result; a job that failed (its traceback's last line) or ended without one is "failed"."""
    from submitit.core.utils import FailedJobError, UncompletedJobError

    try:
        return job.result()
    except FailedJobError as err:  # submitit's message: the job's traceback between two dashed lines, then log paths
        parts = str(err).split("-" * 22)
        lines = (parts[1] if len(parts) >= 3 else str(err)).strip().splitlines()
        message = f"job {job.job_id}: {lines[-1].strip() if lines else type(err).__name__}"
    except UncompletedJobError:  # killed
        message = f"job {job.job_id} ended ({job.state}) without a result; its log: {job.paths.stderr}"
    return RunResult(Path(folder), Status.FAILED, None, message)
