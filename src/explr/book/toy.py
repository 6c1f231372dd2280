"""The toy model of Li & Arora's Section 3: BN and WD each converge, together they do not.

Inputs x ~ N(0, I_m), m ≥ 3, labels y = sign(x_1), logistic loss ℓ(z) = ln(1 + e^{−z}) of the margin y f(x), plain
SGD with step η on fresh batches of B, for three models of one w ∈ R^m (:data:`MODELS`): ``"wd"`` f = wᵀx with weight
decay λ; ``"bn"`` f = wᵀx/‖w‖ (population BN), no weight decay; ``"bn+wd"`` both.  With u = w/‖w‖ and
s_b = −σ(−y_b f(x_b)) y_b / B, one step is

    WD: ∇ = Σ_b s_b x_b + λ w;   BN: ∇ = (I − u uᵀ) Σ_b s_b x_b / ‖w‖ (+ λ w);   w ← w − η ∇.

:func:`simulate` runs all seeds and models as one batch of tensors (common random numbers).  The error of a linear
classifier is ∠(w, e_1)/π (:func:`training_error`); Thm 3.1's window is :func:`theorem_W1` + :func:`theorem_W2`;
the BN models' expected loss is E_z[ln(1 + e^z)] − u_1/√(2π) (:func:`population_grad`).  The derivations:
docs/maths-notes.md, "The toy model".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..invariance import step_angle
from ..params import MAX_SEED, Float, Int, checked

__all__ = [
    "MODELS",
    "ToyRun",
    "sample_batch",
    "loss_grad",
    "population_grad",
    "simulate",
    "angle_to_e1",
    "training_error",
    "theorem_W1",
    "theorem_W2",
    "WindowCheck",
    "check_window_claim",
]

#: The three models of Sec. 3, by name: (uses population BN, uses weight decay).
MODELS = {"wd": (False, True), "bn": (True, False), "bn+wd": (True, True)}


# ----------------------------------------------------------------------------- validation
def _count(name, value, minimum=1) -> int:
    return int(checked(name, value, Int(minimum)))


def _positive(name, value) -> float:
    return float(checked(name, value, Float(0)))


def _check_models(models):
    models = tuple(models)
    bad = [m for m in models if m not in MODELS]
    if not models or bad:
        raise ValueError(f"models must be a non-empty subset of {tuple(MODELS)}; got {models!r}")
    return models


# ----------------------------------------------------------------------------- data and loss
def sample_batch(seeds: int, batch_size: int, dim: int, generator=None, dtype=torch.float64):
    """A fresh mini-batch per seed: x of shape (seeds, B, m) with x ~ N(0, I_m), y = sign(x_1) of shape (seeds, B)."""
    seeds = _count("seeds", seeds)
    batch_size = _count("batch_size", batch_size)
    dim = _count("dim", dim, minimum=3)
    x = torch.randn(seeds, batch_size, dim, generator=generator, dtype=dtype)
    return x, torch.sign(x[..., 0])


def loss_grad(w, x, y, bn, wd):
    """Analytic ∇_w of the batch-mean logistic loss (+ (λ/2)‖w‖²), for stacked models: w (K, S, m), x (S, B, m), y
    (S, B).

    ``bn`` and ``wd`` broadcast against (K, S, 1): a bool tensor (population BN or not) and the weight
    decay of each model.  Formula in the module docstring.  Cost: two einsums over (K, S, B, m).
    """
    norm = w.norm(dim=-1, keepdim=True)
    v = torch.where(bn, w / norm, w)                         # the direction that meets the data
    margin = torch.einsum("ksm,sbm->ksb", v, x) * y
    s = -torch.sigmoid(-margin) * y / x.shape[-2]            # dℓ/df per sample, batch-averaged
    g = torch.einsum("ksb,sbm->ksm", s, x)                   # ∂L/∂v
    g_bn = (g - (g * v).sum(-1, keepdim=True) * v) / norm    # chain rule through v = w/‖w‖
    return torch.where(bn, g_bn, g) + wd * w


def population_grad(w, wd):
    """∇_w of the expected loss of the BN models (B = ∞): −(I − u uᵀ) e_1 / (√(2π) ‖w‖) + λ w, u = w/‖w‖.

    ``w`` (..., m); ``wd`` broadcasts against (..., 1).  Derivation: docs/maths-notes.md, "The toy model".
    """
    norm = w.norm(dim=-1, keepdim=True)
    u = w / norm
    e1 = torch.zeros_like(w)
    e1[..., 0] = 1
    return -(e1 - u[..., :1] * u) / (math.sqrt(2 * math.pi) * norm) + wd * w


# ----------------------------------------------------------------------------- geometry
def angle_to_e1(w):
    """∠(w, e_1) in [0, π] for w (..., m), computed as atan2(‖w_{2:m}‖, w_1) (accurate near 0 and π)."""
    w = torch.as_tensor(w)
    return torch.atan2(w[..., 1:].norm(dim=-1), w[..., 0])


def training_error(w):
    """Population error of the linear classifier sign(wᵀx) on x ~ N(0, I), y = sign(x_1): ∠(w, e_1)/π.

    (The sign of a Gaussian projects onto a uniform direction in span(w, e_1); the two half-planes
    disagree on a wedge of angle 2∠(w, e_1) out of 2π.)  Population BN does not change the sign.
    """
    return angle_to_e1(w) / math.pi


# ----------------------------------------------------------------------------- simulation
@dataclass(frozen=True)
class ToyRun:
    """What :func:`simulate` records, at every step, for every model and seed (numpy float64).

    error : (steps + 1, K, S) -- training error ∠(w_t, e_1)/π, t = 0..steps.
    norm : (steps + 1, K, S) -- ‖w_t‖.
    step_angle : (steps, K, S) -- ∠(w_t, w_{t+1}).
    models : the K model names; lr, wd, batch_size, dim : the hyperparameters (wd is that of the WD models;
        batch_size is math.inf for population gradient descent).
    """

    error: np.ndarray
    norm: np.ndarray
    step_angle: np.ndarray
    models: tuple
    lr: float
    wd: float
    batch_size: int | float
    dim: int

    def __getitem__(self, model):
        """(error, norm, step_angle) of one model, each of shape (time, seeds)."""
        k = self.models.index(model)
        return self.error[:, k], self.norm[:, k], self.step_angle[:, k]


def simulate(
    models=tuple(MODELS),
    *,
    steps: int,
    seeds: int,
    batch_size: int | float,
    lr: float,
    wd: float,
    dim: int = 10,
    norm0: float = 1.0,
    w0=None,
    seed: int = 0,
    dtype=torch.float32,
) -> ToyRun:
    """SGD on the toy problem for all ``models`` × ``seeds`` at once, recording every step.

    Each seed starts from one uniformly random direction with ‖w_0‖ = ``norm0`` (the same for every
    model), or from ``w0`` if given (shape (dim,) for all seeds, or (seeds, dim)), and draws a fresh
    batch of ``batch_size`` samples per step, shared by all models of that seed.  ``batch_size =
    math.inf`` is the noiseless limit B = ∞: gradient descent on the expected loss
    (:func:`population_grad`), for the BN models only (the WD model's expected gradient has no closed
    form); run it in float64, since between its bursts the error decays far below float32's range.
    ``wd`` is λ of the ``"wd"`` and ``"bn+wd"`` models (``"bn"`` uses none).  Reproducible from
    ``seed``.  float32 (default) is the faster, and ample for the recorded angles of finite-batch runs.
    """
    models = _check_models(models)
    steps = _count("steps", steps)
    seeds = _count("seeds", seeds)
    population = batch_size == math.inf
    if population:
        if any(not MODELS[m][0] for m in models):
            raise ValueError(f"batch_size = inf (population gradient) needs BN models only; got {models!r}")
    else:
        batch_size = _count("batch_size", batch_size)
    dim = _count("dim", dim, minimum=3)
    lr = _positive("lr", lr)
    norm0 = _positive("norm0", norm0)
    wd = float(checked("wd", wd, Float(0, 1 / lr, lo_open=False, note=" (lr * wd < 1)")))
    gen = torch.Generator().manual_seed(int(checked("seed", seed, Int(0, maximum=MAX_SEED))))
    K = len(models)
    bn = torch.tensor([MODELS[m][0] for m in models]).view(K, 1, 1)
    lam = torch.tensor([wd if MODELS[m][1] else 0.0 for m in models], dtype=dtype).view(K, 1, 1)

    if w0 is None:
        start = torch.randn(seeds, dim, generator=gen, dtype=dtype)
        start = norm0 * start / start.norm(dim=-1, keepdim=True)
    else:
        start = torch.as_tensor(w0, dtype=dtype)
        bad = not torch.isfinite(start).all() or (start.norm(dim=-1) == 0).any()
        if start.shape not in ((dim,), (seeds, dim)) or bad:
            raise ValueError(f"w0 must be finite and nonzero, of shape ({dim},) or ({seeds}, {dim}); "
                             f"got shape {tuple(start.shape)}")
    w = start.expand(K, seeds, dim).clone()
    error = torch.empty(steps + 1, K, seeds, dtype=dtype)
    norm = torch.empty(steps + 1, K, seeds, dtype=dtype)
    angle = torch.empty(steps, K, seeds, dtype=dtype)
    error[0], norm[0] = training_error(w), w.norm(dim=-1)
    for t in range(steps):
        if population:
            grad = population_grad(w, lam)
        else:
            x, y = sample_batch(seeds, batch_size, dim, gen, dtype)
            grad = loss_grad(w, x, y, bn, lam)
        w_next = w - lr * grad
        angle[t] = step_angle(w, w_next)
        w = w_next
        error[t + 1], norm[t + 1] = training_error(w), w.norm(dim=-1)
    as_np = lambda a: a.double().numpy()  # noqa: E731
    return ToyRun(as_np(error), as_np(norm), as_np(angle), models, lr, wd, batch_size, dim)


# ----------------------------------------------------------------------------- the theorem
def _check_eps(eps, lr, wd):
    return float(checked("eps", eps, Float(0, math.sqrt(lr * wd / 2), note=" (0 < eps < sqrt(lr*wd/2))")))


def theorem_W1(norm, *, lr, wd, eps, batch_size, dim):
    """W_1 of Thm 3.1 at ‖w_{k_0}‖ = ``norm`` (array ok): ln(64‖w‖² ε √B/(η √(m−2))) / (2(ηλ − 2ε²)).

    Needs 0 < ε < √(ηλ/2) and m >= 3.  Where the logarithm is negative the norm is already below the
    proof's threshold ‖w‖² <= η√(m−2)/(64 ε √B) and W_1 = 0 (returned clipped at 0).
    """
    lr, wd = _positive("lr", lr), _positive("wd", wd)
    eps = _check_eps(eps, lr, wd)
    batch_size = _count("batch_size", batch_size)
    dim = _count("dim", dim, minimum=3)
    arg = 64 * np.asarray(norm, dtype=np.float64) ** 2 * eps * math.sqrt(batch_size) / (lr * math.sqrt(dim - 2))
    return np.maximum(np.log(arg) / (2 * (lr * wd - 2 * eps**2)), 0.0)


def theorem_W2(delta):
    """W_2 = 9 ln(1/δ) of Thm 3.1 (each step leaves the cone with probability >= 1/9 once ‖w‖ is small)."""
    return 9 * math.log(1 / float(checked("delta", delta, Float(0, 1))))


@dataclass(frozen=True)
class WindowCheck:
    """Result of :func:`check_window_claim`.

    windows : number of (seed, k_0) windows that fit in the run and were checked.
    violations : how many of them never saw the error exceed ε/π.
    length : (windows,) the window lengths ⌊W_1 + W_2⌋ in steps.
    """

    windows: int
    violations: int
    length: np.ndarray

    @property
    def violation_rate(self) -> float:
        return self.violations / max(self.windows, 1)


def check_window_claim(error, norm, *, lr, wd, eps, delta, batch_size, dim, starts=None) -> WindowCheck:
    """Check Thm 3.1 on recorded runs: for each seed and each start k_0, does the error exceed ε/π at some
    t ∈ {k_0, …, k_0 + ⌊W_1(‖w_{k_0}‖) + W_2⌋}?

    ``error``, ``norm``: (steps + 1, seeds) of one BN+WD run.  ``starts``: the k_0 to try (default: all);
    windows that run past the end are skipped.  The theorem allows a fraction δ of violations.
    """
    error, norm = np.asarray(error), np.asarray(norm)
    if error.shape != norm.shape or error.ndim != 2:
        raise ValueError(f"error and norm must both have shape (steps + 1, seeds); got {error.shape}, {norm.shape}")
    n = error.shape[0]
    starts = np.arange(n) if starts is None else np.asarray(starts, dtype=int)
    if starts.size == 0 or starts.min() < 0 or starts.max() >= n:
        raise ValueError(f"starts must be indices in [0, {n}); got {starts!r}")
    # next_exceed[t] = first t' >= t with error > ε/π (n if none)
    t = np.arange(n)[:, None]
    idx = np.where(error > eps / math.pi, t, n)
    next_exceed = np.minimum.accumulate(idx[::-1], axis=0)[::-1]
    length = np.floor(theorem_W1(norm[starts], lr=lr, wd=wd, eps=eps, batch_size=batch_size, dim=dim)
                      + theorem_W2(delta)).astype(int)
    end = starts[:, None] + length
    fits = end < n
    ok = next_exceed[starts] <= end
    return WindowCheck(int(fits.sum()), int((fits & ~ok).sum()), length[fits])
