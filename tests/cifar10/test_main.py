"""explr.cifar10.__main__, the command line: every list-valued flag trains end to end, negative numbers are values,
every value out of range (the device, float32's range for lr and rescale limits, seeds, epochs, memory) is one
line naming the flag, exit code 2, with nothing created; the report and its exit codes; and end to end, the same
runs from every data format and from concurrent jobs.

PreResNet8 on 192 generated images, batch 32 (6 steps per epoch; the end-to-end sweep uses 64 images, 2 steps),
in-process calls of ``main(argv)``.
"""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import explr.cifar10.data
from explr.cifar10 import data
from explr.cifar10.__main__ import build_parser, main
from explr.cifar10.config import RESCALE_ABOVE_MAX
from explr.cifar10.data import make_synthetic
from cifar10_helpers import write_cifar_batches
from cifar10_helpers import write_npz
from cifar10_helpers import write_image_folder
from explr.cifar10.runfolder import TIMING_KEYS, read_metrics
from explr.cifar10.runfolder import load_runs

from cifar10_helpers import CLI_TINY, EPOCH_KEYS, refused, reproducible, tiny_arrays, tiny_npz
from explr.cifar10.config import TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


@pytest.fixture(scope="module")
def npz64(tmp_path_factory):
    """64 training images: 2 steps per epoch at batch 32."""
    return str(write_npz(tmp_path_factory.mktemp("data") / "64.npz", make_synthetic(n_train=64, n_test=32, seed=2)))


# ----------------------------------------------------------------------------- list-valued flags, end to end
def test_every_list_valued_flag_trains_through_the_cli(npz64, tmp_path):
    """--schedule, --seed and --decay-epochs each take several values (a parser that refused every value of
    --decay-epochs once made custom milestones impossible)."""
    assert main(["--data", npz64, "--out", str(tmp_path), *CLI_TINY, "--epochs", "3", "--decay-epochs", "1", "2",
                 "--schedule", "step", "texp", "--seed", "3", "4"]) == 0
    for schedule in ("step", "texp"):
        for seed in (3, 4):
            run = tmp_path / schedule / f"seed{seed}"
            manifest = json.loads((run / "manifest.json").read_text())
            assert manifest["status"] == "finished" and manifest["resolved"]["milestones"] == [1, 2]
            assert manifest["config"]["seed"] == seed
    step = read_metrics(tmp_path / "step" / "seed3")
    np.testing.assert_allclose([r["lr"] for r in step], [0.1, 0.01, 0.001], rtol=1e-12)  # decays at 1 and 2
    assert step[0]["train_loss"] != read_metrics(tmp_path / "step" / "seed4")[0]["train_loss"]
    # --decay-epochs with no value: a constant lr (the default for 2 epochs would decay at 1)
    assert main(["--data", npz64, "--out", str(tmp_path / "constant"), *CLI_TINY, "--epochs", "2", "--decay-epochs",
                 "--schedule", "step"]) == 0
    np.testing.assert_allclose([r["lr"] for r in read_metrics(tmp_path / "constant" / "step" / "seed0")], [0.1, 0.1],
                               rtol=1e-12)


