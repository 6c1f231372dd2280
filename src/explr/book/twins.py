"""The exact-twin test on a real network: Step Decay + WD ≡ TEXP and Cosine + WD ≡ Cosine-TEXP, logit for logit.

:func:`run_unit` trains a network with a schedule and its twins of :func:`explr.schedules.texp` (Li & Arora 2020,
Thm 2.12) on the same batches and compares the logits on a held-out batch, D_k = max |f̃_k − f_k| / max |f_k|.  In
float64 the exact twin stays within B_k = e_f + (k + 1)(4u + e_g) G_k (:func:`roundoff_estimate`); in float32 and
bf16 D_k is reported, never asserted.  The derivations: docs/maths-notes.md, "The exact-twin test".
"""
from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..invariance import trainable_parameters
from ..params import Float, Int, checked
from ..schedules import MOMENTUM, PlainSchedule, alpha, cosine, step_decay, texp
from ..sgd import output_deviation, prediction_agreement, train_sgd
from .digits import batch_schedule

__all__ = ["PAIRS", "PRECISIONS", "RUNS", "BN_EPS", "CONTROL_DELTA", "CHAOS_LEVEL", "TwinSettings", "pair_schedules",
           "roundoff_estimate", "departure_estimate", "near_estimate", "unit_roundoff", "run_unit", "summarise"]

#: the original schedule of each pair; its twins are :func:`explr.schedules.texp` of it.
PAIRS = {"step": "Step Decay + WD vs TEXP", "cosine": "Cosine (per epoch) + WD vs Cosine-TEXP (the hybrid)"}
#: the arithmetic of a unit: float64 weights and data; float32; float32 weights under bf16 autocast (CPU).
PRECISIONS = ("float64", "float32", "bf16")
#: the runs beside the original: the twins (``corrections="all"``, ``"none"``), the control, the near twin
RUNS = ("exact", "uncorrected", "control", "near")
#: BN's ε per precision: ~0 (torch refuses 0; float32 would round 1e-300 to 0)
BN_EPS = {"float64": 1e-300, "float32": 1e-30, "bf16": 1e-30}
#: the control run's relative perturbation of θ₀: 1e4 ulps, far above e_f, too small to flip a ReLU
CONTROL_DELTA = 1e-12
#: the rescalings c (not powers of two) whose largest effect is one evaluation's round-off
ROUNDOFF_SCALES = (3.0, 5.0, 7.0)
#: a departure D_k above this is O(1) in the logits' units: the two runs are different networks (float32/bf16).
CHAOS_LEVEL = 1e-2
U64 = float(np.finfo(np.float64).eps)


@dataclass(frozen=True)
class TwinSettings:
    """One experiment's schedule and sampling: Step Decay (×0.1 at two or more ``milestones``) or the per-epoch
    cosine over ``epochs`` × ``steps_per_epoch`` steps; ``batch_size`` images a step from ``seed``; logits every
    ``record_every`` steps (a divisor of ``steps_per_epoch``).  ``rescale_at`` > 1: every twin runs through
    PerStepLR's rescaling above ``rescale_at`` × its lr[0]; ``near`` = ε: also the near twin, built for (1 + ε)λ."""

    epochs: int
    steps_per_epoch: int
    milestones: tuple
    lr: float = 0.1
    wd: float = 5e-3
    momentum: float = 0.9
    batch_size: int = 32
    seed: int = 0
    record_every: int = 1
    rescale_at: float | None = None
    near: float | None = None

    def __post_init__(self):
        for name in ("epochs", "steps_per_epoch", "batch_size", "record_every"):
            checked(name, getattr(self, name), Int(1))
        if self.steps_per_epoch % self.record_every:
            raise ValueError(f"record_every must divide steps_per_epoch = {self.steps_per_epoch}; "
                             f"got {self.record_every!r}")
        object.__setattr__(self, "milestones", tuple(self.milestones))
        if len(self.milestones) < 2:
            raise ValueError(f"milestones must hold at least two decay epochs in [1, epochs-1] = [1, {self.epochs - 1}]"
                             f" (the twin test crosses two decays); got {list(self.milestones)!r}")
        step_decay(self.lr, self.epochs, self.steps_per_epoch, self.milestones)  # checks lr and the milestones
        checked("momentum", self.momentum, MOMENTUM)
        checked("wd", self.wd, Float(0, note=" (without weight decay there is no twin to test)"))
        alpha(self.lr, self.wd, self.momentum)  # refuses an lr·wd without an exponential twin
        if self.rescale_at is not None:
            checked("rescale_at", self.rescale_at, Float(1, note=" (a multiple of the twin's lr[0])"))
        if self.near is not None:
            checked("near", self.near, Float(0, note=" (the near twin is built for (1 + near)·wd)"))
            alpha(self.lr, (1 + self.near) * self.wd, self.momentum)

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def recorded(self) -> np.ndarray:
        """The recorded steps k = 0, r, 2r, ..., steps (r = ``record_every``): every epoch's end among them."""
        return np.arange(0, self.steps + 1, self.record_every)


