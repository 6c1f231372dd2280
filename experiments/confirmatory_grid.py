#!/usr/bin/env python3
"""Chapter 6's confirmatory grid: exactly the runs of the registered analysis plan (v3), in seed-complete rounds.

    PYTHONPATH=src python experiments/confirmatory_grid.py --data cifar10-jpeg.tar.gz --data-root /tmp/explr-data
    PYTHONPATH=src python experiments/confirmatory_grid.py ... --resume        # continue an interrupted grid
    PYTHONPATH=src python experiments/confirmatory_grid.py --dry-run          # seconds, on the CPU

The plan (:data:`explr.book.registration.PLAN_V3_PATH`) names the arms (schedule, momentum corrections), the seeds and
the recipe (``config``).  Each round trains every arm of ``--seeds-at-once`` seeds (the first round seeds
``seeds[0:k]``, then the next k, ...) and the next round starts only when all of them finished, so a grid stopped
anywhere holds whole runs of complete seeds, plus at most one round of runs that ``--resume`` finishes.  A run
never stops early on purpose (no deadline); a run that diverges or fails stops the grid after its round.

Runs of corrections "all" train into ``<out>/main/<schedule>/seed<k>``, the others into
``<out>/ablation-<corrections>/...`` (the layout of ``results/cifar10-full``), each with its manifest, whose
``started`` time :func:`explr.book.stats.split_runs` compares with the plan's registration.  The grid refuses a
plan that is not registered (its runs would judge nothing) or was edited (:func:`~explr.book.registration.load_plan`).

Engine API used (names exported by :mod:`explr.cifar10`): ``TrainConfig``, ``run_plan``, ``load_cifar10``,
``load_runs``, ``RunError``, ``Status``, ``make_synthetic`` (dry run), ``train_run`` and ``run_dir`` (the dry run's
interrupted run); the command line's parts: :mod:`explr.cifar10.config` (``CommandLineParser``,
``add_config_arguments``, ``JOBS``), :func:`explr.cifar10.preflight.check_before_data` and
:func:`explr.cifar10.lock.handle_signals`.

Bad input is one line on stderr and exit code 2, with nothing created: the flags (by the engine's rules:
``--data``, ``--data-root`` and ``--device`` are :class:`~explr.cifar10.TrainConfig`'s, ``--jobs`` the CLI's), a
missing, malformed or edited plan, an unavailable device, a file where a folder goes, a run folder that cannot be
used (:func:`explr.cifar10.preflight.check_before_data`) and a manifest that does not parse, all checked before the
data is loaded; then bad data.  SIGINT, SIGTERM, SIGHUP and SIGUSR2 stop the grid with one line and 128 + the
signal's number (the runs record "interrupted"; ``--resume`` continues them); a full disk is exit code 6.
``--jobs`` (default: the runs of one round) is capped by the runs and, on the CPU, by the CPUs
(:func:`explr.cifar10.hardware.workers`).

``--dry-run`` trains the same grid logic on a tiny recipe (synthetic images, PreResNet-8, 2 epochs, the plan's
first 2 seeds) on the CPU into a temporary folder, and checks the balance and resume rules: one round leaves
exactly one complete seed; a run interrupted mid-way and a grid rerun without ``--resume`` are handled; the rerun
with ``--resume`` finishes the grid and leaves the first round's files untouched.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import fields, replace
from pathlib import Path

from explr.book.registration import PLAN_V3_PATH, AnalysisPlan, load_plan
from explr.book.stats import complete_seeds, count_by_arm
from explr.cifar10 import (RunError, Status, TrainConfig, load_cifar10, load_runs, make_synthetic, run_dir, run_plan,
                           train_run)
from explr.cifar10.config import FOLDER, JOBS, MAX_JOBS, CommandLineParser, add_config_arguments, argument_type
from explr.cifar10.lock import DiskFull, exit_code, handle_signals, signal_name
from explr.cifar10.preflight import check_before_data
from explr.params import Int, Text

#: the dry run's recipe: everything small, on the CPU (decays at epoch 1 of 2, so each schedule has a phase change).
DRY_RUN = dict(epochs=2, depth=8, batch_size=32, decay_epochs=[1], device="cpu", threads=1, eval_batch_size=64,
               log_every=2)
DRY_IMAGES = (160, 40)  # synthetic training and test images: 5 steps per epoch
#: the engine's settings that the grid takes from its command line (the plan gives the recipe).
MACHINE = ("data", "data_root", "device")
#: the rule of --seeds-at-once and --rounds.
COUNT = Int(1)


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


def train_grid(plan: AnalysisPlan, out, *, arrays, resume: bool = False, jobs: int = 1, seeds_at_once: int = 1,
               rounds: int | None = None, progress: bool = True, **common) -> list[int]:
    """Train the plan's grid into ``out`` round by round (module docstring); at most ``rounds`` rounds that still
    need training.  Returns the seeds complete afterwards (every arm finished).  Without ``resume`` an existing
    run is refused by the engine (``RunError``) before its round starts."""
    if not COUNT.ok(seeds_at_once) or not (rounds is None or COUNT.ok(rounds)):
        raise ValueError(f"--seeds-at-once and --rounds must be {COUNT.rule()}; got {seeds_at_once}, {rounds}")
    done = set(complete_seeds(plan, grid_runs(plan, out))) if resume else set()
    todo = [k for k in plan.seeds if k not in done]
    batches = [todo[i:i + seeds_at_once] for i in range(0, len(todo), seeds_at_once)][:rounds]
    for seeds in batches:
        run_plan(round_plan(plan, seeds, **common), out, arrays=arrays, jobs=jobs, resume=resume, progress=progress)
        if not set(seeds) <= set(complete_seeds(plan, grid_runs(plan, out))):  # from the manifests, not the pool
            print(f"round of seeds {seeds}: not every run finished (their manifests say why); the grid stops here",
                  file=sys.stderr)
            break
    return complete_seeds(plan, grid_runs(plan, out))


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise RuntimeError(f"dry run: {what}")
    print(f"dry run: {what}: ok")


def dry_run(plan: AnalysisPlan, out=None) -> dict[str, int]:
    """The grid's logic on :data:`DRY_RUN` (module docstring), in ``out`` or a temporary folder.  Returns the runs
    per arm; raises ``RuntimeError`` naming the first rule that failed."""
    tiny = replace(plan, seeds=plan.seeds[:2], config={**plan.config, **DRY_RUN},
                   data={"n_train": DRY_IMAGES[0], "n_test": DRY_IMAGES[1]})  # complete_seeds checks the recipe
    arrays = make_synthetic(n_train=DRY_IMAGES[0], n_test=DRY_IMAGES[1], seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(out or tmp)
        first, second = tiny.seeds
        _check(train_grid(tiny, out, arrays=arrays, rounds=1, progress=False) == [first],
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
        _check(train_grid(tiny, out, arrays=arrays, resume=True, progress=False) == [first, second],
               "--resume finishes the grid: both seeds complete")
        _check(all(p.read_bytes() == data for p, data in before.items()), "the first round's files are untouched")
        runs = grid_runs(tiny, out)
        _check(all(len(r["metrics"]["test_acc"]) == DRY_RUN["epochs"] for r in runs),
               "every run (the interrupted one too) has all its epochs")
        return count_by_arm(runs)


def check_grid(plan: AnalysisPlan, out, *, resume: bool, jobs: int, **common) -> list[TrainConfig]:
    """What the grid needs checked before its data is loaded: every run's settings (the plan's recipe with
    ``common``), the device, ``jobs``, ``out`` and every run folder in it
    (:func:`explr.cifar10.preflight.check_before_data`), and with ``resume`` every manifest :func:`grid_runs` reads.
    Returns every run's config; raises ``ValueError`` (one line); creates nothing."""
    configs = []
    for name, group in round_plan(plan, plan.seeds, **common).items():
        check_before_data(group, Path(out) / name, resume=resume, jobs=jobs)
        configs += group
    if resume:
        grid_runs(plan, out)
    return configs


