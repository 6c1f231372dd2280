"""explr.cifar10.cluster: runs as submitit jobs (the local executor here; tests/slurm/ on a real SLURM cluster) and the launcher's options."""
import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from explr.cifar10 import load_runs
from explr.cifar10 import cluster
from explr.cifar10.__main__ import main
from explr.cifar10.arrays import write_npz
from explr.cifar10.engine import TrainingDiverged
from explr.cifar10.files import DiskFull
from explr.cifar10.lock import lock_holder
from explr.cifar10.metrics import read_metrics
from explr.cifar10.cluster import check_launcher
from explr.cifar10.status import Status

from cifar10_helpers import CLI_TINY, alive, reproducible, tiny_arrays

pytestmark = pytest.mark.usefixtures("one_thread")
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
    monkeypatch.setattr(cluster.shutil, "which", lambda name: None)  # no sbatch, no srun: not a SLURM cluster
    with pytest.raises(SystemExit) as exc:
        main(["--data", "synthetic", "--out", str(tmp_path / "o"), *CLI_TWO_EPOCHS, "--launcher", "submitit"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "--cluster slurm" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("err, status", [(DiskFull("seed0/checkpoint.pt", "disk full while writing (test)"),
                                          Status.DISK_FULL),
                                         (TrainingDiverged("the training loss is nan (test)"), Status.DIVERGED)])
def test_a_job_stopped_by_a_full_disk_or_divergence_returns_its_status(err, status, tmp_path, monkeypatch):
    """A job's full disk was an exception, which submitit reports as the job failing: status "failed", exit code 5
    (a worker of the local pool said "disk full", 6)."""
    def stopped(*args, **kwargs):
        raise err

    monkeypatch.setattr(cluster, "train_prepared", stopped)
    r = cluster.RunJob(SimpleNamespace(folder=tmp_path / "seed0"))()
    assert (r.status, r.message, r.status.exit_code) == (status, str(err), status.exit_code)
