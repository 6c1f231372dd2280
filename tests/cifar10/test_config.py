"""explr.cifar10.config: every setting declared once (parser, validation, resume keys), the schedule a config plays,
the machine it resolves to (CPUs, memory, one GPU per worker) and the named plans."""
import argparse
import dataclasses

import numpy as np
import pytest
import torch

from explr.cifar10 import config, sweep
from explr.cifar10.__main__ import build_parser, main
from explr.cifar10.config import (
    PAPER_SCALE, RESOLVED_KEYS, SCHEDULES, TRAJECTORY_KEYS, TrainConfig, add_config_arguments, config_to_argv,
    configs_from_args, default_decay_epochs, experiment_plan, lr_wd_limit, played_schedule,
)
from explr.schedules import EquivalentSchedule, PlainSchedule, cosine, step_decay, texp, texp_minus_minus

from cifar10_helpers import CLI_TINY, refused, tiny_arrays, tiny_npz

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


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


# ----------------------------------------------------------------------------- what the maths says can train
@pytest.mark.parametrize("schedule, lr, wd, momentum, words", [
    ("step", 0.1, 100.0, 0.9, ("wd (--wd) 100", "lr*wd = 10", "2(1 + momentum) = 3.8")),
    ("cosine", 1.0, 2.0, 0.0, ("wd (--wd) 2", "lr*wd = 2", "2(1 + momentum) = 2")),  # the limit itself diverges
    ("step", 0.1, 3.4e38, 0.9, ("lr*wd = 3.4e+37",)),
    ("texp", 0.1, 0.03, 0.9, ("schedule texp", "wd (--wd) 0.03", "no positive real root")),
    ("cosine-texp", 1.0, 1.0, 0.0, ("schedule cosine-texp", "no positive real root")),
])
def test_a_weight_decay_at_which_sgd_must_diverge_is_refused(schedule, lr, wd, momentum, words):
    """Issue 41 item 18: such a run started, left its folder and ended diverged (exit 3)."""
    config = TrainConfig(schedule=schedule, lr=lr, wd=wd, momentum=momentum)
    with pytest.raises(ValueError) as raised:
        config.validate()
    assert "\n" not in str(raised.value)
    for word in words:
        assert word in str(raised.value)


def test_the_largest_weight_decays_below_the_limits_validate():
    limit = lr_wd_limit(0.9)
    assert limit == pytest.approx(3.8)
    TrainConfig(schedule="step", lr=0.1, wd=np.nextafter(limit, 0) / 0.1, momentum=0.9).validate()
    TrainConfig(schedule="texp", lr=0.1, wd=(1 - np.sqrt(0.9)) ** 2 / 0.1 * (1 - 1e-12), momentum=0.9).validate()


@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
def test_the_limit_is_where_sgd_with_momentum_blows_the_weights_up(momentum):
    """torch's SGD on a scale-invariant loss, in float64.  3 % above :func:`lr_wd_limit` the weight norm grows from
    the first step: by more than 10^4 in 200 steps from a unit norm (the predicted root -1.06^200 = 1e5 for momentum
    0, more for the others).  3 % below it the weight decay shrinks the norm, seen where it dominates the gradient
    (a norm of 10^30, 50 steps; nearer the unit sphere the gradient, ~1/norm, makes the norm fluctuate)."""
    torch.manual_seed(0)
    x, target = torch.randn(64, 8, dtype=torch.float64), torch.randn(64, dtype=torch.float64)

    def growth(lr_wd, norm, steps, lr=1e-3):
        w = torch.randn(8, dtype=torch.float64)
        w = (w * (norm / w.norm())).requires_grad_()
        opt = torch.optim.SGD([w], lr=lr, weight_decay=lr_wd / lr, momentum=momentum)
        for _ in range(steps):
            opt.zero_grad()
            ((x @ (w / w.norm()) - target) ** 2).mean().backward()  # L(c w) = L(w): scale invariant
            opt.step()
        return w.detach().norm().item() / norm

    assert growth(1.03 * lr_wd_limit(momentum), 1.0, 200) > 1e4
    assert growth(0.97 * lr_wd_limit(momentum), 1e30, 50) < 1


