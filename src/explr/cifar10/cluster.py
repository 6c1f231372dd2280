"""Many runs on a cluster, through submitit.

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
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .config import TrainConfig
from .files import DiskFull
from .lock import RunLocked
from .preflight import prepare
from .prepared import PreparedRun
from .runfolder import run_dir
from .runs import SWEEP_GOES_ON, RunResult, train_prepared
from .sources import load_cifar10
from .status import RunState, Status

__all__ = ["RunJob", "check_gpus", "check_launcher", "check_slurm", "submit", "train_on_node"]


# ----------------------------------------------------------------------------- a cluster, through submitit
def check_launcher(launcher: str, *, jobs: int = 1, cluster: str | None = None, partition: str | None = None,
                   account: str | None = None, gpus_per_run: int = 0, cpus_per_run: int | None = None,
                   wait: bool = True, timeout_min: int | None = None) -> None:
    """Refuse, in one ``ValueError`` line, options that the chosen launcher would silently ignore.

    ``cluster`` and ``timeout_min`` are ``None`` where they were not given (submitit's run with slurm and
    60 minutes then); given with ``launcher="local"``, like ``partition`` or ``wait=False``, they are refused."""
    if launcher == "submitit":
        if jobs != 1:
            raise ValueError("--jobs is for --launcher local: with --launcher submitit every run is its own job, "
                             "and the cluster decides how many run at once")
        if cluster == "local" and (partition or account):
            raise ValueError("--partition and --account are SLURM's: they mean nothing with --cluster local")
        return
    given = [flag for flag, value in (("--cluster", cluster is not None), ("--partition", partition),
                                      ("--account", account), ("--gpus-per-run", gpus_per_run),
                                      ("--cpus-per-run", cpus_per_run), ("--time", timeout_min is not None),
                                      ("--no-wait", not wait)) if value]
    if given:
        raise ValueError(f"{', '.join(given)} only apply to --launcher submitit (this sweep trains here)")


def check_gpus(configs: list[TrainConfig], gpus_per_run: int) -> None:
    """A job sees only the GPUs it asks for: ``--device cuda[:N]`` needs ``gpus_per_run`` > N (one ``ValueError``
    line otherwise).  Whether the node has them is the job's check, not the submitting host's."""
    for c in configs:
        c.validate()
        if c.device.startswith("cuda") and int(c.device[5:] or 0) >= gpus_per_run:
            raise ValueError(f"device (--device) {c.device!r}: the jobs ask for {gpus_per_run} GPU(s) "
                             f"(--gpus-per-run); give --gpus-per-run {int(c.device[5:] or 0) + 1} or more")


def train_on_node(run: PreparedRun) -> RunResult:
    """Train ``run``, prepared on the submitting host, on this node: the data loaded here (and checked to be the one
    it was prepared with), its device, precision and CPU threads this node's
    (:meth:`~explr.cifar10.prepared.PreparedRun.resolved_here`)."""
    c = run.config
    arrays = load_cifar10(c.data, c.data_root, progress=False, batch_size=c.batch_size)
    run.check_data(arrays)
    return train_prepared(run.resolved_here(), arrays, progress=False)


class RunJob:
    """One prepared run (:class:`~explr.cifar10.prepared.PreparedRun`) as a submitit job: trains (or resumes) it on
    its node (:func:`train_on_node`), a run a full disk stopped included (its result says "disk full", as the local
    pool's does); ``checkpoint`` requeues it with ``resume=True``."""

    def __init__(self, run: PreparedRun):
        self.run = run

    def __call__(self) -> RunResult:
        try:
            return train_on_node(self.run)
        except (*SWEEP_GOES_ON, DiskFull) as err:
            return RunResult.of_error(self.run.folder, err)

    def checkpoint(self, *args, **kwargs):
        """Called by submitit on preemption or timeout: the same run again, resuming from its last checkpoint (its
        folder changed since it was prepared, so it is checked again under the lock)."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(RunJob(dataclasses.replace(self.run, resume=True)))


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
           account: str | None = None, cpus_per_run: int | None = None) -> list[RunResult]:
    """Check the sweep (:func:`prepare`, all but what depends on the node: each job resolves its device, precision
    and threads itself), then submit each run as one job of a submitit job array.

    ``cluster``: ``"slurm"`` or ``"local"`` (submitit's local executor: subprocesses of this machine).  On
    SLURM the request (partition, account, GPUs, CPUs, time) is checked first (:func:`check_slurm`).
    ``folder``: submitit's logs and pickles (default ``<out>/.submitit``; files ``<job id>_...``).
    With ``resume``, finished runs are skipped and runs held by a live process (a job still running) are
    reported "locked"; neither is submitted.  ``wait=True`` waits for every job and returns one
    :class:`~explr.cifar10.runs.RunResult` per run; otherwise returns at once, with the ``job_id`` of each run
    submitted (status "submitted"; ``None`` for a run not submitted).  SIGINT
    or SIGTERM while waiting cancels the jobs of ``cluster="local"`` (they end with this process);
    SLURM jobs keep running.
    """
    try:
        import submitit
    except ImportError:
        raise ValueError("--launcher submitit needs the submitit package (pip install submitit, pinned in "
                         "requirements.txt)") from None
    check_launcher("submitit", cluster=cluster, partition=partition, account=account)
    check_gpus(configs, gpus_per_run)
    _, runs, notes = prepare(configs, out, resume=resume, skip_locked=True, progress=False, here=False)
    for note in notes:
        print(note, file=sys.stderr)
    dirs = [str(run_dir(out, c.schedule, c.seed)) for c in configs]
    results = [_skipped(d, run) for d, run in zip(dirs, runs)]
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
            submitted = [executor.submit(RunJob(runs[i])) for i in todo]
        jobs = dict(zip(todo, submitted))
    if not wait:
        return [r or RunResult(Path(dirs[i]), Status.SUBMITTED, job_id=jobs[i].job_id) for i, r in enumerate(results)]
    for i, r in _wait_for(jobs, dirs, cluster).items():
        results[i] = r
    return results


def _skipped(folder: str, run) -> RunResult | None:
    """The result of a run that :func:`submit` does not submit (finished, or held by a live process), else None."""
    if isinstance(run, RunLocked):
        return RunResult.of_error(folder, run)
    if run.state is RunState.FINISHED:
        return dataclasses.replace(RunResult.from_folder(folder), status=Status.FINISHED)
    return None


def _wait_for(jobs: dict, dirs: list[str], cluster: str) -> dict:
    """{index: result} of every job, when all have ended (submitit's ``job.result()``, which waits for its result
    file or, where SLURM keeps accounting, for ``sacct`` to say it ended); a job that failed is status "failed"."""
    results = {}
    try:
        for i, job in jobs.items():
            results[i] = _outcome(dirs[i], job)
    except KeyboardInterrupt:
        pending = [job for i, job in jobs.items() if i not in results]
        if cluster == "local":  # the jobs are processes of this machine: they end with this one
            for job in pending:
                job.cancel(check=False)
            deadline = time.monotonic() + 60
            while any(not job.done() for job in pending) and time.monotonic() < deadline:
                time.sleep(0.2)
        else:
            print(f"the SLURM jobs keep running; scancel {' '.join(j.job_id for j in pending)} stops them",
                  file=sys.stderr)
        raise
    return results


def _outcome(folder: str, job) -> RunResult:
    try:
        return job.result()
    except Exception as err:  # the job failed: submitit re-raises its error with the job's traceback
        message = _last_error_line(str(err)) or type(err).__name__
        return RunResult(Path(folder), Status.FAILED, None, f"job {job.job_id}: {message}")


def _last_error_line(text: str) -> str:
    """The last line of the job's traceback inside submitit's error message (which ends with log paths)."""
    parts = text.split("-" * 22)
    trace = parts[1] if len(parts) >= 3 else text
    lines = [line.strip() for line in trace.splitlines() if line.strip()]
    return lines[-1] if lines else ""
