"""explr.book.flow: derivatives, modified flows, their error orders, and the scale/translation facts of chapter 5."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from explr.book.digits import batch_schedule
from explr.book.flow import (
    FlatProblem,
    angular_updates,
    composite_batchnorm,
    discretisation_error,
    gradient_descent,
    integrate_flow,
    reparametrised_time,
    smooth_activations,
)
from explr.book.sharpness import top_eigenvalue
from explr.book.fits import loglog_slope
from explr.invariance import make_scale_invariant
from explr.models import bn_mlp, invariant_bn_mlp
from flow_problems import invariant_problem, logistic_problem, quadratic_problem

loss_fn = F.cross_entropy


pytestmark = pytest.mark.usefixtures("one_thread")


# --- building blocks -------------------------------------------------------------------------------

def test_smooth_activations_and_composite_batchnorm_keep_the_function_and_the_frozen_parameters(digits64):
    x = digits64.x_train[:100]
    model = bn_mlp(hidden=(8, 8), eps=1e-5, seed=0).double()
    smooth_activations(model)
    assert not any(isinstance(m, nn.ReLU) for m in model.modules())
    assert sum(isinstance(m, nn.Tanh) for m in model.modules()) == 2
    make_scale_invariant(model)
    before = model(x)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    composite_batchnorm(model)
    assert not any(isinstance(m, nn.BatchNorm1d) for m in model.modules())
    assert torch.allclose(model(x), before, rtol=0, atol=1e-12)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == trainable


def test_composite_batchnorm_refuses_running_statistics():
    with pytest.raises(ValueError, match="running statistics"):
        composite_batchnorm(bn_mlp(hidden=(4,), running_stats=True))


def test_flat_problem_gradient_matches_the_model_and_hvp_matches_finite_differences(digits64):
    p = invariant_problem(digits64)
    model = p.model
    model.zero_grad()
    loss_fn(model(p.inputs), p.targets).backward()
    direct = torch.cat([q.grad.reshape(-1) for q in model.parameters() if q.requires_grad])
    theta = p.theta0
    assert torch.allclose(p.grad(theta), direct, rtol=0, atol=1e-14)
    v = torch.randn(p.n, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    h = 1e-5
    fd = (p.grad(theta + h * v) - p.grad(theta - h * v)) / (2 * h)
    assert ((fd - p.hvp(theta, v)).norm() / fd.norm()).item() < 1e-7


def test_third_derivative_matches_second_differences_with_error_falling_like_h_squared(digits64):
    """Steps relative to ‖θ‖/‖v‖, so that the check does not depend on the gradient's size (issue 16):
    a wrong D³L would leave an error that stops falling."""
    p = invariant_problem(digits64)
    theta, v = p.theta0, p.grad(p.theta0)
    d3 = p.third(theta, v)
    steps = [s * (theta.norm() / v.norm()).item() for s in (1e-3, 1e-4)]
    err = [((p.grad(theta + h * v) - 2 * p.grad(theta) + p.grad(theta - h * v)) / h**2 - d3).norm().item() / d3.norm().item()
           for h in steps]
    assert err[1] < 1e-4
    assert abs(loglog_slope(steps, err) - 2) < 0.3


def test_flat_problem_validates_its_inputs(digits64):
    p = logistic_problem(digits64)
    with pytest.raises(ValueError, match="wd"):
        FlatProblem(p.model, loss_fn, p.inputs, p.targets, wd=-1.0)
    with pytest.raises(ValueError, match="flat vector"):
        p.grad(torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="order"):
        p.vector_field(p.theta0, 0.1, 3)
    with pytest.raises(ValueError, match="lr"):
        p.vector_field(p.theta0, 0.0, 1)
    frozen = nn.Linear(2, 2)
    frozen.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable"):
        FlatProblem(frozen, loss_fn, None, None)


# --- the modified equation -------------------------------------------------------------------------

def test_modified_vector_field_on_a_quadratic_is_the_series_of_log(digits64):
    """GD on ½θᵀAθ is θ_k = (I − ηA)^k θ_0, the exact flow of θ̇ = η⁻¹ log(I − ηA) θ
    = −(A + ηA²/2 + η²A³/3 + …) θ; orders 0, 1, 2 must be its partial sums."""
    p, a = quadratic_problem([3.0, 1.0, 0.5, 0.2, 0.1])
    theta, lr = p.theta0, 0.07
    partial = [-a @ theta, -(lr / 2) * a @ a @ theta, -(lr**2 / 3) * a @ a @ a @ theta]
    for order in (0, 1, 2):
        expected = sum(partial[: order + 1])
        assert torch.allclose(p.vector_field(theta, lr, order), expected, rtol=0, atol=1e-14)


def test_global_error_orders_on_a_smooth_non_quadratic_loss(digits64):
    p = logistic_problem(digits64, n=100)
    lrs, horizon = [0.2, 0.1, 0.05], 0.6
    runs = [discretisation_error(p, p.theta0, lr, round(horizon / lr), rtol=1e-11, atol=1e-13) for lr in lrs]
    for r in runs:
        assert all(r.errors[q][0] == 0 for q in (0, 1, 2))
        assert r.t[-1] == pytest.approx(horizon)
    for order in (0, 1, 2):
        slope = loglog_slope(lrs, [r.errors[order][-1] for r in runs])
        assert abs(slope - (order + 1)) < 0.2, (order, slope)


def test_local_error_of_one_step_has_order_p_plus_2(digits64):
    p = logistic_problem(digits64)
    errors = {}
    for lr in (0.1, 0.05):
        gd = gradient_descent(p, p.theta0, lr, 1)[-1]
        for order in (0, 1, 2):
            flow = integrate_flow(p, p.theta0, [0.0, lr], lr, order, rtol=1e-13, atol=1e-15).theta
            assert np.array_equal(flow[0], p.theta0.numpy())
            errors[lr, order] = np.linalg.norm(gd - flow[-1])
    for order in (0, 1, 2):
        assert abs(math.log2(errors[0.1, order] / errors[0.05, order]) - (order + 2)) < 0.3, (order, errors)


def test_integrate_flow_and_gradient_descent_validate(digits64):
    p = logistic_problem(digits64)
    with pytest.raises(ValueError, match="t_eval"):
        integrate_flow(p, p.theta0, [1.0, 0.5])
    with pytest.raises(ValueError, match="t_eval"):
        integrate_flow(p, p.theta0, [-1.0])
    with pytest.raises(ValueError, match="rtol"):
        integrate_flow(p, p.theta0, [1.0], rtol=0)
    with pytest.raises(ValueError, match="lr"):
        gradient_descent(p, p.theta0, 0.0, 3)
    with pytest.raises(ValueError, match="steps"):
        discretisation_error(p, p.theta0, 0.1, 0)


# --- scale invariance --------------------------------------------------------------------------------

def test_norm_rates_of_the_modified_flows_on_a_scale_invariant_loss(digits64):
    """2⟨θ, F₁⟩ = η‖∇L‖², 2⟨θ, F₂⟩ = η‖∇L‖² + η²∇LᵀH∇L (chapter 5, lemma on norm dynamics)."""
    p = invariant_problem(digits64)
    theta, lr = p.theta0, 0.3
    g = p.grad(theta)
    gg, ghg = g.square().sum(), torch.dot(g, p.hvp(theta, g))
    assert abs(2 * torch.dot(theta, p.vector_field(theta, lr, 0))) < 1e-14 * gg
    assert torch.isclose(2 * torch.dot(theta, p.vector_field(theta, lr, 1)), lr * gg, rtol=1e-11, atol=0)
    assert torch.isclose(2 * torch.dot(theta, p.vector_field(theta, lr, 2)), lr * gg + lr**2 * ghg, rtol=1e-11, atol=0)
    assert torch.isclose(torch.dot(theta, p.third(theta, g)), -2 * ghg, rtol=1e-10, atol=0)


def test_gradient_flow_conserves_the_norm_and_gradient_descent_grows_it(digits64):
    p = invariant_problem(digits64)
    flow = integrate_flow(p, p.theta0, np.linspace(0, 1.0, 5), rtol=1e-10, atol=1e-12)
    norms = np.linalg.norm(flow.theta, axis=1)
    assert np.abs(norms / norms[0] - 1).max() < 1e-9
    gd = gradient_descent(p, p.theta0, 0.25, 4)
    assert np.all(np.diff(np.linalg.norm(gd, axis=1)) > 0)


@pytest.mark.slow
def test_gradient_flow_with_weight_decay_is_reparametrised_gradient_flow(digits64):
    wd, ts = 0.3, np.linspace(0, 1.0, 6)
    plain, decayed = invariant_problem(digits64, n=64), invariant_problem(digits64, n=64, wd=wd)
    theta = decayed.theta0
    with_wd = integrate_flow(decayed, theta, ts, rtol=1e-11, atol=1e-13).theta
    phi = integrate_flow(plain, theta, reparametrised_time(ts, wd), rtol=1e-11, atol=1e-13).theta
    err = np.linalg.norm(with_wd - np.exp(-wd * ts)[:, None] * phi, axis=1) / np.linalg.norm(with_wd, axis=1)
    assert err.max() < 1e-8
    # and without the reparametrisation the two differ by far more than that
    naive = integrate_flow(plain, theta, ts, rtol=1e-11, atol=1e-13).theta
    assert (np.linalg.norm(with_wd - np.exp(-wd * ts)[:, None] * naive, axis=1)[-1] / np.linalg.norm(with_wd[-1])) > 1e-3


def test_reparametrised_time():
    t = np.array([0.0, 0.5, 2.0])
    assert np.array_equal(reparametrised_time(t, 0.0), t)
    tau = reparametrised_time(t, 0.2)
    assert tau[0] == 0 and np.allclose(tau, (np.exp(0.4 * t) - 1) / 0.4)
    h = 1e-6
    assert (reparametrised_time(h, 0.2) - 0) / h == pytest.approx(1.0, rel=1e-5)   # τ'(0) = 1
    with pytest.raises(ValueError, match="wd"):
        reparametrised_time(t, -0.1)


# --- translation invariance --------------------------------------------------------------------------

@pytest.mark.slow
def test_softmax_bias_sum_is_conserved_by_gd_flows_and_counter_terms(digits64):
    p = invariant_problem(digits64, trainable_bias=True)
    bias = p.slices()["6.bias"]
    u = torch.zeros(p.n, dtype=torch.float64)
    u[bias] = 1.0
    theta = p.theta0
    g = p.grad(theta)
    assert abs(torch.dot(g, u)) < 1e-15
    assert p.hvp(theta, u).norm() < 1e-14
    for order in (1, 2):
        assert abs(torch.dot(p.vector_field(theta, 0.5, order), u)) < 1e-14
    gd = gradient_descent(p, theta, 0.5, 10)
    assert np.abs(gd[:, bias].sum(axis=1) - gd[0, bias].sum()).max() < 1e-13
    assert np.abs(gd[-1, bias] - gd[0, bias]).max() > 1e-3               # while the biases move
    flow = integrate_flow(p, theta, [0.0, 2.0], 0.5, 1, rtol=1e-9, atol=1e-11).theta
    assert abs(flow[-1, bias].sum() - flow[0, bias].sum()) < 1e-13


# --- SGD with weight decay -----------------------------------------------------------------------------

@pytest.mark.slow
def test_angular_updates_obey_the_exact_right_triangle_identity(digits64):
    """Without momentum, cos∠(θ_k, θ_{k+1}) = (1 − ηλ)‖θ_k‖/‖θ_{k+1}‖ on a scale-invariant loss."""
    model = invariant_bn_mlp(hidden=(8, 8))
    lr, wd = 0.3, 0.02
    batches = [(digits64.x_train[i], digits64.y_train[i]) for i in batch_schedule(len(digits64.y_train), 64, 10)]
    params = [p for p in model.parameters() if p.requires_grad]
    norms = [torch.cat([q.detach().reshape(-1) for q in params]).norm().item()]

    angles = angular_updates(model, loss_fn, batches[:1], lr, wd)["all"]
    norms.append(torch.cat([q.detach().reshape(-1) for q in params]).norm().item())
    assert math.cos(angles[0]) == pytest.approx((1 - lr * wd) * norms[0] / norms[1], rel=1e-12)
    more = angular_updates(model, loss_fn, batches[1:], lr, wd)
    assert set(more) == {"0.weight", "3.weight", "all"} and all(len(a) == 9 for a in more.values())
    assert np.all(more["all"] > 0)


def test_angular_updates_validate():
    model = invariant_bn_mlp(hidden=(4,))
    with pytest.raises(ValueError, match="momentum"):
        angular_updates(model, loss_fn, [], 0.1, 0.0, momentum=1.0)
    with pytest.raises(ValueError, match="not trainable"):
        angular_updates(model, loss_fn, [], 0.1, 0.0, groups={"x": ["2.weight"]})


def test_gd_with_weight_decay_below_the_edge_descends_and_shrinks_the_norm(digits64):
    """The two facts behind Li & Arora's Section 4 argument (chapter 5, proposition prop-edge): ‖∇R‖² =
    ‖∇L‖² + λ²‖θ‖² (the gradient of L is orthogonal to θ), and with η·λ_max(∇²R) < 2 GD descends R."""
    wd = 0.2
    plain, decayed = invariant_problem(digits64, n=64), invariant_problem(digits64, n=64, wd=wd)
    theta = decayed.theta0
    gr, gl = decayed.grad(theta), plain.grad(theta)
    assert torch.isclose(gr.square().sum(), gl.square().sum() + wd**2 * theta.square().sum(), rtol=1e-12, atol=0)
    lr = 0.1 / top_eigenvalue(decayed, theta)                  # η·λ_max = 0.1 at the start
    gd = gradient_descent(decayed, theta, lr, 10)
    assert all(lr * top_eigenvalue(decayed, th, tol=1e-6) < 2 for th in gd[::5])
    assert np.all(np.diff([decayed.loss(th) for th in gd]) < 0)
    assert np.all(np.diff(np.linalg.norm(gd, axis=1)) < 0)