def pair_schedules(pair: str, settings: TwinSettings, twin_wd: float | None = None) -> dict:
    """The pair's schedule with WD ("original") and its TEXP twins ("exact", "uncorrected"; "near" with
    ``settings.near``), the twins built for ``twin_wd`` if given (a deliberately wrong twin)."""
    if pair not in PAIRS:
        raise ValueError(f"pair must be one of {tuple(PAIRS)}; got {pair!r}")
    s = settings
    if pair == "step":
        base = step_decay(s.lr, s.epochs, s.steps_per_epoch, s.milestones)
    else:
        base = cosine(s.lr, s.epochs, s.steps_per_epoch, per="epoch")
    wd = s.wd if twin_wd is None else twin_wd
    out = {"original": PlainSchedule(base, np.full(len(base), float(s.wd)), name=pair),
           "exact": texp(base, wd, s.momentum, corrections="all"),
           "uncorrected": texp(base, wd, s.momentum, corrections="none")}
    if s.near is not None:
        out["near"] = texp(base, (1 + s.near) * s.wd, s.momentum, corrections="all")
    return out


class _Autocast(nn.Module):
    """``net`` run under CPU bf16 autocast, its output returned in float32 (numpy has no bf16)."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.net(x).float()


def _network(build_model, precision: str, reference: torch.Tensor | None):
    """The builder's network for ``precision`` (dtype, BN ε, batch statistics in train and eval mode); refuses
    initial weights other than ``reference`` (the first build's)."""
    net = build_model(BN_EPS[precision])
    if not isinstance(net, nn.Module):
        raise ValueError(f"build_model must return an nn.Module; got {type(net).__name__}")
    start = torch.cat([p.detach().double().reshape(-1) for _, p in trainable_parameters(net)])
    if reference is not None and not torch.equal(start, reference):
        raise ValueError("build_model must return the same initial weights at every call (seed it)")
    for m in net.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.track_running_stats = False
            m.running_mean = m.running_var = m.num_batches_tracked = None
    net = net.to(torch.float64 if precision == "float64" else torch.float32)
    return (_Autocast(net) if precision == "bf16" else net), start


def roundoff(model: nn.Module, inputs, targets, probe) -> dict:
    """One evaluation's rounding, 0 in exact arithmetic: e_f = max|f(cθ) − f(θ)| / max|f(θ)| on ``probe``, e_g =
    max|c∇L(cθ) − ∇L(θ)| / max|∇L(θ)| on the batch, the largest over :data:`ROUNDOFF_SCALES`; and the control's δ."""
    def evaluate(c):
        net = copy.deepcopy(model)
        params = [p for _, p in trainable_parameters(net)]
        with torch.no_grad():
            for p in params:
                p.mul_(c)
            logits = net(probe)
        loss = F.cross_entropy(net(inputs), targets)
        return logits, c * torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])

    def rel(a, b):
        return float((b - a).abs().max() / a.abs().max())

    f, g = evaluate(1.0)
    scaled = [evaluate(c) for c in ROUNDOFF_SCALES]
    return {"forward": max(rel(f, fc) for fc, _ in scaled), "gradient": max(rel(g, gc) for _, gc in scaled),
            "delta": CONTROL_DELTA}


def roundoff_estimate(steps, control_deviation, forward: float, gradient: float, delta: float = CONTROL_DELTA):
    """B_k = e_f + (k + 1)(4u + e_g) G_k, G_k = max(1, max_{i≤k} D^ctl_i / δ_c): the D_k that round-off alone gives
    two float64 runs of the same iterates (an estimate, not a bound)."""
    steps = np.asarray(steps, dtype=np.float64)
    gain = np.maximum(1.0, np.maximum.accumulate(np.asarray(control_deviation, dtype=np.float64) / delta))
    return forward + (steps + 1) * (4 * U64 + gradient) * gain


