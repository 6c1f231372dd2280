"""Sharpness: the top eigenvalue of the Hessian of a :class:`explr.book.flow.FlatProblem`.

Gradient descent with step η is stable along a direction of curvature λ only while η·λ < 2, so the
largest eigenvalue λ_max(∇²R(θ)) (the *sharpness*) decides whether GD can follow gradient flow.
Chapter 5 uses it for the fact that GD with weight decay cannot keep λ_max below 2/η on a
scale-invariant loss (paper notes §6).  Two independent methods, both on Hessian-vector products
(no Hessian is formed except the at most 2×2 one of a tiny problem), so the book can check one
against the other: the power iteration (:func:`power_iteration`, the largest |λ| and ‖∇²R‖₂) and
Lanczos (:func:`top_eigenvalue`, the most positive λ).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .flow import FlatProblem

__all__ = ["PowerIteration", "power_iteration", "top_eigenvalue"]


@dataclass(frozen=True)
class PowerIteration:
    """Result of :func:`power_iteration` on A = ∇²R(θ).

    eigenvalue : Rayleigh quotient vᵀAv, the eigenvalue of A of largest magnitude
        once the iteration has converged and that eigenvalue is unique in magnitude;
    norm : ‖Av‖, which tends to ‖A‖₂ = max|λ(A)| even when λ and −λ tie in magnitude;
    vector : the final unit vector v;  iterations : used;  converged : whether v is an eigenvector
        (see :func:`power_iteration`).
    """

    eigenvalue: float
    norm: float
    vector: torch.Tensor
    iterations: int
    converged: bool


def power_iteration(problem: FlatProblem, theta, iters: int = 1000, tol: float = 1e-10, seed: int = 0) -> PowerIteration:
    """Power iteration v ← Av/‖Av‖ on A = ∇²R(θ) with Hessian-vector products (no Hessian).

    ``norm`` is the spectral norm ‖∇²R(θ)‖₂, the smoothness (Lipschitz constant of
    ∇R) near θ, and ``eigenvalue`` the signed eigenvalue attaining it.  Stops when ‖Av‖ changes by
    less than ``tol`` relatively; ``converged`` is whether v is then an eigenvector, i.e. the
    residual ‖Av − μv‖/‖Av‖ is below 10·√tol (so that μ is accurate to about ``tol``).  When λ and
    −λ tie in magnitude, ‖Av‖ still converges to |λ| but v does not.  :func:`top_eigenvalue` gives
    the most positive eigenvalue (by Lanczos: an independent method, the book checks one against the other).
    """
    if iters < 1 or not tol > 0:
        raise ValueError(f"need iters >= 1 and tol > 0; got {iters!r}, {tol!r}")
    theta = problem._as_tensor(theta).detach()
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(problem.n, generator=gen, dtype=problem.dtype)
    v /= v.norm()
    norm = math.nan
    for i in range(1, iters + 1):
        av = problem.hvp(theta, v)
        value, new_norm = torch.dot(v, av).item(), av.norm().item()
        residual = ((av - value * v).norm() / new_norm).item()
        v = av / new_norm
        settled = abs(new_norm - norm) <= tol * new_norm
        norm = new_norm
        if settled:
            break
    return PowerIteration(value, norm, v, i, residual <= 10 * math.sqrt(tol))


def top_eigenvalue(problem: FlatProblem, theta, tol: float = 1e-10, seed: int = 0) -> float:
    """Largest (most positive) eigenvalue λ_max of ∇²R(θ): the *sharpness* that GD's stability
    (η·λ_max < 2) sees, and the curvature bound of the descent lemma.

    Lanczos iteration (``scipy.sparse.linalg.eigsh``, ``which="LA"``, ARPACK) on Hessian-vector products,
    from a random start drawn with ``seed``; ``tol`` is ARPACK's relative accuracy.  Unlike the power
    iteration it needs no spectral gap in magnitude (a concave direction of larger |λ| or a tie ±λ
    does not matter) and it converges in a few dozen products where the top eigenvalues cluster.
    Raises RuntimeError if ARPACK does not converge.
    """
    from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh

    if not tol > 0:
        raise ValueError(f"tol must be > 0; got {tol!r}")
    theta = problem._as_tensor(theta).detach()

    def hvp(u):
        return problem.hvp(theta, np.ascontiguousarray(u, dtype=np.float64).ravel()).double().numpy()

    if problem.n < 3:   # ARPACK needs k < n - 1: build the tiny Hessian instead
        dense = np.stack([hvp(e) for e in np.eye(problem.n)])
        return float(np.linalg.eigvalsh((dense + dense.T) / 2)[-1])
    start = np.random.default_rng(seed).standard_normal(problem.n)
    operator = LinearOperator((problem.n, problem.n), dtype=np.float64, matvec=hvp)
    try:
        return float(eigsh(operator, k=1, which="LA", tol=tol, v0=start)[0][0])
    except ArpackNoConvergence as err:
        raise RuntimeError(f"top_eigenvalue: Lanczos did not converge ({err})") from None
