"""explr.cifar10.plans (the named experiment plans), config_to_argv and the sweep pool's deadline."""
import time

import pytest

from explr.cifar10.__main__ import build_parser
from explr.cifar10.config import SCHEDULES, TrainConfig, config_to_argv, configs_from_args
from explr.cifar10.plans import PAPER_SCALE, experiment_plan, paper_scale_milestones
from explr.cifar10.sweep import run_many

from cifar10_helpers import TINY, tiny_arrays

arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")


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


def test_the_plans_are_chapter_6s():
    assert PAPER_SCALE == {"wd": 5e-3, "rescale_above": 1.0}
    assert paper_scale_milestones(12) == [8, 10] and paper_scale_milestones(16) == [11, 13]
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


def test_a_passed_deadline_starts_no_run(arrays, tmp_path):
    configs = [TrainConfig(**TINY, schedule=s) for s in ("step", "texp")]
    results = run_many(configs, tmp_path, arrays=arrays, jobs=2, progress=False, deadline=time.time() - 1)
    assert [r.status for r in results] == ["not started", "not started"]
    assert not list(tmp_path.rglob("checkpoint.pt"))
