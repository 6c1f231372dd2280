"""explr.models.PreResNet, the explr.cifar10 engine and its CLI on tiny generated CIFAR-format data.

Every run here is PreResNet8 on 192 generated 32×32 images, batch 32 (6 steps per epoch), a few
epochs: seconds on a CPU.
"""
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import explr.cifar10.data
from explr.cifar10.__main__ import main
from explr.cifar10.config import TrainConfig, default_decay_epochs, played_schedule, schedule_arrays
from explr.cifar10.data import CifarArrays, make_synthetic, write_cifar_batches
from explr.cifar10.engine import Trainer
from explr.cifar10.runs import METRIC_KEYS, RunError, load_runs, read_metrics, train_run
from explr.invariance import check_scale_invariance
from explr.models import PreResNet, rescale_running_statistics
from explr.schedules import EquivalentSchedule, PlainSchedule, cosine, step_decay, texp, texp_minus_minus

from cifar10_helpers import CLI_TINY, TINY, reproducible, tiny_arrays, tiny_npz

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


# ----------------------------------------------------------------------------- the model
@pytest.mark.parametrize("depth", [8, 20, 32])
def test_preresnet_has_depth_weighted_layers_and_the_invariant_mode_freezes_bn_and_fc(depth):
    model = PreResNet(depth, seed=0)
    convs3 = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3)]
    assert len(convs3) + 1 == depth  # 6n + 1 convolutions and the linear layer
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d) for n in [n + ".weight"]}
    assert all(not p.requires_grad for p in model.fc.parameters())
    ordinary = PreResNet(depth, invariant=False, seed=0)
    assert all(p.requires_grad for p in ordinary.parameters())
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_preresnet_rejects_bad_depth():
    for bad in (21, 2, 32.0, True):
        with pytest.raises(ValueError, match="depth must be 6n \\+ 2"):
            PreResNet(bad)


def test_invariant_preresnet_is_jointly_scale_invariant_and_bn_stats_follow_rescaling():
    torch.manual_seed(0)  # 8×8 inputs (the network pools globally): float64 convolutions are slow on a CPU
    x, y = torch.randn(16, 3, 8, 8, dtype=torch.float64), torch.randint(0, 10, (16,))
    model = PreResNet(8, eps=1e-300, seed=0).double()
    rows = check_scale_invariance(model, F.cross_entropy, x, y, scales=(0.1, 10.0), rtol=1e-10)
    assert rows[-1].group == "all trainable" and rows[-1].invariant and rows[-1].grad_alignment < 1e-10
    ordinary = PreResNet(8, eps=1e-300, invariant=False, seed=0).double()
    assert not check_scale_invariance(ordinary, F.cross_entropy, x, y, scales=(0.1, 10.0), rtol=1e-6)[-1].invariant
    # eval mode uses running statistics: they must be rescaled with θ to keep the function
    for _ in range(3):
        model(x)  # fill the running statistics
    model.eval()
    before = model(x)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.mul_(7.0)
    stale = model(x)
    rescale_running_statistics(model, 7.0)
    torch.testing.assert_close(model(x), before, rtol=1e-10, atol=1e-10)
    assert (stale - before).abs().max() > 1e-3


