#!/usr/bin/env python3
"""The exact-twin test on PreResNet-32 with real CIFAR-10 images, on the CPU (issue 29, item 3).

    OMP_NUM_THREADS=1 PYTHONPATH=src python experiments/exact_twins.py --data ../shared/data/cifar10_jpg_small.npz

Trains Step Decay + WD and its TEXP twins, and the per-epoch Cosine + WD and its hybrid twins
(:func:`explr.book.twins.run_unit`), on the same batches of real training images, in float64 (BN ε = 1e-300,
batch statistics), float32 and bf16 autocast, and writes every twin's logit deviation on a fixed batch of test
images, per step, to ``results/exact-twins/metrics.json`` (:func:`explr.book.twins.summarise` reads it).  Each
pair × precision is a unit; the file is rewritten atomically after each, and ``--resume`` skips the units it
holds (refusing other settings or other data).  Nothing decoded from the images is written: metrics only.

The weight decay is 5e-3 (the paper-scale pair of chapter 6): ηλ = 5e-4 makes the exponential LR grow 1 % a
step in phase 0 and the start correction 4.8e-3, ten times the standard 5e-4's, so a short run shows both.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from explr.book.twins import PAIRS, PRECISIONS, TwinSettings, run_unit, summarise
from explr.cifar10.arrays import load_npz
from explr.cifar10.config import default_decay_epochs
from explr.cifar10.files import atomic_write
from explr.cifar10.runs import git_commit
from explr.models import PreResNet

ROOT = Path(__file__).resolve().parents[1]
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f} s] {msg}", file=sys.stderr, flush=True)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "cifar10_jpg_small.npz",
                   help=".npz with uint8 x_train (N,32,32,3), y_train, x_test, y_test")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "exact-twins" / "metrics.json")
    p.add_argument("--resume", action="store_true", help="keep the units --out already holds (same settings)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--depth", type=int, default=32, help="PreResNet depth 6n+2 (default 32)")
    p.add_argument("--epochs", type=int, default=8, help="'epochs' of --steps-per-epoch steps; decays at 50/75 %%")
    p.add_argument("--steps-per-epoch", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--probe-size", type=int, default=32, help="held-out test images whose logits are compared")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--wd", type=float, default=5e-3)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0, help="initial weights, batch order and image choice")
    p.add_argument("--record-every", type=int, default=None,
                   help="steps between recorded logits in float64 (default: each epoch's end; a probe costs half a "
                        "step there); float32 and bf16 record every step, their departure curves")
    p.add_argument("--pairs", nargs="+", choices=tuple(PAIRS), default=list(PAIRS))
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    args = p.parse_args(argv)
    if args.threads < 1:
        p.error(f"--threads must be >= 1; got {args.threads}")
    if args.probe_size < 2:
        p.error(f"--probe-size must be >= 2; got {args.probe_size}")
    return args


def data(args, settings: TwinSettings):
    """(images, labels, probe, description): ``steps × batch`` training images (a seeded choice, each used once)
    and ``--probe-size`` test images, normalised with the training set's channel statistics, float64 NCHW."""
    arrays = load_npz(args.data)
    mean, std = arrays.channel_stats
    rng = np.random.default_rng(args.seed)
    n = settings.steps * settings.batch_size
    if n > len(arrays.y_train) or args.probe_size > len(arrays.y_test):
        raise SystemExit(f"--data {args.data.name} holds {len(arrays.y_train)} training and {len(arrays.y_test)} "
                         f"test images; this run needs {n} and {args.probe_size}")
    train = rng.permutation(len(arrays.y_train))[:n]
    test = rng.permutation(len(arrays.y_test))[:args.probe_size]

    def tensor(x):
        return torch.from_numpy(((x / 255.0 - mean) / std).transpose(0, 3, 1, 2).copy())

    described = {**arrays.describe(), "train_images_used": n, "probe_images": args.probe_size,
                 "normalisation": {"mean": mean.tolist(), "std": std.tolist()}}
    return (tensor(arrays.x_train[train]), torch.from_numpy(arrays.y_train[train].astype(np.int64)),
            tensor(arrays.x_test[test]), described)


def write(path: Path, metrics: dict) -> None:
    """``metrics`` as indented JSON at ``path``, whole or not at all (the engine's atomic write)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: f.write((json.dumps(metrics, indent=1) + "\n").encode()))


def main(argv=None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    settings = TwinSettings(epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
                            milestones=default_decay_epochs(args.epochs), lr=args.lr, wd=args.wd,
                            momentum=args.momentum, batch_size=args.batch_size, seed=args.seed,
                            record_every=args.record_every or args.steps_per_epoch)
    every_step = dataclasses.replace(settings, record_every=1)
    images, labels, probe, described = data(args, settings)
    recorded_settings = {**dataclasses.asdict(settings), "milestones": list(settings.milestones),
                         "record_every": {p: settings.record_every if p == "float64" else 1 for p in PRECISIONS},
                         "model": f"PreResNet-{args.depth} (scale invariant, explr.models.PreResNet)",
                         "depth": args.depth, "probe_size": args.probe_size}
    metrics = {"settings": recorded_settings, "data": described, "units": {}}
    if args.resume and args.out.is_file():
        previous = json.loads(args.out.read_text())
        if previous.get("settings") != recorded_settings or previous.get("data", {}).get("sha256") != described[
                "sha256"]:
            raise SystemExit(f"--resume: {args.out} holds another experiment (settings or data differ); "
                             "move it away or run without --resume")
        metrics = previous
        log(f"resuming: {len(metrics['units'])} unit(s) done: {sorted(metrics['units'])}")
    metrics["machine"] = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                          "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
                          "numpy": np.__version__, "python": platform.python_version(),
                          "threads": torch.get_num_threads(), "git": git_commit()}

    def build(eps):
        return PreResNet(args.depth, eps=eps, seed=args.seed)

    for precision in args.precisions:
        for pair in args.pairs:
            key = f"{pair}/{precision}"
            if key in metrics["units"]:
                log(f"{key}: done before, skipped")
                continue
            log(f"{key}: {PAIRS[pair]}, {settings.steps} steps")
            unit = run_unit(build, images, labels, probe, settings if precision == "float64" else every_step, pair,
                            precision, log=log)
            metrics["units"][key] = {**unit, "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
            metrics["summary"] = summarise(metrics)
            write(args.out, metrics)
            log(f"{key}: written to {args.out}")
    print(json.dumps(metrics.get("summary", {}), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
