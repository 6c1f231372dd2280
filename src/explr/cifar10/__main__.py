"""Command line: train the paper's CIFAR-10 schedules on a (scale-invariant) PreResNet.

    python -m explr.cifar10 --schedule step texp texp-- cosine cosine-texp --seed 0 1 \\
        --epochs 200 --data auto --out runs/cifar10

trains every (schedule, seed) pair into ``<out>/<schedule>/seed<seed>/`` (manifest.json,
metrics.jsonl, checkpoint.pt; see :mod:`explr.train`).  ``--resume`` continues interrupted runs,
skips finished ones and starts missing ones, so the same command can simply be run again.
``python -m explr.cifar10 --help`` lists every option.
"""
from __future__ import annotations

import argparse
import math
import sys

from .data import DataError, load_cifar10
from .train import COMPILE_MODES, PRECISIONS, SCHEDULES, TrainConfig, resume_mismatch, run_dir, run_many
from .schedules import CORRECTIONS

__all__ = ["main", "build_parser"]


def _int(minimum):
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {v}")
        return v
    parse.__name__ = f"integer>={minimum}"
    return parse


def _float(lo, hi=math.inf, lo_open=True, hi_open=True):
    rule = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"

    def parse(text):
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number in {rule}, got {text!r}") from None
        ok = math.isfinite(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        if not ok:
            raise argparse.ArgumentTypeError(f"must be a finite number in {rule}, got {text}")
        return v
    parse.__name__ = f"number in {rule}"
    return parse


def _depth(text):
    v = _int(8)(text)
    if (v - 2) % 6:
        raise argparse.ArgumentTypeError(f"must be 6n + 2 (20, 32, 56, ...), got {v}")
    return v


def build_parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    p = argparse.ArgumentParser(
        prog="python -m explr.cifar10",
        description="Train PreResNet on CIFAR-10 with the schedules of Li & Arora (ICLR 2020): step decay + WD, "
                    "its exact exponential equivalent TEXP (no WD), TEXP--, cosine + WD and TEXP of the cosine. "
                    "Every (schedule, seed) pair is one run in OUT/<schedule>/seed<seed>/ with manifest.json, "
                    "metrics.jsonl (one line per epoch) and checkpoint.pt (every epoch).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("runs")
    g.add_argument("--schedule", nargs="+", choices=SCHEDULES, default=["step"], metavar="NAME",
                   help=f"one or more of {', '.join(SCHEDULES)}: step = step decay + WD; texp = TEXP of it, no WD "
                        "(exact, with momentum corrections); texp-- = TEXP without the LR drops; cosine = per-epoch "
                        "cosine + WD; cosine-texp = TEXP of that cosine")
    g.add_argument("--seed", nargs="+", type=_int(0), default=[0],
                   help="one or more seeds (model init, data order, augmentation); runs = schedules x seeds")
    g.add_argument("--epochs", type=_int(1), default=d.epochs, help="epochs per run")
    g.add_argument("--out", default="runs/cifar10", help="output folder; each run goes to OUT/<schedule>/seed<seed>")
    g.add_argument("--resume", action="store_true",
                   help="continue interrupted runs from their checkpoints, skip finished ones, start missing ones "
                        "(without it an existing run folder is an error)")
    g.add_argument("--jobs", type=_int(1), default=1,
                   help="runs trained at the same time as separate processes (useful on a GPU)")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="tqdm progress bar with live loss/accuracy")

    g = p.add_argument_group("data")
    g.add_argument("--data", default=d.data,
                   help="'auto' (download CIFAR-10 into --data-root, md5-checked), 'synthetic' (small generated "
                        "stand-in), a .npz with x_train,y_train,x_test,y_test (uint8, HWC) or a folder with "
                        "CIFAR-10's python batches")
    g.add_argument("--data-root", default=d.data_root, help="download/extract folder for --data auto")
    g.add_argument("--augment", action=argparse.BooleanOptionalAction, default=d.augment,
                   help="random crop (pad 4) and horizontal flip of training images")

    g = p.add_argument_group("optimisation")
    g.add_argument("--lr", type=_float(0), default=d.lr, help="initial learning rate eta_0")
    g.add_argument("--wd", type=_float(0, lo_open=False), default=d.wd,
                   help="weight decay lambda (the exponential schedules use it to build their growth rate and "
                        "train without it)")
    g.add_argument("--momentum", type=_float(0, 1, lo_open=False), default=d.momentum, help="momentum gamma in [0, 1)")
    g.add_argument("--batch-size", type=_int(1), default=d.batch_size,
                   help="training batch size (each epoch uses n_train // batch-size full batches)")
    g.add_argument("--decay-epochs", nargs="*", type=_int(1), default=None, metavar="E",
                   help="epochs where step decay multiplies the lr by --decay-factor (default: 50%% and 75%% of "
                        "--epochs, i.e. 100 150 for 200); give none for a constant lr")
    g.add_argument("--decay-factor", type=_float(0, 1, hi_open=False), default=d.decay_factor,
                   help="step-decay factor in (0, 1]")
    g.add_argument("--corrections", choices=CORRECTIONS, default=d.corrections,
                   help="momentum corrections of TEXP at phase starts: all (exact), start, none")
    g.add_argument("--rescale-above", type=_float(0), default=d.rescale_above,
                   help="exponential schedules: when the optimizer's lr would exceed this, rescale (theta, v, lr) -> "
                        "(c theta, v/c, c^2 lr), the same network, so float32/bf16 never overflow")

    g = p.add_argument_group("model")
    g.add_argument("--depth", type=_depth, default=d.depth, help="PreResNet depth 6n+2 (20, 32, 56, ...)")
    g.add_argument("--invariant", action=argparse.BooleanOptionalAction, default=d.invariant,
                   help="scale-invariant mode of the paper: BN scale/bias and the last linear layer fixed "
                        "(--no-invariant: ordinary PreResNet, step/cosine only)")
    g.add_argument("--bn-eps", type=_float(0), default=d.bn_eps, help="BatchNorm epsilon")

    g = p.add_argument_group("hardware")
    g.add_argument("--device", default=d.device, help="auto (cuda if available, else cpu), cpu, cuda, cuda:N, ...")
    g.add_argument("--precision", choices=PRECISIONS, default=d.precision,
                   help="fp32; bf16 = torch.autocast bfloat16 (fp32 weights); fp64; auto = bf16 on CUDA, fp32 elsewhere")
    g.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=d.channels_last,
                   help="channels_last memory format for images and convolutions")
    g.add_argument("--compile", choices=COMPILE_MODES, default=d.compile, help="torch.compile mode for the model")
    g.add_argument("--threads", type=_int(1), default=None, help="torch CPU threads (default: torch's choice)")
    g.add_argument("--eval-batch-size", type=_int(1), default=d.eval_batch_size, help="test-set batch size")
    g.add_argument("--log-every", type=_int(1), default=d.log_every,
                   help="steps between host syncs (progress bar update and NaN/inf check)")
    return p


