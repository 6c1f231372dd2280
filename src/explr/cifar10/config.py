"""Every setting of a CIFAR-10 run, declared once: :class:`TrainConfig`, and the command line made from it.

Each field of :class:`TrainConfig` carries its help text, its rule (type and valid range), its group
and whether it changes the trajectory, in ``dataclasses.field(metadata=...)``.  From that one
declaration come the command-line parser (:func:`add_config_arguments`: ``--`` + the field name
with ``-``), the validation (:meth:`TrainConfig.validate`), the settings a resumed run must agree
on (:data:`TRAJECTORY_KEYS`, and :data:`RESOLVED_KEYS` compared by their resolved value), the flags of a
config (:func:`config_to_argv`) and the benchmark's options.  Adding an option means adding one field here.
:class:`CommandLineParser` is the parser of every command line that takes them (the CLI, the experiment scripts).

Beyond each field's own range, :meth:`TrainConfig.validate` refuses a weight decay at which the run cannot train:
lr·wd at or beyond :func:`lr_wd_limit`, where SGD with momentum blows the weights up from the first step, and for an
exponential schedule an lr·wd at which its growth rate α does not exist (:func:`explr.schedules.alpha`).

The five schedules that :data:`SCHEDULES` names are built by :mod:`explr.cifar10.played`.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import torch

from ..lr_scheduler import max_rescale_above
from ..params import MAX_SEED, Choice, Flag, Float, Int, Numbers, Text
from ..schedules import alpha, check_milestones
from ..schedules import CORRECTIONS

__all__ = [
    "SCHEDULES",
    "EXPONENTIAL",
    "PRECISIONS",
    "COMPILE_MODES",
    "LR_MIN",
    "LR_MAX",
    "RESCALE_ABOVE_MAX",
    "MAX_EPOCHS",
    "MAX_DEPTH",
    "MAX_THREADS",
    "MAX_DEVICE_INDEX",
    "BN_EPS_MAX",
    "FOLDER",
    "MAX_JOBS",
    "JOBS",
    "TRAJECTORY_KEYS",
    "RESOLVED_KEYS",
    "TrainConfig",
    "CommandLineParser",
    "add_config_arguments",
    "argument_type",
    "configs_from_args",
    "config_to_argv",
    "default_decay_epochs",
    "lr_wd_limit",
    "milestones_at",
]

#: the values of ``--schedule`` (:attr:`TrainConfig.schedule`), built by :mod:`explr.cifar10.played`.
SCHEDULES = ("step", "texp", "texp--", "cosine", "cosine-texp")
#: the schedules played as an exponential equivalent without weight decay: they need a scale-invariant network
#: and are played with ``rescale_above``.
EXPONENTIAL = ("texp", "texp--", "cosine-texp")
#: the values of ``--precision``: fp32; bf16 (torch.autocast bfloat16, fp32 weights); fp64; auto (bf16 on CUDA,
#: fp32 elsewhere).
PRECISIONS = ("auto", "fp32", "bf16", "fp64")
#: the values of ``--compile``: ``torch.compile``'s modes, or none (no compilation).
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune")
DEVICES = ("auto", "cpu", "cuda", "mps")

#: float32's smallest normal and largest value: every lr the optimizer plays stays in between (the weights
#: are float32 under fp32 and bf16; below LR_MIN an lr has lost precision and underflows against them).
LR_MIN, LR_MAX = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)
#: the largest ``rescale_above``: float32's largest value / 4, the bound that
#: :class:`~explr.lr_scheduler.PerStepLR` sets for float32 weights (:func:`~explr.lr_scheduler.max_rescale_above`).
RESCALE_ABOVE_MAX = max_rescale_above(torch.float32)
#: the most epochs a run may ask for (``--epochs``).
MAX_EPOCHS = 100_000
#: the deepest PreResNet: 6n + 2 with n = 200, He et al.'s ResNet-1202 (2016, Sec. 4.2), the deepest CIFAR ResNet
#: trained in the literature (19.4M parameters).  Building and training cost grow linearly with the depth, and far
#: deeper ones run out of memory only late or never finish building.
MAX_DEPTH = 1202
#: the most CPU threads a run may ask for: more than the hardware threads of any one machine today (two 192-core
#: CPUs with SMT have 768), and ``torch.set_num_threads`` takes a C int.  Beyond the CPUs this process may use
#: (:func:`explr.cifar10.hardware.available_cpus`) threads only wait for one another.
MAX_THREADS = 1024
#: the largest N of ``cuda:N``: torch keeps a device index in 8 bits (``torch.device("cuda:128")`` is cuda:-128).
MAX_DEVICE_INDEX = 127
#: the largest BatchNorm epsilon.  eps is added to each channel's batch variance, which BN divides out: it is a
#: small stabiliser (torch's default 1e-5).  At 0.1 it already damps a channel of unit variance by 5 % (1/sqrt(1.1))
#: and breaks the scale invariance of the network in proportion; large values make BN's outputs constant (1e39
#: once trained a network whose loss stayed at ln 10).
BN_EPS_MAX = 0.1
#: the rule of a folder setting (``--data-root``, the CLI's ``--out``).
FOLDER = Text("a folder")
#: the most runs one sweep trains at once on one machine (``--jobs``): each is a process with at least one thread, so
#: as many as :data:`MAX_THREADS`.  The pool is smaller still: :func:`explr.cifar10.hardware.workers`.
MAX_JOBS = MAX_THREADS
#: the rule of ``--jobs`` (the CLI's and the experiment scripts').
JOBS = Int(1, maximum=MAX_JOBS)
#: where step decay multiplies the lr by default: at 50 % and 75 % of training (He et al. 2016's CIFAR recipe).
DEFAULT_DECAY_AT = (Fraction(1, 2), Fraction(3, 4))


# ----------------------------------------------------------------------------- rules of a value (explr.params)
@dataclass(frozen=True)
class Device:
    """A device name the engine trains on; whether it is available here is
    :func:`explr.cifar10.hardware.resolve_device`'s check."""

    index = Int(0, maximum=MAX_DEVICE_INDEX)

    def rule(self) -> str:
        return f"one of auto, cpu, cuda, cuda:N with N in [0, {self.index.maximum}], mps"

    def ok(self, v) -> bool:
        if not isinstance(v, str):
            return False
        return v in DEVICES or (re.fullmatch(r"cuda:[0-9]+", v) is not None and self.index.ok(int(v[5:])))

    def parse(self, text: str):
        return text


