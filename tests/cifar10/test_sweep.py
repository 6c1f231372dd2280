"""explr.cifar10.sweep: every run checked before any starts, many runs in worker processes (the data through shared
memory) and as submitit jobs (the local executor here; tests/slurm/ on a real SLURM cluster)."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from explr.cifar10 import config, load_runs, run_many, sweep
from explr.cifar10.__main__ import main
from explr.cifar10.config import TrainConfig, config_to_argv, resolved_settings
from explr.cifar10.data import CifarArrays, make_synthetic
from explr.cifar10.runs import TrainingDiverged
from explr.cifar10.runfolder import DiskFull, RunState, Status, lock_holder
from explr.cifar10.runfolder import read_metrics
from explr.cifar10.sweep import check_launcher, prepare

from cifar10_helpers import (
    CLI_TINY, TINY, _cli, _wait_for_epochs, alive, fails_in_one_line, reproducible,
    tiny_arrays, tiny_npz, write_npz,
)

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


# ----------------------------------------------------------------------------- validated before anything starts
def test_every_run_is_checked_before_the_first_starts(npz, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    base = ["--data", npz, "--out", str(out), *CLI_TINY]
    # texp cannot be built at lr 1, wd 0.01: step must not have trained first
    fails_in_one_line([*base, "--schedule", "step", "texp", "--lr", "1", "--wd", "0.01"], capsys, "schedule texp")
    fails_in_one_line([*base, "--schedule", "step", "texp", "--rescale-above", "0.05"], capsys, "--rescale-above")
    fails_in_one_line([*base, "--jobs", "2", "--seed", "0", "1", "--batch-size", "500"], capsys, "--batch-size")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    fails_in_one_line([*base, "--device", "cuda"], capsys, "CUDA is not available")
    assert not out.exists()


def test_truncated_npz_and_constant_images_are_refused_before_start(arrays, tmp_path, capsys):
    good = write_npz(tmp_path / "good.npz", arrays).read_bytes()
    (tmp_path / "cut.npz").write_bytes(good[: len(good) // 2])
    fails_in_one_line(["--data", str(tmp_path / "cut.npz"), "--out", str(tmp_path / "o"), *CLI_TINY], capsys,
                      "truncated or damaged")
    for value in (0, 77):
        flat = CifarArrays(np.full_like(arrays.x_train, value), arrays.y_train, arrays.x_test, arrays.y_test,
                           source="flat", kind="npz")
        write_npz(tmp_path / "flat.npz", flat)
        fails_in_one_line(["--data", str(tmp_path / "flat.npz"), "--out", str(tmp_path / "o"), *CLI_TINY], capsys,
                          "constant")  # the words are data.py's
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- the data, read once
def test_the_sweep_decodes_with_the_progress_setting_and_checks_the_largest_batch(npz, tmp_path, monkeypatch):
    """--no-progress reaches the decoder, and the batch size is checked by the loader before anything is cached."""
    import explr.cifar10.sweep as sweep_mod
    from explr.cifar10 import TrainConfig

    seen = {}
    real = sweep_mod.load_cifar10

    def recording(data, root, **kwargs):
        seen.update(kwargs)
        return real(data, root, **kwargs)

    monkeypatch.setattr(sweep_mod, "load_cifar10", recording)
    configs = [TrainConfig(schedule="step", seed=0, data=npz, epochs=1, batch_size=32, depth=8, threads=1),
               TrainConfig(schedule="texp", seed=0, data=npz, epochs=1, batch_size=64, depth=8, threads=1)]
    sweep_mod.prepare(configs, tmp_path, progress=False)
    assert seen == {"progress": False, "batch_size": 64}


CLI_TWO_EPOCHS = [*CLI_TINY, "--epochs", "2"]


# ----------------------------------------------------------------------------- workers: shared data, checks first
def test_workers_get_the_parents_data_through_shared_memory():
    arrays = make_synthetic(n_train=50, n_test=20, seed=4)
    tensors, meta = sweep.share_arrays(arrays)
    assert all(t.is_shared() for t in tensors.values())
    got = CifarArrays(**{k: t.numpy() for k, t in tensors.items()}, **meta)  # what a worker makes of them
    assert got.sha256 == arrays.sha256 and got.describe() == arrays.describe()
    np.testing.assert_array_equal(got.x_train, arrays.x_train)


@pytest.mark.slow  # separate processes (spawn: each imports torch)
def test_jobs_workers_train_on_the_data_the_parent_loaded(tmp_path):
    """The configs name a file that does not exist: the workers can only have the parent's arrays."""
    arrays = tiny_arrays()
    configs = [TrainConfig(schedule="step", seed=s, data=str(tmp_path / "gone.npz"), epochs=1, batch_size=32, depth=8,
                           threads=1, eval_batch_size=64) for s in (0, 1)]
    results = run_many(configs, tmp_path / "out", arrays=arrays, jobs=2, progress=False)
    assert [r.status for r in results] == ["finished", "finished"]
    for r in load_runs(tmp_path / "out"):
        assert r["manifest"]["data"]["sha256"] == arrays.sha256 and r["manifest"]["config"]["data"] == "gone.npz"