def configs_from_args(args) -> list[TrainConfig]:
    shared = {k: getattr(args, k) for k in (
        "epochs", "lr", "wd", "momentum", "batch_size", "decay_factor", "depth", "invariant", "bn_eps",
        "corrections", "rescale_above", "augment", "data", "data_root", "device", "precision", "channels_last",
        "compile", "threads", "eval_batch_size", "log_every")}
    shared["decay_epochs"] = None if args.decay_epochs is None else tuple(args.decay_epochs)
    schedules = list(dict.fromkeys(args.schedule))
    seeds = list(dict.fromkeys(args.seed))
    return [TrainConfig(schedule=s, seed=seed, **shared) for s in schedules for seed in seeds]


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configs = configs_from_args(args)
    try:
        for c in configs:
            c.validate()
    except ValueError as err:
        parser.error(str(err))
    if args.resume:
        for c in configs:
            diff = resume_mismatch(c, run_dir(args.out, c.schedule, c.seed))
            if diff:
                parser.error(f"--resume: the run in {run_dir(args.out, c.schedule, c.seed)} was made with other "
                             f"settings: {', '.join(diff)}")
    else:
        taken = [str(run_dir(args.out, c.schedule, c.seed)) for c in configs
                 if (run_dir(args.out, c.schedule, c.seed) / "checkpoint.pt").exists()
                 or (run_dir(args.out, c.schedule, c.seed) / "metrics.jsonl").exists()]
        if taken:
            parser.error(f"--out: these run folders already hold runs: {', '.join(taken)}; pass --resume to continue "
                         "them or choose another --out")
    try:
        arrays = load_cifar10(args.data, args.data_root) if args.jobs == 1 else None
        if args.jobs > 1:
            load_cifar10(args.data, args.data_root)  # fail fast before the workers start
    except DataError as err:
        parser.error(f"--data: {err}")
    if arrays is not None and args.batch_size > len(arrays.y_train):
        parser.error(f"--batch-size {args.batch_size} exceeds the {len(arrays.y_train)} training images")
    print(f"{len(configs)} run(s) into {args.out}: schedules {', '.join(dict.fromkeys(args.schedule))}; "
          f"seeds {', '.join(map(str, dict.fromkeys(args.seed)))}; {args.epochs} epochs", file=sys.stderr)
    results = run_many(configs, args.out, arrays=arrays, jobs=args.jobs, resume=args.resume, progress=args.progress)
    diverged = False
    print(f"{'run':<28} {'status':<12} {'epochs':>6} {'test acc':>9}")
    for c, r in zip(configs, results):
        final = r.get("final") or {}
        acc = f"{final['test_acc']:.4f}" if final else "-"
        print(f"{c.schedule + ' seed ' + str(c.seed):<28} {r['status']:<12} {final.get('epoch', '-'):>6} {acc:>9}")
        if r["status"] == "diverged":
            diverged = True
            print(f"  {r['message']}", file=sys.stderr)
    return 3 if diverged else 0


if __name__ == "__main__":
    sys.exit(main())