def test_the_cli_refuses_such_a_weight_decay_before_the_data_and_creates_nothing(tmp_path, capsys, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the data was loaded before the settings were checked")

    monkeypatch.setattr(sweep, "load_cifar10", never)
    for argv, word in ((["--schedule", "step", "--wd", "100"], "2(1 + momentum)"),
                       (["--schedule", "texp", "--wd", "0.03"], "no positive real root")):
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--out", str(tmp_path / "out"), "--data-root", str(tmp_path / "data"), *CLI_TINY])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and word in err and "--wd" in err, err
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- a config's command line
@pytest.mark.parametrize("config", [
    TrainConfig(),
    TrainConfig(schedule="texp", seed=2**64 - 1, wd=5e-3, rescale_above=1.0, decay_epochs=(8, 10), epochs=12),
    TrainConfig(schedule="cosine", decay_epochs=(), invariant=False, augment=False, channels_last=False, threads=3,
                lr=0.05, corrections="none", data="x.npz", precision="fp64", compile="default"),
])
def test_config_to_argv_gives_the_config_back_through_the_command_line(config):
    args = build_parser().parse_args(config_to_argv(config))
    assert configs_from_args(args) == [config]
    assert configs_from_args(build_parser().parse_args(config_to_argv(config, defaults=True))) == [config]


def test_config_to_argv_names_only_what_differs_from_the_defaults():
    assert config_to_argv(TrainConfig()) == []
    assert config_to_argv(TrainConfig(wd=5e-3, augment=False)) == ["--wd", "0.005", "--no-augment"]


def test_available_cpus_follow_the_affinity_mask_and_threads_leave_one_free(monkeypatch):
    """SLURM, taskset and Docker's --cpuset-cpus show in the affinity mask: 2 of the host's CPUs are 2 CPUs."""
    monkeypatch.setattr(config.os, "sched_getaffinity", lambda pid: {3, 5})
    assert config.available_cpus() == 2
    monkeypatch.setattr(config, "available_cpus", lambda: 8)
    assert config.resolve_threads(None, torch.device("cpu")) == 7  # one CPU left for everything else
    assert config.resolve_threads(None, torch.device("cpu"), jobs=3) == 2
    assert config.resolve_threads(None, torch.device("cuda")) == 1
    monkeypatch.setattr(config, "available_cpus", lambda: 1)
    assert config.resolve_threads(None, torch.device("cpu")) == 1
    assert config.resolve_threads(5, torch.device("cpu")) == 5  # --threads overrides


def test_worker_i_gets_gpu_i_mod_g(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert config.worker_gpus(7) == ["0", "1", "2", "0", "1", "2", "0"]
    assert config.worker_gpus(4, visible="5,6,7") == ["5", "6", "7", "5"]  # the parent's own subset
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert config.worker_gpus(2) == [None, None]


def test_available_memory_is_memavailable():
    with open("/proc/meminfo") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    assert abs(config.available_memory() - kib * 1024) < 256 << 20  # read again a moment later


# ----------------------------------------------------------------------------- memory
def test_the_schedule_must_fit_in_memory_and_is_checked_before_it_is_built(npz, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(config, "available_memory", lambda: 10 * 2**20)  # 10 MiB

    def never(*args, **kwargs):
        raise AssertionError("the schedule was built before its size was checked")

    monkeypatch.setattr(config, "step_decay", never)
    # 10,000 epochs x 6 steps x 256 bytes = 15 MB
    refused(["--data", npz, "--out", str(tmp_path), *CLI_TINY, "--epochs", "10000"], capsys, "--epochs",
            "0.0143 GiB of memory, more than the 0.00977 GiB available")
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- the paper's schedules
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
    assert default_decay_epochs(200) == [100, 150] and default_decay_epochs(20) == [10, 15]
    assert default_decay_epochs(1) == []


def test_the_plans_are_chapter_6s():
    assert PAPER_SCALE == {"wd": 5e-3, "rescale_above": 1.0}
    assert [c.decay_epochs for c in experiment_plan(4, [0], paper_epochs=12)["paper-scale"]] == [(8, 10), (8, 10)]
    plan = experiment_plan(16, [0, 1], device="cpu")
    assert list(plan) == ["main", "ablation-none", "paper-scale"]
    assert [(c.schedule, c.seed) for c in plan["main"]] == [(s, k) for s in SCHEDULES for k in (0, 1)]
    assert all(c.corrections == "none" and c.schedule == "texp" for c in plan["ablation-none"])
    assert [(c.schedule, c.seed, c.decay_epochs, c.wd, c.rescale_above) for c in plan["paper-scale"]] == [
        ("step", 0, (11, 13), 5e-3, 1.0), ("texp", 0, (11, 13), 5e-3, 1.0)]
    assert all(c.device == "cpu" and c.epochs == 16 for group in plan.values() for c in group)
    assert list(experiment_plan(4, [0], schedules=("step",))) == ["main", "paper-scale"]
    assert list(experiment_plan(4, [0], ablation=False, paper_scale=False)) == ["main"]
    uneven = experiment_plan(2, {"step": [0, 1], "texp": [0, 1, 2]}, schedules=("step", "texp"), paper_scale=False)
    assert [c.seed for c in uneven["ablation-none"]] == [0, 1, 2]
