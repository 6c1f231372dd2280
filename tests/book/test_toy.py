"""explr.book.toy: the BN + WD counterexample of Li & Arora, Sec. 3 (data, models, vectorised SGD, theorem quantities)."""
import math

import numpy as np
import pytest
import torch

from explr.book.toy import (
    MODELS,
    check_window_claim,
    loss_grad,
    population_grad,
    sample_batch,
    simulate,
    theorem_W1,
    theorem_W2,
    training_error,
)
from explr.invariance import angular_identity_gap, equilibrium_step_angle

ALL = tuple(MODELS)


def _flags(models, wd, dtype=torch.float64):
    bn = torch.tensor([MODELS[m][0] for m in models]).view(-1, 1, 1)
    lam = torch.tensor([wd if MODELS[m][1] else 0.0 for m in models], dtype=dtype).view(-1, 1, 1)
    return bn, lam


def logistic_loss(w, x, y, model: str, wd: float = 0.0):
    """The reference for loss_grad, written plainly for autograd: the batch-mean logistic loss of the margin
    y f(x), f = wᵀx (or wᵀx/‖w‖ with BN), plus (λ/2)‖w‖² for the models with weight decay."""
    bn, uses_wd = MODELS[model]
    f = torch.einsum("...m,...bm->...b", w, x)
    loss = torch.nn.functional.softplus(-y * (f / w.norm(dim=-1, keepdim=True) if bn else f)).mean(-1)
    return loss + 0.5 * wd * (w * w).sum(-1) if uses_wd else loss


def test_analytic_gradient_matches_autograd_for_all_three_models():
    gen = torch.Generator().manual_seed(1)
    S, B, m, wd = 5, 7, 6, 0.3
    x, y = sample_batch(S, B, m, gen)
    w = torch.randn(len(ALL), S, m, generator=gen, dtype=torch.float64) * torch.tensor([0.2, 1.0, 3.0]).view(-1, 1, 1)
    bn, lam = _flags(ALL, wd)
    analytic = loss_grad(w, x, y, bn, lam)
    for k, model in enumerate(ALL):
        wk = w[k].clone().requires_grad_(True)
        logistic_loss(wk, x, y, model, wd).sum().backward()
        torch.testing.assert_close(analytic[k], wk.grad, rtol=1e-12, atol=1e-14)


def test_bn_gradient_is_orthogonal_to_w_and_scales_like_one_over_norm():
    """Lemma 1.3 on the toy: ⟨∇L(w), w⟩ = 0 and ∇L(cw) = ∇L(w)/c for the BN model without WD."""
    gen = torch.Generator().manual_seed(2)
    x, y = sample_batch(4, 16, 5, gen)
    w = torch.randn(1, 4, 5, generator=gen, dtype=torch.float64)
    bn, lam = _flags(("bn",), 0.0)
    g = loss_grad(w, x, y, bn, lam)
    assert (g * w).sum(-1).abs().max() < 1e-14
    torch.testing.assert_close(loss_grad(7.0 * w, x, y, bn, lam), g / 7.0, rtol=1e-12, atol=1e-15)


def test_population_gradient_is_the_mean_stochastic_gradient():
    """E ℓ(y uᵀx) = C − u_1/√(2π): the batch-mean gradient of a huge batch matches the closed form."""
    gen = torch.Generator().manual_seed(3)
    n, m = 400_000, 4
    x, y = sample_batch(1, n, m, gen)
    for angle in (0.05, 1.0, 2.5):
        w = torch.zeros(2, 1, m, dtype=torch.float64)
        w[:, 0, 0], w[:, 0, 1] = math.cos(angle), math.sin(angle)
        w[1] *= 0.3  # another norm: the gradient scales like 1/‖w‖
        bn, lam = _flags(("bn+wd", "bn+wd"), 0.1)
        mc = loss_grad(w, x, y, bn, lam)
        exact = population_grad(w, 0.1)
        assert (mc - exact).norm() < 5 / math.sqrt(n) / 0.3, (angle, mc, exact)
        # the pull toward e_1 has size sin(angle)/(√(2π)‖w‖)
        pull = population_grad(w, 0.0).norm(dim=-1).squeeze(-1)
        torch.testing.assert_close(pull, math.sin(angle) / math.sqrt(2 * math.pi) / w.norm(dim=-1).squeeze(-1))
    # the loss itself: linear in cos∠(w, e_1)
    losses = []
    for angle in (0.0, 1.0, 2.0, 3.0):
        u = torch.zeros(1, m, dtype=torch.float64)
        u[0, 0], u[0, 1] = math.cos(angle), math.sin(angle)
        losses.append(logistic_loss(u, x, y, "bn").item() + math.cos(angle) / math.sqrt(2 * math.pi))
    assert max(losses) - min(losses) < 5e-3


