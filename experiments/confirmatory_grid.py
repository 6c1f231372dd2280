#!/usr/bin/env python3
"""Chapter 6's confirmatory grid: exactly the runs of the registered analysis plan (v4), in seed-complete rounds.

    PYTHONPATH=src python experiments/confirmatory_grid.py --data cifar10-jpeg.tar.gz --data-root /tmp/explr-data
    PYTHONPATH=src python experiments/confirmatory_grid.py ... --resume        # continue an interrupted grid
    PYTHONPATH=src python experiments/confirmatory_grid.py --dry-run          # seconds, on the CPU

The plan (:data:`explr.book.registration.PLAN_V4_PATH`) names the arms (schedule, momentum corrections), the seeds,
the recipe (``config``) and, from v4, what its runs must resolve to (``resolved``: bf16 on a CUDA device; the
grid refuses to start where ``--device`` resolves to another type, since such runs would not be judged).  Each round
trains every arm of ``--seeds-at-once`` seeds (the first round seeds
``seeds[0:k]``, then the next k, ...) and the next round starts only when each of its runs finished or was
declared missing, so a grid stopped anywhere holds whole runs of closed seeds, plus at most one round of runs that
``--resume`` finishes.  A run never stops early on purpose (no deadline); a round in which a run did not finish
stops the grid after it, once its failures are recorded, with the worst exit code of its runs
(:class:`explr.cifar10.Status`, as ``python -m explr.cifar10`` returns it: 3 diverged, 4 a run folder taken by
another process, 5 a worker failed, 6 a full disk; 0 when every run finished).

Failed runs (the plan's ``missing_runs`` rule, written once in :mod:`explr.book.judging` and registered with v4:
:func:`~explr.book.judging.failure`, :func:`~explr.book.judging.declared_missing`).  A run that diverged (the
engine's status "diverged": a non-finite or exploding loss), whose worker failed (status "failed": the pool saw it
exit with another code) or whose process died without recording its end (its manifest still says "running" and no
process holds its lock: a crash, a lost machine, SIGKILL) is a failed attempt.  After its round (or, for a folder a
stopped grid left so, when ``--resume``
starts) its run folder is moved, whole (one rename), to
``<out>/failed/<experiment>/<schedule>/seed<k>/attempt<N>/`` with ``attempt.json`` (``{"status", "message"}``,
written atomically into the folder before it is moved, so that a grid killed in between records it again, once);
a failure that left no folder gets an attempt folder holding ``attempt.json`` alone.  The attempt folders are the
record: ``--resume`` trains the run again from its beginning (its folder is gone) with the same seed and recipe
(not at once, in the same grid: a broken machine would spend every run's attempts in minutes), and after
:data:`ATTEMPTS` failed attempts the (arm, seed) is declared missing in
``<out>/missing.json``, ``{"missing": [{"arm", "seed", "attempts": [{"status", "message", "folder"}, ...]}]}``,
rewritten atomically from the attempt folders whenever it changes; it is never trained again, and a seed whose
arms all finished or are declared missing is closed.  The failed folders lie outside the experiment folders,
where :func:`explr.cifar10.load_runs` (``<experiment>/*/seed*/manifest.json``) and chapter 6 never see them.  A
finished run is never rerun (the engine returns it as it is).

A run interrupted by a signal to the grid (SIGINT, SIGTERM, SIGHUP, SIGUSR2; a worker whose parent dies gets
SIGTERM) is not a failed attempt: the engine catches the signal, records status "interrupted" with the signal's
name and keeps its last checkpoint, and ``--resume`` continues it from there; so does a run stopped by a full
disk ("disk full", exit code 6).  What tells the two apart is the engine's own record: "diverged" and a
"running" left by a dead process say the run itself went wrong, "interrupted" and "disk full" say it was stopped
from outside.  A grid killed with SIGKILL while its runs train in its own process (``--jobs 1``), or a disk so full
that not even the manifest could record "disk full", leaves "running" and reads as a crash: one of the plan's
failures.

Runs of corrections "all" train into ``<out>/main/<schedule>/seed<k>``, the others into
``<out>/ablation-<corrections>/...`` (the layout of ``results/cifar10-full``), each with its manifest, whose
``started`` time :func:`explr.book.judging.split_runs` compares with the plan's registration.  The grid refuses a
plan that is not registered (its runs would judge nothing) or was edited (:func:`~explr.book.registration.load_plan`).

Engine API used (names exported by :mod:`explr.cifar10`): ``TrainConfig``, ``run_plan``, ``load_cifar10``,
``load_runs``, ``RunError``, ``RunResult``, ``Status``, ``make_synthetic`` (dry run), ``train_run`` and ``run_dir``
(the dry run's interrupted run); the command line's parts: :mod:`explr.cifar10.config` (``CommandLineParser``,
``add_config_arguments``, ``JOBS``), :func:`explr.cifar10.sweep.check_before_data` and
:func:`explr.cifar10.runfolder.handle_signals`; a run folder's record: :func:`explr.cifar10.runfolder.read_manifest`,
:func:`explr.cifar10.runfolder.write_file` (atomic) and :func:`explr.cifar10.runfolder.lock_holder`.

Bad input is one line on stderr and exit code 2, with nothing created: the flags (by the engine's rules:
``--data``, ``--data-root`` and ``--device`` are :class:`~explr.cifar10.TrainConfig`'s, ``--jobs`` the CLI's), a
missing, malformed or edited plan, an unavailable device, a file where a folder goes, a run folder that cannot be
used (:func:`explr.cifar10.sweep.check_before_data`), a manifest that does not parse and a record of the failed
runs that cannot be read (:func:`read_attempt`; a file named ``failed``), all checked before the data is loaded;
then bad data.  SIGINT, SIGTERM, SIGHUP and SIGUSR2 stop the grid with one line and 128 + the
signal's number (the runs record "interrupted"; ``--resume`` continues them); a full disk is exit code 6.
``--jobs`` (default: the runs of one round) is capped by the runs and, on the CPU, by the CPUs
(:func:`explr.cifar10.config.workers`).

``--dry-run`` trains the same grid logic on a tiny recipe (synthetic images, PreResNet-8, 2 epochs, the plan's
first 2 seeds) on the CPU into a temporary folder, and checks the balance and resume rules: one round leaves
exactly one complete seed; a run interrupted mid-way and a grid rerun without ``--resume`` are handled; the rerun
with ``--resume`` finishes the grid, continues the interrupted run without counting it as a failed attempt and
leaves the first round's files untouched.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import fields, replace
from pathlib import Path
from typing import NamedTuple

import torch

from explr.book.judging import ATTEMPTS, FAILURES, declared_missing, failure, open_runs
from explr.book.registration import PLAN_V4_PATH, AnalysisPlan, load_plan
from explr.book.stats import complete_seeds, count_by_arm
from explr.cifar10 import (RunError, RunResult, Status, TrainConfig, load_cifar10, load_runs, make_synthetic, run_dir,
                           run_plan, train_run)
from explr.cifar10.config import FOLDER, JOBS, MAX_JOBS, CommandLineParser, add_config_arguments, argument_type
from explr.cifar10.runfolder import DiskFull, exit_code, handle_signals, lock_holder, signal_name, write_file
from explr.cifar10.runfolder import MANIFEST, read_manifest
from explr.cifar10.sweep import check_before_data
from explr.params import Int, Text

#: the dry run's recipe: everything small, on the CPU (decays at epoch 1 of 2, so each schedule has a phase change).
DRY_RUN = dict(epochs=2, depth=8, batch_size=32, decay_epochs=[1], device="cpu", precision="fp32", threads=1,
               eval_batch_size=64, log_every=2)
DRY_IMAGES = (160, 40)  # synthetic training and test images: 5 steps per epoch
#: the engine's settings that the grid takes from its command line (the plan gives the recipe).
MACHINE = ("data", "data_root", "device")
#: the rule of --seeds-at-once and --rounds.
COUNT = Int(1)
#: under ``--out``: the failed attempts' folders, and the runs declared missing (module docstring).
FAILED, MISSING, ATTEMPT = "failed", "missing.json", "attempt.json"


def experiment_of(corrections: str) -> str:
    """The folder of an arm's runs under ``--out``: ``main`` for corrections "all", else ``ablation-<corrections>``."""
    return "main" if corrections == "all" else f"ablation-{corrections}"


