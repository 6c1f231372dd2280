"""experiments/confirmatory_grid.py: the v2 plan's grid, built from the plan, in seed-complete rounds; its dry run
(tiny recipe, synthetic images, CPU) checks balance and resume on the engine."""
import importlib.util
import json
import os
import signal
from pathlib import Path

import pytest
import torch

import explr.cifar10.runs as runs_mod
from explr.book.registration import PLAN_V2_PATH, load_plan
from explr.cifar10 import hardware, preflight, sweep

from cifar10_helpers import tiny_arrays, tiny_npz

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
        with pytest.raises(ValueError, match="must be an integer >= 1"):
            grid.train_grid(PLAN, tmp_path, arrays=None, **bad)


def test_the_dry_run_trains_a_balanced_grid_and_resumes_it(tmp_path, capsys):
    """Each arm of the plan twice (2 seeds), after one round, an interrupted run and a refused rerun."""
    assert grid.dry_run(PLAN, tmp_path) == dict.fromkeys(sorted(PLAN.arms), 2)
    lines = capsys.readouterr().out.splitlines()
    for rule in ("one round leaves exactly seed", "without --resume is refused", "--resume finishes the grid",
                 "untouched", "has all its epochs"):
        assert any(rule in line and line.endswith(": ok") for line in lines), rule


# ----------------------------------------------------------------------------- bad input: one line, exit 2, before the data
def exit_code_of(argv) -> int:
    """``grid.main(argv)``'s exit code, whether it returns it or exits (argparse)."""
    try:
        return grid.main(argv)
    except SystemExit as exc:
        return exc.code


def refused(argv, capsys, *words):
    """The grid exits 2 with one line on stderr, no traceback, naming every one of ``words``."""
    code = exit_code_of(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


@pytest.fixture()
def loads(monkeypatch):
    """The data sources the grid loads (none, in these tests: each load fails the test)."""
    loaded = []

    def never(*args, **kwargs):
        loaded.append(args)
        raise AssertionError("the data was loaded before the flags, the plan and the run folders were checked")

    monkeypatch.setattr(grid, "load_cifar10", never)
    monkeypatch.setattr(preflight, "load_cifar10", never)
    return loaded


def manifest_of(out, schedule="step", seed=100, text=None, **fields):
    """A run folder of the grid's main experiment holding only a manifest (``text``, or ``fields`` as JSON)."""
    run = out / "main" / schedule / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(text if text is not None else json.dumps(fields))
    return run / "manifest.json"


@pytest.mark.parametrize("argv, words", [
    (["--seeds-at-once", "0"], ("--seeds-at-once", "an integer >= 1", "got '0'")),
    (["--seeds-at-once", "x"], ("--seeds-at-once", "an integer >= 1")),
    (["--rounds", "-1"], ("--rounds", "an integer >= 1", "got '-1'")),
    (["--rounds", "0"], ("--rounds", "an integer >= 1")),
    (["--jobs", "0"], ("--jobs", "an integer in [1, 1024]")),
    (["--jobs", str(10**12)], ("--jobs", "an integer in [1, 1024]")),
    (["--jobs", str(2**70)], ("--jobs", "an integer in [1, 1024]")),
    (["--device", "xpu"], ("--device", "one of auto, cpu, cuda")),
    (["--data", ""], ("--data", "a data source")),
    (["--data-root", ""], ("--data-root", "a folder")),
    (["--out", ""], ("--out", "a folder")),
])
def test_a_bad_flag_is_one_line_before_any_data_is_loaded(argv, words, tmp_path, capsys, loads):
    refused(["--out", str(tmp_path / "out"), "--device", "cpu", *argv], capsys, *words)
    assert not (tmp_path / "out").exists() and not loads


def test_a_missing_or_edited_plan_and_cuda_without_cuda_are_one_line(tmp_path, capsys, monkeypatch, loads):
    out = ["--out", str(tmp_path / "out")]
    refused([*out, "--plan", str(tmp_path / "missing.json")], capsys, "--plan", "missing.json")
    (tmp_path / "folder.json").mkdir()
    refused([*out, "--plan", str(tmp_path / "folder.json")], capsys, "--plan", "folder.json")
    edited = tmp_path / PLAN_V2_PATH.name
    edited.write_bytes(PLAN_V2_PATH.read_bytes().replace(b'"margin": 0.005', b'"margin": 0.006'))
    refused([*out, "--plan", str(edited)], capsys, "--plan", str(edited), "never edited")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    refused([*out, "--device", "cuda"], capsys, "--device", "CUDA is not available")
    assert not (tmp_path / "out").exists() and not loads


@pytest.mark.parametrize("resume", [False, True])
def test_a_file_where_a_folder_goes_or_a_garbage_manifest_is_one_line_before_the_data(resume, tmp_path, capsys,
                                                                                      loads):
    flags = ["--device", "cpu", *(["--resume"] if resume else [])]
    (tmp_path / "file").write_text("x")
    refused(["--out", str(tmp_path / "file"), *flags], capsys, "--out", "is a file")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "main").write_text("x")  # the main experiment's folder
    refused(["--out", str(tmp_path / "a"), *flags], capsys, str(tmp_path / "a" / "main"), "is a file")
    (tmp_path / "b" / "ablation-none").mkdir(parents=True)
    (tmp_path / "b" / "ablation-none" / "texp").write_text("x")  # a schedule's folder
    refused(["--out", str(tmp_path / "b"), *flags], capsys, "is a file")
    garbage = manifest_of(tmp_path / "c", text="{not json")
    refused(["--out", str(tmp_path / "c"), *flags], capsys, str(garbage), "unreadable")
    listed = manifest_of(tmp_path / "d", text="[1, 2]")
    refused(["--out", str(tmp_path / "d"), *flags], capsys, str(listed), "not a JSON object")
    assert not loads


