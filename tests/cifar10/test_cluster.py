"""explr.cifar10.cluster: runs as submitit jobs (the local executor here; tests/slurm/ on a real SLURM cluster) and the launcher's options."""
import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from explr.cifar10 import load_runs
from explr.cifar10 import cluster, hardware
from explr.cifar10.config import TrainConfig
from explr.cifar10.__main__ import main
from explr.cifar10.arrays import write_npz
from explr.cifar10.engine import TrainingDiverged
from explr.cifar10.files import DiskFull
from explr.cifar10.lock import lock_holder
from explr.cifar10.metrics import read_metrics
from explr.cifar10.cluster import check_launcher
from explr.cifar10.status import Status

from cifar10_helpers import CLI_TINY, TINY, alive, reproducible, tiny_arrays

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


@pytest.mark.slow  # a separate process (it imports torch)
def test_a_job_resolves_device_precision_and_threads_on_its_own_node(tmp_path, monkeypatch):
    """The submitter sees a GPU (patched here), its job does not (submitit's local executor hides every GPU from a job
    that asks for none): the job trains on the CPU in fp32 with this machine's default threads, as its manifest says.
    (Resolved where it was prepared, the job trained with cuda and bf16: it failed.)"""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert hardware.resolved_settings(TrainConfig())["device"] == "cuda"  # what the submitter would resolve
    data = str(write_npz(tmp_path / "tiny.npz", tiny_arrays()))
    config = TrainConfig(**{**TINY, "epochs": 1, "threads": None}, data=data)
    [result] = cluster.submit([config], tmp_path / "out", cluster="local", timeout_min=10)
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
        cluster.submit([config], tmp_path / "out", cluster="local")
    with pytest.raises(ValueError, match="give --gpus-per-run 3 or more"):
        cluster.check_gpus([TrainConfig(device="cuda:2")], 2)
    try:
        [result] = cluster.submit([config], tmp_path / "out", cluster="local", gpus_per_run=1, timeout_min=10)
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

    monkeypatch.setattr(cluster, "train_on_node", stopped)
    r = cluster.RunJob(SimpleNamespace(folder=tmp_path / "seed0"))()
    assert (r.status, r.message, r.status.exit_code) == (status, str(err), status.exit_code)