def lr_wd_limit(momentum: float) -> float:
    """2(1 + γ): the product λη of weight decay and learning rate from which on SGD with momentum γ cannot keep the
    weights bounded: beyond it the weight norm grows geometrically from the first step.

    torch's SGD with weight decay is v ← γv + ∇L(θ) + λθ, θ ← θ − ηv, that is

        θ_{t+1} = (1 + γ − λη) θ_t − γ θ_{t−1} − η ∇L(θ_t).

    Its weight-decay part is heavy-ball on the quadratic λ‖θ‖²/2, the recursion x_{t+1} = (1 + γ − λη) x_t − γ x_{t−1},
    whose characteristic polynomial x² − (1 + γ − λη) x + γ is the one of :func:`explr.schedules.alpha` (Li & Arora
    2020, Thm 2.5).  Both roots lie inside the unit circle iff 0 < λη < 2(1 + γ) (Jury's criterion: the polynomial's
    value at x = −1, 2(1 + γ) − λη, must be positive; the stability region of Polyak's heavy-ball method, Polyak 1964).
    Beyond it a real root below −1 makes the norm grow geometrically with alternating sign.  The gradient of a
    scale-invariant loss is orthogonal to θ and shrinks as 1/‖θ‖ (Lemma 1.3), so it does not stop the growth: for
    γ = 0 exactly, ‖θ_{t+1}‖² = (1 − λη)²‖θ_t‖² + η²‖∇L(θ_t)‖² ≥ (1 − λη)²‖θ_t‖² (as in
    :func:`explr.invariance.equilibrium_step_angle`), so from λη = 2 on the norm never shrinks; for γ > 0 the
    growth at the linear recursion's rate is what torch's SGD shows.  The schedules of :data:`EXPONENTIAL` train
    without weight decay; they need the stricter λη ≤ (1 − √γ)², for their growth rate α to exist."""
    return 2.0 * (1.0 + momentum)