def test_the_grid_refuses_an_unregistered_plan(tmp_path, capsys):
    draft = tmp_path / "draft.json"
    draft.write_bytes(PLAN_V2_PATH.read_bytes())
    refused(["--plan", str(draft), "--out", str(tmp_path / "out")], capsys, "is not registered")
    assert not (tmp_path / "out").exists()


def test_a_bogus_status_in_a_manifest_is_one_line_naming_it_before_the_data(tmp_path, capsys, loads):
    """Issue 41 item 16, for the grid: a status the engine never writes."""
    bogus = manifest_of(tmp_path / "out", status="bogus", config={"schedule": "step", "seed": 100})
    refused(["--out", str(tmp_path / "out"), "--device", "cpu", "--resume"], capsys, str(bogus), "'bogus'")
    assert not loads


def test_bad_data_is_one_line(tmp_path, capsys):
    refused(["--out", str(tmp_path / "out"), "--device", "cpu", "--data", str(tmp_path / "none.npz")], capsys,
            "--data", "no such file")
    (tmp_path / "bad.npz").write_bytes(b"not a zip file")
    refused(["--out", str(tmp_path / "out"), "--device", "cpu", "--data", str(tmp_path / "bad.npz")], capsys,
            "bad.npz")
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- signals and the pool
@pytest.fixture()
def npz(tmp_path_factory):
    return tiny_npz(tiny_arrays(), tmp_path_factory)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_is_one_line_and_the_run_records_interrupted(sig, code, npz, tmp_path, capsys, monkeypatch):
    """SIGINT or SIGTERM in the first run's first epoch (``--jobs 1``: the run trains in this process)."""
    started = runs_mod.Trainer.train_epoch

    def signalled(self, *args, **kwargs):
        os.kill(os.getpid(), sig)
        return started(self, *args, **kwargs)

    def outside(signum, frame):
        raise AssertionError(f"{signal.Signals(signum).name} reached the grid's caller: the grid handles no signals")

    monkeypatch.setattr(runs_mod.Trainer, "train_epoch", signalled)
    before = signal.signal(sig, outside)
    try:
        got = exit_code_of(["--out", str(tmp_path / "out"), "--device", "cpu", "--data", npz, "--jobs", "1",
                            "--seeds-at-once", "1", "--no-progress"])
    finally:
        signal.signal(sig, before)
    err = capsys.readouterr().err
    assert got == code and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "--resume" in err, err
    manifest = json.loads((tmp_path / "out" / "main" / "step" / "seed100" / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and signal.Signals(sig).name in manifest["message"]
    assert not (tmp_path / "out" / "main" / "texp").exists()  # the grid stopped with its first run


def test_the_default_jobs_are_the_runs_of_a_round_capped_by_the_cpus(tmp_path, monkeypatch):
    """Issue 41 item 11: the default was 14 workers (7 arms x 2 seeds) also on 2 CPUs."""
    pools = []

    def pool(configs, dirs, arrays, jobs, *args):
        pools.append(jobs)
        return []

    monkeypatch.setattr(hardware, "available_cpus", lambda: 2)
    monkeypatch.setattr(sweep, "_run_processes", pool)
    monkeypatch.setattr(grid, "load_cifar10", lambda *args, **kwargs: tiny_arrays())
    monkeypatch.setattr(grid, "complete_seeds", lambda plan, runs: [])
    grid.main(["--out", str(tmp_path / "out"), "--device", "cpu", "--rounds", "1"])
    assert pools == [2]
