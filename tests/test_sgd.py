"""explr.sgd: the paper's convention is torch.optim.SGD, and train_sgd records and validates."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from explr.models import invariant_bn_mlp
from explr.sgd import paper_sgd_step, train_sgd

from digits_helpers import digit_batches


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
