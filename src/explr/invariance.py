"""Scale invariance: make a network's loss scale invariant, check how far it is, and its norm equilibrium.

A loss is scale invariant in θ if L(cθ) = L(θ) for every c > 0 (a layer followed by BN/GN/LN, in its weight); then
⟨∇L(θ), θ⟩ = 0, ∇L(cθ) = ∇L(θ)/c and ∇²L(θ) θ = −∇L(θ) (Li & Arora, Lemma 1.3).  What breaks it in a real network,
the step angles and the norm-equilibrium model: docs/maths-notes.md, "Scale invariance".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .params import Float, checked
from .schedules import MOMENTUM, per_step_array

__all__ = ["NORM_LAYERS", "make_scale_invariant", "InvarianceCheck", "check_scale_invariance", "trainable_parameters",
           "flat_norm", "effective_lr", "step_angle", "equilibrium_step_angle", "angular_identity_gap",
           "norm_relaxation_time", "effective_lr_relaxation", "chained_effective_lr", "effective_lr_gap"]

#: the normalisation layers (BatchNorm*, InstanceNorm*, GroupNorm, LayerNorm) whose affine parameters
#: :func:`make_scale_invariant` freezes.
NORM_LAYERS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) pairs with ``requires_grad``, in ``named_parameters`` order."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def make_scale_invariant(model: nn.Module, last_layer: nn.Module | None = None) -> list[str]:
    """Freeze what breaks scale invariance, in place, as the paper's experiments do; return the frozen names.

    Frozen: every normalisation layer's affine parameters; the last layer (``last_layer``, default the last
    ``nn.Linear``: a fixed random classifier, Hoffer et al. 2018); the other linear and conv biases, zeroed.  BN's
    ``eps`` and running statistics are not parameters: check the result with :func:`check_scale_invariance`.
    """
    if last_layer is None:
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        if not linears:
            raise ValueError("make_scale_invariant: the model has no nn.Linear; pass last_layer=")
        last_layer = linears[-1]
    names = {id(p): n for n, p in model.named_parameters()}
    frozen = []

    def freeze(p, zero=False):
        if p is not None and p.requires_grad:
            with torch.no_grad():
                if zero:
                    p.zero_()
            p.requires_grad_(False)
            frozen.append(names[id(p)])

    for module in model.modules():
        if isinstance(module, NORM_LAYERS):
            freeze(getattr(module, "weight", None))
            freeze(getattr(module, "bias", None))
        elif module is last_layer:
            freeze(module.weight)
            freeze(module.bias)
        elif isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)):
            freeze(module.bias, zero=True)
    return frozen


@dataclass(frozen=True)
class InvarianceCheck:
    """One row of :func:`check_scale_invariance`."""

    #: the parameter's name (``named_parameters``), or ``"all trainable"`` for all of them jointly.
    group: str
    #: how many numbers it holds.
    numel: int
    #: max over the scales c of ``|L(c·θ_group) − L(θ)| / |L(θ)|``.
    loss_change: float
    #: ``|⟨∇_group L, θ_group⟩| / (‖∇_group L‖ ‖θ_group‖)``, 0 for an invariant group (Lemma 1.3).
    grad_alignment: float
    #: whether ``loss_change`` is at most the check's ``rtol``.
    invariant: bool


def check_scale_invariance(model, loss_fn, inputs, targets, scales=(0.01, 0.1, 10.0, 100.0), rtol=1e-6):
    """Whether L(cθ) = L(θ) for every c in ``scales``, per trainable parameter (each scaled alone) and, in the last
    row, ``"all trainable"`` scaled jointly (what the theorems need), in the model's current mode."""
    params = trainable_parameters(model)
    if not params:
        raise ValueError("check_scale_invariance: the model has no trainable parameters")
    if not scales or any(not c > 0 for c in scales):
        raise ValueError(f"scales must be a non-empty list of numbers > 0; got {scales!r}")

    def loss():
        return loss_fn(model(inputs), targets)

    base = loss()
    grads = torch.autograd.grad(base, [p for _, p in params])
    base = base.item()

    @torch.no_grad()
    def scaled_change(group):
        worst = 0.0
        for c in scales:
            for p in group:
                p.mul_(c)
            worst = max(worst, abs(loss().item() - base) / abs(base))
            for p in group:
                p.div_(c)
        return worst

    rows = []
    for (name, p), g in zip(params, grads):
        change = scaled_change([p])
        align = (g * p).sum().abs() / (g.norm() * p.norm()).clamp_min(1e-300)
        rows.append(InvarianceCheck(name, p.numel(), change, align.item(), change <= rtol))
    change = scaled_change([p for _, p in params])
    dot = sum((g * p).sum() for (_, p), g in zip(params, grads)).abs()
    norms = torch.sqrt(sum(g.square().sum() for g in grads)) * flat_norm([p for _, p in params])
    rows.append(
        InvarianceCheck("all trainable", sum(p.numel() for _, p in params), change,
                        (dot / norms.clamp_min(1e-300)).item(), change <= rtol)
    )
    return rows


def flat_norm(tensors) -> torch.Tensor:
    """‖θ‖ of a list of tensors viewed as one flat vector."""
    return torch.sqrt(sum(t.detach().square().sum() for t in tensors))


def effective_lr(lr: float, params) -> float:
    """lr / ‖θ‖²: the step size on the unit sphere of a scale-invariant group (Lemma 1.3, ∇L(cθ) = ∇L(θ)/c)."""
    return lr / flat_norm(list(params)).item() ** 2


