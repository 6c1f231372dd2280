#!/usr/bin/env python3
"""The exact-twin test on PreResNet-32 with real CIFAR-10 images, on the CPU (issue 29, item 3; issue 39, item 2).

    OMP_NUM_THREADS=1 PYTHONPATH=src python experiments/exact_twins.py --data ../shared/data/cifar10_jpg_small.npz

Trains Step Decay + WD and its TEXP twins, and the per-epoch Cosine + WD and its hybrid twins
(:func:`explr.book.twins.run_unit`), on the same batches of real training images, in float64 (BN ε = 1e-300,
batch statistics), float32 and bf16 autocast, and writes every twin's logit deviation on a fixed batch of test
images, per step, to ``--out`` (:func:`explr.book.twins.summarise` reads it).  ``--rescale-at`` sends every twin
through PerStepLR's power-of-two rescaling; ``--near ε`` adds the near twin (TEXP built for (1 + ε)·wd), which
must depart.  Each pair × precision is a unit; the file is rewritten atomically after each, and ``--resume``
skips the units it holds (refusing other settings or other data).  Nothing decoded from the images is written:
metrics only.  Results come from a clean checkout: the commit is recorded, and a tree with uncommitted changes
is refused unless ``--allow-dirty`` is given.

Every flag is checked before any data is read; a bad one exits 2 with one line on stderr.  SIGINT, SIGTERM, SIGHUP
or SIGUSR2 ends it with one line and the exit code 128 + the signal, the units finished before kept whole.

The default weight decay is 5e-3 (the paper-scale pair of chapter 6): ηλ = 5e-4 makes the exponential LR grow 1 %
a step in phase 0 and the start correction 4.8e-3, ten times the standard 5e-4's, so a short run shows both.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from explr.book.twins import PAIRS, PRECISIONS, RUNS, TwinSettings, run_unit, summarise
from explr.cifar10.data import DataError, load_npz
from explr.cifar10.config import CommandLineParser, TrainConfig, argument_type, default_decay_epochs
from explr.cifar10.runfolder import atomic_write, exit_code, handle_signals, signal_name
from explr.models import PreResNet
from explr.params import MAX_SEED, Float, Int

ROOT = Path(__file__).resolve().parents[1]
T0 = time.time()
#: the engine's rules for the flags the experiment shares with it (explr.cifar10.TrainConfig).
ENGINE = {f.name: f.metadata["rule"] for f in dataclasses.fields(TrainConfig)}
#: the seed also seeds the control's perturbation with seed + 1, which torch.manual_seed must take.
SEED = Int(0, note=" (seed + 1 seeds the control run)", maximum=MAX_SEED - 1)


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f} s] {msg}", file=sys.stderr, flush=True)


def fail(msg: str) -> SystemExit:
    """Exit 2 with ``msg`` as one line on stderr."""
    print(f"exact_twins.py: error: {msg}", file=sys.stderr, flush=True)
    return SystemExit(2)


def parse(argv=None):
    p = CommandLineParser(prog="exact_twins.py", description=__doc__.split("\n\n")[0],
                          formatter_class=argparse.RawTextHelpFormatter)

    def rule(name, r=None):
        return argument_type(name, r if r is not None else ENGINE[name])

    p.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "cifar10_jpg_small.npz",
                   help=".npz with uint8 x_train (N,32,32,3), y_train, x_test, y_test")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "exact-twins" / "metrics.json")
    p.add_argument("--resume", action="store_true", help="keep the units --out already holds (same settings)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="write results from a tree with uncommitted changes (recorded as dirty); for tests")
    p.add_argument("--threads", type=rule("threads"), default=1, help="torch CPU threads (default 1)")
    p.add_argument("--depth", type=rule("depth"), default=32, help="PreResNet depth 6n+2 (default 32)")
    p.add_argument("--epochs", type=rule("epochs"), default=8,
                   help="'epochs' of --steps-per-epoch steps; decays at 50/75 %%")
    p.add_argument("--steps-per-epoch", type=rule("steps_per_epoch", Int(1)), default=5)
    p.add_argument("--batch-size", type=rule("batch_size"), default=32)
    p.add_argument("--probe-size", type=rule("probe_size", Int(2)), default=32,
                   help="held-out test images whose logits are compared")
    p.add_argument("--lr", type=rule("lr"), default=0.1)
    p.add_argument("--wd", type=rule("wd", Float(0)), default=5e-3)
    p.add_argument("--momentum", type=rule("momentum"), default=0.9)
    p.add_argument("--seed", type=rule("seed", SEED), default=0, help="initial weights, batch order and image choice")
    p.add_argument("--record-every", type=rule("record_every", Int(1)), default=None,
                   help="steps between recorded logits in float64 (default: each epoch's end; a probe costs half a "
                        "step there); float32 and bf16 record every step, their departure curves")
    p.add_argument("--rescale-at", type=rule("rescale_at", Float(1)), default=None,
                   help="rescale each twin (PerStepLR, rescale_above) when its lr passes this multiple of its lr[0]")
    p.add_argument("--near", type=rule("near", Float(0)), default=None,
                   help="also train the near twin, TEXP built for (1 + NEAR)·wd (float64)")
    p.add_argument("--runs", nargs="+", choices=RUNS, default=None,
                   help="the float64 runs beside the original (default: all; near only with --near)")
    p.add_argument("--pairs", nargs="+", choices=tuple(PAIRS), default=list(PAIRS))
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    args = p.parse_args(argv)
    try:
        settings = TwinSettings(epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
                                milestones=default_decay_epochs(args.epochs), lr=args.lr, wd=args.wd,
                                momentum=args.momentum, batch_size=args.batch_size, seed=args.seed,
                                record_every=args.record_every or args.steps_per_epoch, rescale_at=args.rescale_at,
                                near=args.near)
    except ValueError as err:
        p.error(str(err).splitlines()[0])
    if args.runs is not None and "near" in args.runs and args.near is None:
        p.error("--runs near needs --near (its ε)")
    check_out(p, args.out)
    check_data_path(p, args.data)
    return args, settings


def check_out(p: argparse.ArgumentParser, out: Path) -> None:
    """Refuse an ``--out`` that cannot become a file: a folder, a path under a file, a folder not writable."""
    if out.is_dir():
        p.error(f"--out {out} is a folder; give the path of the JSON file to write")
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        p.error(f"--out {out}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        p.error(f"--out {out}: the folder {parent} is not writable")


def check_data_path(p: argparse.ArgumentParser, data: Path) -> None:
    if not data.is_file():
        what = "is a folder" if data.is_dir() else "no such file"
        p.error(f"--data {data}: {what}; give a .npz with uint8 x_train (N,32,32,3), y_train, x_test, y_test")


def read_previous(out: Path) -> dict | None:
    """The experiment ``out`` holds, checked for shape (a dict with settings, data and units), or None."""
    if not out.is_file():
        return None
    try:
        previous = json.loads(out.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise fail(f"--resume: {out} is not a readable JSON file ({type(err).__name__}: {err}); "
                   "move it away or run without --resume") from None
    if not (isinstance(previous, dict) and isinstance(previous.get("settings"), dict)
            and isinstance(previous.get("data"), dict) and isinstance(previous.get("units"), dict)):
        raise fail(f"--resume: {out} is not an exact-twins results file (a JSON object with settings, data and "
                   "units); move it away or run without --resume")
    return previous


def source_state() -> dict:
    """The commit of the checkout and whether it has uncommitted changes (``git status --porcelain`` of the whole
    repository, untracked files included); None for both outside a git checkout."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30)
        status = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    if commit.returncode or status.returncode:
        return {"commit": None, "dirty": None}
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def data(args, settings: TwinSettings):
    """(images, labels, probe, description): ``steps × batch`` training images (a seeded choice, each used once)
    and ``--probe-size`` test images, normalised with the training set's channel statistics, float64 NCHW."""
    try:
        arrays = load_npz(args.data)
    except DataError as err:
        raise fail(str(err).splitlines()[0]) from None
    mean, std = arrays.channel_stats
    rng = np.random.default_rng(args.seed)
    n = settings.steps * settings.batch_size
    if n > len(arrays.y_train) or args.probe_size > len(arrays.y_test):
        raise fail(f"--data {args.data.name} holds {len(arrays.y_train)} training and {len(arrays.y_test)} "
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
    args, settings = parse(argv)
    try:
        with handle_signals():  # SIGINT, SIGTERM, SIGHUP, SIGUSR2; also in a background job, which ignores SIGINT
            return run(args, settings)
    except KeyboardInterrupt as err:
        print(f"exact_twins.py: interrupted by {signal_name(err)}; {args.out} holds the units finished before, whole "
              "(rerun with --resume to continue)", file=sys.stderr, flush=True)
        return exit_code(err)


def run(args, settings: TwinSettings) -> int:
    """The experiment of ``args`` (checked by :func:`parse`): every unit, written after each."""
    source = source_state()
    if source["dirty"] is not False and not args.allow_dirty:
        raise fail("the checkout has uncommitted changes (or is no git checkout): results must come from a clean "
                   "commit; commit first, or pass --allow-dirty (recorded as dirty)")
    recorded_settings = {**dataclasses.asdict(settings), "milestones": list(settings.milestones),
                         "record_every": {p: settings.record_every if p == "float64" else 1 for p in PRECISIONS},
                         "model": f"PreResNet-{args.depth} (scale invariant, explr.models.PreResNet)",
                         "depth": args.depth, "probe_size": args.probe_size,
                         **({"runs": list(args.runs)} if args.runs else {})}
    previous = read_previous(args.out) if args.resume else None
    if previous is not None and previous["settings"] != recorded_settings:
        raise fail(f"--resume: {args.out} holds another experiment (its settings differ); move it away or run "
                   "without --resume")
    torch.set_num_threads(args.threads)
    every_step = dataclasses.replace(settings, record_every=1)
    images, labels, probe, described = data(args, settings)
    metrics = {"settings": recorded_settings, "data": described, "units": {}}
    if previous is not None:
        if previous["data"].get("sha256") != described["sha256"]:
            raise fail(f"--resume: {args.out} was made from other data (sha256 differs); move it away or run "
                       "without --resume")
        metrics = previous
        log(f"resuming: {len(metrics['units'])} unit(s) done: {sorted(metrics['units'])}")
    metrics["machine"] = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                          "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
                          "numpy": np.__version__, "python": platform.python_version(),
                          "threads": torch.get_num_threads(), "git": source}

    def build(eps):
        return PreResNet(args.depth, eps=eps, seed=args.seed)

    for precision in args.precisions:
        for pair in args.pairs:
            key = f"{pair}/{precision}"
            if key in metrics["units"]:
                log(f"{key}: done before, skipped")
                continue
            log(f"{key}: {PAIRS[pair]}, {settings.steps} steps")
            f64 = precision == "float64"
            unit = run_unit(build, images, labels, probe, settings if f64 else every_step, pair, precision,
                            runs=tuple(args.runs) if args.runs and f64 else None, log=log)
            metrics["units"][key] = {**unit, "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
            metrics["summary"] = summarise(metrics)
            write(args.out, metrics)
            log(f"{key}: written to {args.out}")
    print(json.dumps(metrics.get("summary", {}), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
