"""``--launcher submitit --cluster slurm`` on a real SLURM cluster: job arrays, preemption, time limits, resume.

These tests need a SLURM cluster that answers (``.ci/slurm-up`` starts a one-node one on this machine,
and ``.ci/run`` does so around ``make test``); without one they skip, saying why, or fail under CI.  The jobs run the
same Python as the tests (submitit starts ``sys.executable``), on tiny synthetic runs, and write under
pytest's ``tmp_path`` (on one node the local disk is the shared filesystem).

To make a running job meet SLURM's signal at a known point, a test stops the job's process (SIGSTOP,
its pid is in the run's ``.lock``), lets SLURM signal it, sees the signal pending in ``/proc``, and
continues it.  A requeued job waits a few seconds before it starts again; the tests start it at once.
"""
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from explr.cifar10 import sweep
from explr.cifar10.__main__ import main
from explr.cifar10.config import TrainConfig
from explr.cifar10.runfolder import lock_holder
from explr.cifar10.runfolder import read_metrics
from explr.cifar10.runfolder import run_dir
from explr.cifar10.runs import train_run

from cifar10_helpers import CLI_TINY, TINY, reproducible, tiny_arrays, tiny_npz

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("one_thread")]
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")
EPOCHS = 4  # long enough to stop a job between two epochs, short enough for seconds per job
SCHEDULES = ("step", "texp", "cosine")


def _sh(*cmd) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout.strip()


@pytest.fixture(scope="module")
def partition(missing):
    """The default partition of the SLURM cluster here; skips the module when there is none that answers
    (fails under CI: tests/conftest.py, ``missing``)."""
    how = "as root, .ci/slurm-up starts a one-node cluster (Debian's slurmctld, slurmd, munge)"
    if not shutil.which("sbatch"):
        missing("a SLURM cluster (no sbatch on PATH)", how)
    r = subprocess.run(["sinfo", "-h", "-o", "%P %a"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0 or not r.stdout.strip():
        why = (r.stderr.strip().splitlines() or ["no partition"])[-1]
        missing(f"a SLURM cluster that answers (sinfo: {why})", how)
    names = [line.split()[0] for line in r.stdout.splitlines() if line.split()[1] == "up"]
    return next((n for n in names if n.endswith("*")), names[0]).rstrip("*")


def _config(schedule, npz):
    return TrainConfig(**{**TINY, "epochs": EPOCHS}, schedule=schedule, data=npz)


@pytest.fixture(scope="module")
def reference(npz, tmp_path_factory):
    """{schedule: metrics} of each run trained here, in this process, without interruption."""
    out = tmp_path_factory.mktemp("here")
    return {s: train_run(_config(s, npz), run_dir(out, s, 0), progress=False).metrics for s in SCHEDULES}


def _cli(npz, out, partition, *schedules):
    return ["--schedule", *schedules, "--data", npz, "--out", str(out), *CLI_TINY, "--epochs", str(EPOCHS),
            "--launcher", "submitit", "--cluster", "slurm", "--partition", partition, "--time", "5"]


def _until(condition, what, timeout=60.0):
    t0 = time.monotonic()
    while not condition():
        assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.02)


def _stop_while_training(run) -> int:
    """SIGSTOP the job training ``run`` once it holds the run's lock and finished an epoch; returns its pid."""
    _until(lambda: lock_holder(run)[1] and (run / "metrics.jsonl").exists() and read_metrics(run), f"{run} training")
    pid = lock_holder(run)[0]
    os.kill(pid, signal.SIGSTOP)
    return pid


def _signalled(pid, sig) -> bool:
    """Whether ``sig`` reached the stopped process ``pid``: pending, or handled already (slurmstepd sends SIGCONT
    with the signals of a time limit, so the process may have run its handler and exited)."""
    try:
        status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status") if ":" in line)
    except FileNotFoundError:
        return True
    pending = int(status["ShdPnd"], 16) | int(status["SigPnd"], 16)
    return status["State"].split()[0] != "T" or bool(pending & (1 << (sig - 1)))


def _state(job_id) -> str:
    return _sh("squeue", "-h", "-r", "-o", "%T", "-j", job_id) or "gone"


def _requeued_and_released(job_id, *updates):
    """Wait until SLURM requeued ``job_id`` (it then waits ``cred_expire`` seconds), apply ``updates`` and start
    it at once."""
    _until(lambda: _state(job_id) == "PENDING", f"job {job_id} requeued")
    if updates:
        _sh("scontrol", "update", f"JobId={job_id}", *updates)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], capture_output=True, timeout=60)
    # (fails if the job started meanwhile: then there was nothing to release)


