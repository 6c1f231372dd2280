"""experiments/confirmatory_grid.py: the v2 plan's grid, built from the plan, in seed-complete rounds; its dry run
(tiny recipe, synthetic images, CPU) checks balance and resume on the engine."""
import importlib.util
from pathlib import Path

import pytest

from explr.book.stats import PLAN_V2_PATH, load_plan

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("confirmatory_grid", ROOT / "experiments" / "confirmatory_grid.py")
grid = importlib.util.module_from_spec(spec)
spec.loader.exec_module(grid)
PLAN = load_plan(PLAN_V2_PATH)


def test_a_round_is_every_arm_of_its_seeds_with_the_plans_recipe():
    seeds = PLAN.seeds[:2]
    rounds = grid.round_plan(PLAN, seeds, device="cpu")
    assert set(rounds) == {"main", "ablation-none"}
    got = {(c.schedule, c.corrections, c.seed) for group in rounds.values() for c in group}
    assert got == {(a["schedule"], a["corrections"], k) for a in PLAN.arms.values() for k in seeds}
    assert len(got) == sum(len(g) for g in rounds.values()) == 2 * len(PLAN.arms)
    assert all(c.corrections == "none" for c in rounds["ablation-none"])
    for c in (c for group in rounds.values() for c in group):
        assert c.device == "cpu" and c.epochs == PLAN.config["epochs"] == 16
        assert list(c.decay_epochs) == PLAN.config["decay_epochs"] and c.wd == PLAN.config["wd"]


def test_train_grid_checks_its_round_sizes(tmp_path):
    for bad in (dict(seeds_at_once=0), dict(rounds=0)):
        with pytest.raises(ValueError, match="must be >= 1"):
            grid.train_grid(PLAN, tmp_path, arrays=None, **bad)


def test_the_dry_run_trains_a_balanced_grid_and_resumes_it(tmp_path, capsys):
    """Each arm of the plan twice (2 seeds), after one round, an interrupted run and a refused rerun."""
    assert grid.dry_run(PLAN, tmp_path) == dict.fromkeys(sorted(PLAN.arms), 2)
    lines = capsys.readouterr().out.splitlines()
    for rule in ("one round leaves exactly seed", "without --resume is refused", "--resume finishes the grid",
                 "untouched", "has all its epochs"):
        assert any(rule in line and line.endswith(": ok") for line in lines), rule


def test_the_grid_refuses_an_unregistered_or_edited_plan(tmp_path, capsys):
    draft = tmp_path / "draft.json"
    draft.write_bytes(PLAN_V2_PATH.read_bytes())
    assert grid.main(["--plan", str(draft), "--out", str(tmp_path / "out")]) == 2
    assert "is not registered" in capsys.readouterr().err and not (tmp_path / "out").exists()
    edited = tmp_path / PLAN_V2_PATH.name
    edited.write_bytes(PLAN_V2_PATH.read_bytes().replace(b'"margin": 0.005', b'"margin": 0.006'))
    with pytest.raises(ValueError, match="never edited"):
        grid.main(["--plan", str(edited)])