@pytest.mark.parametrize("jobs", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_file_in_the_output_tree_is_one_line_before_any_worker_starts(jobs, tmp_path, capsys):
    (tmp_path / "step").write_text("not a folder")
    with pytest.raises(SystemExit) as exc:
        main(["--schedule", "step", "--seed", "0", "1", "--jobs", str(jobs), "--data", "synthetic", "--out",
              str(tmp_path), *CLI_TINY])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and "is a file" in err, err


@pytest.mark.parametrize("jobs", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_run_taken_meanwhile_by_another_process_is_exit_code_4_with_the_summary(jobs, tmp_path, capfd,
                                                                                  monkeypatch):
    checked = sweep.prepare

    def prepare_then_taken(configs, out, **kwargs):  # another process trains texp once the sweep was checked
        result = checked(configs, out, **kwargs)
        (tmp_path / "texp" / "seed0").mkdir(parents=True)
        (tmp_path / "texp" / "seed0" / "metrics.jsonl").write_text('{"epoch": 1}\n')
        return result

    monkeypatch.setattr(sweep, "prepare", prepare_then_taken)
    data = str(write_npz(tmp_path / "tiny.npz", tiny_arrays()))
    assert main(["--schedule", "step", "texp", "--jobs", str(jobs), "--data", data, "--out", str(tmp_path),
                 *CLI_TINY, "--epochs", "1"]) == 4
    out, err = capfd.readouterr()  # (a worker's lines come from another process)
    assert re.search(r"step seed 0 +finished", out) and re.search(r"texp seed 0 +locked", out), out
    assert str(tmp_path / "texp" / "seed0") in err and "Traceback" not in err, err


def manifest_of(folder, status, message="the worker's own line"):
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"status": status, "message": message, "epochs_done": 1}))


@pytest.mark.parametrize("recorded, code, status, message", [
    (None, None, Status.NOT_STARTED, ""),  # never started, or stopped by the pool itself
    (Status.FINISHED, 0, Status.FINISHED, "own"), (Status.INTERRUPTED, 0, Status.INTERRUPTED, "own"),  # stop_after
    (Status.DIVERGED, 3, Status.DIVERGED, "own"),
    (Status.FINISHED, 4, Status.LOCKED, "exited with code 4 (locked)"),  # another process's run
    (Status.DISK_FULL, 6, Status.DISK_FULL, "own"), (Status.RUNNING, 6, Status.DISK_FULL, "code 6 (disk full)"),
    (Status.INTERRUPTED, 143, Status.INTERRUPTED, "own"),  # a signal the worker caught and recorded
    (Status.RUNNING, -9, Status.FAILED, "exited with code -9"), (None, 1, Status.FAILED, "exited with code 1")])
def test_a_workers_exit_code_says_what_its_run_folder_cannot(recorded, code, status, message, tmp_path):
    """The pool reads a worker's exit code through :meth:`Status.from_exit_code`; the run folder's record wins
    unless the code says locked, disk full or failed and the folder says otherwise."""
    if recorded is not None:
        manifest_of(tmp_path / "run", recorded)
    r = sweep._folder_result(tmp_path / "run", code)
    assert r.status is status and message in r.message, r