def _finished(run) -> bool:
    manifest = run / "manifest.json"
    return manifest.exists() and json.loads(manifest.read_text())["status"] == "finished" and not lock_holder(run)[1]


def test_a_sweep_is_one_job_array_with_the_metrics_of_the_runs_trained_here(partition, npz, reference, tmp_path,
                                                                            capsys):
    assert main(_cli(npz, tmp_path, partition, "step", "texp")) == 0
    assert capsys.readouterr().out.count("finished") == 2
    array_ids = {p.name.split("_")[0] for p in (tmp_path / ".submitit").glob("*_submitted.pkl")}
    assert len(array_ids) == 1 and not list(tmp_path.rglob("%j"))
    for s in ("step", "texp"):
        assert reproducible(read_metrics(run_dir(tmp_path, s, 0))) == reproducible(reference[s])


def _continue_after_the_signal(job_id, pid, *updates):
    """Once SLURM's SIGUSR2 reached the stopped job, continue it; once it requeued itself, start it again."""
    _until(lambda: _signalled(pid, signal.SIGUSR2), "SIGUSR2 from SLURM", timeout=45)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
    _requeued_and_released(job_id, *updates)


def _resumed_exactly(out, schedule, before, reference):
    """The run finished with the metrics of the uninterrupted run, its first epochs those of before the signal."""
    run = run_dir(out, schedule, 0)
    _until(lambda: _finished(run), f"{run} finished after the requeue")
    rows = read_metrics(run)
    assert reproducible(rows) == reproducible(reference[schedule])
    assert 0 < len(before) < EPOCHS and rows[:len(before)] == before  # the same rows, timings too: resumed
    assert "Requeued job" in "".join(p.read_text() for p in (out / ".submitit").glob("*_log.out"))


@pytest.fixture(scope="module", autouse=True)
def time_limited(partition, npz, tmp_path_factory):
    """A job whose time limit is cut to one minute while it trains (stopped between two epochs).

    SLURM signals it (submitit asks for SIGUSR2 90 s before the limit) when it next looks at time limits,
    every 30 s: the job is submitted before the other tests, which run meanwhile, and a thread continues and
    releases it (with its five minutes back, as a requeued job that was not cut has them).
    """
    out = tmp_path_factory.mktemp("time-limit")
    (job,) = sweep.submit([_config("texp", npz)], out, cluster="slurm", partition=partition, timeout_min=5,
                          wait=False)
    pid = _stop_while_training(run_dir(out, "texp", 0))
    before = read_metrics(run_dir(out, "texp", 0))
    _sh("scontrol", "update", f"JobId={job.job_id}", "TimeLimit=1")
    with ThreadPoolExecutor(1) as pool:
        yield out, before, pool.submit(_continue_after_the_signal, job.job_id, pid, "TimeLimit=5")