def round_plan(plan: AnalysisPlan, seeds, **common) -> dict[str, list[TrainConfig]]:
    """Every arm of the plan for each of ``seeds``, with the plan's recipe; ``common``: machine settings (device,
    data, ...).  An experiment plan (``{folder: [TrainConfig, ...]}``) for :func:`explr.cifar10.run_plan`."""
    recipe = {k: tuple(v) if isinstance(v, list) else v for k, v in plan.config.items()}
    out: dict[str, list[TrainConfig]] = {}
    for k in seeds:
        for arm in plan.arms.values():
            config = TrainConfig(**{**recipe, **common}, schedule=arm["schedule"], corrections=arm["corrections"],
                                 seed=k)
            out.setdefault(experiment_of(arm["corrections"]), []).append(config)
    return out


def grid_runs(plan: AnalysisPlan, out) -> list[dict]:
    """The runs already under ``out`` (:func:`explr.cifar10.load_runs` of each experiment folder)."""
    folders = {experiment_of(arm["corrections"]) for arm in plan.arms.values()}
    return [r for name in sorted(folders) if (Path(out) / name).is_dir() for r in load_runs(Path(out) / name)]


def _arm_runs(plan: AnalysisPlan, seeds):
    """``(arm, experiment, schedule, seed)`` of every arm of the plan for each of ``seeds``, in round order."""
    return [(name, experiment_of(arm["corrections"]), arm["schedule"], k) for k in seeds
            for name, arm in plan.arms.items()]


