"""Sharpness: the top eigenvalue λ_max of the Hessian of a :class:`explr.book.flow.FlatProblem` (GD with step η is
stable only while η·λ_max < 2), by two independent methods on Hessian-vector products: the power iteration (the
largest |λ|) and Lanczos (the most positive λ)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .flow import FlatProblem

__all__ = ["PowerIteration", "power_iteration", "top_eigenvalue"]


@dataclass(frozen=True)
class PowerIteration:
    """:func:`power_iteration` on A = ∇²R(θ): the Rayleigh quotient vᵀAv, ‖Av‖ (→ ‖A‖₂ even when λ and −λ tie),
    the last unit vector v, the iterations used, and whether v is an eigenvector."""

    eigenvalue: float
    norm: float
    vector: torch.Tensor
    iterations: int
    converged: bool


def power_iteration(problem: FlatProblem, theta, iters: int = 1000, tol: float = 1e-10,
                    seed: int = 0) -> PowerIteration:
    """Power iteration v ← Av/‖Av‖ on A = ∇²R(θ) until ‖Av‖ changes by less than ``tol`` relatively; converged
    when the residual ‖Av − μv‖/‖Av‖ is below 10·√tol."""
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
    """The most positive eigenvalue λ_max of ∇²R(θ), by Lanczos (ARPACK's ``eigsh``, ``which="LA"``, relative
    accuracy ``tol``, a random start from ``seed``); RuntimeError if ARPACK does not converge."""
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
