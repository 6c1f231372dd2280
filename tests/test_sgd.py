"""explr.sgd: the paper's convention is torch.optim.SGD, and train_sgd records and validates; Lemma B.1 (norm growth
with momentum), the recorded per-step norms, and the step at which an exponential schedule leaves float32."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from explr.models import invariant_bn_mlp
from explr.schedules import alpha, exp_lr
from explr.sgd import exp_lr_overflow_step, norm_recursion, train_sgd

from digits_helpers import digit_batches


def paper_sgd_step(theta, theta_prev, lr, lr_prev, grad, wd, momentum):
    """Definition 1.2 literally: θ_t from θ_{t−1} = ``theta``, θ_{t−2} = ``theta_prev``, η_{t−1} = ``lr``,
    η_{t−2} = ``lr_prev``, ∇L(θ_{t−1}) = ``grad`` and λ_{t−1} = ``wd``."""
    velocity = momentum * (theta - theta_prev) / lr_prev - (grad + wd * theta)
    return theta + lr * velocity


def test_torch_sgd_is_the_papers_recursion():
    """Definition 1.2 with θ_{−1} = θ_0 (zero initial momentum) and torch.optim.SGD agree step by step."""
    rng = np.random.default_rng(0)
    A = torch.tensor(rng.normal(size=(5, 5)), dtype=torch.float64)
    A = A @ A.T
    grad_fn = lambda th: A @ th  # noqa: E731  (gradient of ½ θᵀAθ)
    lrs, wds, gamma = rng.uniform(0.01, 0.1, 50), rng.uniform(0, 0.1, 50), 0.9
    p = torch.nn.Parameter(torch.tensor(rng.normal(size=5), dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=lrs[0], momentum=gamma)
    theta, theta_prev, lr_prev = p.detach().clone(), p.detach().clone(), lrs[0]
    for k in range(50):
        opt.param_groups[0].update(lr=lrs[k], weight_decay=wds[k])
        p.grad = grad_fn(p.detach())
        opt.step()
        theta, theta_prev, lr_prev = paper_sgd_step(theta, theta_prev, lrs[k], lr_prev, grad_fn(theta), wds[k], gamma), theta, lrs[k]
        torch.testing.assert_close(p.detach(), theta, rtol=1e-12, atol=1e-12)


def test_train_sgd_records_and_validates(digits64):
    batches = digit_batches(digits64, 20)
    traj = train_sgd(invariant_bn_mlp(), F.cross_entropy, batches, np.full(20, 0.1), 5e-4, 0.9,
                     probe=digits64.x_test[:8], record_every=5)
    assert list(traj.steps) == [0, 5, 10, 15, 20]
    assert traj.outputs.shape == (5, 8, 10) and traj.losses.shape == (20,) and traj.rescale == 1.0
    with pytest.raises(ValueError, match="batches has 20 entries but the schedule has 30 steps"):
        train_sgd(invariant_bn_mlp(), F.cross_entropy, batches, np.full(30, 0.1))
    with pytest.raises(ValueError, match="record_every"):
        train_sgd(invariant_bn_mlp(), F.cross_entropy, batches, np.full(20, 0.1), record_every=0)


# ----------------------------------------------------------------------------- norm growth
@pytest.mark.usefixtures("one_thread")
class TestNormRecursion:
    """Lemma B.1 (norm growth with momentum), the recorded per-step norms, and the step at which an exponential
    schedule leaves float32."""

    def test_recorded_norms_and_updates_are_those_of_the_parameters(self, digits64):
        model = invariant_bn_mlp()
        before = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters() if p.requires_grad])
        traj = train_sgd(model, F.cross_entropy, digit_batches(digits64, 5), np.full(5, 0.1), 5e-4, 0.9, record_every=5)
        after = torch.cat([p.detach().reshape(-1) for p in model.parameters() if p.requires_grad])
        assert traj.sq_norms.shape == (6,) and traj.sq_updates.shape == (5,)
        assert math.isclose(traj.sq_norms[0], before.square().sum().item(), rel_tol=1e-14)
        assert math.isclose(traj.sq_norms[-1], after.square().sum().item(), rel_tol=1e-14)
        np.testing.assert_allclose(np.sqrt(traj.sq_norms[[0, -1]]), traj.norms, rtol=1e-14)

    @pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
    def test_lemma_b1_holds_at_every_step_without_weight_decay(self, digits64, momentum):
        """Constant LR (the lemma as stated) and a varying LR (γ_t = γ η_t/η_{t−1}), both without WD."""
        steps = 40
        for lr in (np.full(steps, 0.3), np.geomspace(0.05, 2.0, steps)):
            traj = train_sgd(invariant_bn_mlp(), F.cross_entropy, digit_batches(digits64, steps), lr, 0.0, momentum)
            growth = np.diff(traj.sq_norms)
            predicted = norm_recursion(traj.sq_norms, traj.sq_updates, lr, momentum)
            np.testing.assert_allclose(predicted, growth, rtol=1e-9, atol=1e-12 * traj.sq_norms[0])
            assert np.all(growth > 0)  # the norm never decreases

    def test_lemma_b1_fails_with_weight_decay(self, digits64):
        """Weight decay breaks ⟨update, θ⟩ = γ⟨previous update, θ⟩: the check is not vacuous."""
        steps, lr = 20, np.full(20, 0.3)
        traj = train_sgd(invariant_bn_mlp(), F.cross_entropy, digit_batches(digits64, steps), lr, 5e-2, 0.9)
        predicted = norm_recursion(traj.sq_norms, traj.sq_updates, lr, 0.9)
        assert np.abs(predicted - np.diff(traj.sq_norms)).max() > 1e-3 * traj.sq_norms[0]

    def test_norm_recursion_validates_lengths(self):
        with pytest.raises(ValueError, match="T \\+ 1 squared norms"):
            norm_recursion(np.ones(5), np.ones(5), np.ones(5), 0.9)

    @pytest.mark.parametrize("lr, wd, momentum", [(0.1, 5e-4, 0.9), (0.1, 0.025, 0.9), (0.05, 1e-3, 0.0)])
    def test_overflow_step_is_the_first_step_above_float32(self, lr, wd, momentum):
        k = exp_lr_overflow_step(lr, wd, momentum)
        schedule = exp_lr(lr, wd, momentum, k + 1).lr
        limit = float(np.finfo(np.float32).max)
        assert schedule[k] > limit >= schedule[k - 1]
        a = alpha(lr, wd, momentum)
        assert math.isclose(k, math.log(limit / lr) / (-2 * math.log(a)), abs_tol=1)

    def test_overflow_step_values(self):
        assert exp_lr_overflow_step(0.1, 5e-4, 0.9) == 90591      # standard values: ~232 CIFAR-10 epochs of 391 steps
        assert exp_lr_overflow_step(0.1, 0.0, 0.9) is None        # no weight decay: a constant schedule
        with pytest.raises(ValueError, match="lr\\*wd"):
            exp_lr_overflow_step(0.1, 0.1, 0.9)