def _attempts_home(out, experiment: str, schedule: str, seed: int) -> Path:
    """Where the failed attempts of one run lie: ``<out>/failed/<experiment>/<schedule>/seed<k>``."""
    return Path(out) / FAILED / experiment / schedule / f"seed{seed}"


def _attempt_folders(home: Path) -> list[tuple[int, Path]]:
    """``(N, folder)`` of the folders ``attempt<N>`` in ``home``, by N."""
    return sorted((int(p.name[7:]), p) for p in home.glob("attempt*") if p.name[7:].isdigit())


def failed_attempts(out, experiment: str, schedule: str, seed: int) -> list[dict]:
    """The recorded failed attempts of one run, in order: ``{"status", "message", "folder"}`` (``folder`` relative to
    ``out``), read from ``<out>/failed/<experiment>/<schedule>/seed<k>/attempt<N>/attempt.json``."""
    return [{**read_attempt(p / ATTEMPT), "folder": str(p.relative_to(out))}
            for _, p in _attempt_folders(_attempts_home(out, experiment, schedule, seed)) if (p / ATTEMPT).is_file()]


def read_attempt(path: Path) -> dict:
    """A failed attempt's ``attempt.json``: an object whose ``status`` and ``message`` are strings; ``ValueError``
    naming the file otherwise (deleting it would drop an attempt the plan counts)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as err:
        raise ValueError(f"{path} is unreadable ({err}); restore it: it records a failed attempt") from None
    if not (isinstance(record, dict) and all(type(record.get(k)) is str for k in ("status", "message"))):
        raise ValueError(f"{path} is not a failed attempt's record (an object with the strings status and message; "
                         "hand-edited?); restore it")
    return record


def _failure(folder: Path, result: RunResult | None) -> dict | None:
    """``{"status", "message"}`` if the run in ``folder`` is a failed attempt (:func:`explr.book.judging.failure`),
    else ``None``.  ``result``: what this grid's round said of it (``None``: the run folder alone tells)."""
    manifest = read_manifest(folder / MANIFEST) if (folder / MANIFEST).is_file() else {}
    if manifest.get("status") != Status.FINISHED and (folder / ATTEMPT).is_file():  # being set aside at a stop
        return read_attempt(folder / ATTEMPT)
    if result is not None:
        return failure(manifest, str(result.status), result.message)
    return failure(manifest, locked=manifest.get("status") == Status.RUNNING and lock_holder(folder)[1])


def _set_aside(folder: Path, home: Path, record: dict) -> None:
    """Move the failed run ``folder`` (created where the failure left none) to the next ``home/attempt<N>``, with
    ``attempt.json`` written into it first: a grid stopped in between finds the record in the run folder."""
    folder.mkdir(parents=True, exist_ok=True)
    write_file(folder / ATTEMPT, lambda f: f.write((json.dumps(record, indent=2) + "\n").encode()))
    home.mkdir(parents=True, exist_ok=True)
    folder.rename(home / f"attempt{max((n for n, _ in _attempt_folders(home)), default=0) + 1}")


