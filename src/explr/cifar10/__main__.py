"""Command line: train the paper's CIFAR-10 schedules on a (scale-invariant) PreResNet, each (schedule, seed) pair
into ``<out>/<schedule>/seed<seed>/``, e.g. (options: ``--help``; exit codes: docs/cifar10-engine.md)

    python -m explr.cifar10 --schedule step texp texp-- cosine cosine-texp --seed 0 1 --epochs 200 --data auto
"""
from __future__ import annotations

import argparse
import contextlib
import sys

from ..params import Int
from .config import FOLDER, JOBS, CommandLineParser, add_config_arguments, argument_type, configs_from_args
from .runfolder import MANIFEST, DiskFull, exit_code, handle_signals, run_dir
from .sweep import check_launcher, run_many, submit

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    positive, count = argument_type("count", Int(1)), argument_type("count", Int(0))
    p = CommandLineParser(
        prog="python -m explr.cifar10",
        description="Train PreResNet on CIFAR-10 with the schedules of Li & Arora (ICLR 2020): step decay + WD, "
                    "its exact exponential equivalent TEXP (no WD), TEXP--, cosine + WD and TEXP of the cosine. "
                    "Every (schedule, seed) pair is one run in OUT/<schedule>/seed<seed>/ with manifest.json, "
                    "metrics.jsonl (one line per epoch) and checkpoint.pt (every epoch).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_config_arguments(p)
    g = p.add_argument_group("sweep")
    g.add_argument("--out", default="runs/cifar10", type=argument_type("out", FOLDER),
                   help="output folder; each run goes to OUT/<schedule>/seed<seed>")
    g.add_argument("--resume", action="store_true",
                   help="continue interrupted runs from their checkpoints, skip finished ones, start missing ones "
                        "(without it an existing run folder is an error)")
    g.add_argument("--jobs", type=argument_type("jobs", JOBS), default=1,
                   help="runs trained at the same time as separate processes (worker i uses GPU i mod G); no more "
                        "than the runs, nor on the CPU than the CPUs this process may use")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="tqdm progress bar with live loss/accuracy")
    g = p.add_argument_group("cluster (--launcher submitit)")
    g.add_argument("--launcher", choices=("local", "submitit"), default="local",
                   help="local: train here (--jobs at a time); submitit: one job per run through submitit")
    g.add_argument("--cluster", choices=("slurm", "local"), default=None,
                   help="submitit's executor: slurm, or local (subprocesses of this machine, for tests); None: slurm")
    g.add_argument("--partition", default=None, help="SLURM partition")
    g.add_argument("--account", default=None, help="SLURM account")
    g.add_argument("--gpus-per-run", type=count, default=0, help="GPUs per job")
    g.add_argument("--cpus-per-run", type=positive, default=None, help="CPUs per job (None: the cluster's default)")
    g.add_argument("--time", type=positive, default=None, help="time limit per job in minutes (preempted or timed-out "
                   "jobs are requeued and resume from their last checkpoint); None: 60")
    g.add_argument("--no-wait", dest="wait", action="store_false",
                   help="return after submitting (print the job ids); by default wait for every job")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configs = configs_from_args(args)
    manifests = _manifest_times(configs, args.out)
    with handle_signals():
        try:
            job = {"wait": args.wait, "partition": args.partition, "account": args.account,
                   "gpus_per_run": args.gpus_per_run, "cpus_per_run": args.cpus_per_run}
            given = {k: v for k, v in (("cluster", args.cluster), ("timeout_min", args.time)) if v is not None}
            check_launcher(args.launcher, jobs=args.jobs, **job, **given)
            if args.launcher == "submitit":  # submit's defaults where not given
                results = submit(configs, args.out, resume=args.resume, **job, **given)
            else:
                results = run_many(configs, args.out, jobs=args.jobs, resume=args.resume, progress=args.progress)
        except ValueError as err:  # settings, device, data, run folders: nothing was written
            parser.error(str(err))
        except DiskFull as err:
            print(err, file=sys.stderr)
            return exit_code(err)
        except KeyboardInterrupt as err:
            started = _manifest_times(configs, args.out) != manifests
            print("interrupted; the runs keep their last checkpoints: rerun with --resume" if started else
                  "interrupted before any run started (while loading the data or checking the runs): rerun the same "
                  "command", file=sys.stderr)
            return exit_code(err)
    return _report(configs, results, submitted=args.launcher == "submitit" and not args.wait)


def _manifest_times(configs, out) -> dict:
    """{manifest: its modification time}: a run that starts (or records an interruption) writes it."""
    times = {}
    for manifest in (run_dir(out, c.schedule, c.seed) / MANIFEST for c in configs):
        with contextlib.suppress(OSError):  # none yet, or a path that the checks refuse in one line
            times[manifest] = manifest.stat().st_mtime_ns
    return times


def _report(configs, results, submitted: bool = False) -> int:
    """One line per run (``submitted``: the job ids of ``--no-wait``); the largest exit code of their statuses."""
    if submitted:
        for c, r in zip(configs, results):
            what = f"job {r.job_id}" if r.job_id is not None else f"not submitted: {r.status}"
            print(f"{c.schedule + ' seed ' + str(c.seed):<28} {what}  {r.out}")
        return 0
    print(f"{'run':<28} {'status':<12} {'epochs':>6} {'test acc':>9}")
    for c, r in zip(configs, results):
        final = r.final or {}
        acc = f"{final['test_acc']:.4f}" if final else "-"
        print(f"{c.schedule + ' seed ' + str(c.seed):<28} {r.status:<12} {final.get('epoch', '-'):>6} {acc:>9}")
        if r.status.exit_code:
            print(f"  {r.message}", file=sys.stderr)
    return max((r.status.exit_code for r in results), default=0)


if __name__ == "__main__":
    sys.exit(main())