# ----------------------------------------------------------------------------- the pool's size and its threads
@pytest.mark.parametrize("jobs", [10**12, 2**70, 0, 1025])
def test_jobs_beyond_any_machine_are_one_line_before_anything_starts(jobs, tmp_path, capsys, monkeypatch):
    """Issue 41 item 11: ``--jobs 10**12`` was a MemoryError, ``2**70`` an OverflowError (``[None] * jobs``)."""
    monkeypatch.setattr(sweep, "_run_processes", lambda *args: pytest.fail("a pool was started"))
    with pytest.raises(SystemExit) as exc:
        main(["--schedule", "step", "texp", "--jobs", str(jobs), "--data", "synthetic", "--out", str(tmp_path),
              *CLI_TINY])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--jobs" in err and "an integer in [1, 1024]" in err, err
    with pytest.raises(ValueError, match=r"jobs \(--jobs\) must be an integer in \[1, 1024\]"):
        run_many([TrainConfig(**TINY)], tmp_path, arrays=tiny_arrays(), jobs=jobs)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("runs, jobs, cpus, device, workers", [
    (14, 14, 2, "cpu", 2),  # the CPUs: each worker on the CPU has a thread of its own
    (2, 8, 16, "cpu", 2),  # the runs: no worker without a run
    (3, 1024, 2, "cuda", 3),  # on a GPU a worker mostly waits for its kernels: the CPUs do not cap it
])
def test_the_pool_has_no_more_workers_than_runs_and_on_the_cpu_than_cpus(runs, jobs, cpus, device, workers,
                                                                         tmp_path, monkeypatch, capsys):
    pools = []
    monkeypatch.setattr(config, "available_cpus", lambda: cpus)
    monkeypatch.setattr(sweep, "_run_processes", lambda runs, arrays, jobs, *rest: pools.append(jobs) or [])
    monkeypatch.setattr(config, "resolve_device", lambda name: torch.device(device))
    configs = [TrainConfig(**TINY, seed=s) for s in range(runs)]
    run_many(configs, tmp_path, arrays=tiny_arrays(), jobs=jobs, progress=False)
    assert pools == [workers]
    assert config.workers(jobs, runs, torch.device(device)) == workers
    capped = f"--jobs {jobs}: {workers} runs at a time, as many as the CPUs"
    assert (capped in capsys.readouterr().err) == (workers < min(jobs, runs))


def test_the_default_threads_depend_on_jobs_not_on_the_runs_of_the_sweep(npz, tmp_path, monkeypatch):
    """Issue 41 item 15: a 1-run sweep with ``--jobs 2`` was checked for two workers' threads and trained with
    one's, so a ``--resume`` of it in a 2-run sweep with ``--jobs 2`` was refused ("threads=4 (now 2)")."""
    monkeypatch.setattr(config, "available_cpus", lambda: 5)  # threads: 4 for one worker, 2 each for two
    default_threads = {**TINY, "threads": None}
    assert main(["--schedule", "step", "--jobs", "2", "--data", npz, "--out", str(tmp_path),
                 *config_to_argv(TrainConfig(**default_threads)), "--no-progress"]) == 0
    (run,) = load_runs(tmp_path)
    assert run["manifest"]["resolved"]["threads"] == 2
    configs = [TrainConfig(**default_threads, schedule=s, data=npz) for s in ("step", "texp")]
    _, checks = prepare(configs, tmp_path, resume=True, jobs=2, progress=False)  # refused before the fix
    assert [c.check.state for c in checks] == [RunState.FINISHED, RunState.NEW]


