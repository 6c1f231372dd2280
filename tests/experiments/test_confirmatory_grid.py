"""experiments/confirmatory_grid.py: the registered plan's (v4) grid, built from the plan, in seed-complete rounds;
the plan's rule for failed runs (started again, declared missing after 3 attempts); its exit code; its dry run
(tiny recipe, synthetic images, CPU) checks balance and resume on the engine."""
import errno
import importlib.util
import json
import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import explr.cifar10.runs as runs_mod
from explr.book.judging import open_runs, split_runs
from explr.book.registration import PLAN_V3_PATH, load_plan
from explr.cifar10 import RunResult, Status, TrainingDiverged, runfolder, make_synthetic, run_dir, sweep
from explr.cifar10.runfolder import DiskFull

from cifar10_helpers import tiny_arrays, tiny_npz

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("confirmatory_grid", ROOT / "experiments" / "confirmatory_grid.py")
grid = importlib.util.module_from_spec(spec)
spec.loader.exec_module(grid)
#: the registered plan (v4) as these tests train it, on the CPU: without its device and precision pin
#: (test_the_grid_starts_no_run_of_v4_that_would_resolve_to_another_device checks the pin).
PLAN = replace(load_plan(), resolved={})

#: ... and as the grid's command line loads it here (this file's own copy of the module): without the pin.
grid.load_plan = lambda path, **kwargs: replace(load_plan(path, **kwargs), resolved={})


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
    monkeypatch.setattr(sweep, "load_cifar10", never)
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
    edited = tmp_path / PLAN_V3_PATH.name
    edited.write_bytes(PLAN_V3_PATH.read_bytes().replace(b'"margin": 0.00384', b'"margin": 0.00385'))
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


def test_the_grid_starts_no_run_of_v4_that_would_resolve_to_another_device(tmp_path, capsys, monkeypatch, loads):
    """v4 judges only bf16 runs on a CUDA device: --device cpu, or auto on a machine without CUDA, is one line
    naming the flag and exit code 2, before any data or folder; cuda and cuda:N pass; v3 pinned no device."""
    monkeypatch.setattr(grid, "load_plan", load_plan)  # the plan as registered, with its pin
    refused(["--out", str(tmp_path / "out"), "--device", "cpu"], capsys, "--device 'cpu' resolves to cpu",
            "judges only runs on cuda in bf16")
    assert not (tmp_path / "out").exists() and not loads
    v4 = load_plan()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cpu", "auto", "mps"):
        with pytest.raises(ValueError, match=f"--device '{device}' resolves to .* judges only runs on cuda in bf16"):
            grid.check_resolved(v4, device)
    for device in ("cuda", "cuda:1"):
        grid.check_resolved(v4, device)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    grid.check_resolved(v4, "auto")
    grid.check_resolved(load_plan(PLAN_V3_PATH, check_git=False), "cpu")


def test_the_grid_refuses_an_unregistered_plan(tmp_path, capsys):
    draft = tmp_path / "draft.json"
    draft.write_bytes(PLAN_V3_PATH.read_bytes())
    refused(["--plan", str(draft), "--out", str(tmp_path / "out")], capsys, "is not registered")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("record, words", [
    ("{not json", ("attempt.json", "unreadable", "restore it")),
    ('{"status": "diverged"}', ("attempt.json", "not a failed attempt's record")),
    ('["diverged", "nan"]', ("attempt.json", "not a failed attempt's record")),
    (None, ("failed", "must be a folder")),
])
def test_a_bad_record_of_the_failed_runs_is_one_line_before_the_data(record, words, tmp_path, capsys, loads):
    out = tmp_path / "out"
    if record is None:
        out.mkdir()
        (out / "failed").write_text("x")
    else:
        attempt = out / "failed" / "main" / "texp" / "seed100" / "attempt1"
        attempt.mkdir(parents=True)
        (attempt / "attempt.json").write_text(record)
    refused(["--out", str(out), "--device", "cpu", "--resume"], capsys, *words)
    assert not loads and not (out / "missing.json").exists()


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

    def pool(runs, arrays, jobs, *args):
        pools.append(jobs)
        return []

    monkeypatch.setattr("explr.cifar10.config.available_cpus", lambda: 2)
    monkeypatch.setattr(sweep, "_run_processes", pool)
    monkeypatch.setattr(grid, "load_cifar10", lambda *args, **kwargs: tiny_arrays())
    monkeypatch.setattr(grid, "complete_seeds", lambda plan, runs: [])
    grid.main(["--out", str(tmp_path / "out"), "--device", "cpu", "--rounds", "1"])
    assert pools == [2]