def test_training_error_is_angle_over_pi():
    gen = torch.Generator().manual_seed(4)
    x, y = sample_batch(1, 200_000, 5, gen)
    for angle in (0.1, 0.7, 2.0):
        w = torch.tensor([math.cos(angle), 0.0, math.sin(angle), 0.0, 0.0], dtype=torch.float64)
        mc = (torch.sign(x[0] @ w) != y[0]).double().mean().item()
        assert abs(training_error(w).item() - angle / math.pi) < 1e-12
        assert abs(mc - angle / math.pi) < 4e-3
    assert abs(training_error(torch.tensor([-2.0, 0.0, 0.0], dtype=torch.float64)).item() - 1) < 1e-12 / math.pi


def test_vectorised_simulation_equals_a_loop_over_seeds_with_autograd():
    """The batched implementation reproduces plain per-seed SGD (autograd) on the same random draws."""
    S, B, m, steps, lr, wd = 3, 5, 4, 25, 0.3, 0.2
    run = simulate(ALL, steps=steps, seeds=S, batch_size=B, lr=lr, wd=wd, dim=m, seed=7, dtype=torch.float64)
    gen = torch.Generator().manual_seed(7)
    w0 = torch.randn(S, m, generator=gen, dtype=torch.float64)
    w0 = w0 / w0.norm(dim=-1, keepdim=True)
    batches = [sample_batch(S, B, m, gen) for _ in range(steps)]
    for k, model in enumerate(ALL):
        for s in range(S):
            w, errors = w0[s].clone(), []
            for x, y in batches:
                wv = w.clone().requires_grad_(True)
                logistic_loss(wv, x[s], y[s], model, wd).backward()
                w = w - lr * wv.grad
                errors.append(training_error(w).item())
            np.testing.assert_allclose(run.error[1:, k, s], errors, rtol=1e-10, atol=1e-13)
            assert abs(run.norm[-1, k, s] - w.norm().item()) < 1e-10


def test_models_share_init_and_batches_and_runs_are_reproducible():
    kw = dict(steps=30, seeds=4, batch_size=8, lr=0.1, wd=0.05, dim=5, seed=3, dtype=torch.float64)
    both = simulate(("wd", "bn+wd"), **kw)
    alone = simulate(("bn+wd",), **kw)
    np.testing.assert_allclose(both["bn+wd"][0], alone["bn+wd"][0], rtol=1e-12)
    np.testing.assert_array_equal(both.error[0, 0], both.error[0, 1])  # same starting point
    again = simulate(("wd", "bn+wd"), **kw)
    np.testing.assert_array_equal(both.error, again.error)
    assert both.error.shape == (31, 2, 4) and both.step_angle.shape == (30, 2, 4)
    other = simulate(("bn+wd",), **{**kw, "seed": 4})
    assert not np.allclose(other.error, alone.error)


def test_norm_dynamics_of_the_scale_invariant_models():
    """BN alone: ‖w‖ never decreases.  BN + WD: the exact identity mean(−ln cos θ) = −ln(1−ηλ) + drift."""
    lr, wd = 0.1, 0.05
    run = simulate(("bn", "bn+wd"), steps=1000, seeds=6, batch_size=16, lr=lr, wd=wd, dim=5, dtype=torch.float64)
    _, norm_bn, angle_bn = run["bn"]
    assert (np.diff(norm_bn, axis=0) >= -1e-15).all()
    _, norm, angle = run["bn+wd"]
    assert np.abs(angular_identity_gap(angle, norm, lr=lr, wd=wd)).max() < 1e-12
    assert np.abs(angular_identity_gap(angle_bn, norm_bn, lr=lr, wd=wd)).min() > 1e-3  # WD matters
    # in equilibrium (the last half: 500 steps = 2.5 relaxation times 1/(ηλ) in) the RMS step is ≈ √(2ηλ)
    rms = np.sqrt((angle[500:] ** 2).mean())
    assert abs(rms / equilibrium_step_angle(lr, wd) - 1) < 0.05
    with pytest.raises(ValueError, match="one more row"):
        angular_identity_gap(angle, norm[1:], lr=lr, wd=wd)