def test_a_preempted_job_checkpoints_requeues_and_resumes_from_its_last_epoch(partition, npz, reference, tmp_path):
    """The signal SLURM sends before it preempts a job (submitit's SIGUSR2), here from ``scancel --signal``."""
    (job,) = sweep.submit([_config("step", npz)], tmp_path, cluster="slurm", partition=partition, timeout_min=5,
                          wait=False)
    pid = _stop_while_training(run_dir(tmp_path, "step", 0))
    before = read_metrics(run_dir(tmp_path, "step", 0))
    _sh("scancel", "--signal=USR2", job.job_id)
    _continue_after_the_signal(job.job_id, pid)
    _resumed_exactly(tmp_path, "step", before, reference)


def test_no_wait_then_resume_while_jobs_run_reports_running_runs_locked_and_skips_finished_ones(partition, npz,
                                                                                                tmp_path, capsys):
    args = _cli(npz, tmp_path, partition, "step", "cosine")
    assert main([*args, "--no-wait"]) == 0
    assert capsys.readouterr().out.count(" job ") == 2
    step, cosine = run_dir(tmp_path, "step", 0), run_dir(tmp_path, "cosine", 0)
    _until(lambda: lock_holder(cosine)[1], "cosine's job started")
    pid = lock_holder(cosine)[0]
    os.kill(pid, signal.SIGSTOP)  # cosine's job keeps its run until the check below is done
    try:
        _until(lambda: _finished(step), "step finished")
        submitted = sorted((tmp_path / ".submitit").glob("*_submitted.pkl"))
        assert main([*args, "--resume"]) == 4  # a run held by a live process: exit code 4
        out, err = capsys.readouterr()
        assert re.search(r"step seed 0 +finished", out) and re.search(r"cosine seed 0 +locked", out), out
        assert f"being trained by process {pid}" in err
        assert sorted((tmp_path / ".submitit").glob("*_submitted.pkl")) == submitted  # nothing submitted
    finally:
        os.kill(pid, signal.SIGCONT)
    _until(lambda: _finished(cosine), "cosine finished")
    assert main([*args, "--resume"]) == 0
    assert sorted((tmp_path / ".submitit").glob("*_submitted.pkl")) == submitted


def test_a_failed_job_is_exit_code_5_with_its_last_error_line(partition, npz, tmp_path, capsys, monkeypatch):
    data = shutil.copy(npz, tmp_path / "tiny.npz")
    checked = sweep.prepare  # what submit checks with

    def prepare_then_lose_the_data(*args, **kwargs):  # the data is gone by the time the job runs
        result = checked(*args, **kwargs)
        os.remove(data)
        return result

    monkeypatch.setattr(sweep, "prepare", prepare_then_lose_the_data)
    assert main(_cli(str(data), tmp_path / "out", partition, "step")) == 5
    out, err = capsys.readouterr()
    assert "failed" in out
    (line,) = [line for line in err.strip().splitlines() if not line.startswith("sacct does not answer")]
    assert line.lstrip().startswith("job ") and "DataError" in line and "no such file" in line
    # where SLURM keeps no accounting (.ci/slurm-up), the wait says it sees jobs end by their result files only
    assert (subprocess.run(["sacct", "-n"], capture_output=True).returncode == 0) != ("sacct does not answer" in err)


def test_a_bad_partition_is_one_line_and_exit_2_before_anything_is_submitted(npz, partition, tmp_path, capsys):
    jobs = _sh("squeue", "-h", "-r", "-o", "%i")
    with pytest.raises(SystemExit) as exc:
        main(_cli(npz, tmp_path / "out", "no-such-partition", "step"))
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "invalid partition" in err.lower() and "no-such-partition" in err
    # nothing submitted: no job that was not queued before (others may end meanwhile: the time-limited one)
    assert not (tmp_path / "out").exists() and set(_sh("squeue", "-h", "-r", "-o", "%i").split()) <= set(jobs.split())


def test_a_job_that_hits_its_time_limit_is_requeued_and_resumes_from_its_last_epoch(time_limited, reference):
    out, before, released = time_limited
    released.result(timeout=120)
    _resumed_exactly(out, "texp", before, reference)