# ----------------------------------------------------------------------------- schedules
def test_schedule_names_map_to_the_papers_schedules():
    c = TrainConfig(epochs=8, decay_epochs=(4, 6), wd=5e-4, momentum=0.9)
    S = 5
    base = step_decay(0.1, 8, S, [4, 6])
    expected = {
        "step": (base, np.full(40, 5e-4), False),
        "texp": (texp(base, 5e-4, 0.9).lr, texp(base, 5e-4, 0.9).wd, True),
        "texp--": (texp_minus_minus(base, 5e-4, 0.9).lr, texp_minus_minus(base, 5e-4, 0.9).wd, True),
        "cosine": (cosine(0.1, 8, S), np.full(40, 5e-4), False),
        "cosine-texp": (texp(cosine(0.1, 8, S), 5e-4, 0.9).lr, texp(cosine(0.1, 8, S), 5e-4, 0.9).wd, True),
    }
    for name, (lr, wd, exponential) in expected.items():
        c.schedule = name
        got = played_schedule(c, S)
        np.testing.assert_array_equal(got.lr, lr)
        np.testing.assert_array_equal(got.wd, wd)
        assert isinstance(got, EquivalentSchedule) == exponential
        assert isinstance(got, EquivalentSchedule if exponential else PlainSchedule)
        np.testing.assert_array_equal(schedule_arrays(c, S)[0], lr)  # chapter 6's per-step lr
    assert default_decay_epochs(200) == [100, 150] and default_decay_epochs(20) == [10, 15]
    assert default_decay_epochs(1) == []


@pytest.mark.slow
def test_texp_run_trains_the_same_networks_as_step_decay_in_float64(arrays):
    """Engine-level Theorem 2.12: same seed, same batches; texp (no WD, rescaled on the way) ≡ step decay + WD.

    Training losses use batch statistics, which are scale invariant; with BN eps ~ 0 in float64 the
    per-epoch mean losses agree to 1e-9.  (Eval-mode test losses use running averages over steps at
    different scales, so they agree only approximately.)  12×12 crops of the images keep float64 fast.
    """
    small = CifarArrays(arrays.x_train[:, :12, :12].copy(), arrays.y_train, arrays.x_test[:, :12, :12].copy(),
                        arrays.y_test, source="crop", kind="synthetic")
    base = dict(epochs=3, batch_size=32, depth=8, precision="fp64", bn_eps=1e-300, wd=5e-3, decay_epochs=(2,),
                channels_last=False, threads=1, eval_batch_size=64)
    step = Trainer(TrainConfig(schedule="step", **base).validate(), small)
    exp = Trainer(TrainConfig(schedule="texp", rescale_above=0.102, **base).validate(), small)
    for epoch in range(3):
        a, b = step.train_epoch(epoch), exp.train_epoch(epoch)
        assert abs(a[0] - b[0]) <= 1e-9 * abs(a[0]) and a[1] == b[1]
    assert exp.scheduler.rescale_count >= 1
    assert abs(step.evaluate()[0] - exp.evaluate()[0]) < 0.05


# ----------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_cli_end_to_end_on_npz_and_on_cifar_batches_gives_identical_runs(arrays, npz, tmp_path, capsys):
    table = write_cifar_batches(tmp_path / "cifar" / "cifar-10-batches-py", arrays)
    assert main(["--schedule", "texp", "--data", npz, "--out", str(tmp_path / "a"), *CLI_TINY]) == 0
    out = tmp_path / "a" / "texp" / "seed0"
    rows = read_metrics(out)
    assert [r["epoch"] for r in rows] == [1, 2, 3] and set(rows[0]) == set(METRIC_KEYS)
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


@pytest.mark.slow
def test_a_schedule_beyond_float64_trains_from_log_space():
    """TEXP at wd 1e-2 over 80,000 steps: its lr passes float64's range (e^1600), yet the engine plays it."""
    arrays = make_synthetic(n_train=400, n_test=20, seed=0)
    config = TrainConfig(schedule="texp", epochs=200, batch_size=1, depth=8, wd=1e-2, device="cpu",
                         precision="fp32", rescale_above=1.0).validate()
    lr, _ = schedule_arrays(config, 400)
    assert np.isinf(lr).any(), "the schedule's lr exceeds float64 somewhere"
    trainer = Trainer(config, arrays)
    assert trainer.schedule.log_lr.max() > 709 and np.isfinite(trainer.schedule.log_lr).all()
    state = trainer.begin_epoch(0)
    trainer.run_steps(state, 0, 20)
    assert 0 < trainer.optimizer.param_groups[0]["lr"] <= 1.0 and math.isfinite(trainer.norms())