def test_each_value_and_the_whole_list_of_decay_epochs_are_checked(npz, tmp_path, capsys):
    base = ["--data", npz, "--out", str(tmp_path), *CLI_TINY]
    refused([*base, "--decay-epochs", "1", "x"], capsys, "--decay-epochs", "must be an integer >= 1; got 'x'")
    refused([*base, "--decay-epochs", "2", "1"], capsys, "--decay-epochs", "strictly increasing")
    refused([*base, "--decay-epochs", "1", "3"], capsys, "--decay-epochs", "[1, 2]")
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- negative numbers
def test_a_negative_number_is_the_value_of_its_flag(npz, tmp_path, capsys):
    base = ["--data", npz, "--out", str(tmp_path), *CLI_TINY]
    refused([*base, "--wd", "-1e-4"], capsys, "--wd",
            "must be a finite number in [0, 3.40282e+38] (float32's range); got '-1e-4'")
    refused([*base, "--lr", "-1E-3"], capsys, "--lr", "got '-1E-3'")
    refused([*base, "--momentum", "-inf"], capsys, "--momentum", "got '-inf'")
    assert build_parser().parse_args(["--wd", "-0e0", "--seed", "1", "2"]).wd == 0.0
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- ranges, before anything is created
@pytest.mark.parametrize("argv, flag, words", [
    (["--device", "meta"], "--device", "one of auto, cpu, cuda, cuda:N with N in [0, 127], mps"),
    (["--device", "xpu"], "--device", "got 'xpu'"),
    (["--device", "cuda:x"], "--device", "got 'cuda:x'"),
    (["--schedule", "texp", "--lr", "5e-324"], "--lr", "float32's normal range"),
    (["--lr", "1e39"], "--lr", "float32's normal range"),
    (["--lr", "1e-39"], "--lr", "float32's normal range"),
    (["--schedule", "step", "--lr", "1e-36", "--decay-factor", "0.001", "--decay-epochs", "1", "2"], "--lr",
     "falls to 1e-42 in epoch 3, below float32's smallest normal number"),
    (["--schedule", "cosine", "--lr", "2e-38"], "--lr", "falls to 5e-39 in epoch 3"),  # (1 + cos(2pi/3))/2 = 1/4
    (["--schedule", "texp", "--lr", "1e-36", "--decay-factor", "0.001", "--decay-epochs", "1", "2"], "--lr",
     "texp schedule's lr as the optimizer plays it (rescaled) falls to"),
    (["--schedule", "texp", "--rescale-above", "1e39"], "--rescale-above", "float32's largest value / 4"),
    (["--schedule", "texp", "--rescale-above", f"{RESCALE_ABOVE_MAX * 1.01!r}"], "--rescale-above", "/ 4"),
    (["--seed", str(2**64)], "--seed", "[0, 18446744073709551615]"),
    (["--seed", "0", str(2**64)], "--seed", "torch.manual_seed"),
    (["--epochs", "100000000"], "--epochs", "[1, 100000]"),
])
def test_values_out_of_range_are_one_line_naming_the_flag_and_nothing_is_created(argv, flag, words, npz, tmp_path,
                                                                                 capsys):
    refused(["--data", npz, "--out", str(tmp_path), *CLI_TINY, *argv], capsys, flag, words)
    assert not any(tmp_path.iterdir())


def test_the_largest_values_in_range_still_train(npz, tmp_path):
    """A seed of 2**64 - 1 (torch.manual_seed's largest) and rescale_above at its bound."""
    assert main(["--data", npz, "--out", str(tmp_path), *CLI_TINY, "--epochs", "1", "--seed", str(2**64 - 1),
                 "--schedule", "texp", "--rescale-above", repr(RESCALE_ABOVE_MAX)]) == 0
    assert len(read_metrics(tmp_path / "texp" / f"seed{2**64 - 1}")) == 1


# ----------------------------------------------------------------------------- launcher options and the report
@pytest.mark.parametrize("extra, flag", [
    (["--launcher", "submitit", "--jobs", "2"], "--jobs"),
    (["--partition", "gpu"], "--partition"),
    (["--account", "lab"], "--account"),
    (["--no-wait"], "--no-wait"),
])
def test_options_the_launcher_would_ignore_are_refused(npz, tmp_path, capsys, extra, flag):
    refused(["--data", npz, "--out", str(tmp_path / "out"), *CLI_TINY, *extra], capsys, flag)
    assert not (tmp_path / "out").exists()


