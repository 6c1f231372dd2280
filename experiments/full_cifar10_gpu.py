#!/usr/bin/env python3
"""Chapter 6's full-data experiment on one GPU, sized to a fixed wall-clock budget (how results/cifar10-full was made).

    PYTHONPATH=src python experiments/full_cifar10_gpu.py --data cifar10-jpeg.tar.gz --budget 540 --pack OUTDIR

1. Decode the data once (``explr.cifar10.data`` caches the uint8 arrays under ``--data-root``).
2. Measure the aggregate throughput of 1 and ``--concurrency`` engine processes
   (``benchmarks/bench_concurrency.py``).
3. Pick the first of ``SIZES`` (epochs of the main recipe, seeds) whose predicted time fits what is
   left of the budget with a margin.
4. Train its plan (:func:`explr.cifar10.config.experiment_plan`): ``main`` (the five schedules),
   ``ablation-none`` (TEXP with ``corrections="none"``, paired by seed with main's TEXP) and ``paper-scale``
   (Step Decay + WD and TEXP at λ = 5e-3, decays at 2/3 and 5/6 of 12 epochs, whose TEXP lr grows e^33 in
   phase 0 and is rescaled whenever it passes 1), every run at once in the sweep's pool
   (:func:`explr.cifar10.sweep.run_plan`, one process per run, its output in its folder's ``train.log``).
5. At the deadline the pool stops what still runs (its checkpoint of the last epoch stays: ``--resume``
   continues it); metrics, manifests and logs are packed into ``OUTDIR/results.tar.gz`` (checkpoints of
   unfinished runs into ``OUTDIR/checkpoints.tar``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

T0 = time.time()
STEPS_PER_EPOCH = 50_000 // 128
#: (main epochs, seeds of step/texp/ablation, seeds of cosine/cosine-texp/texp--), most preferred first.
SIZES = [(40, 5, 2), (30, 5, 3), (30, 5, 2), (30, 3, 2), (20, 3, 2), (16, 3, 2)]
PAPER_EPOCHS, PAPER_SEEDS = 12, (0,)


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f} s] {msg}", flush=True)


def plan_for(size, **common):
    """The experiment plan of ``size`` (:data:`SIZES`); ``common``: settings of every run (data, device, ...)."""
    from explr.cifar10.config import experiment_plan

    epochs, s_main, s_other = size
    seeds = {s: range(s_main if s in ("step", "texp") else s_other)
             for s in ("step", "texp", "texp--", "cosine", "cosine-texp")}
    return experiment_plan(epochs, seeds, paper_seeds=PAPER_SEEDS, paper_epochs=PAPER_EPOCHS, **common)


def pack(out: Path, dest: Path) -> None:
    from explr.cifar10 import Status

    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest / "results.tar.gz", "w:gz") as tar:
        for p in sorted(out.rglob("*")):
            if p.is_file() and p.suffix in (".json", ".jsonl", ".log"):
                tar.add(p, arcname=p.relative_to(out.parent))
    unfinished = []
    for m in out.rglob("manifest.json"):
        try:
            status = json.loads(m.read_text()).get("status")
        except ValueError:
            status = None
        if status != Status.FINISHED and (m.parent / "checkpoint.pt").exists():
            unfinished.append(m.parent / "checkpoint.pt")
    if 0 < len(unfinished) <= 3:  # the device tool brings back files of at most 16 MB
        with tarfile.open(dest / "checkpoints.tar", "w") as tar:
            for p in unfinished:
                tar.add(p, arcname=p.relative_to(out.parent))
    log(f"packed into {dest} ({len(unfinished)} unfinished checkpoints)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--data-root", default="/tmp/explr-data")
    ap.add_argument("--out", default="runs/full")
    ap.add_argument("--pack", required=True, help="folder for results.tar.gz, checkpoints.tar, probe.json")
    ap.add_argument("--budget", type=float, default=540, help="seconds from start until results are packed")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--margin", type=float, default=1.3, help="predicted time x margin must fit")
    ap.add_argument("--plan", type=int, default=None, help="force SIZES[i] (skips the probe)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny plan and paper-scale runs (a check of this script)")
    args = ap.parse_args()
    global PAPER_EPOCHS
    if args.smoke:
        SIZES[:] = [(2, 1, 1)]
        PAPER_EPOCHS = 3
        args.plan = 0
    out, dest = Path(args.out), Path(args.pack)
    dest.mkdir(parents=True, exist_ok=True)
    os.environ.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

    from explr.cifar10 import load_cifar10
    from explr.cifar10.config import config_to_argv
    from explr.cifar10.sweep import run_plan

    arrays = load_cifar10(args.data, root=args.data_root, progress=False)
    log(f"data: {arrays.describe()['source']} {arrays.x_train.shape} {arrays.x_test.shape}")
    common = dict(data=args.data, data_root=args.data_root, device=args.device, threads=1)

    if args.plan is None:
        probe = subprocess.run([sys.executable, "benchmarks/bench_concurrency.py", "--device", args.device, "--jobs", "1",
                                str(args.concurrency), "--seconds", "8", "--json", str(dest / "probe.json")],
                               capture_output=True, text=True)
        print(probe.stdout, probe.stderr[-3000:], flush=True)
        if probe.returncode != 0:
            log("probe failed")
            return 1
        rows = json.loads((dest / "probe.json").read_text())["rows"]
        agg = rows[-1]["images_per_s"]
        left = args.budget - (time.time() - T0) - 25  # start-up and packing
        choice = len(SIZES) - 1
        for i, size in enumerate(SIZES):
            runs = [c for group in plan_for(size, **common).values() for c in group]
            work = sum(c.epochs for c in runs) * STEPS_PER_EPOCH * 128 * 1.08  # +8 %: evaluation
            predicted = work / agg * args.margin
            log(f"size {size}: {len(runs)} runs, predicted {predicted:.0f} s of {left:.0f} s left")
            if predicted <= left:
                choice = i
                break
    else:
        choice = args.plan
    size = SIZES[choice]
    plan = plan_for(size, **common)
    n_runs = sum(len(group) for group in plan.values())
    log(f"chosen size {size}: {n_runs} runs")
    (dest / "plan.json").write_text(json.dumps({"plan": size, "runs": [
        [str(out / name), c.schedule, c.seed, config_to_argv(c)] for name, group in plan.items() for c in group]},
        indent=1))
    results = run_plan(plan, out, arrays=arrays, jobs=n_runs, resume=True, progress=False,
                       deadline=T0 + args.budget - 15, log_file="train.log")
    for r in results:
        log(f"{r.out}: {r.status}, {r.epochs_done} epochs")
    pack(out, dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
