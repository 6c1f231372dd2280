"""Aggregate images/s of K engine processes training at once on one device: how many runs share a GPU well?

    python benchmarks/bench_concurrency.py --device cuda --jobs 1 4 16 --seconds 10

Small-batch ResNet training on a large GPU is bound by kernel launches from Python, so one process
leaves most of the GPU idle; separate processes (``python -m explr.cifar10 --jobs K``) fill the gaps.
For each K this starts K processes, each a full engine (``explr.cifar10.Trainer``: on-device data,
augmentation, PerStepLR with rescaling, metric sums) on synthetic CIFAR-shaped data.  After
``--warmup`` steps they wait at a barrier, then each trains for ``--seconds`` and reports its images/s.
The table gives the sum over processes and the ratio to K = 1 measured in the same invocation.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time

from explr.cifar10.config import add_config_arguments


def _worker(rank: int, jobs: int, args, barrier, queue) -> None:
    import torch

    from explr.cifar10 import TrainConfig, Trainer, make_synthetic
    from explr.cifar10.config import resolve_device, resolve_threads

    torch.set_num_threads(resolve_threads(args.threads, resolve_device(args.device), jobs))
    B = args.batch_size
    arrays = make_synthetic(n_train=B * 100, n_test=B, seed=rank)
    config = TrainConfig(schedule=args.schedule, epochs=1000, seed=rank, batch_size=B, depth=args.depth,
                         device=args.device, precision=args.precision, compile=args.compile,
                         decay_epochs=()).validate()
    trainer = Trainer(config, arrays)
    sync = torch.cuda.synchronize if trainer.device.type == "cuda" else (lambda: None)
    epoch, k, steps = 0, 0, trainer.steps_per_epoch
    state = trainer.begin_epoch(epoch)

    def advance(n: int) -> None:
        nonlocal epoch, k, state
        while n > 0:
            if k == steps:
                epoch, k = epoch + 1, 0
                state = trainer.begin_epoch(epoch)
            m = min(n, steps - k)
            trainer.run_steps(state, k, k + m)
            k, n = k + m, n - m

    advance(args.warmup)
    sync()
    barrier.wait()
    t0, done = time.perf_counter(), 0
    while time.perf_counter() - t0 < args.seconds:
        advance(args.chunk)
        sync()
        done += args.chunk
    queue.put((rank, done * B / (time.perf_counter() - t0)))


def measure(args, jobs: int) -> list[float]:
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(jobs), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, jobs, args, barrier, queue)) for r in range(jobs)]
    for p in procs:
        p.start()
    rates = [queue.get(timeout=args.seconds + 600) for _ in procs]
    for p in procs:
        p.join()
    return [r for _, r in sorted(rates)]


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, nargs="+", default=[1, 2, 4], help="numbers of concurrent processes")
    add_config_arguments(p, names=("schedule", "depth", "batch_size", "precision", "device", "compile", "threads"))
    p.set_defaults(schedule="texp")
    p.add_argument("--warmup", type=int, default=30, help="untimed steps per process before the barrier")
    p.add_argument("--chunk", type=int, default=10, help="steps between synchronisations")
    p.add_argument("--seconds", type=float, default=10.0, help="timed training per process")
    p.add_argument("--json", default=None, help="also write the table to this JSON file")
    args = p.parse_args(argv)
    rows, base = [], None
    for k in args.jobs:
        rates = measure(args, k)
        total = sum(rates)
        base = base if base is not None else total / k if k == 1 else None
        rows.append({"jobs": k, "images_per_s": total, "per_process": total / k,
                     "ratio_to_one": (total / base) if base else None})
        print(f"K={k:>3}: {total:10.0f} img/s in all, {total / k:9.0f} per process"
              + (f", {total / base:5.2f}x one process" if base else ""), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "rows": rows}, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