def test_theorem_quantities():
    kw = dict(lr=0.1, wd=0.05, eps=0.03, batch_size=64, dim=6)
    t1 = theorem_W1(np.array([1.0, 2.0]), **kw)
    expected = math.log(64 * 1.0 * 0.03 * 8 / (0.1 * 2)) / (2 * (0.005 - 2 * 0.03**2))
    assert abs(t1[0] - expected) < 1e-9
    assert abs(t1[1] - t1[0] - math.log(4) / (2 * (0.005 - 2 * 0.03**2))) < 1e-9
    assert theorem_W1(1e-3, **kw) == 0.0  # already below the proof's norm threshold
    assert abs(theorem_W2(0.01) - 9 * math.log(100)) < 1e-12
    with pytest.raises(ValueError, match=r"^eps = 0.06: must be a finite number in \(0, 0.05\) \(0 < eps < sqrt"):
        theorem_W1(1.0, **{**kw, "eps": 0.06})
    with pytest.raises(ValueError, match="^dim = 2: must be an integer >= 3$"):
        theorem_W1(1.0, **{**kw, "dim": 2})
    with pytest.raises(ValueError, match="delta"):
        theorem_W2(1.0)


def test_window_claim_counts_violations():
    kw = dict(lr=0.1, wd=0.05, eps=0.03, delta=0.5, batch_size=1, dim=3)
    n, level = 200, 0.03 / math.pi
    norm = np.full((n, 2), 0.01)  # tiny norm: W_1 = 0, windows of ⌊9 ln 2⌋ = 6 steps
    error = np.full((n, 2), 2 * level)
    check = check_window_claim(error, norm, **kw)
    assert check.violations == 0 and check.windows == 2 * (n - 6) and (check.length == 6).all()
    error[50:57, 1] = level  # 7 steps at (not above) the level: only the window t = 50..56 never exceeds it
    check = check_window_claim(error, norm, **kw)
    assert check.violations == 1 and abs(check.violation_rate - 1 / (2 * (n - 6))) < 1e-15
    assert check_window_claim(error, norm, starts=[50], **kw).violations == 1
    assert check_window_claim(error, norm, starts=[49], **kw).violations == 0
    with pytest.raises(ValueError, match="starts"):
        check_window_claim(error, norm, starts=[n], **kw)
    with pytest.raises(ValueError, match="shape"):
        check_window_claim(error, norm[:, :1], **kw)


def test_population_limit_is_gradient_descent_on_the_expected_loss():
    """batch_size = inf runs w <- w - η ∇E[loss] (no sampling); a huge batch follows it closely."""
    lr, wd, m = 0.1, 0.05, 4
    w0 = torch.tensor([[0.6, 0.8, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]], dtype=torch.float64)
    run = simulate(("bn", "bn+wd"), steps=5, seeds=2, batch_size=math.inf, lr=lr, wd=wd, dim=m, w0=w0,
                   dtype=torch.float64)
    for k, lam in enumerate((0.0, wd)):
        w = w0.clone()
        for _ in range(5):
            w = w - lr * population_grad(w, lam)
        np.testing.assert_allclose(run.norm[-1, k], w.norm(dim=-1).numpy(), rtol=1e-14)
        np.testing.assert_allclose(run.error[-1, k], training_error(w).numpy(), rtol=1e-13)
    huge = simulate(("bn+wd",), steps=5, seeds=2, batch_size=200_000, lr=lr, wd=wd, dim=m, w0=w0,
                    dtype=torch.float64)
    assert np.abs(huge.error[-1, 0] - run.error[-1, 1]).max() < 0.01
    assert run.batch_size == math.inf
    with pytest.raises(ValueError, match="BN models only"):
        simulate(("wd",), steps=2, seeds=1, batch_size=math.inf, lr=lr, wd=wd, dim=m)


def test_simulation_from_a_given_start():
    kw = dict(steps=3, seeds=2, batch_size=4, lr=0.1, wd=0.05, dim=3, dtype=torch.float64)
    run = simulate(("bn+wd",), w0=[5.0, 0.0, 0.0], **kw)
    np.testing.assert_array_equal(run.norm[0, 0], [5.0, 5.0])
    np.testing.assert_array_equal(run.error[0, 0], [0.0, 0.0])
    for bad in ([1.0, 0.0], [0.0, 0.0, 0.0], [[1.0, 0.0, 0.0]] * 3):
        with pytest.raises(ValueError, match="w0 must be"):
            simulate(("bn+wd",), w0=bad, **kw)
