"""The command line of explr.cifar10: every list-valued flag trains end to end, negative numbers are values, and
every value out of range (the device, float32's range for lr and rescale limits, seeds, epochs, memory) is one
line naming the flag, exit code 2, with nothing created.

PreResNet8 on 192 generated images, batch 32 (6 steps per epoch; the end-to-end sweep uses 64 images, 2 steps),
in-process calls of ``main(argv)``.
"""
import json
from pathlib import Path

import numpy as np
import pytest

import explr.cifar10.played as played_mod
from explr.cifar10 import hardware
from explr.cifar10.__main__ import build_parser, main
from explr.cifar10.config import RESCALE_ABOVE_MAX
from explr.cifar10.sources import make_synthetic
from explr.cifar10.arrays import write_npz
from explr.cifar10.metrics import read_metrics

from cifar10_helpers import CLI_TINY, tiny_arrays, tiny_npz
from explr.cifar10.config import TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


@pytest.fixture(scope="module")
def npz64(tmp_path_factory):
    """64 training images: 2 steps per epoch at batch 32."""
    return str(write_npz(tmp_path_factory.mktemp("data") / "64.npz", make_synthetic(n_train=64, n_test=32, seed=2)))


def refused(argv, capsys, flag, words=""):
    """``main(argv)`` exits 2 with one line on stderr naming ``flag`` (and ``words``)."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert flag in err and words in err, err
    return err


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
    refused([*base, "--wd", "-1e-4"], capsys, "--wd", "must be a finite number in [0, 3.40282e+38] (float32's range); got '-1e-4'")
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


def test_the_schedule_must_fit_in_memory_and_is_checked_before_it_is_built(npz, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(hardware, "available_memory", lambda: 10 * 2**20)  # 10 MiB

    def never(*args, **kwargs):
        raise AssertionError("the schedule was built before its size was checked")

    monkeypatch.setattr(played_mod, "step_decay", never)
    # 10,000 epochs x 6 steps x 256 bytes = 15 MB
    refused(["--data", npz, "--out", str(tmp_path), *CLI_TINY, "--epochs", "10000"], capsys, "--epochs",
            "0.0143 GiB of memory, more than the 0.00977 GiB available")
    assert not any(tmp_path.iterdir())


def test_available_memory_is_the_smaller_of_memavailable_and_the_cgroup_limit(tmp_path):
    (tmp_path / "meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n")
    (tmp_path / "memory.max").write_text("3000000000\n")
    (tmp_path / "memory.current").write_text("1000000000\n")
    assert hardware.available_memory(tmp_path, tmp_path / "meminfo") == 2_000_000_000
    (tmp_path / "memory.max").write_text("max\n")
    assert hardware.available_memory(tmp_path, tmp_path / "meminfo") == 4_096_000_000
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("1500000000")
    (v1 / "memory" / "memory.usage_in_bytes").write_text("500000000")
    assert hardware.available_memory(v1, tmp_path / "meminfo") == 1_000_000_000
    assert hardware.available_memory(tmp_path / "none", tmp_path / "none") is None


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
    from explr.cifar10.status import Status

    configs = [TrainConfig(schedule="step", seed=0), TrainConfig(schedule="texp", seed=0)]
    assert _report(configs, [RunResult(Path("a"), Status.SUBMITTED, job_id="17"),
                             RunResult(Path("b"), Status.FINISHED)], submitted=True) == 0
    out = capsys.readouterr().out
    assert "job 17" in out and "not submitted: finished" in out and "job None" not in out
    full = RunResult(Path("a"), Status.DISK_FULL, message="the disk filled up")
    assert _report(configs[:1], [full]) == 6


def test_the_sweep_decodes_with_the_progress_setting_and_checks_the_largest_batch(npz, tmp_path, monkeypatch):
    """--no-progress reaches the decoder, and the batch size is checked by the loader before anything is cached."""
    import explr.cifar10.preflight as sweep_mod
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
