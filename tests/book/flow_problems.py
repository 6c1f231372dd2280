"""Small FlatProblems shared by the tests of explr.book.flow and explr.book.sharpness (imported by
name, like digits_helpers)."""
import torch
import torch.nn.functional as F
from torch import nn

from explr.book.flow import FlatProblem, composite_batchnorm, smooth_activations
from explr.models import invariant_bn_mlp

loss_fn = F.cross_entropy


class Quadratic(nn.Module):
    """L(w) = ½ wᵀAw, the input ignored: every derivative is known in closed form."""

    def __init__(self, a):
        super().__init__()
        self.register_buffer("a", a)
        self.w = nn.Parameter(torch.linspace(-1.0, 1.0, a.shape[0], dtype=a.dtype))

    def forward(self, x):
        return 0.5 * self.w @ self.a @ self.w


def quadratic_problem(eigenvalues, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(len(eigenvalues), len(eigenvalues), generator=g, dtype=torch.float64))
    a = q @ torch.diag(torch.tensor(eigenvalues, dtype=torch.float64)) @ q.T
    return FlatProblem(Quadratic(a), lambda out, y: out, None, None), a


def logistic_problem(data, n=200):
    torch.manual_seed(0)
    model = nn.Linear(64, 10).double()
    return FlatProblem(model, loss_fn, data.x_train[:n], data.y_train[:n])


def invariant_problem(data, n=128, hidden=6, trainable_bias=False, wd=0.0):
    model = composite_batchnorm(smooth_activations(invariant_bn_mlp(hidden=(hidden, hidden))))
    if trainable_bias:
        model[-1].bias.requires_grad_(True)
    return FlatProblem(model, loss_fn, data.x_train[:n], data.y_train[:n], wd=wd)
