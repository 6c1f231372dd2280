"""explr.cifar10 end to end: the command line and the API train PreResNet8 on 192 generated 32×32 images
(batch 32, 6 steps per epoch, a few epochs: seconds on a CPU), resume exactly, and agree across data formats
and concurrent jobs."""
import json

import numpy as np
import pytest
import torch

import explr.cifar10.sources
from explr.cifar10.__main__ import main
from explr.cifar10.config import TrainConfig
from explr.cifar10.sources import write_cifar_batches
from explr.cifar10.metrics import TIMING_KEYS
from explr.cifar10.runs import train_run
from explr.cifar10.lock import RunError
from explr.cifar10.metrics import read_metrics
from explr.cifar10.runfolder import load_runs

from cifar10_helpers import CLI_TINY, TINY, reproducible, tiny_arrays, tiny_npz

#: the rows of metrics.jsonl, as the README documents them (Trainer.epoch_metrics, then the run's timings).
METRIC_KEYS = ("epoch", "step", "train_loss", "train_acc", "test_loss", "test_acc", "lr", "log_lr", "lr_opt", "rescale",
               "log2_rescale", "rescale_count", "weight_norm", "weight_norm_opt", "effective_lr")

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


@pytest.mark.slow
def test_cli_end_to_end_on_npz_and_on_cifar_batches_gives_identical_runs(arrays, npz, tmp_path, capsys):
    table = write_cifar_batches(tmp_path / "cifar" / "cifar-10-batches-py", arrays)
    assert main(["--schedule", "texp", "--data", npz, "--out", str(tmp_path / "a"), *CLI_TINY]) == 0
    out = tmp_path / "a" / "texp" / "seed0"
    rows = read_metrics(out)
    assert [r["epoch"] for r in rows] == [1, 2, 3] and set(rows[0]) == set(METRIC_KEYS + TIMING_KEYS)
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]  # it learns
    for r in rows:
        assert np.isclose(r["effective_lr"], r["lr"] / r["weight_norm"] ** 2, rtol=1e-9)
        assert np.isclose(r["lr_opt"], r["lr"] * r["rescale"], rtol=1e-12)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["epochs_done"] == 3
    assert manifest["data"]["sha256"] == arrays.sha256 and manifest["data"]["kind"] == "npz"
    assert manifest["config"]["schedule"] == "texp" and manifest["resolved"]["steps_per_epoch"] == 6
    assert manifest["environment"]["torch"] == torch.__version__ and "commit" in manifest["environment"]["git"]
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == 3 and reproducible(ckpt["metrics"]) == reproducible(rows)
    assert "texp seed 0" in capsys.readouterr().out

    # the same images as CIFAR's python batches (md5 table of the generated files): the same run
    original = explr.cifar10.sources.CIFAR10_FILES_MD5
    explr.cifar10.sources.CIFAR10_FILES_MD5 = table
    try:
        assert main(["--schedule", "texp", "--data", str(tmp_path / "cifar"), "--out", str(tmp_path / "b"),
                     *CLI_TINY]) == 0
    finally:
        explr.cifar10.sources.CIFAR10_FILES_MD5 = original
    other = tmp_path / "b" / "texp" / "seed0"
    assert reproducible(read_metrics(other)) == reproducible(rows)
    assert json.loads((other / "manifest.json").read_text())["data"]["kind"] == "cifar-python"


@pytest.mark.slow  # separate processes (spawn: each imports torch)
def test_several_runs_from_one_command_and_concurrent_jobs_agree(npz, tmp_path):
    args = ["--schedule", "step", "texp", "--seed", "0", "1", "--data", npz, *CLI_TINY, "--epochs", "2"]
    assert main([*args, "--out", str(tmp_path / "seq")]) == 0
    runs = load_runs(tmp_path / "seq")
    assert sorted((r["schedule"], r["seed"]) for r in runs) == [("step", 0), ("step", 1), ("texp", 0), ("texp", 1)]
    by = {(r["schedule"], r["seed"]): r["metrics"] for r in runs}
    assert len(by["step", 0]["test_acc"]) == 2
    # same seed = same initialisation and batches: step+WD and its exact equivalent start identically
    assert abs(by["step", 0]["train_loss"][0] - by["texp", 0]["train_loss"][0]) < 1e-3
    assert by["step", 0]["train_loss"][0] != by["step", 1]["train_loss"][0]
    assert main(["--schedule", "texp", "--seed", "0", "1", "--data", npz, *CLI_TINY, "--epochs", "2",
                 "--jobs", "2", "--out", str(tmp_path / "par")]) == 0
    for seed in (0, 1):
        assert reproducible(read_metrics(tmp_path / "par" / "texp" / f"seed{seed}")) == reproducible(
            read_metrics(tmp_path / "seq" / "texp" / f"seed{seed}"))
    # --resume over finished runs is a no-op that succeeds
    assert main([*args, "--out", str(tmp_path / "seq"), "--resume"]) == 0


@pytest.mark.slow
def test_interrupted_and_resumed_run_reproduces_the_uninterrupted_one_exactly(arrays, npz, tmp_path):
    cfg = dict(TINY, schedule="texp", wd=5e-3, rescale_above=0.102, epochs=4, data=npz)
    full = train_run(TrainConfig(**cfg), tmp_path / "full", arrays, progress=False)
    assert full.status == "finished" and full.metrics[-1]["rescale_count"] >= 1
    part = train_run(TrainConfig(**cfg), tmp_path / "part", arrays, progress=False, stop_after=2)
    assert part.status == "interrupted" and part.epochs_done == 2
    assert json.loads((tmp_path / "part" / "manifest.json").read_text())["status"] == "interrupted"
    with pytest.raises(RunError, match="already holds a run; pass --resume"):
        train_run(TrainConfig(**cfg), tmp_path / "part", arrays, progress=False)
    resumed = train_run(TrainConfig(**cfg), tmp_path / "part", arrays, progress=False, resume=True)
    assert resumed.status == "finished"
    assert reproducible(read_metrics(tmp_path / "part")) == reproducible(read_metrics(tmp_path / "full"))
    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)
    b = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=True)
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert a["scheduler"] == b["scheduler"]
    again = train_run(TrainConfig(**cfg), tmp_path / "part", arrays, progress=False, resume=True)
    assert again.message == "already finished" and again.epochs_done == 4
    with pytest.raises(ValueError, match="other settings: lr=0.1 \\(now 0.2\\)"):
        train_run(TrainConfig(**{**cfg, "lr": 0.2}), tmp_path / "part", arrays, progress=False, resume=True)
