"""explr.cifar10 beyond one process: settings declared once, CPUs and GPUs per worker, shared data, submitit, results."""
import argparse
import dataclasses
import io
import json
import tarfile

import numpy as np
import pytest
import torch

from explr.cifar10 import committed_results, load_runs, run_many
from explr.cifar10 import hardware
from explr.cifar10.__main__ import build_parser, main
from explr.cifar10.config import RESOLVED_KEYS, TRAJECTORY_KEYS, TrainConfig, add_config_arguments
from explr.cifar10.data import make_synthetic, write_npz
from explr.cifar10.runs import read_metrics
from explr.cifar10.sweep import attach_arrays, share_arrays

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


def test_slurm_without_slurm_is_one_line(tmp_path, capsys):
    import shutil

    if shutil.which("srun"):
        pytest.skip("this machine has SLURM: the submission would really happen")
    with pytest.raises(SystemExit) as exc:
        main(["--data", "synthetic", "--out", str(tmp_path / "o"), *CLI_TWO_EPOCHS, "--launcher", "submitit"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "--cluster slurm" in err
    assert not (tmp_path / "o").exists()
