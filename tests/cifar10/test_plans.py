"""explr.cifar10.plans: the named experiment plans of chapter 6."""
from explr.cifar10.config import SCHEDULES
from explr.cifar10.plans import PAPER_SCALE, experiment_plan, paper_scale_milestones


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