def build_parser() -> argparse.ArgumentParser:
    ap = CommandLineParser(prog="confirmatory_grid.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", default=str(PLAN_V3_PATH), type=argument_type("plan", Text("a plan file")),
                    help="the registered analysis plan (default: v3)")
    ap.add_argument("--out", default="results/cifar10-confirmatory", type=argument_type("out", FOLDER),
                    help="folder of the grid's runs")
    add_config_arguments(ap, names=MACHINE)  # as python -m explr.cifar10 takes them
    ap.add_argument("--resume", action="store_true", help="continue the runs already under --out")
    ap.add_argument("--seeds-at-once", type=argument_type("seeds_at_once", COUNT), default=2,
                    help="seeds per round (a round trains every arm of each; default 2: 14 runs at once, near the "
                         "17 processes at which the pilot's throughput was measured)")
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
            configs = check_grid(plan, args.out, resume=args.resume, jobs=jobs, **common)
            arrays = load_cifar10(args.data, args.data_root, progress=args.progress,
                                  batch_size=max(c.batch_size for c in configs))
            done = train_grid(plan, args.out, arrays=arrays, resume=args.resume, jobs=jobs,
                              seeds_at_once=args.seeds_at_once, rounds=args.rounds, progress=args.progress, **common)
        except ValueError as err:  # settings, device, run folders, manifests, data: one line
            parser.error(str(err))
        except DiskFull as err:
            print(err, file=sys.stderr)
            return Status.DISK_FULL.exit_code
        except KeyboardInterrupt as err:
            print(f"{parser.prog}: interrupted by {signal_name(err)}; the runs keep their last checkpoints: rerun "
                  "with --resume to continue the grid", file=sys.stderr)
            return exit_code(err)
    print(f"complete seeds: {len(done)} of {len(plan.seeds)} ({done}); runs per arm: "
          f"{count_by_arm(grid_runs(plan, args.out))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
