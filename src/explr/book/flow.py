"""Gradient flow, modified flows with counter terms, and how far gradient descent is from them.

GD θ_{k+1} = θ_k − η∇L(θ_k) solves, up to O(η³), the modified equation (Hairer, Lubich & Wanner, *Geometric
Numerical Integration*, Sec. IX.1; f₁: Barrett & Dherin 2021; f₂: chapter 5)

    θ̇ = g + η f₁ + η² f₂,   g = −∇L,   f₁ = −½ H∇L,   f₂ = −(1/12) D³L[∇L, ∇L] − (1/3) H²∇L,

on the flat parameter vector (:class:`FlatProblem`, autograd, no Hessian formed).  More: docs/maths-notes.md, "Flows".
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..invariance import step_angle, trainable_parameters

__all__ = ["FlatProblem", "FlowResult", "integrate_flow", "gradient_descent", "GDComparison", "discretisation_error",
           "reparametrised_time", "angular_updates", "smooth_activations", "CompositeBatchNorm1d",
           "composite_batchnorm"]


def smooth_activations(model: nn.Module, activation=nn.Tanh) -> nn.Module:
    """Replace every ``nn.ReLU`` of ``model`` by ``activation()`` in place (backward error analysis needs a smooth
    loss); returns the model."""
    for name, child in model.named_children():
        if isinstance(child, nn.ReLU):
            setattr(model, name, activation())
        else:
            smooth_activations(child, activation)
    return model


class CompositeBatchNorm1d(nn.Module):
    """y = (x − mean_B x) / √(var_B x + ε) · weight + bias: ``nn.BatchNorm1d(track_running_stats=False)`` in
    elementary operations, differentiable to any order (torch's fused ``batch_norm`` refuses third derivatives, and
    under nested ``torch.func.grad`` returns a wrong D³L: pytorch/pytorch#186256)."""

    def __init__(self, bn: nn.modules.batchnorm._BatchNorm):
        super().__init__()
        self.eps = bn.eps
        self.weight = bn.weight
        self.bias = bn.bias

    def forward(self, x):
        centred = x - x.mean(0, keepdim=True)
        y = centred / torch.sqrt(centred.square().mean(0, keepdim=True) + self.eps)
        if self.weight is not None:
            y = y * self.weight + self.bias
        return y


def composite_batchnorm(model: nn.Module) -> nn.Module:
    """Replace every ``nn.BatchNorm1d`` (batch statistics only) of ``model`` by a :class:`CompositeBatchNorm1d`
    sharing its affine parameters, in place; returns the model.  Call it after
    :func:`explr.invariance.make_scale_invariant`, which recognises only torch's layers."""
    for name, child in model.named_children():
        if isinstance(child, nn.BatchNorm1d):
            if child.track_running_stats:
                raise ValueError(f"composite_batchnorm: layer {name!r} tracks running statistics; "
                                 "build the model with running_stats=False")
            setattr(model, name, CompositeBatchNorm1d(child))
        else:
            composite_batchnorm(child)
    return model


class FlatProblem:
    """R(θ) = L(θ) + (wd/2)‖θ‖² of ``model`` on one fixed batch, θ the trainable parameters flattened in
    ``named_parameters`` order (frozen ones and buffers fixed), evaluated by ``torch.func.functional_call`` in the
    model's current mode."""

    def __init__(self, model: nn.Module, loss_fn, inputs, targets, wd: float = 0.0):
        if not wd >= 0:
            raise ValueError(f"wd must be >= 0; got {wd!r}")
        trainable = trainable_parameters(model)
        if not trainable:
            raise ValueError("FlatProblem: the model has no trainable parameters")
        self.model, self.loss_fn, self.inputs, self.targets, self.wd = model, loss_fn, inputs, targets, float(wd)
        self.names = [n for n, _ in trainable]
        self.shapes = [p.shape for _, p in trainable]
        self.sizes = [p.numel() for _, p in trainable]
        self.fixed = {n: p.detach() for n, p in model.named_parameters() if not p.requires_grad}
        self.fixed.update({n: b for n, b in model.named_buffers()})
        self.dtype = trainable[0][1].dtype
        self.theta0 = torch.cat([p.detach().reshape(-1) for _, p in trainable]).clone()
        self.n = self.theta0.numel()

    def slices(self) -> dict[str, slice]:
        """Where each named parameter lives in θ."""
        ends = itertools.accumulate(self.sizes)
        return {name: slice(end - size, end) for name, size, end in zip(self.names, self.sizes, ends)}

    def _as_tensor(self, theta) -> torch.Tensor:
        theta = torch.as_tensor(theta, dtype=self.dtype)
        if theta.shape != (self.n,):
            raise ValueError(f"theta must be a flat vector of {self.n} entries; got shape {tuple(theta.shape)}")
        return theta

    def _loss(self, theta: torch.Tensor) -> torch.Tensor:
        split = {n: t.view(s) for n, t, s in zip(self.names, torch.split(theta, self.sizes), self.shapes)}
        out = torch.func.functional_call(self.model, {**self.fixed, **split}, (self.inputs,))
        loss = self.loss_fn(out, self.targets)
        if self.wd:
            loss = loss + 0.5 * self.wd * theta.square().sum()
        return loss

    def loss(self, theta) -> float:
        """R(θ)."""
        with torch.no_grad():
            return self._loss(self._as_tensor(theta)).item()

    def grad(self, theta) -> torch.Tensor:
        """∇R(θ)."""
        theta = self._as_tensor(theta).detach().requires_grad_(True)
        return torch.autograd.grad(self._loss(theta), theta)[0]

    def hvp(self, theta, v) -> torch.Tensor:
        """∇²R(θ) v by double backward (no Hessian formed)."""
        theta = self._as_tensor(theta).detach().requires_grad_(True)
        g = torch.autograd.grad(self._loss(theta), theta, create_graph=True)[0]
        return torch.autograd.grad(g, theta, grad_outputs=self._as_tensor(v).detach())[0]

    def third(self, theta, v) -> torch.Tensor:
        """D³R(θ)[v, v] = ∇_θ ⟨v, ∇²R(θ) v⟩ (v held fixed), by triple backward."""
        theta = self._as_tensor(theta).detach().requires_grad_(True)
        v = self._as_tensor(v).detach()
        g = torch.autograd.grad(self._loss(theta), theta, create_graph=True)[0]
        hv = torch.autograd.grad(g, theta, grad_outputs=v, create_graph=True)[0]
        if not hv.requires_grad:  # D³R = 0 (a quadratic R)
            return torch.zeros_like(theta)
        return torch.autograd.grad(hv, theta, grad_outputs=v, allow_unused=True, materialize_grads=True)[0]

    def vector_field(self, theta, lr: float = 0.0, order: int = 0) -> torch.Tensor:
        """The modified equation of GD with step ``lr`` truncated after η^order: −∇R (order 0), − (η/2) H∇R (1),
        − η² [(1/12) D³R[∇R, ∇R] + (1/3) H²∇R] (2), on one forward pass."""
        if order not in (0, 1, 2):
            raise ValueError(f"order must be 0, 1 or 2; got {order!r}")
        if order and not lr > 0:
            raise ValueError(f"lr must be > 0 for a modified flow (order {order}); got {lr!r}")
        theta = self._as_tensor(theta).detach().requires_grad_(True)
        loss = self._loss(theta)
        if order == 0:
            return -torch.autograd.grad(loss, theta)[0]
        g = torch.autograd.grad(loss, theta, create_graph=True)[0]
        v = g.detach()
        hv = torch.autograd.grad(g, theta, grad_outputs=v, create_graph=order == 2, retain_graph=order == 2)[0]
        field = -v - 0.5 * lr * hv.detach()
        if order == 2:
            # (1/12) D³R[v, v] + (1/3) H²v = ∇_θ[(1/12) vᵀ(Hv) + (1/3) gᵀ(Hv)], v and Hv fixed: one backward pass
            if hv.requires_grad:
                terms = torch.autograd.grad((hv, g), theta, grad_outputs=(v / 12.0, hv.detach() / 3.0))[0]
            else:  # D³R = 0 (a quadratic R): only H²v is left
                terms = torch.autograd.grad(g, theta, grad_outputs=hv.detach() / 3.0)[0]
            field = field - lr**2 * terms
        return field


@dataclass(frozen=True)
class FlowResult:
    """A solved flow: ``theta[i]`` is θ(``t[i]``); ``nfev`` right-hand-side evaluations."""

    t: np.ndarray
    theta: np.ndarray
    nfev: int


def integrate_flow(problem: FlatProblem, theta0, t_eval, lr: float = 0.0, order: int = 0,
                   method: str = "DOP853", rtol: float = 1e-11, atol: float = 1e-13) -> FlowResult:
    """θ̇ = ``problem.vector_field(θ, lr, order)`` from θ(0) = ``theta0``, by ``scipy.integrate.solve_ivp`` in
    float64 (DOP853 at rtol 1e-11: far below the errors the book measures); RuntimeError if the solver fails."""
    from scipy.integrate import solve_ivp

    t_eval = np.atleast_1d(np.asarray(t_eval, dtype=np.float64))
    if t_eval.size == 0 or np.any(t_eval < 0) or np.any(np.diff(t_eval) < 0):
        raise ValueError("t_eval must be a non-empty, non-decreasing array of times >= 0")
    if not 0 < rtol < 1:
        raise ValueError(f"rtol must be in (0, 1); got {rtol!r}")
    theta0 = problem._as_tensor(theta0).detach()
    problem.vector_field(theta0, lr, order)  # validates lr and order early

    def rhs(_t, y):
        return problem.vector_field(torch.from_numpy(y), lr, order).numpy()

    t_end = float(t_eval[-1])
    if t_end == 0:
        return FlowResult(t_eval, np.tile(theta0.numpy(), (t_eval.size, 1)), 0)
    sol = solve_ivp(rhs, (0.0, t_end), theta0.numpy().astype(np.float64), method=method, t_eval=t_eval,
                    rtol=rtol, atol=atol)
    if not sol.success:
        raise RuntimeError(f"solve_ivp failed: {sol.message}")
    return FlowResult(sol.t, sol.y.T.copy(), sol.nfev)


def gradient_descent(problem: FlatProblem, theta0, lr: float, steps: int, record_every: int = 1) -> np.ndarray:
    """θ_{k+1} = θ_k − η∇R(θ_k); returns θ_k for k = 0, record_every, 2·record_every, …, steps."""
    if not lr > 0:
        raise ValueError(f"lr must be > 0; got {lr!r}")
    if steps < 0 or record_every < 1:
        raise ValueError(f"need steps >= 0 and record_every >= 1; got {steps!r}, {record_every!r}")
    theta = problem._as_tensor(theta0).detach().clone()
    out = [theta.numpy().copy()]
    for k in range(1, steps + 1):
        theta = theta - lr * problem.grad(theta)
        if k % record_every == 0 or k == steps:
            out.append(theta.numpy().copy())
    return np.stack(out)


@dataclass(frozen=True)
class GDComparison:
    """GD's iterates ``gd`` (steps+1, n) at t_k = kη, each order's flow ``flows[p]`` there, and ``errors[p]`` =
    ‖θ_k − θ_flow(t_k)‖ / ‖θ₀‖."""

    lr: float
    t: np.ndarray
    gd: np.ndarray
    flows: dict
    errors: dict


def discretisation_error(problem: FlatProblem, theta0, lr: float, steps: int, orders=(0, 1, 2),
                         **solver) -> GDComparison:
    """``steps`` GD steps of size ``lr`` against each flow of ``orders`` at t = kη: order p's global error is
    O(η^{p+1}) (Hairer, Lubich & Wanner, Sec. IX.1).  ``solver``: keywords of :func:`integrate_flow`."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1; got {steps!r}")
    gd = gradient_descent(problem, theta0, lr, steps)
    t = lr * np.arange(steps + 1)
    scale = float(np.linalg.norm(gd[0]))
    flows = {p: integrate_flow(problem, theta0, t, lr, p, **solver).theta for p in orders}
    errors = {p: np.linalg.norm(gd - flow, axis=1) / scale for p, flow in flows.items()}
    return GDComparison(lr, t, gd, flows, errors)


def reparametrised_time(t, wd: float):
    """τ(t) = (e^{2λt} − 1)/(2λ) (τ = t for λ = 0): on a scale-invariant L, GF with weight decay λ is θ(t) =
    e^{−λt} φ(τ(t)), φ the plain GF (chapter 5; Li & Arora 2020, Sec. 4)."""
    if not wd >= 0:
        raise ValueError(f"wd must be >= 0; got {wd!r}")
    t = np.asarray(t, dtype=np.float64)
    return t.copy() if wd == 0 else np.expm1(2 * wd * t) / (2 * wd)


def angular_updates(model: nn.Module, loss_fn, batches, lr: float, wd: float, momentum: float = 0.0,
                    groups: dict[str, list[str]] | None = None) -> dict[str, np.ndarray]:
    """Train ``model`` in place with ``torch.optim.SGD(lr, momentum, weight_decay=wd)``; per step, the angle between
    θ_k and θ_{k+1} of each group of ``groups`` (name → parameter names; default each parameter, and "all")."""
    if not lr > 0 or not wd >= 0 or not 0 <= momentum < 1:
        raise ValueError(f"need lr > 0, wd >= 0, 0 <= momentum < 1; got {lr!r}, {wd!r}, {momentum!r}")
    named = dict(trainable_parameters(model))
    if groups is None:
        groups = {n: [n] for n in named} | {"all": list(named)}
    unknown = {n for names in groups.values() for n in names} - set(named)
    if unknown:
        raise ValueError(f"groups name parameters that are not trainable: {sorted(unknown)}")
    opt = torch.optim.SGD(list(named.values()), lr=lr, momentum=momentum, weight_decay=wd)
    out = {g: np.empty(len(batches)) for g in groups}

    def snapshot():
        return {n: p.detach().clone() for n, p in named.items()}

    before = snapshot()
    for k, (x, y) in enumerate(batches):
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
        after = snapshot()
        for g, names in groups.items():
            out[g][k] = step_angle(torch.cat([before[n].reshape(-1) for n in names]),
                                   torch.cat([after[n].reshape(-1) for n in names])).item()
        before = after
    return out