def test_the_report_names_runs_not_submitted_and_maps_a_full_disk_to_its_exit_code(capsys):
    from explr.cifar10.__main__ import _report
    from explr.cifar10.runs import RunResult
    from explr.cifar10.runfolder import Status

    configs = [TrainConfig(schedule="step", seed=0), TrainConfig(schedule="texp", seed=0)]
    assert _report(configs, [RunResult(Path("a"), Status.SUBMITTED, job_id="17"),
                             RunResult(Path("b"), Status.FINISHED)], submitted=True) == 0
    out = capsys.readouterr().out
    assert "job 17" in out and "not submitted: finished" in out and "job None" not in out
    full = RunResult(Path("a"), Status.DISK_FULL, message="the disk filled up")
    assert _report(configs[:1], [full]) == 6


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--epochs", "0"], "--epochs"),
        (["--depth", "21"], "--depth"),
        (["--schedule", "exp"], "--schedule"),
        (["--lr", "-0.1"], "--lr"),
        (["--lr", "nan"], "--lr"),
        (["--momentum", "1"], "--momentum"),
        (["--wd", "-1e-4"], "--wd"),
        (["--seed", "-1"], "--seed"),
        (["--precision", "fp16"], "--precision"),
        (["--device", "warp-drive"], "--device"),
        (["--epochs", "4", "--decay-epochs", "2", "4"], "--decay-epochs"),
        (["--schedule", "cosine-texp", "--no-invariant"], "--no-invariant"),
        (["--data", "/nonexistent/cifar.npz"], "--data"),
        (["--batch-size", "1000"], "--batch-size"),
    ],
)
def test_cli_fails_fast_naming_the_flag(argv, flag, npz, tmp_path, capsys):
    base = ["--data", npz, "--out", str(tmp_path), "--epochs", "4"]
    with pytest.raises(SystemExit) as exc:
        main([*base, *argv])
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing was trained or written


def test_cli_refuses_to_overwrite_or_to_resume_with_other_settings(npz, tmp_path, capsys):
    args = ["--schedule", "step", "--data", npz, "--out", str(tmp_path), *CLI_TINY, "--epochs", "1"]
    assert main(args) == 0
    with pytest.raises(SystemExit):
        main(args)
    assert "pass --resume" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*args, "--resume", "--wd", "1e-3"])
    assert "--resume" in (err := capsys.readouterr().err) and "wd=0.0005 (now 0.001)" in err


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--schedule", "--epochs", "--seed", "--data", "--out", "--lr", "--wd", "--momentum", "--batch-size",
                 "--decay-epochs", "--depth", "--device", "--precision", "--compile", "--resume", "--jobs",
                 "--channels-last", "--rescale-above", "--invariant"):
        assert flag in text


# ----------------------------------------------------------------------------- hostile input
class TestHostileInput:
    """Values that once escaped the checks (the hostile-input probe's defects 4-8, 11, 12): exit code 2 with one
    line naming the flag and its valid range, and nothing created."""

    @pytest.mark.parametrize("argv, flag, valid", [
        (["--schedule", "step", "--wd", "1e39"], "--wd", "[0, 3.40282e+38]"),  # 4
        (["--schedule", "cosine", "--wd", "1e39"], "--wd", "[0, 3.40282e+38]"),
        (["--device", "cuda:99999999999999999999"], "--device", "cuda:N with N in [0, 127]"),  # 5
        (["--device", "cuda:128"], "--device", "cuda:N with N in [0, 127]"),  # torch reads it as cuda:-128
        (["--threads", "99999999999"], "--threads", "[1, 1024]"),  # 6
        (["--threads", "1025"], "--threads", "[1, 1024]"),
        (["--depth", "6000002"], "--depth", "n in [1, 200]"),  # 7
        (["--depth", "1208"], "--depth", "n in [1, 200]"),
        (["--bn-eps", "1e39"], "--bn-eps", "(0, 0.1]"),  # 11
        (["--bn-eps", "0.5"], "--bn-eps", "(0, 0.1]"),
        (["--time", "30"], "--time", "--launcher submitit"),  # 12
        (["--cluster", "local"], "--cluster", "--launcher submitit"),
        (["--cluster", "slurm"], "--cluster", "--launcher submitit"),
    ])
    def test_a_value_out_of_range_is_one_line_naming_the_flag_and_its_range(self, argv, flag, valid, npz, tmp_path,
                                                                             capsys):
        out = tmp_path / "out"
        refused(["--data", npz, "--out", str(out), *CLI_TINY, *argv], capsys, flag, valid)
        assert not any(tmp_path.iterdir())

    def test_an_empty_out_is_refused_like_an_empty_data(self, npz, tmp_path, capsys, monkeypatch):
        """8: ``--out ''`` once trained into ./step/seed0."""
        monkeypatch.chdir(tmp_path)
        refused(["--data", npz, "--out", "", *CLI_TINY], capsys, "--out", "must be a folder")
        refused(["--data", "", "--out", "x", *CLI_TINY], capsys, "--data", "must be a data source")
        assert not any(tmp_path.iterdir())

    def test_the_largest_values_in_range_are_accepted(self, npz, tmp_path):
        """The new upper bounds do not refuse what they allow: depth 1202 (He et al.'s deepest CIFAR ResNet) parses,
        and so does wd at float32's largest value; wd just below the stability limit 2(1 + momentum)/lr = 38, bn_eps 0.1
        and 1024 threads validate."""
        from explr.cifar10.__main__ import build_parser
        from explr.cifar10.config import configs_from_args

        assert build_parser().parse_args(["--wd", "3.4e38"]).wd == 3.4e38
        args = build_parser().parse_args(["--depth", "1202", "--wd", "37.99", "--bn-eps", "0.1", "--threads", "1024",
                                          "--device", "cuda:127"])
        (config,) = configs_from_args(args)
        assert config.validate().depth == 1202 and config.threads == 1024