def step_angle(theta, theta_next) -> torch.Tensor:
    """∠(θ, θ') in [0, π] along the last dimension (one angle per row; a 0-d tensor for flat vectors):
    2 atan2(‖û − v̂‖, ‖û + v̂‖) with û = θ/‖θ‖, v̂ = θ'/‖θ'‖, accurate for tiny angles (arccos is not) and near π."""
    theta, theta_next = torch.as_tensor(theta), torch.as_tensor(theta_next)
    u = theta / theta.norm(dim=-1, keepdim=True)
    v = theta_next / theta_next.norm(dim=-1, keepdim=True)
    return 2 * torch.atan2((u - v).norm(dim=-1), (u + v).norm(dim=-1))


def equilibrium_step_angle(lr: float, wd: float, momentum: float = 0.0) -> float:
    """√(2ηλ/(1+γ)): the RMS angle per step at which SGD with learning rate η, weight decay λ > 0 and momentum γ
    settles on a scale-invariant loss, to first order in ηλ (Li & Arora, App. A; Wan et al. 2021 for γ > 0;
    docs/maths-notes.md, "Scale invariance")."""
    lr, wd = float(checked("lr", lr, Float(0))), float(checked("wd", wd, Float(0)))
    checked("momentum", momentum, MOMENTUM)
    return math.sqrt(2 * lr * wd / (1 + momentum))


def angular_identity_gap(step_angles, norms, *, lr: float, wd: float) -> np.ndarray:
    """Per seed, mean_t[−ln cos θ_t] − (−ln(1 − ηλ) + ln(‖θ_end‖/‖θ_start‖)/n): 0 up to rounding for SGD + WD
    without momentum on a scale-invariant loss, where cos θ_t = (1 − ηλ)‖θ_t‖/‖θ_{t+1}‖ (Lemma 1.3).
    ``step_angles`` (n, seeds) and ``norms`` (n + 1, seeds) of one window."""
    step_angles, norms = np.asarray(step_angles), np.asarray(norms)
    n = step_angles.shape[0]
    if norms.shape[0] != n + 1:
        raise ValueError(f"norms must have one more row than step_angles; got {norms.shape[0]} and {n}")
    predicted = -math.log(1 - lr * wd) + np.log(norms[-1] / norms[0]) / n
    return (-np.log(np.cos(step_angles))).mean(axis=0) - predicted


def effective_lr_relaxation(steps, *, lr_ratio: float, wd_ratio: float, lr: float, wd: float,
                            momentum: float = 0.0) -> np.ndarray:
    """η_t^eff / η_0^eff = r_η / √(q + (1 − q) e^{−t/τ_θ}), q = r_η / r_λ: the effective lr η/‖θ‖² after (η, λ)
    changes at step 0 from equilibrium by the factors ``lr_ratio`` r_η and ``wd_ratio`` r_λ to ``lr`` and ``wd``,
    τ_θ = :func:`norm_relaxation_time` of the new values (the mean-field norm model: docs/maths-notes.md,
    "Scale invariance")."""
    for name, value in (("lr_ratio", lr_ratio), ("wd_ratio", wd_ratio), ("lr", lr), ("wd", wd)):
        checked(name, value, Float(0))
    checked("momentum", momentum, MOMENTUM)
    t = np.asarray(steps, dtype=float)
    q = lr_ratio / wd_ratio
    return lr_ratio / np.sqrt(q + (1 - q) * np.exp(-t / norm_relaxation_time(lr, wd, momentum)))


def norm_relaxation_time(lr, wd, momentum: float = 0.0):
    """τ_θ = (1 − γ)/(4ηλ): the steps in which ‖θ‖⁴ relaxes by a factor e towards its equilibrium ∝ η/λ
    (:func:`effective_lr_relaxation`)."""
    return (1 - momentum) / (4 * np.asarray(lr, dtype=float) * np.asarray(wd, dtype=float))


def chained_effective_lr(lr, wd, momentum: float = 0.0) -> np.ndarray:
    """η_k/√u_k after each step of a per-step SGD + WD schedule ``lr``, ``wd`` (scalars broadcast): the model of
    :func:`effective_lr_relaxation` chained phase by phase, u = ‖θ‖⁴ relaxing in each stretch of constant (η, λ)
    as u_k = η/λ + (u_start − η/λ) e^{−(k − k_start)/τ_θ} from the first phase's equilibrium (units where the
    equilibrium effective lr is √(ηλ))."""
    lr, wd = np.broadcast_arrays(np.asarray(lr, dtype=float), np.asarray(wd, dtype=float))
    lr, wd = per_step_array("lr", lr, None, "> 0"), per_step_array("wd", wd, None, "> 0")
    checked("momentum", momentum, MOMENTUM)
    starts = np.concatenate([[0], np.flatnonzero((np.diff(lr) != 0) | (np.diff(wd) != 0)) + 1, [len(lr)]])
    u, out = lr[0] / wd[0], np.empty(len(lr))
    for begin, end in zip(starts[:-1], starts[1:]):
        eta, lam = lr[begin], wd[begin]
        relaxed = eta / lam + (u - eta / lam) * np.exp(-np.arange(1, end - begin + 1)
                                                       / norm_relaxation_time(eta, lam, momentum))
        out[begin:end] = eta / np.sqrt(relaxed)
        u = relaxed[-1]
    return out


def effective_lr_gap(twin, original) -> float:
    """``max_k |twin_k / original_k − 1|``: the largest relative gap of two effective-learning-rate series."""
    twin, original = np.asarray(twin, dtype=float), np.asarray(original, dtype=float)
    if twin.shape != original.shape or twin.size == 0:
        raise ValueError(f"the two series must have the same non-empty shape; got {twin.shape} and {original.shape}")
    return float(np.max(np.abs(twin / original - 1)))