def departure_estimate(steps, function_change, nudge: float, lr: float, wd: float, momentum: float) -> np.ndarray:
    """D_k ≈ 2 s_k F_k, s_k = δ(1 − r^k)/(1 − r), r = γα*⁻², δ = |``nudge``|: the uncorrected twin's departure, F_k
    the ``function_change`` (α* of phase 0's ``lr``, ``wd``, ``momentum``)."""
    r = momentum / alpha(lr, wd, momentum) ** 2
    shortfall = abs(nudge) * (1 - r ** np.asarray(steps, dtype=np.float64)) / (1 - r)
    return 2 * shortfall * np.asarray(function_change, dtype=np.float64)


def near_estimate(steps, function_change, eps: float, lr: float, wd: float, momentum: float) -> np.ndarray:
    """D_k ≈ min(2 s_k, ε/2) F_k, s_k = k ln(α*(λ)/α*((1 + ε)λ)): the near twin's departure, built for (1 +
    ``eps``)λ (α* of phase 0's ``lr``, ``wd``, ``momentum``)."""
    per_step = math.log(alpha(lr, wd, momentum) / alpha(lr, (1 + eps) * wd, momentum))
    error = np.minimum(2 * per_step * np.asarray(steps, dtype=np.float64), eps / 2)
    return error * np.asarray(function_change, dtype=np.float64)


def unit_roundoff(unit: dict) -> np.ndarray:
    """B_k of a float64 unit of :func:`run_unit` (needs its control run): :func:`roundoff_estimate`."""
    return roundoff_estimate(unit["steps"], unit["deviation"]["control"], **unit["roundoff"])