# ----------------------------------------------------------------------------- failed runs: the plan's missing_runs
#: the data of the dry run's recipe (:data:`grid.DRY_IMAGES`).
ARRAYS = make_synthetic(n_train=grid.DRY_IMAGES[0], n_test=grid.DRY_IMAGES[1], seed=0)


def tiny_plan(arms=("step", "texp")):
    """The plan's ``arms`` at its first seed, on the dry run's recipe (a second per run)."""
    return replace(PLAN, arms={a: PLAN.arms[a] for a in arms}, seeds=PLAN.seeds[:1],
                   config={**PLAN.config, **grid.DRY_RUN},
                   data={"n_train": grid.DRY_IMAGES[0], "n_test": grid.DRY_IMAGES[1]})


@pytest.fixture()
def epochs(monkeypatch):
    """Every epoch the engine starts, as ``(schedule, seed, epoch)``; a run whose schedule is a key of
    ``epochs.diverge`` diverges (TrainingDiverged, as a non-finite loss raises it) in that epoch."""
    started = runs_mod.Trainer.train_epoch

    class Epochs(list):
        diverge: dict = {}

    calls = Epochs()

    def train_epoch(self, epoch, *args, **kwargs):
        calls.append((self.config.schedule, self.config.seed, epoch))
        if calls.diverge.get(self.config.schedule) == epoch:
            raise TrainingDiverged(f"the training loss is nan in epoch {epoch + 1} (test)")
        return started(self, epoch, *args, **kwargs)

    monkeypatch.setattr(runs_mod.Trainer, "train_epoch", train_epoch)
    return calls


def files_of(folder):
    return {p.relative_to(folder): p.read_bytes() for p in Path(folder).rglob("*") if p.is_file()}


def fail_three_times(plan, out, epochs):
    """TEXP diverges in its first epoch in the grid, and in each of two ``--resume``; Step Decay finishes."""
    epochs.diverge = {"texp": 0}
    return [grid.train_grid(plan, out, arrays=ARRAYS, resume=resume, progress=False) for resume in (False, True, True)]


def test_the_grid_allows_the_plans_number_of_attempts():
    assert f"up to {grid.ATTEMPTS} attempts in all" in PLAN.missing_runs


def test_a_failed_run_is_started_again_and_after_3_failures_declared_missing(tmp_path, capsys, epochs):
    plan = tiny_plan()
    results = fail_three_times(plan, tmp_path, epochs)
    err = capsys.readouterr().err
    assert [line.split(":")[1] for line in err.splitlines() if line.startswith("texp seed 100")] == [
        " diverged (failed attempt 1 of 3)", " diverged (failed attempt 2 of 3)",
        " diverged (failed attempt 3 of 3, declared missing)"], err
    assert [r.exit_code for r in results] == [Status.DIVERGED.exit_code] * 3
    assert epochs.count(("texp", 100, 0)) == 3 and epochs.count(("step", 100, 0)) == 1
    assert [len(r.missing) for r in results] == [0, 0, 1]
    declared = json.loads((tmp_path / grid.MISSING).read_text())
    assert list(declared) == ["missing"] and results[-1].missing == declared["missing"]
    (entry,) = declared["missing"]
    assert (entry["arm"], entry["seed"]) == ("texp", 100) and len(entry["attempts"]) == 3
    for n, attempt in enumerate(entry["attempts"], 1):
        assert attempt["status"] == "diverged" and "loss is nan in epoch 1" in attempt["message"]
        kept = tmp_path / attempt["folder"]
        assert kept == tmp_path / "failed" / "main" / "texp" / "seed100" / f"attempt{n}"
        assert json.loads((kept / "manifest.json").read_text())["status"] == "diverged"  # the attempt, kept whole
    assert not run_dir(tmp_path / "main", "texp", 100).exists()
    assert [r["schedule"] for r in grid.grid_runs(plan, tmp_path)] == ["step"]  # the failed folders are no runs
    epochs.clear()
    again = grid.train_grid(plan, tmp_path, arrays=ARRAYS, resume=True, progress=False)
    assert epochs == [] and again == grid.GridResult([], declared["missing"], 0)  # no 4th attempt: the grid is closed
    assert json.loads((tmp_path / grid.MISSING).read_text()) == declared