# ----------------------------------------------------------------------------- hostile run files
class TestHostileRunFiles:
    """Run folders and flags a hostile or careless user can hand the engine: each is one line naming the file or
    flag (exit code 2, or 6 for a full disk), and nothing outside the engine's own files is written or deleted."""

    def test_an_interrupt_while_decoding_says_no_run_started(self, tmp_path, capsys, monkeypatch):
        tree = write_image_folder(tmp_path / "tree", make_synthetic(n_train=40, n_test=20, seed=3))

        def interrupted(*args):
            raise KeyboardInterrupt()

        monkeypatch.setattr(data, "_decode_image", interrupted)
        argv = ["--schedule", "step", "--data", str(tree), "--data-root", str(tmp_path / "root"), "--out",
                str(tmp_path / "out"), *CLI_TINY]
        assert main(argv) == 130
        err = capsys.readouterr().err
        assert "last checkpoints" not in err and "interrupted before any run started" in err, err
        assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- a diverged run
def test_the_command_line_exits_3_with_the_divergence_line(npz, tmp_path, capsys):
    """A run that really diverges: lr = 1e30 without weight decay (inside float32's range, and lr*wd = 0 below the
    stability limit, so the config accepts it) overflows the weights within the first epoch; the CLI names the epoch
    and the remedy, and exits 3."""
    assert main(["--schedule", "step", "--data", npz, "--out", str(tmp_path / "cli"), *CLI_TINY, "--lr", "1e30",
                 "--wd", "0"]) == 3
    err = capsys.readouterr().err
    assert "non-finite" in err and "epoch 1" in err and "Lower --lr" in err, err
    manifest = json.loads((tmp_path / "cli" / "step" / "seed0" / "manifest.json").read_text())
    assert manifest["status"] == "diverged" and manifest["epochs_done"] == 0


# ----------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_cli_end_to_end_on_npz_and_on_cifar_batches_gives_identical_runs(arrays, npz, tmp_path, capsys):
    table = write_cifar_batches(tmp_path / "cifar" / "cifar-10-batches-py", arrays)
    assert main(["--schedule", "texp", "--data", npz, "--out", str(tmp_path / "a"), *CLI_TINY]) == 0
    out = tmp_path / "a" / "texp" / "seed0"
    rows = read_metrics(out)
    assert [r["epoch"] for r in rows] == [1, 2, 3] and list(rows[0]) == [*EPOCH_KEYS, *TIMING_KEYS]
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
    original = explr.cifar10.data.CIFAR10_FILES_MD5
    explr.cifar10.data.CIFAR10_FILES_MD5 = table
    try:
        assert main(["--schedule", "texp", "--data", str(tmp_path / "cifar"), "--out", str(tmp_path / "b"),
                     *CLI_TINY]) == 0
    finally:
        explr.cifar10.data.CIFAR10_FILES_MD5 = original
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
