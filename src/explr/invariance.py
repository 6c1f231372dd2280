"""Scale invariance: make a network's loss scale invariant, and check how far it is.

A loss is scale invariant in a group of parameters θ if L(cθ) = L(θ) for every c > 0.  A linear or
convolutional layer followed by a normalisation layer (BN/GN/LN) is scale invariant in its weight.
Lemma 1.3 of Li & Arora (after Arora et al. 2019) then gives

    ⟨∇L(θ), θ⟩ = 0,      ∇L(cθ) = ∇L(θ) / c,      ∇²L(θ) θ = −∇L(θ).

What breaks it in a real network: trainable affine parameters of the normalisation layers, the
last (un-normalised) layer, biases of layers whose output is not normalised, the ``eps`` inside BN
(L(cθ) ≠ L(θ) once c²·Var is comparable to eps) and BN's running statistics in eval mode.

Angles.  On a scale-invariant loss only the direction θ/‖θ‖ matters, so the natural measure of one
step is the angle ∠(θ_t, θ_{t+1}) between consecutive iterates (:func:`step_angle`).  With weight
decay the norm settles where that angle is about √(2ηλ/(1+γ)) (:func:`equilibrium_step_angle`);
without momentum an exact identity ties the angles to the norms (:func:`angular_identity_gap`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .params import is_real
from .schedules import check_momentum

__all__ = [
    "NORM_LAYERS",
    "make_scale_invariant",
    "InvarianceCheck",
    "check_scale_invariance",
    "trainable_parameters",
    "flat_norm",
    "effective_lr",
    "step_angle",
    "equilibrium_step_angle",
    "angular_identity_gap",
    "norm_relaxation_time",
    "effective_lr_relaxation",
    "chained_effective_lr",
    "effective_lr_gap",
]

#: the normalisation layers (BatchNorm*, InstanceNorm*, GroupNorm, LayerNorm) whose affine parameters
#: :func:`make_scale_invariant` freezes.
NORM_LAYERS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) pairs with ``requires_grad``, in ``named_parameters`` order."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def make_scale_invariant(model: nn.Module, last_layer: nn.Module | None = None) -> list[str]:
    """Freeze what breaks scale invariance, in place, the way the paper's experiments do.

    * affine parameters of every normalisation layer (frozen at their current values; a fixed
      affine map after a normalisation keeps the layers before it scale invariant);
    * the last layer (``last_layer``, default: the last ``nn.Linear`` in ``model.modules()``),
      weight and bias frozen: a fixed random classifier costs little accuracy (Hoffer et al. 2018);
    * the biases of all other linear/convolutional layers, set to zero and frozen: before a
      normalisation a bias is cancelled anyway, elsewhere a nonzero bias would break the
      homogeneity that makes the whole network scale invariant.

    Returns the names of the parameters it froze.  Check the result with
    :func:`check_scale_invariance` -- BN's ``eps`` and running statistics are not parameters.
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
    """Report, per trainable parameter and for all of them jointly, whether L(cθ) = L(θ).

    The model is evaluated in whatever mode it is in (train: batch statistics; eval: running
    statistics).  Each parameter is scaled alone (with the others fixed) for every c in ``scales``,
    then restored; the last row, ``"all trainable"``, scales every trainable parameter at once --
    the invariance the exponential-LR theorems need.  ``invariant`` is loss_change ≤ ``rtol``.
    """
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
    """∠(θ, θ') in [0, π] along the last dimension (one angle per row; a 0-d tensor for flat vectors).

    Computed as 2 atan2(‖û − v̂‖, ‖û + v̂‖) with û = θ/‖θ‖, v̂ = θ'/‖θ'‖: exact for the half-angle of the
    isosceles triangle (û, v̂), and accurate for tiny angles, where arccos(⟨û, v̂⟩) loses all digits
    below ~1e-8, and near π.  For a step of length ‖θ' − θ‖ = η‖∇L‖ orthogonal to θ (Lemma 1.3, no
    weight decay) the angle is atan(η‖∇L‖/‖θ‖): η‖∇L‖/‖θ‖ is its tangent.
    """
    theta, theta_next = torch.as_tensor(theta), torch.as_tensor(theta_next)
    u = theta / theta.norm(dim=-1, keepdim=True)
    v = theta_next / theta_next.norm(dim=-1, keepdim=True)
    return 2 * torch.atan2((u - v).norm(dim=-1), (u + v).norm(dim=-1))