def record_failures(plan: AnalysisPlan, out, runs=(), results=None) -> list[dict]:
    """Set aside every failed attempt among ``runs`` (``(arm, experiment, schedule, seed)``; ``results``: their
    :class:`~explr.cifar10.RunResult` in order, where this grid just trained them, else their folders tell), then
    rewrite ``<out>/missing.json`` where it changes.  Returns its entries: the (arm, seed) pairs of the plan with
    :data:`ATTEMPTS` failed attempts, each with its attempts."""
    for (_, experiment, schedule, seed), result in zip(runs, results or [None] * len(runs)):
        folder = run_dir(Path(out) / experiment, schedule, seed)
        failed = _failure(folder, result)
        if failed is not None:
            _set_aside(folder, _attempts_home(out, experiment, schedule, seed), failed)
    missing = declared_missing({(arm, seed): failed_attempts(out, experiment, schedule, seed)
                                for arm, experiment, schedule, seed in _arm_runs(plan, plan.seeds)})
    path, text = Path(out) / MISSING, json.dumps({"missing": missing}, indent=2) + "\n"
    if (missing or path.is_file()) and not (path.is_file() and path.read_text() == text):
        write_file(path, lambda f: f.write(text.encode()))
    return missing


class GridResult(NamedTuple):
    """What :func:`train_grid` leaves: the ``complete`` seeds (every arm finished), the ``missing`` entries of
    ``missing.json`` and ``exit_code``, the worst :class:`~explr.cifar10.Status` exit code of the runs it trained
    (0: every one finished)."""

    complete: list[int]
    missing: list[dict]
    exit_code: int


def train_grid(plan: AnalysisPlan, out, *, arrays, resume: bool = False, jobs: int = 1, seeds_at_once: int = 1,
               rounds: int | None = None, progress: bool = True, **common) -> GridResult:
    """Train the plan's grid into ``out`` round by round (module docstring); at most ``rounds`` rounds that still
    need training.  With ``resume`` the failed attempts the run folders hold are set aside first and the seeds
    already closed (each arm finished or declared missing) are skipped; without it an existing run is refused by the
    engine (``RunError``) before its round starts.  A run declared missing is never trained again; after each round
    its failed runs are set aside, and a round in which a run did not finish stops the grid."""
    if not COUNT.ok(seeds_at_once) or not (rounds is None or COUNT.ok(rounds)):
        raise ValueError(f"--seeds-at-once and --rounds must be {COUNT.rule()}; got {seeds_at_once}, {rounds}")
    missing = record_failures(plan, out, _arm_runs(plan, plan.seeds)) if resume else []
    done = set(closed_seeds(plan, out, missing)) if resume else set()
    todo = [k for k in plan.seeds if k not in done]
    batches = [todo[i:i + seeds_at_once] for i in range(0, len(todo), seeds_at_once)][:rounds]
    names = {(arm["schedule"], arm["corrections"]): name for name, arm in plan.arms.items()}
    worst = 0
    for seeds in batches:
        gone = {(m["arm"], m["seed"]) for m in missing}
        chosen = {e: [c for c in group if (names[c.schedule, c.corrections], c.seed) not in gone]
                  for e, group in round_plan(plan, seeds, **common).items()}
        chosen = {e: group for e, group in chosen.items() if group}
        runs = [(names[c.schedule, c.corrections], e, c.schedule, c.seed) for e, group in chosen.items() for c in group]
        results = run_plan(chosen, out, arrays=arrays, jobs=jobs, resume=resume, progress=progress) if chosen else []
        missing = record_failures(plan, out, runs, results)  # run_plan's results are in plan order
        worst = max([worst, *(r.status.exit_code for r in results)])
        for (arm, experiment, schedule, seed), r in zip(runs, results):
            n = len(failed_attempts(out, experiment, schedule, seed)) if r.status in FAILURES else 0
            if r.status.exit_code:
                print(f"{arm} seed {seed}: {r.status}"
                      + (f" (failed attempt {n} of {ATTEMPTS}{', declared missing' if n >= ATTEMPTS else ''})"
                         if n else "") + f": {r.message}", file=sys.stderr)
        if worst or not set(seeds) <= set(closed_seeds(plan, out, missing)):  # from the manifests, not the pool
            print(f"round of seeds {seeds}: not every run finished (their manifests and {FAILED}/ say why); the grid "
                  "stops here" + ("; --resume starts the failed runs again" if worst else ""), file=sys.stderr)
            break
    return GridResult(complete_seeds(plan, grid_runs(plan, out)), missing, worst)


