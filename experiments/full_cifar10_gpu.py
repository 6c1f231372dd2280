#!/usr/bin/env python3
"""Chapter 6's full-data experiment on one GPU, sized to a fixed wall-clock budget (how results/cifar10-full was made).

    PYTHONPATH=src python experiments/full_cifar10_gpu.py --data cifar10-jpeg.tar.gz --budget 540 --pack OUTDIR

1. Decode the data once (``explr.cifar10.data`` caches the uint8 arrays under ``--data-root``).
2. Measure the aggregate throughput of 1 and ``--concurrency`` engine processes
   (``benchmarks/bench_concurrency.py``).
3. Pick the first plan of ``PLANS`` (epochs of the main recipe, seeds) whose predicted time fits what is
   left of the budget with a margin.
4. Start every run as its own ``python -m explr.cifar10`` process (one (schedule, seed) each):
   ``main`` (the five schedules), ``ablation-none`` (TEXP with ``--corrections none``, paired by seed with
   main's TEXP) and ``paper-scale`` (Step Decay + WD and TEXP at λ = 5e-3 whose TEXP lr grows e^33 in
   phase 0 and is rescaled whenever it passes 1).
5. At the deadline, stop what still runs (its checkpoint of the last epoch stays: ``--resume`` continues it)
   and pack metrics, manifests and logs into ``OUTDIR/results.tar.gz`` (checkpoints of unfinished runs
   into ``OUTDIR/checkpoints.tar``).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

T0 = time.time()
STEPS_PER_EPOCH = 50_000 // 128
#: (main epochs, seeds of step/texp/ablation, seeds of cosine/cosine-texp/texp--), most preferred first.
PLANS = [(40, 5, 2), (30, 5, 3), (30, 5, 2), (30, 3, 2), (20, 3, 2), (16, 3, 2)]
PAPER = dict(epochs=12, decay=(8, 10), wd=5e-3, rescale_above=1.0, seeds=(0,))


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f} s] {msg}", flush=True)


def runs_for(plan, out: Path):
    epochs, s_main, s_other = plan
    common = ["--epochs", str(epochs), "--depth", "32", "--batch-size", "128", "--lr", "0.1", "--momentum", "0.9"]
    runs = []
    for sched in ("step", "texp", "texp--", "cosine", "cosine-texp"):
        for seed in range(s_main if sched in ("step", "texp") else s_other):
            runs.append((out / "main", sched, seed, common + ["--wd", "5e-4"], epochs))
    for seed in range(s_main):
        runs.append((out / "ablation-none", "texp", seed, common + ["--wd", "5e-4", "--corrections", "none"], epochs))
    for sched in ("step", "texp"):
        for seed in PAPER["seeds"]:
            runs.append((out / "paper-scale", sched, seed,
                         ["--epochs", str(PAPER["epochs"]), "--decay-epochs", *map(str, PAPER["decay"]),
                          "--depth", "32", "--batch-size", "128", "--lr", "0.1", "--momentum", "0.9",
                          "--wd", str(PAPER["wd"]), "--rescale-above", str(PAPER["rescale_above"])],
                         PAPER["epochs"]))
    return runs


def pack(out: Path, dest: Path) -> None:
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
        if status != "finished" and (m.parent / "checkpoint.pt").exists():
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
    ap.add_argument("--plan", type=int, default=None, help="force PLANS[i] (skips the probe)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny plan and paper-scale runs (a check of this script)")
    args = ap.parse_args()
    if args.smoke:
        PLANS[:] = [(2, 1, 1)]
        PAPER.update(epochs=3, decay=(1, 2))
        args.plan = 0
    out, dest = Path(args.out), Path(args.pack)
    dest.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

    from explr.cifar10 import load_cifar10
    arrays = load_cifar10(args.data, root=args.data_root, progress=False)
    log(f"data: {arrays.describe()['source']} {arrays.x_train.shape} {arrays.x_test.shape}")

    if args.plan is None:
        probe = subprocess.run([sys.executable, "benchmarks/bench_concurrency.py", "--device", args.device, "--jobs", "1",
                                str(args.concurrency), "--seconds", "8", "--json", str(dest / "probe.json")],
                               env=env, capture_output=True, text=True)
        print(probe.stdout, probe.stderr[-3000:], flush=True)
        if probe.returncode != 0:
            log("probe failed")
            return 1
        rows = json.loads((dest / "probe.json").read_text())["rows"]
        agg = rows[-1]["images_per_s"]
        left = args.budget - (time.time() - T0) - 25  # start-up and packing
        choice = len(PLANS) - 1
        for i, plan in enumerate(PLANS):
            work = sum(e for *_, e in runs_for(plan, out)) * STEPS_PER_EPOCH * 128 * 1.08  # +8 %: evaluation
            predicted = work / agg * args.margin
            log(f"plan {plan}: {len(runs_for(plan, out))} runs, predicted {predicted:.0f} s of {left:.0f} s left")
            if predicted <= left:
                choice = i
                break
    else:
        choice = args.plan
    plan = PLANS[choice]
    runs = runs_for(plan, out)
    log(f"chosen plan {plan}: {len(runs)} runs")
    (dest / "plan.json").write_text(json.dumps({"plan": plan, "runs": [[str(o), s, seed, a] for o, s, seed, a, _ in runs]},
                                               indent=1))
    procs = []
    for o, sched, seed, extra, _ in runs:
        d = o / sched / f"seed{seed}"
        d.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "explr.cifar10", "--schedule", sched, "--seed", str(seed), "--out", str(o),
               "--data", args.data, "--data-root", args.data_root, "--device", args.device, "--threads", "1",
               "--no-progress", "--resume", *extra]
        f = open(d / "train.log", "w")
        procs.append((subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env), f, d))
    deadline = T0 + args.budget - 15
    last = 0.0
    while time.time() < deadline and any(p.poll() is None for p, _, _ in procs):
        time.sleep(2)
        if time.time() - last > 60:
            last = time.time()
            done = []
            for _, _, d in procs:
                try:
                    done.append(json.loads((d / "manifest.json").read_text()).get("epochs_done", 0))
                except (OSError, ValueError):
                    done.append(0)
            log(f"epochs done per run: {done}")
    for p, f, d in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p, f, d in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
        f.close()
        log(f"{d}: exit {p.returncode}")
    pack(out, dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