def run_unit(build_model: Callable[[float], nn.Module], images: torch.Tensor, labels: torch.Tensor,
             probe: torch.Tensor, settings: TwinSettings, pair: str, precision: str, *,
             runs: tuple | None = None, twin_wd: float | None = None, log: Callable[[str], None] | None = None) -> dict:
    """Train one pair in one precision and compare the twins' logits with the original's.

    ``build_model(eps)``: a scale-invariant network with BN ε = ``eps``, the same initial weights at every call
    (e.g. ``lambda eps: PreResNet(32, eps=eps, seed=0)``); ``images`` (N, C, H, W), ``labels`` (N,), ``probe`` the
    held-out batch; ``runs`` of :data:`RUNS` (default: all in float64, the exact twin otherwise).  Returns a JSON-able
    dict: ``steps``, ``deviation`` and ``agreement`` per run, ``norm_error``, ``function_change`` F_k, ``nudge``
    (η̃₀c₀), ``loss``, ``rescalings``, ``rescale_steps``, ``seconds``; in float64 also ``roundoff``.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}; got {precision!r}")
    default = tuple(r for r in RUNS if r != "near" or settings.near is not None)
    runs = (default if precision == "float64" else ("exact",)) if runs is None else tuple(runs)
    if not runs or any(r not in RUNS for r in runs) or ("control" in runs and precision != "float64"):
        raise ValueError(f"runs must be a non-empty selection of {RUNS} (the control in float64 only); got {runs!r}")
    if "near" in runs and settings.near is None:
        raise ValueError("runs holds 'near' but settings.near (its ε) is None")
    schedules = pair_schedules(pair, settings, twin_wd)
    dtype = torch.float64 if precision == "float64" else torch.float32
    for name, x in (("images", images), ("probe", probe)):
        if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.ndim == 4):
            raise ValueError(f"{name} must be a floating-point tensor (N, C, H, W); got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
    if not isinstance(labels, torch.Tensor) or labels.shape != (len(images),):
        raise ValueError(f"labels must be a tensor of shape ({len(images)},), one per image; got "
                         f"{getattr(labels, 'shape', type(labels).__name__)}")
    images, labels, probe = images.to(dtype), labels.long(), probe.to(dtype)
    index = batch_schedule(len(labels), settings.batch_size, settings.steps, settings.seed)
    batches = [(images[i], labels[i]) for i in index]
    recorded = settings.recorded()
    started, trained = time.perf_counter(), {}
    _, reference = _network(build_model, precision, None)
    names = ("original", *runs)
    for name in names:
        model, _ = _network(build_model, precision, reference)
        if name == "control":
            generator = torch.Generator().manual_seed(settings.seed + 1)
            with torch.no_grad():
                for _, p in trainable_parameters(model):
                    p.mul_(1 + CONTROL_DELTA * torch.randn(p.shape, generator=generator, dtype=p.dtype))
        if name == "original" and precision == "float64":
            errors = roundoff(model, *batches[0], probe)
        played = schedules["original" if name == "control" else name]
        twin = name not in ("original", "control")
        above = settings.rescale_at * math.exp(played.log_lr[0]) if twin and settings.rescale_at else None
        trained[name] = train_sgd(model, F.cross_entropy, batches, played, momentum=settings.momentum,
                                  probe=probe, record_every=settings.record_every, rescale_above=above)
        if log is not None:
            log(f"{pair}/{precision} {name}: {settings.steps} steps done, {time.perf_counter() - started:.0f} s")
    original = trained["original"]
    f0 = np.abs(original.outputs[0]).max()
    out = {
        "pair": pair, "precision": precision, "steps": recorded.tolist(),
        "deviation": {n: output_deviation(original, trained[n]).tolist() for n in runs},
        "agreement": {n: prediction_agreement(original, trained[n]).tolist() for n in runs},
        "function_change": (np.abs(original.outputs - original.outputs[0]).max(axis=(1, 2)) / f0).tolist(),
        "nudge": float(schedules["exact"].lr_wd[0]),
        "loss": original.losses.tolist(),
        "rescalings": {n: trained[n].rescale_count for n in names},
        "rescale_steps": {n: _rescale_steps(trained[n], schedules["original" if n == "control" else n])
                          for n in names},
    }
    if "exact" in runs:
        scale = schedules["exact"].scale[recorded]
        exact = trained["exact"]
        norms = exact.norms * np.exp2(-exact.log2_rescales / 2)  # the schedule's units: log2 R is even, exact
        out["norm_error"] = float(np.abs(norms / (scale * original.norms) - 1).max())
    if precision == "float64":
        out["roundoff"] = errors
    out["seconds"] = time.perf_counter() - started
    return out


def _rescale_steps(trajectory, schedule) -> list:
    """The steps k after whose update PerStepLR rescaled: where log2 R = log2(lr used) − log2(lr of the schedule)
    (a multiple of 2) changes between step k and k + 1."""
    log2_r = np.rint(np.log2(trajectory.lrs) - np.asarray(schedule.log_lr) / math.log(2))
    return np.flatnonzero(np.diff(log2_r)).tolist()


def summarise(metrics: dict) -> dict:
    """What chapter 6 shows and asserts, per pair, from ``metrics["units"]`` ({"pair/precision": :func:`run_unit`}).

    float64: the exact twin's max D_k, max B_k and max D_k/B_k, ``agree``, ``norm_error``, ``rescalings``; the
    uncorrected twin's max D_k, min D_k/B_k from epoch 1 and ``estimate_ratio`` (over :func:`departure_estimate`);
    the near twin's final D and D/B, ``near_departs_at`` and ``near_estimate_ratio`` (over :func:`near_estimate`).
    float32, bf16: ``chaos_step`` (D_k first above :data:`CHAOS_LEVEL`) and the ``final`` D.
    """
    out = {}
    settings = metrics["settings"]
    for key, unit in metrics["units"].items():
        pair, precision = key.split("/")
        dev = {n: np.asarray(v) for n, v in unit["deviation"].items()}
        row = out.setdefault(pair, {})
        if precision == "float64":
            roundoff, steps = unit_roundoff(unit), np.asarray(unit["steps"])
            phase0 = (settings["lr"], settings["wd"], settings["momentum"])
            row.update(exact=float(dev["exact"].max()), exact_over_roundoff=float((dev["exact"] / roundoff).max()),
                       roundoff=float(roundoff.max()), agree=bool(min(unit["agreement"]["exact"]) == 1.0),
                       norm_error=unit["norm_error"], rescalings=unit.get("rescalings", {}).get("exact", 0))
            if "uncorrected" in dev:
                later = steps >= settings["steps_per_epoch"]
                row.update(uncorrected=float(dev["uncorrected"].max()),
                           uncorrected_over_roundoff=float((dev["uncorrected"][later] / roundoff[later]).min()),
                           estimate_ratio=float(dev["uncorrected"][-1] / departure_estimate(
                               steps, unit["function_change"], unit["nudge"], *phase0)[-1]))
            if "near" in dev:
                ratio = dev["near"] / roundoff
                below = np.flatnonzero(ratio <= 1)
                departs = steps[below[-1] + 1] if below.size else steps[0]
                row.update(near=float(dev["near"][-1]), near_over_roundoff=float(ratio[-1]),
                           near_departs_at=int(departs) if ratio[-1] > 1 else None,
                           near_estimate_ratio=float(dev["near"][-1] / near_estimate(
                               steps, unit["function_change"], settings["near"], *phase0)[-1]))
        else:
            above = np.flatnonzero(dev["exact"] > CHAOS_LEVEL)
            row[precision] = {"chaos_step": int(unit["steps"][above[0]]) if above.size else None,
                              "final": float(dev["exact"][-1])}
    return out
