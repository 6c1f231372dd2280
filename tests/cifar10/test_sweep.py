"""explr.cifar10.sweep: many runs in worker processes (the data through shared memory), checked before any starts."""
import json
import os
import re
import time

import numpy as np
import pytest
import torch

from explr.cifar10 import hardware, load_runs, run_many
from explr.cifar10 import sweep
from explr.cifar10.__main__ import main
from explr.cifar10.config import TrainConfig, config_to_argv
from explr.cifar10.preflight import prepare
from explr.cifar10.sources import make_synthetic
from explr.cifar10.status import RunState, Status
from explr.cifar10.arrays import write_npz
from explr.cifar10.sweep import attach_arrays, share_arrays

from cifar10_helpers import CLI_TINY, TINY, _cli, _wait_for_epochs, alive, tiny_arrays, tiny_npz

pytestmark = pytest.mark.usefixtures("one_thread")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
CLI_TWO_EPOCHS = [*CLI_TINY, "--epochs", "2"]


# ----------------------------------------------------------------------------- workers: shared data, processes, checks first


def test_workers_get_the_parents_data_through_shared_memory():
    arrays = make_synthetic(n_train=50, n_test=20, seed=4)
    shm, handle = share_arrays(arrays)
    try:
        got, view = attach_arrays(handle)
        assert got.sha256 == arrays.sha256 and got.describe() == arrays.describe()
        np.testing.assert_array_equal(got.x_train, arrays.x_train)
        del got
        view.close()
    finally:
        shm.close()
        shm.unlink()


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
    (Status.FINISHED, 4, Status.LOCKED, "taken by another process"),  # another process's run
    (Status.DISK_FULL, 6, Status.DISK_FULL, "own"), (Status.RUNNING, 6, Status.DISK_FULL, "the disk filled up"),
    (Status.INTERRUPTED, 143, Status.INTERRUPTED, "own"),  # a signal the worker caught and recorded
    (Status.RUNNING, -9, Status.FAILED, "exited with code -9"), (None, 1, Status.FAILED, "exited with code 1")])
def test_a_workers_exit_code_says_what_its_run_folder_cannot(recorded, code, status, message, tmp_path):
    """The pool reads a worker's exit code through :meth:`Status.from_exit_code`; the run folder's record wins
    unless the code says locked, disk full or failed and the folder says otherwise."""
    if recorded is not None:
        manifest_of(tmp_path / "run", recorded)
    r = sweep._pool_result(tmp_path / "run", code)
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
    monkeypatch.setattr(hardware, "available_cpus", lambda: cpus)
    monkeypatch.setattr(sweep, "_run_processes", lambda runs, arrays, jobs, *rest: pools.append(jobs) or [])
    monkeypatch.setattr(hardware, "resolve_device", lambda name: torch.device(device))
    configs = [TrainConfig(**TINY, seed=s) for s in range(runs)]
    run_many(configs, tmp_path, arrays=tiny_arrays(), jobs=jobs, progress=False)
    assert pools == [workers]
    assert hardware.workers(jobs, runs, torch.device(device)) == workers
    capped = f"--jobs {jobs}: {workers} runs at a time, as many as the CPUs"
    assert (capped in capsys.readouterr().err) == (workers < min(jobs, runs))


def test_the_default_threads_depend_on_jobs_not_on_the_runs_of_the_sweep(npz, tmp_path, monkeypatch):
    """Issue 41 item 15: a 1-run sweep with ``--jobs 2`` was checked for two workers' threads and trained with
    one's, so a ``--resume`` of it in a 2-run sweep with ``--jobs 2`` was refused ("threads=4 (now 2)")."""
    monkeypatch.setattr(hardware, "available_cpus", lambda: 5)  # threads: 4 for one worker, 2 each for two
    default_threads = {**TINY, "threads": None}
    assert main(["--schedule", "step", "--jobs", "2", "--data", npz, "--out", str(tmp_path),
                 *config_to_argv(TrainConfig(**default_threads)), "--no-progress"]) == 0
    (run,) = load_runs(tmp_path)
    assert run["manifest"]["resolved"]["threads"] == 2
    configs = [TrainConfig(**default_threads, schedule=s, data=npz) for s in ("step", "texp")]
    _, checks, _ = prepare(configs, tmp_path, resume=True, jobs=2, progress=False)  # refused before the fix
    assert [c.state for c in checks] == [RunState.FINISHED, RunState.NEW]


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
