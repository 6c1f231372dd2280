"""Every setting of a CIFAR-10 run, declared once (:class:`TrainConfig`), and what comes from it: the command line,
the schedule played (Li & Arora 2020, Sec. 5), the device, precision and threads, and chapter 6's plan."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import torch

from ..lr_scheduler import max_rescale_above
from ..params import Choice, Flag, Float, Int, MAX_SEED, Numbers, Text
from ..schedules import (
    CORRECTIONS, PlainSchedule, Schedule, alpha, check_milestones, cosine, step_decay, texp, texp_minus_minus,
)


#: the values of ``--schedule`` (:attr:`TrainConfig.schedule`).
SCHEDULES = ("step", "texp", "texp--", "cosine", "cosine-texp")
#: the schedules played as an exponential equivalent without weight decay (scale invariant, rescaled).
EXPONENTIAL = ("texp", "texp--", "cosine-texp")
#: the values of ``--precision``: fp32; bf16 (autocast, fp32 weights); fp64; auto (bf16 on CUDA, else fp32).
PRECISIONS = ("auto", "fp32", "bf16", "fp64")
#: float32's smallest normal and largest value: every lr the optimizer plays stays in between.
LR_MIN, LR_MAX = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)
#: the largest ``rescale_above``: float32's largest value / 4 (:func:`~explr.lr_scheduler.max_rescale_above`).
RESCALE_ABOVE_MAX = max_rescale_above(torch.float32)
#: the bounds of ``--epochs`` and ``--depth`` (He et al.'s ResNet-1202, 2016); why: docs/cifar10-engine.md.
MAX_EPOCHS = 100_000
MAX_DEPTH = 1202
#: the most CPU threads of a run, and runs at once on one machine (``--jobs``).
MAX_THREADS = MAX_JOBS = 1024
#: the largest N of ``cuda:N`` (torch keeps a device index in 8 bits).
MAX_DEVICE_INDEX = 127
#: the rules of a folder setting (``--data-root``, ``--out``) and of ``--jobs``.
FOLDER, JOBS = Text("a folder"), Int(1, maximum=MAX_JOBS)


@dataclass(frozen=True)
class Device:
    """A device name the engine trains on (whether it is available here: :func:`resolve_device`)."""

    def rule(self) -> str:
        return f"one of auto, cpu, cuda, cuda:N with N in [0, {MAX_DEVICE_INDEX}], mps"

    def ok(self, v) -> bool:
        cuda = re.fullmatch(r"cuda:([0-9]+)", v) if isinstance(v, str) else None
        return v in ("auto", "cpu", "cuda", "mps") or (cuda is not None and int(cuda[1]) <= MAX_DEVICE_INDEX)

    parse = staticmethod(str)


def lr_wd_limit(momentum: float) -> float:
    """2(1 + γ): the λη from which SGD with momentum γ blows the weights up (docs/cifar10-engine.md, Polyak 1964)."""
    return 2.0 * (1.0 + momentum)


def setting(default, help: str, rule, group: str, *, trajectory=True, optional=False, sweep=False):
    """A field of :class:`TrainConfig`; ``trajectory``: a resume must agree (``"resolved"``: once ``auto`` is resolved);
    ``optional``: ``None`` means automatic; ``sweep``: the CLI takes several values."""
    return field(default=default, metadata={"help": help, "rule": rule, "group": group, "trajectory": trajectory,
                                            "optional": optional, "sweep": sweep})


@dataclass
class TrainConfig:
    """Everything that defines a run; the CLI flag of a field is ``--`` + its name with ``-``, its help the flag's.
    ``decay_epochs=None``: 50 % and 75 % of ``epochs``; ``threads=None``: from the CPUs this process may use."""

    schedule: str = setting(
        "step", "step = step decay + WD; texp = its exact exponential equivalent, no WD (with momentum corrections); "
        "texp-- = TEXP without the LR drops; cosine = per-epoch cosine + WD; cosine-texp = TEXP of that cosine",
        Choice(SCHEDULES), "runs", sweep=True)
    seed: int = setting(0, "seeds (model init, data order, augmentation); runs = schedules x seeds",
                        Int(0, note=" (what torch.manual_seed takes)", maximum=MAX_SEED), "runs", sweep=True)
    epochs: int = setting(200, "epochs per run", Int(1, maximum=MAX_EPOCHS), "runs")
    lr: float = setting(0.1, "initial learning rate eta_0; every lr the schedule plays must stay in float32's normal "
                        "range", Float(LR_MIN, LR_MAX, lo_open=False, hi_open=False, note=" (float32's normal range)"),
                        "optimisation")
    wd: float = setting(5e-4, "weight decay lambda (the exponential schedules build their growth rate from it and "
                        "train without it); at most float32's largest value, as the optimizer holds it in float32",
                        Float(0, LR_MAX, lo_open=False, hi_open=False, note=" (float32's range)"), "optimisation")
    momentum: float = setting(0.9, "momentum gamma in [0, 1)", Float(0, 1, lo_open=False), "optimisation")
    batch_size: int = setting(128, "training batch size (each epoch uses n_train // batch-size full batches)",
                              Int(1), "optimisation")
    decay_epochs: tuple | None = setting(
        None, "epochs where step decay multiplies the lr by --decay-factor (default: 50%% and 75%% of --epochs, "
        "i.e. 100 150 for 200); give none for a constant lr", Numbers(Int(1), min_len=0), "optimisation",
        optional=True)
    decay_factor: float = setting(0.1, "step-decay factor in (0, 1]", Float(0, 1, hi_open=False), "optimisation")
    corrections: str = setting("all", "momentum corrections of TEXP at phase starts: all (exact), start, none",
                               Choice(CORRECTIONS), "optimisation")
    rescale_above: float = setting(
        100.0, "exponential schedules: when the optimizer's lr would exceed this, rescale (theta, v, lr) -> "
        "(c theta, v/c, c^2 lr), the same network, so float32/bf16 never overflow; must exceed the schedule's "
        "first lr", Float(0, RESCALE_ABOVE_MAX, hi_open=False, note=" (at most float32's largest value / 4)"),
        "optimisation")
    depth: int = setting(32, "PreResNet depth 6n+2 (20, 32, 56, ...); at most 1202, He et al.'s deepest CIFAR ResNet",
                         Int(8, (6, 2), note=" (20, 32, 56, ..., 1202)", maximum=MAX_DEPTH), "model")
    invariant: bool = setting(True, "scale-invariant mode of the paper: BN scale/bias and the last linear layer "
                              "fixed (--no-invariant: ordinary PreResNet, step/cosine only)", Flag(), "model")
    bn_eps: float = setting(1e-5, "BatchNorm epsilon, a small stabiliser added to each channel's batch variance: at "
                            "most 0.1, which already damps a unit-variance channel by 5%% and breaks the scale "
                            "invariance in proportion (larger values make the outputs constant)",
                            Float(0, 0.1, hi_open=False), "model")
    augment: bool = setting(True, "random crop (pad 4) and horizontal flip of training images", Flag(), "data")
    data: str = setting("auto", "'auto' (download CIFAR-10 into --data-root, md5-checked), 'synthetic' (small "
                        "generated stand-in), a .npz with x_train,y_train,x_test,y_test (uint8, HWC), a folder with "
                        "CIFAR-10's python batches, an image-folder tree train/<class>/*.png|jpg, test/... or a "
                        ".tar/.tar.gz/.tgz of one (its data sha256 must match on resume)",
                        Text("a data source"), "data", trajectory=False)
    data_root: str = setting("data", "download/extract folder for --data auto; decoded image folders are cached "
                             "in DATA_ROOT/cache", FOLDER, "data", trajectory=False)
    device: str = setting("auto", "auto (cuda if available, else cpu), cpu, cuda, cuda:N or mps", Device(),
                          "hardware", trajectory="resolved")
    precision: str = setting("auto", "fp32; bf16 = torch.autocast bfloat16 (fp32 weights); fp64; auto = bf16 on "
                             "CUDA, fp32 elsewhere", Choice(PRECISIONS), "hardware", trajectory="resolved")
    channels_last: bool = setting(True, "channels_last memory format for images and convolutions", Flag(),
                                  "hardware", trajectory=False)
    compile: str = setting("none", "torch.compile mode for the model",
                           Choice(("none", "default", "reduce-overhead", "max-autotune")), "hardware", trajectory=False)
    threads: int | None = setting(
        None, "torch CPU threads (default: the CPUs this process may use (its CPU affinity), minus one "
        "left for everything else; 1 per run on a GPU); results on a CPU depend on it; at most 1024, more than "
        "any one machine has", Int(1, maximum=MAX_THREADS), "hardware", trajectory="resolved", optional=True)
    eval_batch_size: int = setting(1000, "test-set batch size", Int(1), "hardware", trajectory=False)
    log_every: int = setting(25, "steps between host syncs (progress bar, divergence check)", Int(1), "hardware",
                             trajectory=False)

    def validate(self) -> "TrainConfig":
        """``ValueError`` naming the field, its flag and the valid range, for any invalid value; at the first lr, the
        largest played, α must exist (:func:`explr.schedules.alpha`) or SGD not blow up (:func:`lr_wd_limit`)."""
        for f in dataclasses.fields(self):
            value, meta = getattr(self, f.name), f.metadata
            if not (value is None and meta["optional"]) and not meta["rule"].ok(value):
                raise ValueError(f"{f.name} ({flag(f.name)}) must be {meta['rule'].rule()}; got {value!r}")
        if self.decay_epochs is not None:
            try:
                check_milestones(self.decay_epochs, self.epochs)
            except ValueError as err:
                raise ValueError(f"decay_epochs ({flag('decay_epochs')}): {err}") from None
        if self.schedule in EXPONENTIAL:
            if not self.invariant:
                raise ValueError(f"schedule (--schedule) {self.schedule!r} is exponential, exact only for a scale-"
                                 "invariant network: it needs invariant=True (drop --no-invariant)")
            try:
                alpha(self.lr, self.wd, self.momentum)
            except ValueError as err:
                raise ValueError(f"wd (--wd) {self.wd!r}: schedule {self.schedule} has no exponential equivalent at "
                                 f"lr (--lr) {self.lr!r}: {err}") from None
        elif self.lr * self.wd >= lr_wd_limit(self.momentum):
            raise ValueError(
                f"wd (--wd) {self.wd!r} with lr (--lr) {self.lr!r}: lr*wd = {self.lr * self.wd:.6g} must be below "
                f"2(1 + momentum) = {lr_wd_limit(self.momentum):.6g}, where SGD with momentum {self.momentum!r} "
                "starts to blow the weights up geometrically from the first step (the run must diverge)")
        return self

    def milestones(self) -> list[int]:
        return list(self.decay_epochs) if self.decay_epochs is not None else default_decay_epochs(self.epochs)


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
#: settings a resumed run must agree on, as given.
TRAJECTORY_KEYS = tuple(n for n, f in _FIELDS.items() if f.metadata["trajectory"] is True)
#: settings a resumed run must agree on after ``auto`` is resolved (device type, precision, CPU threads).
RESOLVED_KEYS = tuple(n for n, f in _FIELDS.items() if f.metadata["trajectory"] == "resolved")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def milestones_at(epochs: int, fractions) -> list[int]:
    """The epochs round(f · ``epochs``) for each fraction f, once each, those in [1, epochs - 1]."""
    return sorted({m for m in (round(Fraction(f) * epochs) for f in fractions) if 1 <= m <= epochs - 1})


def default_decay_epochs(epochs: int) -> list[int]:
    """Step-decay milestones at 50 % and 75 % of training ([100, 150] for 200 epochs; He et al. 2016's recipe)."""
    return milestones_at(epochs, (Fraction(1, 2), Fraction(3, 4)))


class CommandLineParser(argparse.ArgumentParser):
    """The engine's command-line parser: an error is one line and exit code 2; ``--wd -1e-4`` passes -1e-4 to --wd."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"-\.?\d|-inf|-nan", re.IGNORECASE)  # noqa: V101 (argparse reads it)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def argument_type(name: str, rule):
    """An argparse ``type`` that parses ``text`` by ``rule`` and refuses, in one line, a value it does not pass."""

    def parse(text):
        with contextlib.suppress(ValueError):
            if rule.ok(value := rule.parse(text)):
                return value
        raise argparse.ArgumentTypeError(f"must be {rule.rule()}; got {text!r}")

    parse.__name__ = name  # argparse names it in "invalid <name> value"
    return parse


def add_config_arguments(parser: argparse.ArgumentParser, names=None, sweep=None) -> None:
    """A ``--flag`` per field of :class:`TrainConfig` (or of ``names``), grouped; ``sweep`` fields take many values."""
    groups = {}
    for f in [f for f in _FIELDS.values() if names is None or f.name in names]:
        meta = f.metadata
        group = groups.get(meta["group"]) or groups.setdefault(meta["group"], parser.add_argument_group(meta["group"]))
        many = meta["sweep"] if sweep is None else f.name in sweep
        rule, kwargs = meta["rule"], {"help": meta["help"]}
        if isinstance(rule, Flag):
            kwargs.update(action=argparse.BooleanOptionalAction, default=f.default)
        else:
            kwargs.update(type=argument_type(f.name, rule), default=[f.default] if many else f.default)
            if isinstance(rule, Choice):
                kwargs.update(choices=rule.choices, metavar="{" + ",".join(rule.choices) + "}")
            if many:
                kwargs["nargs"] = "+"
            elif isinstance(rule, Numbers):  # each value parsed and checked; validate() checks the whole list
                kwargs.update(nargs="*", metavar="E", type=argument_type(f.name, rule.item))
        group.add_argument(flag(f.name), dest=f.name, **kwargs)


def configs_from_args(args, sweep=("schedule", "seed")) -> list[TrainConfig]:
    """One :class:`TrainConfig` per combination of the ``sweep`` fields' values (each value once, in order)."""
    shared = {n: getattr(args, n) for n in _FIELDS if n not in sweep and hasattr(args, n)}
    if shared.get("decay_epochs") is not None:
        shared["decay_epochs"] = tuple(shared["decay_epochs"])
    values = [list(dict.fromkeys(getattr(args, n))) for n in sweep]
    return [TrainConfig(**shared, **dict(zip(sweep, combo))) for combo in itertools.product(*values)]


def config_to_argv(config: TrainConfig, *, defaults: bool = False) -> list[str]:
    """The flags that give ``config`` back (:func:`configs_from_args`): its fields but defaults (all: ``defaults``)."""
    argv = []
    for name, f in _FIELDS.items():
        value = getattr(config, name)
        if value is None or (not defaults and value == f.default):
            continue
        if isinstance(f.metadata["rule"], Flag):
            argv.append(flag(name) if value else "--no-" + name.replace("_", "-"))
        else:
            argv += [flag(name), *map(str, value if isinstance(value, (list, tuple)) else [value])]
    return argv


def available_cpus() -> int:
    """The CPUs in this process's affinity mask (SLURM, taskset and Docker limit it); ``os.cpu_count()`` elsewhere."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def available_memory() -> int | None:
    """Bytes the host can still give (``MemAvailable`` of ``/proc/meminfo``); ``None`` where unknown."""
    with contextlib.suppress(OSError, StopIteration), open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    return None


def resolve_threads(threads: int | None, device: torch.device, jobs: int = 1) -> int:
    """``threads``, by default 1 on a GPU and ``max(1, (available_cpus() − 1) // jobs)`` on a CPU (one left free)."""
    if threads is not None:
        return threads
    return 1 if device.type != "cpu" else max(1, (available_cpus() - 1) // max(1, jobs))


def workers(jobs: int, runs: int, device: torch.device) -> int:
    """The worker processes of a sweep: ``jobs``, at most the runs and, on the CPU, the CPUs."""
    return min(jobs, runs, available_cpus()) if device.type == "cpu" else min(jobs, runs)


def resolve_device(name: str) -> torch.device:
    """``auto`` → CUDA if available, else CPU; an unavailable device is a ``ValueError`` naming ``--device``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if not {"cpu": True, "cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}[device.type]:
        raise ValueError(f"device (--device) {name!r}: {device.type.upper()} is not available on this machine (use "
                         "--device cpu or auto)")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device (--device) {name!r}: this machine has {torch.cuda.device_count()} CUDA "
                         f"device(s), cuda:0..cuda:{torch.cuda.device_count() - 1}")
    return device


def resolve_precision(precision: str, device: torch.device) -> str:
    return ("bf16" if device.type == "cuda" else "fp32") if precision == "auto" else precision


def param_dtype(precision: str) -> torch.dtype:
    """The weights' dtype under a resolved ``precision`` (bf16 autocasts the computation, not the weights)."""
    return torch.float64 if precision == "fp64" else torch.float32


def worker_gpus(workers: int, visible: str | None = None) -> list[str | None]:
    """``CUDA_VISIBLE_DEVICES`` of each worker: GPU i mod G of the parent's ``visible`` GPUs; ``None`` with no GPU."""
    count = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "") if visible is None else visible
    ids = [v.strip() for v in visible.split(",") if v.strip()][:count]
    ids = ids if len(ids) == count else [str(i) for i in range(count)]
    return [ids[i % count] if count else None for i in range(workers)]


def resolved_settings(config, jobs: int = 1, *, here: bool = True) -> dict:
    """:data:`RESOLVED_KEYS` of ``config`` here, ``jobs`` runs at a time (``here=False``: as given, for a job)."""
    if not here:
        return {"device": config.device, "precision": config.precision, "threads": config.threads}
    device = resolve_device(config.device)
    return {"device": str(device), "precision": resolve_precision(config.precision, device),
            "threads": resolve_threads(config.threads, device, jobs)}


def played_schedule(config: TrainConfig, steps_per_epoch: int) -> Schedule:
    """What :class:`~explr.lr_scheduler.PerStepLR` plays for ``config`` (an exponential one in log space); a
    ``ValueError`` naming the flag if it would not fit in memory (checked first) or plays an lr below :data:`LR_MIN`."""
    c, E, S = config, config.epochs, steps_per_epoch
    need, available = E * S * 256, available_memory()  # bytes per step at the peak of building it, for every schedule
    if available is not None and need > available:
        raise ValueError(f"epochs (--epochs) {E}: the per-step schedule of {E} epochs x {S} steps needs "
                         f"{need / 2**30:.3g} GiB of memory, more than the {available / 2**30:.3g} GiB available "
                         "here; lower --epochs or raise --batch-size")
    base = (step_decay(c.lr, E, S, c.milestones(), c.decay_factor) if c.schedule in ("step", "texp", "texp--")
            else cosine(c.lr, E, S, per="epoch"))
    if c.schedule in ("step", "cosine"):
        played = PlainSchedule(base, np.full(len(base), float(c.wd)), name=c.schedule)
    else:
        equivalent = texp_minus_minus if c.schedule == "texp--" else texp
        played = equivalent(base, c.wd, c.momentum, corrections=c.corrections)
    log_low = played.log_lr  # -inf where an lr underflowed to 0; rescaled: R_k ≥ min(1, lr_0 / (4 max_{j≤k} lr_j))
    if rescale_limit(c) is not None:
        log_low = log_low + np.minimum(0.0, log_low[0] - math.log(4.0) - np.maximum.accumulate(log_low))
    k = int(np.argmin(log_low))
    if log_low[k] < math.log(LR_MIN):
        played_as = "lr as the optimizer plays it (rescaled)" if rescale_limit(c) is not None else "lr"
        raise ValueError(f"lr (--lr) {c.lr:g}: the {c.schedule} schedule's {played_as} falls to "
                         f"{math.exp(log_low[k]):.3g} in epoch {k // S + 1}, below float32's smallest "
                         f"normal number {LR_MIN:.3g}; raise --lr or --decay-factor")
    return played


def rescale_limit(config: TrainConfig) -> float | None:
    """The ``rescale_above`` that ``config`` is played with; ``None`` for step and cosine (never above ``lr``)."""
    return config.rescale_above if config.schedule in EXPONENTIAL else None


#: the paper-scale pair: ten times the weight decay, rescaled whenever the lr passes 1, decays at 2/3 and 5/6.
PAPER_SCALE = {"wd": 5e-3, "rescale_above": 1.0}


def experiment_plan(epochs: int, seeds: Iterable[int] | Mapping[str, Iterable[int]], *, schedules=SCHEDULES,
                    ablation: bool = True, paper_scale: bool = True, paper_seeds: Iterable[int] | None = None,
                    paper_epochs: int | None = None, **common) -> dict[str, list[TrainConfig]]:
    """Chapter 6's plan: ``main``, each of ``schedules`` × its ``seeds`` (a list, or schedule → seeds);
    ``ablation-none``: TEXP without momentum corrections, TEXP's seeds; ``paper-scale``: step and TEXP at
    :data:`PAPER_SCALE` for ``paper_epochs`` (default ``epochs``) and ``paper_seeds`` (default main's first)."""
    seeds = seeds if isinstance(seeds, Mapping) else dict.fromkeys(schedules, list(seeds))
    plan = {"main": [TrainConfig(schedule=s, seed=k, epochs=epochs, **common)
                     for s in schedules for k in seeds.get(s, ())]}
    if ablation and "texp" in schedules:
        plan["ablation-none"] = [TrainConfig(schedule="texp", seed=k, epochs=epochs, corrections="none", **common)
                                 for k in seeds.get("texp", ())]
    if paper_scale:
        E = paper_epochs or epochs
        decays = tuple(milestones_at(E, (Fraction(2, 3), Fraction(5, 6))))
        paper = {**common, **PAPER_SCALE, "epochs": E, "decay_epochs": decays}
        paper_seeds = [c.seed for c in plan["main"]][:1] if paper_seeds is None else paper_seeds
        plan["paper-scale"] = [TrainConfig(schedule=s, seed=k, **paper) for k in paper_seeds for s in ("step", "texp")]
    return plan