def test_a_failed_run_starts_again_from_its_beginning_and_a_finished_run_is_never_rerun(tmp_path, epochs):
    """TEXP diverges in epoch 2, after the checkpoint of epoch 1: --resume trains it again from epoch 1 (index 0)."""
    plan = tiny_plan()
    epochs.diverge = {"texp": 1}
    assert grid.train_grid(plan, tmp_path, arrays=ARRAYS, progress=False).exit_code == Status.DIVERGED.exit_code
    step = run_dir(tmp_path / "main", "step", 100)
    finished = files_of(step)
    assert json.loads(finished[Path("manifest.json")])["status"] == "finished"
    epochs.clear()
    epochs.diverge = {}
    assert grid.train_grid(plan, tmp_path, arrays=ARRAYS, resume=True, progress=False) == ([100], [], 0)
    assert epochs == [("texp", 100, 0), ("texp", 100, 1)]  # from its beginning, not from its checkpoint
    assert files_of(step) == finished  # never rerun, not a byte rewritten
    first = tmp_path / "failed" / "main" / "texp" / "seed100" / "attempt1"
    assert json.loads((first / "manifest.json").read_text())["epochs_done"] == 1 and (first / "checkpoint.pt").is_file()
    epochs.clear()
    assert grid.train_grid(plan, tmp_path, arrays=ARRAYS, resume=True, progress=False) == ([100], [], 0)
    assert epochs == [] and files_of(step) == finished


def test_an_interrupted_run_resumes_and_a_run_whose_process_died_is_a_failed_attempt(tmp_path, epochs):
    """"interrupted" (a signal, recorded by the engine) continues from its checkpoint; "running" with no process
    holding the lock (a crash, a lost machine) counts as a failed attempt and starts again."""
    plan = tiny_plan()
    cuts = {name: grid.round_plan(plan, plan.seeds)["main"][i] for i, name in enumerate(("step", "texp"))}
    for name, config in cuts.items():
        grid.train_run(config, run_dir(tmp_path / "main", name, 100), ARRAYS, stop_after=1, progress=False)
    died = run_dir(tmp_path / "main", "texp", 100) / "manifest.json"
    died.write_text(json.dumps({**json.loads(died.read_text()), "status": "running"}))  # as a killed process leaves it
    epochs.clear()
    assert grid.train_grid(plan, tmp_path, arrays=ARRAYS, resume=True, progress=False) == ([100], [], 0)
    assert sorted(epochs) == [("step", 100, 1), ("texp", 100, 0), ("texp", 100, 1)]
    (attempt,) = grid.failed_attempts(tmp_path, "main", "texp", 100)
    assert attempt["status"] == "failed" and "'running' after 1 epochs" in attempt["message"], attempt
    assert grid.failed_attempts(tmp_path, "main", "step", 100) == []


def test_the_exit_code_is_the_worst_runs_and_the_failures_are_recorded(npz, tmp_path, capsys, epochs):
    """Every run of the plan's first round diverges in its first epoch: exit code 3 (was 0), each attempt recorded."""
    epochs.diverge = dict.fromkeys([a["schedule"] for a in PLAN.arms.values()], 0)
    out = tmp_path / "out"
    got = exit_code_of(["--out", str(out), "--device", "cpu", "--data", npz, "--jobs", "1", "--seeds-at-once", "1",
                        "--no-progress"])
    err = capsys.readouterr().err
    assert got == Status.DIVERGED.exit_code, err
    assert "stops here" in err and all(f"{arm} seed 100: diverged" in err for arm in PLAN.arms), err
    assert len(epochs) == len(PLAN.arms)  # one round, then the grid stopped
    for arm in PLAN.arms.values():
        (attempt,) = grid.failed_attempts(out, grid.experiment_of(arm["corrections"]), arm["schedule"], 100)
        assert attempt["status"] == "diverged"
    assert not (out / grid.MISSING).exists()