def closed_seeds(plan: AnalysisPlan, out, missing) -> list[int]:
    """The plan's seeds of which every arm has a finished run under ``out`` or is declared ``missing``
    (:func:`explr.book.judging.open_runs`, the rule by which chapter 6 closes the grid)."""
    still_open = {k for _, k in open_runs(plan, grid_runs(plan, out), [(m["arm"], m["seed"]) for m in missing])}
    return [k for k in plan.seeds if k not in still_open]


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise RuntimeError(f"dry run: {what}")
    print(f"dry run: {what}: ok")


def dry_run(plan: AnalysisPlan, out=None) -> dict[str, int]:
    """The grid's logic on :data:`DRY_RUN` (module docstring), in ``out`` or a temporary folder.  Returns the runs
    per arm; raises ``RuntimeError`` naming the first rule that failed."""
    tiny = replace(plan, seeds=plan.seeds[:2], config={**plan.config, **DRY_RUN}, resolved={},
                   data={"n_train": DRY_IMAGES[0], "n_test": DRY_IMAGES[1]})  # complete_seeds checks the recipe
    arrays = make_synthetic(n_train=DRY_IMAGES[0], n_test=DRY_IMAGES[1], seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(out or tmp)
        first, second = tiny.seeds
        _check(train_grid(tiny, out, arrays=arrays, rounds=1, progress=False).complete == [first],
               f"one round leaves exactly seed {first} complete")
        _check(count_by_arm(grid_runs(tiny, out)) == dict.fromkeys(sorted(tiny.arms), 1), "one run per arm")
        before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl")}
        cut = round_plan(tiny, [second])["main"][0]  # a run of the next round, interrupted after its first epoch
        train_run(cut, run_dir(out / "main", cut.schedule, cut.seed), arrays, stop_after=1, progress=False)
        try:
            train_grid(tiny, out, arrays=arrays, progress=False)
            refused = ""
        except RunError as err:  # the engine names the folder and --resume
            refused = str(err)
        _check("--resume" in refused, "a rerun without --resume is refused before it trains")
        _check(train_grid(tiny, out, arrays=arrays, resume=True, progress=False) == GridResult([first, second], [], 0),
               "--resume finishes the grid: both seeds complete, exit code 0")
        _check(not (out / FAILED).exists() and not (out / MISSING).exists(),
               "the interrupted run was continued, not counted as a failed attempt")
        _check(all(p.read_bytes() == data for p, data in before.items()), "the first round's files are untouched")
        runs = grid_runs(tiny, out)
        _check(all(len(r["metrics"]["test_acc"]) == DRY_RUN["epochs"] for r in runs),
               "every run (the interrupted one too) has all its epochs")
        return count_by_arm(runs)


def check_resolved(plan: AnalysisPlan, device: str) -> None:
    """``ValueError`` (one line) unless ``device`` (``--device``; ``auto``: CUDA if available) is of the device type
    the plan's runs must resolve to (``plan.resolved``, v4): a run resolved otherwise would not be judged."""
    want = plan.resolved.get("device")
    got = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device.split(":")[0]
    if want is not None and got != want:
        raise ValueError(f"--device {device!r} resolves to {got}, but {plan.path.name} judges only runs on {want} "
                         f"in {plan.resolved['precision']}: the grid starts no run that would not be judged")


def check_grid(plan: AnalysisPlan, out, *, resume: bool, jobs: int, **common) -> list[TrainConfig]:
    """What the grid needs checked before its data is loaded: every run's settings (the plan's recipe with
    ``common``), the device, ``jobs``, ``out`` and every run folder in it
    (:func:`explr.cifar10.sweep.check_before_data`), that ``<out>/failed`` is a folder and ``<out>/missing.json``
    a file where they exist, and with ``resume`` every manifest :func:`grid_runs` reads and every failed attempt's
    record (:func:`read_attempt`).  Returns every run's config; raises ``ValueError`` (one line); creates nothing."""
    configs = []
    for name, group in round_plan(plan, plan.seeds, **common).items():
        check_before_data(group, Path(out) / name, resume=resume, jobs=jobs)
        configs += group
    for path, folder in ((Path(out) / FAILED, True), (Path(out) / MISSING, False)):
        if path.exists() and path.is_dir() != folder:
            raise ValueError(f"--out: {path} must be {'a folder' if folder else 'a file'}, the grid's record of its "
                             "failed runs")
    if resume:
        grid_runs(plan, out)
        for _, experiment, schedule, seed in _arm_runs(plan, plan.seeds):
            failed_attempts(out, experiment, schedule, seed)
            being_set_aside = run_dir(Path(out) / experiment, schedule, seed) / ATTEMPT
            if being_set_aside.is_file():
                read_attempt(being_set_aside)
    return configs


def build_parser() -> argparse.ArgumentParser:
    ap = CommandLineParser(prog="confirmatory_grid.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", default=str(PLAN_V4_PATH), type=argument_type("plan", Text("a plan file")),
                    help="the registered analysis plan (default: v4)")
    ap.add_argument("--out", default="results/cifar10-confirmatory", type=argument_type("out", FOLDER),
                    help="folder of the grid's runs")
    add_config_arguments(ap, names=MACHINE)  # as python -m explr.cifar10 takes them
    ap.add_argument("--resume", action="store_true", help="continue the runs already under --out")
    arms = len(json.loads(PLAN_V4_PATH.read_text())["arms"])
    ap.add_argument("--seeds-at-once", type=argument_type("seeds_at_once", COUNT), default=2,
                    help=f"seeds per round (a round trains every arm of each; default 2: {2 * arms} runs at once with "
                         f"the default plan's {arms} arms)")
    ap.add_argument("--jobs", type=argument_type("jobs", JOBS), default=None,
                    help="processes at once (default: the runs of one round); no more than the runs, nor on the CPU "
                         "than the CPUs this process may use")
    ap.add_argument("--rounds", type=argument_type("rounds", COUNT), default=None,
                    help="train at most this many rounds now (whole rounds)")
    ap.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                    help="progress bars of the decoding and of every run")
    ap.add_argument("--dry-run", action="store_true", help="the tiny CPU check of the grid's logic (seconds)")
    return ap


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        plan = load_plan(args.plan, config_fields=[f.name for f in fields(TrainConfig)])  # refuses an edited plan
    except (ValueError, OSError) as err:
        parser.error(f"--plan: {err}")
    if args.dry_run:
        print(f"dry run: {dry_run(plan)}")
        return 0
    if plan.registration is None:
        parser.error(f"--plan: {args.plan} is not registered (no record in registrations.json): its runs would judge "
                     "nothing")
    common = {k: getattr(args, k) for k in MACHINE}
    jobs = args.jobs or min(len(plan.arms) * min(args.seeds_at_once, len(plan.seeds)), MAX_JOBS)
    with handle_signals():
        try:
            check_resolved(plan, args.device)
            configs = check_grid(plan, args.out, resume=args.resume, jobs=jobs, **common)
            arrays = load_cifar10(args.data, args.data_root, progress=args.progress,
                                  batch_size=max(c.batch_size for c in configs))
            grid = train_grid(plan, args.out, arrays=arrays, resume=args.resume, jobs=jobs,
                              seeds_at_once=args.seeds_at_once, rounds=args.rounds, progress=args.progress, **common)
        except ValueError as err:  # settings, device, run folders, manifests, data: one line
            parser.error(str(err))
        except DiskFull as err:
            print(err, file=sys.stderr)
            return exit_code(err)
        except KeyboardInterrupt as err:
            print(f"{parser.prog}: interrupted by {signal_name(err)}; the runs keep their last checkpoints: rerun "
                  "with --resume to continue the grid", file=sys.stderr)
            return exit_code(err)
    missing = f"; declared missing (in {Path(args.out) / MISSING}): {len(grid.missing)}" if grid.missing else ""
    print(f"complete seeds: {len(grid.complete)} of {len(plan.seeds)} ({grid.complete}); runs per arm: "
          f"{count_by_arm(grid_runs(plan, args.out))}{missing}")
    return grid.exit_code


if __name__ == "__main__":
    sys.exit(main())