def equilibrium_step_angle(lr: float, wd: float, momentum: float = 0.0) -> float:
    """√(2ηλ/(1+γ)): the RMS angle per step at which SGD with learning rate η, weight decay λ and
    momentum γ settles on a scale-invariant loss, to first order in ηλ.

    γ = 0: the norm obeys ‖θ_{t+1}‖² = (1 − ηλ)²‖θ_t‖² + η²‖∇L‖², so at a steady norm the tangent of the
    step angle, η‖∇L‖/((1 − ηλ)‖θ‖), has mean square 1/(1 − ηλ)² − 1 ≈ 2ηλ (exact version:
    :func:`angular_identity_gap`); Li & Arora (2020, App. A, remark after the proof of Thm 3.1) note that
    the angular fluctuation of their BN + WD toy model is at least of this size.  γ > 0: the same
    balance with the momentum-averaged step gives √(2ηλ/(1+γ)) (Wan et al. 2021, "spherical motion
    dynamics"; paper notes §6).
    """
    for name, value in (("lr", lr), ("wd", wd), ("momentum", momentum)):
        if not is_real(value):
            raise ValueError(f"{name} must be a finite number; got {value!r}")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0; got {lr!r}")
    if not (math.isfinite(wd) and wd > 0):
        raise ValueError(f"wd must be a finite number > 0 (no equilibrium without weight decay); got {wd!r}")
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum must be in [0, 1); got {momentum!r}")
    return math.sqrt(2 * lr * wd / (1 + momentum))


def angular_identity_gap(step_angles, norms, *, lr: float, wd: float) -> np.ndarray:
    """How far recorded runs are from an exact identity of SGD + WD (no momentum) on a scale-invariant
    loss, per seed: over a window of n steps,

        mean_t[−ln cos θ_t] − ( −ln(1 − ηλ) + ln(‖θ_end‖/‖θ_start‖)/n )      (= 0 up to rounding),

    where θ_t = ∠(θ_t, θ_{t+1}).  Proof: the step −η∇L is orthogonal to θ (Lemma 1.3), so
    cos θ_t = (1 − ηλ)‖θ_t‖/‖θ_{t+1}‖ exactly and the logarithms telescope.  Once the norm is in
    equilibrium the RMS angle is therefore √(−2 ln(1 − ηλ)) ≈ √(2ηλ).  ``step_angles`` (n, seeds) and
    ``norms`` (n + 1, seeds) of the same window.
    """
    step_angles, norms = np.asarray(step_angles), np.asarray(norms)
    n = step_angles.shape[0]
    if norms.shape[0] != n + 1:
        raise ValueError(f"norms must have one more row than step_angles; got {norms.shape[0]} and {n}")
    predicted = -math.log(1 - lr * wd) + np.log(norms[-1] / norms[0]) / n
    return (-np.log(np.cos(step_angles))).mean(axis=0) - predicted


