"""Images/s of the explr training engine vs a bare forward/backward/SGD-step loop, in one process.

    .venv/bin/python benchmarks/bench_train.py                       # PreResNet32, batch 128, fp32 and bf16
    .venv/bin/python benchmarks/bench_train.py --depth 20 --precision bf16 --steps 30 --device cuda

Both loops train the same model (same depth, seed, channels_last, precision, device, batch size).
The bare loop reuses one pre-normalised batch and does only zero_grad / forward / loss / backward /
SGD step.  The engine (``explr.cifar10.Trainer``: ``begin_epoch`` / ``run_steps`` / ``end_epoch``, the
code ``train_epoch`` runs) additionally draws the epoch's permutation, crops, flips and normalises
every batch on the device, plays the schedule through PerStepLR (with overflow-safe rescaling for the
exponential schedules) and accumulates loss and accuracy on the device, syncing with the host every
``--log-every`` steps and at the end of the epoch.

Timing (``--timing``): ``step`` (default on a CPU) alternates single steps of the two loops and
times each, so that load from other processes hits both alike; the figure of merit is the median
over steps of the paired ratio t_bare / t_engine (target on a CPU: >= 0.9).  ``round`` (default on
a GPU, where single steps cannot be timed without breaking the asynchronous pipeline) alternates
rounds of ``--steps`` steps, synchronising only at round ends.

Contention (``--hog N``): the same measurement with N single-core busy loops (``yes > /dev/null``)
running beside it, as when a reader's machine or a shared build machine is busy.  The engine's default
CPU thread count (:func:`explr.cifar10.config.resolve_threads`) leaves one CPU free for exactly this.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F

from explr.cifar10 import TrainConfig, Trainer, make_synthetic
from explr.cifar10.config import (add_config_arguments, available_cpus, resolve_device, resolve_precision,
                                  resolve_threads)
from explr.models import PreResNet


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench(args, precision):
    device = resolve_device(args.device)
    precision = resolve_precision(precision, device)
    timing = args.timing if args.timing != "auto" else ("round" if device.type == "cuda" else "step")
    B = args.batch_size
    rounds = args.warmup + args.repeats
    total = (args.warmup + args.steps) if timing == "step" else rounds * args.steps
    arrays = make_synthetic(n_train=B * total, n_test=B, seed=0)
    config = TrainConfig(schedule=args.schedule, epochs=2, batch_size=B, depth=args.depth, device=str(device),
                         precision=precision, channels_last=args.channels_last, compile=args.compile,
                         log_every=args.log_every, decay_epochs=(), threads=torch.get_num_threads())
    trainer = Trainer(config.validate(), arrays, device)

    dtype = torch.float64 if precision == "fp64" else torch.float32
    model = PreResNet(args.depth, seed=0).to(dtype)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.to(device)
    fwd = model if args.compile == "none" else torch.compile(model, mode=None if args.compile == "default" else args.compile)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, **({"fused": True} if device.type == "cuda" else {}))
    x, y = trainer.data.train_batch(trainer.data.epoch_plan(1, 0, B), 0)
    x, y = x.clone(memory_format=torch.channels_last if args.channels_last else torch.contiguous_format), y.clone()
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if precision == "bf16" else None

    def bare(n):
        for _ in range(n):
            if autocast:
                with autocast():
                    loss = F.cross_entropy(fwd(x), y)
            else:
                loss = F.cross_entropy(fwd(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    state = None

    def engine(start, n):
        nonlocal state
        if start == 0:
            state = trainer.begin_epoch(0)
        trainer.run_steps(state, start, start + n)
        if start + n == total:
            trainer.end_epoch(state)

    def timed(fn, *a):
        sync(device)
        t0 = time.perf_counter()
        fn(*a)
        sync(device)
        return time.perf_counter() - t0

    tb, te = [], []
    if timing == "step":
        for k in range(total):
            pair = (timed(bare, 1), timed(engine, k, 1)) if k % 2 == 0 else (timed(engine, k, 1), timed(bare, 1))[::-1]
            if k >= args.warmup:
                tb.append(pair[0])
                te.append(pair[1])
        print(f"  [{precision}] {len(tb)} paired steps: bare {B / statistics.median(tb):.1f}, engine "
              f"{B / statistics.median(te):.1f} img/s (medians)", flush=True)
    else:
        for r in range(rounds):
            pair = (timed(bare, args.steps), timed(engine, r * args.steps, args.steps))
            if r >= args.warmup:
                tb.append(pair[0] / args.steps)
                te.append(pair[1] / args.steps)
            print(f"  [{precision}] round {r + 1}/{rounds}{' (warm-up)' if r < args.warmup else ''}: bare "
                  f"{B / pair[0] * args.steps:.1f}, engine {B / pair[1] * args.steps:.1f} img/s", flush=True)
    ratio = statistics.median(b / e for b, e in zip(tb, te))
    return precision, str(device), timing, B / statistics.median(tb), B / statistics.median(te), ratio, \
        sum(tb) / sum(te)


@contextlib.contextmanager
def busy_loops(n: int):
    """``n`` processes ``yes > /dev/null`` (one core each) for the duration of the block."""
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(n)]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # the model and hardware options are TrainConfig's own (same flags, rules and help as the CLI)
    add_config_arguments(p, names=("schedule", "depth", "batch_size", "precision", "device", "threads",
                                   "channels_last", "compile", "log_every"), sweep=("precision",))
    p.set_defaults(schedule="texp", precision=["fp32", "bf16"])
    p.add_argument("--steps", type=int, default=20, help="timed steps (--timing step) or steps per round (round)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps (step) or rounds (round) first")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (--timing round only)")
    p.add_argument("--timing", choices=["auto", "step", "round"], default="auto",
                   help="paired single steps (CPU default) or synchronised rounds (GPU default)")
    p.add_argument("--hog", type=int, default=0, help="single-core busy loops (yes > /dev/null) running beside it")
    args = p.parse_args(argv)
    torch.set_num_threads(resolve_threads(args.threads, resolve_device(args.device)))
    print(f"PreResNet{args.depth}, batch {args.batch_size}, {args.steps} steps/round, channels_last={args.channels_last}, "
          f"compile={args.compile}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads "
          f"({available_cpus()} available), {args.hog} busy loop(s) beside it")
    with busy_loops(args.hog):
        rows = [bench(args, precision) for precision in args.precision]
    print(f"\n{'precision':<10}{'device':<8}{'timing':<7}{'bare img/s':>11}{'engine img/s':>13}"
          f"{'ratio':>7}{'total-time ratio':>18}")
    for precision, device, timing, bare, engine, ratio, total_ratio in rows:
        print(f"{precision:<10}{device:<8}{timing:<7}{bare:>11.1f}{engine:>13.1f}{ratio:>7.3f}{total_ratio:>18.3f}")
    print("img/s: medians over timed steps (rounds); ratio: median of paired t_bare/t_engine (target >= 0.9)")


if __name__ == "__main__":
    main()
