"""The toy model of Li & Arora's Section 3 (Thm 3.1): BN and WD each converge, together they do not.

x ~ N(0, I_m), m ≥ 3, y = sign(x_1), logistic loss of the margin y f(x), SGD with step η on fresh batches of B,
for f = wᵀx with weight decay λ ("wd"), f = wᵀx/‖w‖ (population BN, "bn") and both ("bn+wd").  With u = w/‖w‖ and
s_b = −σ(−y_b f(x_b)) y_b / B:  WD: ∇ = Σ_b s_b x_b + λ w;  BN: ∇ = (I − u uᵀ) Σ_b s_b x_b / ‖w‖ (+ λ w).
The derivations: docs/maths-notes.md, "The toy model".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..invariance import step_angle
from ..params import MAX_SEED, Float, Int, checked

__all__ = ["MODELS", "ToyRun", "sample_batch", "loss_grad", "population_grad", "simulate", "training_error",
           "theorem_W1", "theorem_W2", "WindowCheck", "check_window_claim"]

#: The three models of Sec. 3, by name: (uses population BN, uses weight decay).
MODELS = {"wd": (False, True), "bn": (True, False), "bn+wd": (True, True)}


def _count(name, value, minimum=1) -> int:
    return int(checked(name, value, Int(minimum)))


def _positive(name, value) -> float:
    return float(checked(name, value, Float(0)))


def sample_batch(seeds: int, batch_size: int, dim: int, generator=None, dtype=torch.float64):
    """A fresh mini-batch per seed: x of shape (seeds, B, m) with x ~ N(0, I_m), y = sign(x_1) of shape (seeds, B)."""
    seeds = _count("seeds", seeds)
    batch_size = _count("batch_size", batch_size)
    dim = _count("dim", dim, minimum=3)
    x = torch.randn(seeds, batch_size, dim, generator=generator, dtype=dtype)
    return x, torch.sign(x[..., 0])


def loss_grad(w, x, y, bn, wd):
    """∇_w of the batch-mean logistic loss (+ (λ/2)‖w‖²) of stacked models (module docstring): w (K, S, m), x (S, B,
    m), y (S, B); ``bn`` (population BN or not) and ``wd`` broadcast against (K, S, 1)."""
    norm = w.norm(dim=-1, keepdim=True)
    v = torch.where(bn, w / norm, w)                         # the direction that meets the data
    margin = torch.einsum("ksm,sbm->ksb", v, x) * y
    s = -torch.sigmoid(-margin) * y / x.shape[-2]            # dℓ/df per sample, batch-averaged
    g = torch.einsum("ksb,sbm->ksm", s, x)                   # ∂L/∂v
    g_bn = (g - (g * v).sum(-1, keepdim=True) * v) / norm    # chain rule through v = w/‖w‖
    return torch.where(bn, g_bn, g) + wd * w


def population_grad(w, wd):
    """∇_w of the BN models' expected loss (B = ∞): −(I − u uᵀ) e_1 / (√(2π) ‖w‖) + λ w, u = w/‖w‖, ``w`` (..., m)."""
    norm = w.norm(dim=-1, keepdim=True)
    u = w / norm
    e1 = torch.zeros_like(w)
    e1[..., 0] = 1
    return -(e1 - u[..., :1] * u) / (math.sqrt(2 * math.pi) * norm) + wd * w


def training_error(w):
    """The population error of sign(wᵀx), w (..., m): ∠(w, e_1)/π, the angle as atan2(‖w_{2:m}‖, w_1)."""
    w = torch.as_tensor(w)
    return torch.atan2(w[..., 1:].norm(dim=-1), w[..., 0]) / math.pi


@dataclass(frozen=True)
class ToyRun:
    """What :func:`simulate` records for every model and seed: the error ∠(w_t, e_1)/π and ‖w_t‖ (steps + 1, K, S),
    the step angle ∠(w_t, w_{t+1}) (steps, K, S), and the settings."""

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


def simulate(models=tuple(MODELS), *, steps: int, seeds: int, batch_size: int | float, lr: float, wd: float,
             dim: int = 10, norm0: float = 1.0, w0=None, seed: int = 0, dtype=torch.float32) -> ToyRun:
    """SGD for all ``models`` × ``seeds`` at once from ``seed``: each seed from a random direction of norm ``norm0``
    (or ``w0``, (dim,) or (seeds, dim)) and a fresh batch a step, shared by its models.  ``batch_size = math.inf``:
    GD on the expected loss, BN models only (run it in float64).  ``wd`` is λ of "wd" and "bn+wd"."""
    models = tuple(models)
    if not models or any(m not in MODELS for m in models):
        raise ValueError(f"models must be a non-empty subset of {tuple(MODELS)}; got {models!r}")
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


def theorem_W1(norm, *, lr, wd, eps, batch_size, dim):
    """W_1 of Thm 3.1 at ‖w_{k_0}‖ = ``norm``: ln(64‖w‖² ε √B/(η √(m−2))) / (2(ηλ − 2ε²)), clipped at 0 (0 < ε <
    √(ηλ/2), m >= 3)."""
    lr, wd = _positive("lr", lr), _positive("wd", wd)
    eps = float(checked("eps", eps, Float(0, math.sqrt(lr * wd / 2), note=" (0 < eps < sqrt(lr*wd/2))")))
    batch_size = _count("batch_size", batch_size)
    dim = _count("dim", dim, minimum=3)
    arg = 64 * np.asarray(norm, dtype=np.float64) ** 2 * eps * math.sqrt(batch_size) / (lr * math.sqrt(dim - 2))
    return np.maximum(np.log(arg) / (2 * (lr * wd - 2 * eps**2)), 0.0)


def theorem_W2(delta):
    """W_2 = 9 ln(1/δ) of Thm 3.1 (each step leaves the cone with probability >= 1/9 once ‖w‖ is small)."""
    return 9 * math.log(1 / float(checked("delta", delta, Float(0, 1))))


@dataclass(frozen=True)
class WindowCheck:
    """:func:`check_window_claim`: the (seed, k_0) windows that fit in the run, how many never saw the error exceed
    ε/π, and their lengths ⌊W_1 + W_2⌋."""

    windows: int
    violations: int
    length: np.ndarray

    @property
    def violation_rate(self) -> float:
        return self.violations / max(self.windows, 1)


def check_window_claim(error, norm, *, lr, wd, eps, delta, batch_size, dim, starts=None) -> WindowCheck:
    """Thm 3.1 on one BN+WD run's ``error`` and ``norm`` (steps + 1, seeds): for each seed and start k_0 of ``starts``
    (default all), does the error exceed ε/π in {k_0, …, k_0 + ⌊W_1(‖w_{k_0}‖) + W_2⌋}?  (δ of them may not.)"""
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
