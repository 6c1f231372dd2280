"""explr.cifar10 beyond one process: settings declared once, CPUs and GPUs per worker, shared data, submitit, results."""
import argparse
import dataclasses
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time

import numpy as np
import pytest
import torch

from explr.cifar10 import committed_results, load_runs, run_many
from explr.cifar10 import hardware, sweep
from explr.cifar10.__main__ import build_parser, main
from explr.cifar10.config import RESOLVED_KEYS, TRAJECTORY_KEYS, TrainConfig, add_config_arguments
from explr.cifar10.data import make_synthetic, write_npz
from explr.cifar10.runs import lock_holder, read_metrics
from explr.cifar10.sweep import attach_arrays, check_launcher, share_arrays

from cifar10_helpers import CLI_TINY, reproducible, tiny_arrays

pytestmark = pytest.mark.usefixtures("one_thread")
CLI_TWO_EPOCHS = [*CLI_TINY, "--epochs", "2"]


# ----------------------------------------------------------------------------- one declaration per setting
def test_parser_validation_and_resume_keys_come_from_the_fields():
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    parser = build_parser()
    dests = {a.dest: a for a in parser._actions}
    for name, f in fields.items():
        assert name in dests and dests[name].help.startswith(f.metadata["help"][:20]), name
    assert set(TRAJECTORY_KEYS) | set(RESOLVED_KEYS) == {n for n, f in fields.items() if f.metadata["trajectory"]}
    assert set(RESOLVED_KEYS) == {"device", "precision", "threads"} and "lr" in TRAJECTORY_KEYS
    # the same rule refuses a value in the parser and in validate(), with the same words
    for flag, value in (("--depth", "21"), ("--momentum", "1"), ("--lr", "nan")):
        with pytest.raises(SystemExit):
            parser.parse_args([flag, value])
        with pytest.raises(ValueError, match=f"\\({flag}\\) must be"):
            TrainConfig(**{flag[2:]: float(value) if flag != "--depth" else int(value)}).validate()
    # a subset for another tool (the benchmark), with a field swept
    p = argparse.ArgumentParser()
    add_config_arguments(p, names=("depth", "precision"), sweep=("precision",))
    args = p.parse_args(["--precision", "fp32", "bf16"])
    assert args.precision == ["fp32", "bf16"] and args.depth == 32


# ----------------------------------------------------------------------------- CPUs and GPUs
def test_available_cpus_follow_affinity_and_cgroup_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs of quota
    assert hardware.cgroup_cpu_limit(tmp_path) == 1.5
    assert hardware.available_cpus(tmp_path) == 2
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert hardware.available_cpus(tmp_path) == 8
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert hardware.available_cpus(v1) == 3
    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda pid: {0, 1})
    assert hardware.available_cpus(tmp_path / "none") == 2
    monkeypatch.setattr(hardware, "available_cpus", lambda: 8)
    assert hardware.default_threads(torch.device("cpu")) == 7  # one CPU left for everything else
    assert hardware.default_threads(torch.device("cpu"), jobs=3) == 2
    assert hardware.default_threads(torch.device("cuda")) == 1
    monkeypatch.setattr(hardware, "available_cpus", lambda: 1)
    assert hardware.default_threads(torch.device("cpu")) == 1
    assert hardware.resolve_threads(5, torch.device("cpu")) == 5  # --threads overrides


def test_worker_i_gets_gpu_i_mod_g(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert hardware.worker_gpus(7) == ["0", "1", "2", "0", "1", "2", "0"]
    assert hardware.worker_gpus(4, visible="5,6,7") == ["5", "6", "7", "5"]  # the parent's own subset
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert hardware.worker_gpus(2) == [None, None]


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
    assert [r["status"] for r in results] == ["finished", "finished"]
    for r in load_runs(tmp_path / "out"):
        assert r["manifest"]["data"]["sha256"] == arrays.sha256 and r["manifest"]["config"]["data"] == "gone.npz"


# ----------------------------------------------------------------------------- submitit
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
    assert not lock_holder(run)[1] and not _alive(job)  # the job's process ended too
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and len(read_metrics(run)) < 200


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_options_the_chosen_launcher_would_ignore_are_refused():
    with pytest.raises(ValueError, match="^--jobs is for --launcher local"):
        check_launcher("submitit", jobs=2)
    with pytest.raises(ValueError, match="^--partition and --account are SLURM's"):
        check_launcher("submitit", cluster="local", partition="gpu")
    with pytest.raises(ValueError, match="^--partition, --gpus-per-run, --no-wait only apply to --launcher submitit"):
        check_launcher("local", partition="gpu", gpus_per_run=1, wait=False)
    check_launcher("local", jobs=4)
    check_launcher("submitit", cluster="slurm", partition="gpu", account="me", gpus_per_run=1, wait=False)


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


# ----------------------------------------------------------------------------- committed results (Colab)
def test_committed_results_come_from_the_repository_archive_when_absent(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in [("results/cifar10-subset/step/seed0/manifest.json",
                            json.dumps({"config": {"schedule": "step", "seed": 0}, "status": "finished"})),
                           ("results/cifar10-subset/step/seed0/metrics.jsonl", '{"epoch": 1, "test_acc": 0.5}\n'),
                           ("results/cifar10-subset/step/seed0/checkpoint.pt", "not extracted"),
                           ("book/06_cifar10.ipynb", "{}")]:
            info = tarfile.TarInfo(f"explr-0.1.0/{name}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    (tmp_path / "archive.tar.gz").write_bytes(buf.getvalue())
    url = (tmp_path / "archive.tar.gz").as_uri()
    local = tmp_path / "clone" / "results" / "cifar10-subset"
    local.mkdir(parents=True)
    assert committed_results(local, archive_url=url) == local  # a clone: used as is
    got = committed_results(tmp_path / "colab" / "results" / "cifar10-subset", cache_dir=tmp_path / "cache",
                            archive_url=url)
    runs = load_runs(got)
    assert [(r["schedule"], list(r["metrics"]["test_acc"])) for r in runs] == [("step", [0.5])]
    assert not list(got.rglob("*.pt")) and not list((tmp_path / "cache").rglob("*.ipynb"))
    with pytest.raises(FileNotFoundError, match="holds no results/cifar10-full"):
        committed_results("../results/cifar10-full", cache_dir=tmp_path / "cache2", archive_url=url)
    with pytest.raises(FileNotFoundError, match="could not be fetched"):
        committed_results("../results/cifar10-subset", cache_dir=tmp_path / "cache3",
                          archive_url=(tmp_path / "missing.tar.gz").as_uri())


def test_slurm_without_slurm_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sweep.shutil, "which", lambda name: None)  # no sbatch, no srun: not a SLURM cluster
    with pytest.raises(SystemExit) as exc:
        main(["--data", "synthetic", "--out", str(tmp_path / "o"), *CLI_TWO_EPOCHS, "--launcher", "submitit"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "--cluster slurm" in err
    assert not (tmp_path / "o").exists()