def test_a_worker_that_failed_without_a_run_folder_is_an_attempt_and_the_worst_code_wins(tmp_path, capsys,
                                                                                           monkeypatch):
    """The pool's "failed" (5: its worker exited with another code, before any manifest) beats "diverged" (3)."""
    plan = tiny_plan(("step", "texp", "cosine"))
    status = {"step": Status.FINISHED, "texp": Status.FAILED, "cosine": Status.DIVERGED}

    def pool(chosen, out, **kwargs):
        """run_plan's results, in plan order, for runs that left nothing on disk."""
        results = []
        for name, group in chosen.items():
            for c in group:
                got = status.get(c.schedule, Status.FINISHED)
                results.append(RunResult(run_dir(Path(out) / name, c.schedule, c.seed), got, None,
                                         f"worker exited with code {got.exit_code} (test)"))
        return results

    monkeypatch.setattr(grid, "run_plan", pool)
    for resume in (False, True, True):
        assert grid.train_grid(plan, tmp_path, arrays=ARRAYS, resume=resume, progress=False).exit_code == 5
    declared = json.loads((tmp_path / grid.MISSING).read_text())["missing"]
    assert [(m["arm"], [a["status"] for a in m["attempts"]]) for m in declared] == [
        ("texp", ["failed"] * 3), ("cosine", ["diverged"] * 3)]
    assert all(a["message"] == "worker exited with code 5 (test)" for a in declared[0]["attempts"])
    monkeypatch.setattr(grid, "load_cifar10", lambda *args, **kwargs: ARRAYS)  # the registered plan's grid
    assert exit_code_of(["--out", str(tmp_path / "cli"), "--device", "cpu", "--rounds", "1"]) == 5
    assert "texp seed 100: failed (failed attempt 1 of 3): worker exited with code 5 (test)" in capsys.readouterr().err


def test_the_missing_runs_close_the_grid_for_chapter_6(tmp_path, epochs):
    """judging.open_runs, as chapter 6 calls it with <grid>/missing.json, finds no open run once TEXP failed 3 times."""
    plan = tiny_plan()
    fail_three_times(plan, tmp_path, epochs)
    judged, _ = split_runs(plan, grid.grid_runs(plan, tmp_path))
    assert [r["schedule"] for r in judged] == ["step"]
    assert open_runs(plan, judged) == [("texp", 100)]  # without the declaration, the grid is open
    missing = [(m["arm"], m["seed"]) for m in json.loads((tmp_path / "missing.json").read_text())["missing"]]
    assert open_runs(plan, judged, missing) == []


def test_the_help_counts_the_runs_of_a_round_from_the_plan(capsys):
    with pytest.raises(SystemExit):
        grid.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"default 2: {2 * len(PLAN.arms)} runs at once" in help_text and "17 processes" not in help_text


def test_a_run_a_full_disk_stopped_is_no_failed_attempt_and_resumes(tmp_path, epochs, monkeypatch):
    """A full disk stops a run from outside: its manifest says "disk full" (said "interrupted" on main f49cb6e),
    which is no failed attempt, and ``--resume`` continues the run from its last checkpoint."""
    plan = tiny_plan()
    real, full, written = runfolder.atomic_write, [True], []

    def write(path, fn):  # TEXP's second checkpoint finds the disk full
        if full and Path(path).name == "checkpoint.pt" and "texp" in Path(path).parts:
            written.append(path)
            if len(written) == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
        real(path, fn)

    monkeypatch.setattr(runfolder, "atomic_write", write)
    with pytest.raises(DiskFull):  # --jobs 1: the run trains in this process, and the grid stops with exit code 6
        grid.train_grid(plan, tmp_path, arrays=ARRAYS, progress=False)
    manifest = json.loads((run_dir(tmp_path / "main", "texp", 100) / "manifest.json").read_text())
    assert manifest["status"] == Status.DISK_FULL and manifest["epochs_done"] == 1, manifest
    full.clear()
    epochs.clear()
    assert grid.train_grid(plan, tmp_path, arrays=ARRAYS, resume=True, progress=False) == ([100], [], 0)
    assert epochs == [("texp", 100, 1)]  # continued from its checkpoint, not started again
    assert not (tmp_path / grid.FAILED).exists() and not (tmp_path / grid.MISSING).exists()


def test_a_disk_full_result_of_the_pool_is_no_failed_attempt(tmp_path, monkeypatch):
    """A worker that exited with code 6 (the pool's "disk full"): the grid's exit code, and no attempt recorded."""
    plan = tiny_plan()

    def pool(chosen, out, **kwargs):
        return [RunResult(run_dir(Path(out) / name, c.schedule, c.seed),
                          Status.DISK_FULL if c.schedule == "texp" else Status.FINISHED, None, "disk full (test)")
                for name, group in chosen.items() for c in group]

    monkeypatch.setattr(grid, "run_plan", pool)
    assert grid.train_grid(plan, tmp_path, arrays=ARRAYS, progress=False).exit_code == Status.DISK_FULL.exit_code
    assert grid.failed_attempts(tmp_path, "main", "texp", 100) == [] and not (tmp_path / grid.MISSING).exists()