def setting(default, help: str, rule, group: str, *, trajectory=False, optional=False, sweep=False):
    """A field of :class:`TrainConfig` with everything the parser, the validation and resume need.

    ``trajectory``: True if a resumed run must have the same value; ``"resolved"`` if it must have the
    same *resolved* value (``auto`` resolved on this machine).  ``optional``: ``None`` is allowed
    (meaning "automatic").  ``sweep``: the CLI takes several values and trains every combination.
    """
    return field(default=default, metadata={"help": help, "rule": rule, "group": group, "trajectory": trajectory,
                                            "optional": optional, "sweep": sweep})


# ----------------------------------------------------------------------------- the configuration
@dataclass
class TrainConfig:
    """Everything that defines a run; the CLI flag of a field is ``--`` + its name with ``-``.

    ``decay_epochs=None`` means the step-decay milestones at 50 % and 75 % of ``epochs`` (100 and
    150 of 200, the usual CIFAR recipe).  ``precision="auto"``: bf16 autocast on CUDA, float32
    elsewhere.  ``device="auto"``: CUDA if available, else CPU.  ``threads=None``: from the CPUs this
    process may use (:func:`explr.cifar10.hardware.default_threads`).
    """

    schedule: str = setting(
        "step", "step = step decay + WD; texp = its exact exponential equivalent, no WD (with momentum corrections); "
        "texp-- = TEXP without the LR drops; cosine = per-epoch cosine + WD; cosine-texp = TEXP of that cosine",
        Choice(SCHEDULES), "runs", trajectory=True, sweep=True)
    seed: int = setting(0, "seeds (model init, data order, augmentation); runs = schedules x seeds",
                        Int(0, note=" (what torch.manual_seed takes)", maximum=MAX_SEED), "runs", trajectory=True,
                        sweep=True)
    epochs: int = setting(200, "epochs per run", Int(1, maximum=MAX_EPOCHS), "runs", trajectory=True)
    lr: float = setting(0.1, "initial learning rate eta_0; every lr the schedule plays must stay in float32's normal "
                        "range", Float(LR_MIN, LR_MAX, lo_open=False, hi_open=False, note=" (float32's normal range)"),
                        "optimisation", trajectory=True)
    wd: float = setting(5e-4, "weight decay lambda (the exponential schedules build their growth rate from it and "
                        "train without it); at most float32's largest value, as the optimizer holds it in float32",
                        Float(0, LR_MAX, lo_open=False, hi_open=False, note=" (float32's range)"), "optimisation",
                        trajectory=True)
    momentum: float = setting(0.9, "momentum gamma in [0, 1)", Float(0, 1, lo_open=False), "optimisation",
                              trajectory=True)
    batch_size: int = setting(128, "training batch size (each epoch uses n_train // batch-size full batches)",
                              Int(1), "optimisation", trajectory=True)
    decay_epochs: tuple | None = setting(
        None, "epochs where step decay multiplies the lr by --decay-factor (default: 50%% and 75%% of --epochs, "
        "i.e. 100 150 for 200); give none for a constant lr", Numbers(Int(1), min_len=0), "optimisation",
        trajectory=True, optional=True)
    decay_factor: float = setting(0.1, "step-decay factor in (0, 1]", Float(0, 1, hi_open=False), "optimisation",
                                  trajectory=True)
    corrections: str = setting("all", "momentum corrections of TEXP at phase starts: all (exact), start, none",
                               Choice(CORRECTIONS), "optimisation", trajectory=True)
    rescale_above: float = setting(
        100.0, "exponential schedules: when the optimizer's lr would exceed this, rescale (theta, v, lr) -> "
        "(c theta, v/c, c^2 lr), the same network, so float32/bf16 never overflow; must exceed the schedule's "
        "first lr", Float(0, RESCALE_ABOVE_MAX, hi_open=False, note=" (at most float32's largest value / 4)"),
        "optimisation", trajectory=True)
    depth: int = setting(32, "PreResNet depth 6n+2 (20, 32, 56, ...); at most 1202, He et al.'s deepest CIFAR ResNet",
                         Int(8, (6, 2), note=" (20, 32, 56, ..., 1202)", maximum=MAX_DEPTH), "model", trajectory=True)
    invariant: bool = setting(True, "scale-invariant mode of the paper: BN scale/bias and the last linear layer "
                              "fixed (--no-invariant: ordinary PreResNet, step/cosine only)", Flag(), "model",
                              trajectory=True)
    bn_eps: float = setting(1e-5, "BatchNorm epsilon, a small stabiliser added to each channel's batch variance: at "
                            "most 0.1, which already damps a unit-variance channel by 5%% and breaks the scale "
                            "invariance in proportion (larger values make the outputs constant)",
                            Float(0, BN_EPS_MAX, hi_open=False), "model", trajectory=True)
    augment: bool = setting(True, "random crop (pad 4) and horizontal flip of training images", Flag(), "data",
                            trajectory=True)
    data: str = setting("auto", "'auto' (download CIFAR-10 into --data-root, md5-checked), 'synthetic' (small "
                        "generated stand-in), a .npz with x_train,y_train,x_test,y_test (uint8, HWC), a folder with "
                        "CIFAR-10's python batches, an image-folder tree train/<class>/*.png|jpg, test/... or a "
                        ".tar/.tar.gz/.tgz of one (its data sha256 must match on resume)",
                        Text("a data source"), "data")
    data_root: str = setting("data", "download/extract folder for --data auto; decoded image folders are cached "
                             "in DATA_ROOT/cache", FOLDER, "data")
    device: str = setting("auto", "auto (cuda if available, else cpu), cpu, cuda, cuda:N or mps", Device(),
                          "hardware", trajectory="resolved")
    precision: str = setting("auto", "fp32; bf16 = torch.autocast bfloat16 (fp32 weights); fp64; auto = bf16 on "
                             "CUDA, fp32 elsewhere", Choice(PRECISIONS), "hardware", trajectory="resolved")
    channels_last: bool = setting(True, "channels_last memory format for images and convolutions", Flag(),
                                  "hardware")
    compile: str = setting("none", "torch.compile mode for the model", Choice(COMPILE_MODES), "hardware")
    threads: int | None = setting(
        None, "torch CPU threads (default: the CPUs this process may use, by affinity and cgroup quota, minus one "
        "left for everything else; 1 per run on a GPU); results on a CPU depend on it; at most 1024, more than "
        "any one machine has", Int(1, maximum=MAX_THREADS), "hardware",
        trajectory="resolved", optional=True)
    eval_batch_size: int = setting(1000, "test-set batch size", Int(1), "hardware")
    log_every: int = setting(25, "steps between host syncs (progress bar, divergence check)", Int(1), "hardware")

    def validate(self) -> "TrainConfig":
        """Raise ``ValueError`` naming the field and its CLI flag, with the valid range, for any invalid value."""
        for f in dataclasses.fields(self):
            value, meta = getattr(self, f.name), f.metadata
            if value is None and meta["optional"]:
                continue
            if not meta["rule"].ok(value):
                raise ValueError(f"{f.name} ({flag(f.name)}) must be {meta['rule'].rule()}; got {value!r}")
        if self.decay_epochs is not None:
            try:
                check_milestones(self.decay_epochs, self.epochs)
            except ValueError as err:
                raise ValueError(f"decay_epochs ({flag('decay_epochs')}): {err}") from None
        if self.schedule in EXPONENTIAL and not self.invariant:
            raise ValueError(
                f"schedule (--schedule) {self.schedule!r} is an exponential schedule, exact only for a scale-invariant "
                "network and rescaled during training; it needs invariant=True (drop --no-invariant)")
        self._check_lr_wd()
        return self

    def _check_lr_wd(self) -> None:
        """The first lr is the largest the schedules play (step decay and the cosine only lower it): at it, the growth
        rate α of an exponential schedule must exist (:func:`explr.schedules.alpha`), and SGD with weight decay must
        not blow the weights up (:func:`lr_wd_limit`)."""
        if self.schedule in EXPONENTIAL:
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
    """The epochs round(f · ``epochs``) for each fraction f (exact: ``fractions.Fraction``), once each, those in
    [1, epochs - 1] (a decay at epoch 0 or at the end would change nothing)."""
    return sorted({m for m in (round(Fraction(f) * epochs) for f in fractions) if 1 <= m <= epochs - 1})