# ----------------------------------------------------------------------------- a killed parent
@pytest.mark.slow  # separate processes (spawn: each imports torch)
def test_jobs_workers_die_with_their_parent(npz, tmp_path):
    proc = _cli(tmp_path, npz, "--seed", "0", "1", "--jobs", "2")
    runs = [tmp_path / "texp" / f"seed{s}" for s in (0, 1)]
    for run in runs:
        _wait_for_epochs(run, 1, proc)
    workers = [int((run / ".lock").read_text()) for run in runs]
    assert proc.pid not in workers
    proc.kill()  # SIGKILL: the parent cannot forward anything
    proc.communicate()
    t0 = time.time()
    while time.time() - t0 < 30 and any(os.path.exists(f"/proc/{pid}") and alive(pid) for pid in workers):
        time.sleep(0.1)
    assert not any(alive(pid) for pid in workers)
    for run in runs:  # each worker recorded its interruption (SIGTERM from PR_SET_PDEATHSIG)
        assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"


# ----------------------------------------------------------------------------- a deadline
def test_a_passed_deadline_starts_no_run(arrays, tmp_path):
    configs = [TrainConfig(**TINY, schedule=s) for s in ("step", "texp")]
    results = run_many(configs, tmp_path, arrays=arrays, jobs=2, progress=False, deadline=time.time() - 1)
    assert [r.status for r in results] == ["not started", "not started"]
    assert not list(tmp_path.rglob("checkpoint.pt"))


CLI_TWO_EPOCHS = [*CLI_TINY, "--epochs", "2"]


@pytest.mark.slow  # separate processes (spawn: each imports torch)
def test_two_run_sweep_through_submitit_local_executor(tmp_path, capsys):
    pytest.importorskip("submitit")
    data = str(write_npz(tmp_path / "tiny.npz", tiny_arrays()))
    args = ["--schedule", "step", "texp", "--data", data, *CLI_TWO_EPOCHS]
    assert main([*args, "--out", str(tmp_path / "cluster"), "--launcher", "submitit", "--cluster", "local",
                 "--time", "10"]) == 0
    out = capsys.readouterr().out
    assert out.count("finished") == 2
    assert not list(tmp_path.rglob("%j")) and list((tmp_path / "cluster" / ".submitit").glob("*_0_log.out"))
    runs = load_runs(tmp_path / "cluster")
    assert sorted(r["schedule"] for r in runs) == ["step", "texp"]
    assert all(r["manifest"]["status"] == "finished" and r["manifest"]["format"] == "explr.cifar10/1" for r in runs)
    # the same runs as trained here, and resubmitting with --resume is a no-op
    assert main([*args, "--out", str(tmp_path / "here")]) == 0
    for s in ("step", "texp"):
        a = read_metrics(tmp_path / "cluster" / s / "seed0")
        b = read_metrics(tmp_path / "here" / s / "seed0")
        assert reproducible(a) == reproducible(b)
    before = (tmp_path / "cluster" / "step" / "seed0" / "checkpoint.pt").read_bytes()
    assert main([*args, "--out", str(tmp_path / "cluster"), "--launcher", "submitit", "--cluster", "local",
                 "--resume"]) == 0
    assert (tmp_path / "cluster" / "step" / "seed0" / "checkpoint.pt").read_bytes() == before