def effective_lr_relaxation(steps, *, lr_ratio: float, wd_ratio: float, lr: float, wd: float,
                            momentum: float = 0.0) -> np.ndarray:
    """Effective learning rate η/‖θ‖² after a change of (η, λ) at step 0, relative to its value just before:
    the mean-field model of the norm under SGD + WD on a scale-invariant loss.

    With x = ‖θ‖² and G = ‖∇L(θ/‖θ‖)‖ (the gradient on the unit sphere, taken as constant), one step changes
    x by −2ηλ/(1−γ)·x from the weight decay and by ∝ η²G²/x from the gradient (orthogonal to θ, Lemma 1.3),
    so x² relaxes exponentially, at rate 1/τ_θ = 4ηλ/(1−γ) per step (:func:`norm_relaxation_time`), to an
    equilibrium ∝ η/λ (the same balance as :func:`equilibrium_step_angle`). Starting from equilibrium
    under (η₀, λ₀) and switching to (η, λ) = (r_η η₀, r_λ λ₀) — the new values are ``lr`` and ``wd`` —
    gives, with q = r_η / r_λ and τ_θ of the new values,

        x_t² / x_0² = q + (1 − q) e^{−t/τ_θ},      η_t^eff / η_0^eff = r_η / √(q + (1 − q) e^{−t/τ_θ}).

    Step Decay (r_η = 0.1, r_λ = 1) drops 10× at once and climbs back; TEXP--, which equals a constant
    learning rate with the weight decay cut (r_η = 1, r_λ = 0.1, Li & Arora Sec. 5), falls gradually; both
    tend to √(r_η r_λ) = 1/√10 on the same time scale τ_θ.  :func:`chained_effective_lr` chains this
    over every phase of a schedule.
    """
    for name, value in (("lr_ratio", lr_ratio), ("wd_ratio", wd_ratio), ("lr", lr), ("wd", wd)):
        if not (is_real(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0; got {value!r}")
    check_momentum(momentum)
    t = np.asarray(steps, dtype=float)
    q = lr_ratio / wd_ratio
    return lr_ratio / np.sqrt(q + (1 - q) * np.exp(-t / norm_relaxation_time(lr, wd, momentum)))


def norm_relaxation_time(lr, wd, momentum: float = 0.0):
    """τ_θ = (1 − γ)/(4ηλ): the number of steps in which x² = ‖θ‖⁴ relaxes by a factor e towards its
    equilibrium ∝ η/λ (:func:`effective_lr_relaxation`).  It is also the linearised relaxation time of
    ‖θ‖² itself near that equilibrium, where weight decay (rate 2ηλ/(1−γ)) and the gradient's growth term
    contribute equally; weight decay alone would shrink ‖θ‖² on (1 − γ)/(2ηλ) steps."""
    return (1 - momentum) / (4 * np.asarray(lr, dtype=float) * np.asarray(wd, dtype=float))


def chained_effective_lr(lr, wd, momentum: float = 0.0) -> np.ndarray:
    """The norm-equilibrium model of :func:`effective_lr_relaxation`, chained over a whole per-step schedule.

    ``lr``, ``wd``: per-step arrays (or scalars broadcast to the other's length) of an SGD + WD run.
    Within every stretch of constant (η, λ), u = ‖θ‖⁴ (in units where its equilibrium is η/λ) relaxes as

        u_{k} = η/λ + (u_start − η/λ) e^{−(k − k_start)/τ_θ},      τ_θ = (1 − γ)/(4ηλ),

    starting where the previous stretch ended, and from the equilibrium of the first (η, λ) at step 0 (as
    if the run had been at its first values for a long time).  Returns the effective learning rate
    η_k/‖θ_k‖² = η_k/√u_k after each step, in units where it is √(ηλ) at equilibrium; ratios between two
    schedules with the same gradient scale G are therefore the model's prediction, with no free parameter.
    """
    lr, wd = np.broadcast_arrays(np.asarray(lr, dtype=float), np.asarray(wd, dtype=float))
    if lr.ndim != 1 or len(lr) == 0:
        raise ValueError(f"lr and wd must be per-step arrays with at least one step; got shape {lr.shape}")
    if not (np.isfinite(lr).all() and np.isfinite(wd).all() and (lr > 0).all() and (wd > 0).all()):
        raise ValueError("lr and wd must be finite and > 0 at every step")
    check_momentum(momentum)
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