def default_decay_epochs(epochs: int) -> list[int]:
    """Step-decay milestones at :data:`DEFAULT_DECAY_AT`, 50 % and 75 % of training ([100, 150] for 200 epochs)."""
    return milestones_at(epochs, DEFAULT_DECAY_AT)


# ----------------------------------------------------------------------------- the command line, from the fields
class CommandLineParser(argparse.ArgumentParser):
    """The parser of the engine's command lines (the CLI, the experiment scripts): an error is one line on stderr and
    exit code 2 (argparse would print the whole usage first), and a value that looks like a negative number is the
    value of its flag: ``--wd -1e-4`` reads as ``--wd=-1e-4`` (argparse alone reads only ``-1`` and ``-.5`` so)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(_join_negative_values(self, args), namespace)


def _join_negative_values(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """``--flag -1e-4`` → ``--flag=-1e-4`` for every flag that takes one value, when the next argument
    parses as a number (argparse takes only ``-1`` and ``-.5`` for values, and ``-1e-4`` for an option)."""
    takes_one = {s for a in parser._actions if a.nargs is None and a.option_strings for s in a.option_strings}
    joined, i = [], 0
    while i < len(args):
        if args[i] in takes_one and i + 1 < len(args) and _negative_number(args[i + 1]):
            joined.append(f"{args[i]}={args[i + 1]}")
            i += 2
        else:
            joined.append(args[i])
            i += 1
    return joined


def _negative_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.startswith("-")


def argument_type(name: str, rule):
    """An argparse ``type`` that parses ``text`` by ``rule`` and refuses, in one line, a value it does not pass."""

    def parse(text):
        try:
            value = rule.parse(text)
        except ValueError:
            value = text
        if not rule.ok(value):
            raise argparse.ArgumentTypeError(f"must be {rule.rule()}; got {text!r}")
        return value

    parse.__name__ = name  # argparse names it in "invalid <name> value"
    return parse


def add_config_arguments(parser: argparse.ArgumentParser, names=None, sweep=None) -> None:
    """Add a ``--flag`` for every field of :class:`TrainConfig` (or only ``names``), grouped as declared.

    Fields whose metadata says ``sweep`` (or those named in ``sweep``) take several values.
    """
    groups = {}
    for f in dataclasses.fields(TrainConfig):
        if names is not None and f.name not in names:
            continue
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
    import itertools

    shared = {n: getattr(args, n) for n in _FIELDS if n not in sweep and hasattr(args, n)}
    if shared.get("decay_epochs") is not None:
        shared["decay_epochs"] = tuple(shared["decay_epochs"])
    values = [list(dict.fromkeys(getattr(args, n))) for n in sweep]
    return [TrainConfig(**shared, **dict(zip(sweep, combo))) for combo in itertools.product(*values)]


def config_to_argv(config: TrainConfig, *, defaults: bool = False) -> list[str]:
    """The command-line flags (:func:`add_config_arguments`) that give ``config``: one per field that differs from
    its default (every field with ``defaults=True``), ``--flag``/``--no-flag`` for a switch and the values of a
    list after its flag; a ``None`` (automatic) is left out.  ``configs_from_args`` of them gives ``config`` back."""
    argv = []
    for name, f in _FIELDS.items():
        value = getattr(config, name)
        if value is None or (not defaults and value == f.default):
            continue
        if isinstance(f.metadata["rule"], Flag):
            argv.append(flag(name) if value else "--no-" + name.replace("_", "-"))
        elif isinstance(value, (list, tuple)):
            argv += [flag(name), *map(str, value)]
        else:
            argv += [flag(name), str(value)]
    return argv