@pytest.mark.slow  # separate processes (each imports torch)
def test_submitit_local_jobs_end_with_their_parent_on_sigint(tmp_path):
    """The parent exits 130 after its local jobs recorded "interrupted" (they used to train on, orphaned)."""
    data = str(write_npz(tmp_path / "tiny.npz", tiny_arrays()))
    run = tmp_path / "out" / "texp" / "seed0"
    cmd = [sys.executable, "-m", "explr.cifar10", "--schedule", "texp", "--data", data, "--out", str(tmp_path / "out"),
           *CLI_TINY, "--epochs", "200", "--launcher", "submitit", "--cluster", "local"]
    proc = subprocess.Popen(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not ((run / "metrics.jsonl").exists() and read_metrics(run)):
        assert proc.poll() is None and time.monotonic() - t0 < 120, proc.communicate()
        time.sleep(0.05)
    job = lock_holder(run)[0]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, err
    assert not lock_holder(run)[1] and not alive(job)  # the job's process ended too
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and len(read_metrics(run)) < 200


@pytest.mark.slow  # a separate process (it imports torch)
def test_a_job_resolves_device_precision_and_threads_on_its_own_node(tmp_path, monkeypatch):
    """The submitter sees a GPU (patched here), its job does not (submitit's local executor hides every GPU from a job
    that asks for none): the job trains on the CPU in fp32 with this machine's default threads, as its manifest says.
    (Resolved where it was prepared, the job trained with cuda and bf16: it failed.)"""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolved_settings(TrainConfig())["device"] == "cuda"  # what the submitter would resolve
    data = str(write_npz(tmp_path / "tiny.npz", tiny_arrays()))
    config = TrainConfig(**{**TINY, "epochs": 1, "threads": None}, data=data)
    [result] = sweep.submit([config], tmp_path / "out", cluster="local", timeout_min=10)
    assert result.status is Status.FINISHED, result.message
    resolved = load_runs(tmp_path / "out")[0]["manifest"]["resolved"]
    threads = max(1, len(os.sched_getaffinity(0)) - 1)
    assert (resolved["device"], resolved["precision"], resolved["threads"]) == ("cpu", "fp32", threads)


@pytest.mark.slow  # a separate process (it imports torch)
def test_cuda_is_submitted_from_a_host_without_one_when_the_jobs_ask_for_gpus(tmp_path, monkeypatch):
    """``--device cuda`` is the node's to check: submitted from this host without CUDA when the jobs ask for a GPU,
    it fails in the job (whose local executor has none to give); asking for no GPU is refused at submit."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    data = str(write_npz(tmp_path / "tiny.npz", tiny_arrays()))
    config = TrainConfig(**{**TINY, "epochs": 1}, data=data, device="cuda")
    with pytest.raises(ValueError, match=r"^device \(--device\) 'cuda': the jobs ask for 0 GPU\(s\)"):
        sweep.submit([config], tmp_path / "out", cluster="local")
    with pytest.raises(ValueError, match="give --gpus-per-run 3 or more"):
        sweep.check_gpus([TrainConfig(device="cuda:2")], 2)
    try:
        [result] = sweep.submit([config], tmp_path / "out", cluster="local", gpus_per_run=1, timeout_min=10)
    except ValueError as err:
        pytest.fail(f"refused at submit: {err}")
    if not torch.cuda.device_count():  # the job's machine (this one) has no GPU either: the job says so
        assert result.status is Status.FAILED and "CUDA is not available" in result.message, result.message


def test_options_the_chosen_launcher_would_ignore_are_refused():
    with pytest.raises(ValueError, match="^--jobs is for --launcher local"):
        check_launcher("submitit", jobs=2)
    with pytest.raises(ValueError, match="^--partition and --account are SLURM's"):
        check_launcher("submitit", cluster="local", partition="gpu")
    with pytest.raises(ValueError, match="^--partition, --gpus-per-run, --no-wait only apply to --launcher submitit"):
        check_launcher("local", partition="gpu", gpus_per_run=1, wait=False)
    check_launcher("local", jobs=4)
    check_launcher("submitit", cluster="slurm", partition="gpu", account="me", gpus_per_run=1, wait=False)


def test_slurm_without_slurm_is_one_line(tmp_path, capsys, monkeypatch):
    def no_sbatch(cmd, **kwargs):  # not a SLURM cluster
        raise FileNotFoundError(2, "No such file or directory", cmd[0])

    monkeypatch.setattr(sweep.subprocess, "run", no_sbatch)
    with pytest.raises(SystemExit) as exc:
        main(["--data", "synthetic", "--out", str(tmp_path / "o"), *CLI_TWO_EPOCHS, "--launcher", "submitit"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "--cluster slurm" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("err, status", [(DiskFull("disk full while writing seed0/checkpoint.pt (test)"),
                                          Status.DISK_FULL),
                                         (TrainingDiverged("the training loss is nan (test)"), Status.DIVERGED)])
def test_a_job_stopped_by_a_full_disk_or_divergence_returns_its_status(err, status, tmp_path, monkeypatch):
    """A job's full disk was an exception, which submitit reports as the job failing: status "failed", exit code 5
    (a worker of the local pool said "disk full", 6)."""
    def stopped(*args, **kwargs):
        raise err

    monkeypatch.setattr(sweep, "train_prepared", stopped)
    monkeypatch.setattr(sweep, "load_cifar10", lambda *args, **kwargs: None)
    r = sweep.RunJob(sweep.prepare_run(TrainConfig(**TINY).validate(), tmp_path / "seed0", tiny_arrays()))()
    assert (r.status, r.message, r.status.exit_code) == (status, str(err), status.exit_code)


def test_a_preempted_job_is_requeued_as_the_same_run_resuming(arrays, tmp_path):
    """submitit calls ``checkpoint`` on preemption or a time limit: the job it requeues trains the same run, resuming
    (the real requeue: tests/slurm)."""
    from submitit.helpers import DelayedSubmission

    run = sweep.prepare_run(TrainConfig(**TINY).validate(), tmp_path / "seed0", arrays)
    again = sweep.RunJob(run).checkpoint()
    assert isinstance(again, DelayedSubmission) and isinstance(again.function, sweep.RunJob)
    requeued = again.function.run
    assert (requeued.config, requeued.folder, requeued.resume, run.resume) == (run.config, run.folder, True, False)


# ----------------------------------------------------------------------------- waiting for SLURM jobs
class _KilledJob:
    """A SLURM job as submitit shows it: ``done()`` once sacct reports it ended (after ``polls`` calls), with no
    result file, as after ``scancel`` or a node failure."""

    def __init__(self, tmp_path, polls=2):
        self.job_id, self.state, self.polls = "41_0", "CANCELLED", polls
        self.paths = SimpleNamespace(result_pickle=tmp_path / "41_0_result.pkl", stderr=tmp_path / "41_0_log.err")

    def done(self):
        self.polls -= 1
        return self.polls <= 0

    def result(self):
        from submitit.core.utils import UncompletedJobError

        raise UncompletedJobError(f"Job {self.job_id} has not produced any output (state: {self.state})\nmore")


def _wait_in_thread(jobs, monkeypatch, sacct: bool, seconds=30):
    """``sweep._wait_for`` of ``jobs`` on SLURM (sacct answering or not), given ``seconds`` to end."""
    monkeypatch.setattr(sweep.subprocess, "run", lambda *a, **k: SimpleNamespace(
        returncode=0 if sacct else 1, stdout="", stderr="Slurm accounting storage is disabled\n"))
    sleep = time.sleep
    monkeypatch.setattr(sweep.time, "sleep", lambda s: sleep(min(s, 0.01)))
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(sweep._wait_for, jobs, ["runs/step/seed0"] * len(jobs), "slurm")
        try:
            return future.result(timeout=seconds)
        except TimeoutError:
            for job in jobs.values():  # let the thread end
                job.paths.result_pickle.touch()
                job.result = lambda: None
            pytest.fail(f"the wait did not end within {seconds} s")


def test_a_slurm_job_killed_before_its_result_ends_the_wait_with_one_line_naming_it(tmp_path, monkeypatch, capsys):
    pytest.importorskip("submitit")
    job = _KilledJob(tmp_path)
    [result] = _wait_in_thread({0: job}, monkeypatch, sacct=True).values()
    assert result.status is Status.FAILED and len(result.message.splitlines()) == 1
    assert result.message.startswith("job 41_0 ended (CANCELLED) without a result") and "41_0_log.err" in result.message
    assert capsys.readouterr().err == ""


def test_without_sacct_the_wait_says_so_in_one_line_and_ends_with_the_result_files(tmp_path, monkeypatch, capsys):
    pytest.importorskip("submitit")
    job = _KilledJob(tmp_path, polls=0)  # done() would say it ended: without sacct it is not asked
    job.result = lambda: "the run's result"
    threading.Timer(0.2, job.paths.result_pickle.touch).start()
    assert _wait_in_thread({0: job}, monkeypatch, sacct=False) == {0: "the run's result"}
    assert job.polls == 0  # done() never called
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("sacct does not answer (Slurm accounting storage is disabled)")
