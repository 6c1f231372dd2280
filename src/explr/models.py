"""Networks used in the book.

``bn_mlp``: a small batch-normalised MLP for the 8×8 digits (chapters 1--3 and 5).
``PreResNet``: the pre-activation ResNet for CIFAR (He et al. 2016, "Identity mappings in
deep residual networks"), depth 6n+2, in the scale-invariant form of Li & Arora (2020), Section 5.
"""
from __future__ import annotations

import torch
from torch import nn

from .invariance import make_scale_invariant
from .params import MAX_SEED, Float, Int, checked

__all__ = ["bn_mlp", "invariant_bn_mlp", "PreActBlock", "PreResNet", "rescale_running_statistics"]


def _seed(seed) -> None:
    """Seed torch's generator when ``seed`` is not None (an integer in [0, 2**64 − 1], what torch accepts)."""
    if seed is not None:
        torch.manual_seed(int(checked("seed", seed, Int(0, maximum=MAX_SEED))))


def bn_mlp(in_features=64, hidden=(64, 64), classes=10, eps=1e-5, running_stats=False, seed=None):
    """Linear → BatchNorm1d(``eps``) → ReLU blocks, then a linear classifier, initialised from ``seed``.

    ``running_stats=False``: BN uses batch statistics in eval mode too, which keeps the network scale invariant
    (then :func:`explr.invariance.make_scale_invariant` freezes what breaks invariance).
    """
    eps = float(checked("eps", eps, Float(0)))
    _seed(seed)
    layers, width = [], in_features
    for h in hidden:
        layers += [nn.Linear(width, h), nn.BatchNorm1d(h, eps=eps, track_running_stats=running_stats), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def invariant_bn_mlp(hidden=(64, 64), eps=1e-300, dtype=torch.float64, seed=0, **kwargs) -> nn.Sequential:
    """The digits BN MLP of the exactness experiments, exactly scale invariant: :func:`bn_mlp` (``kwargs`` too) with a
    tiny ``eps`` and batch statistics, in ``dtype``, then :func:`explr.invariance.make_scale_invariant`."""
    model = bn_mlp(hidden=hidden, eps=eps, seed=seed, **kwargs).to(dtype)
    make_scale_invariant(model)
    return model


class PreActBlock(nn.Module):
    """BN → ReLU → conv3×3(stride) → BN → ReLU → conv3×3, plus the shortcut: the identity, or where the shape
    changes a 1×1 conv of relu(bn1(x)) (He et al. 2016); no biases, so homogeneous of degree 1 in the weights."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1, eps: float = 1e-5):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes, eps=eps)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes, eps=eps)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.shortcut = (
            nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False) if stride != 1 or in_planes != planes else None
        )

    def forward(self, x):
        """relu(bn1(x)) → conv1 → relu(bn2) → conv2, plus the shortcut (x, or a 1×1 conv of relu(bn1(x)))."""
        out = torch.relu(self.bn1(x))
        short = x if self.shortcut is None else self.shortcut(out)
        out = self.conv1(out)
        out = self.conv2(torch.relu(self.bn2(out)))
        return out + short


class PreResNet(nn.Module):
    """Pre-activation ResNet for 32×32 images, depth = 6n + 2 (the paper uses 32): conv3×3(3→16) → three stages of
    n :class:`PreActBlock` (16, 32, 64 channels) → BN → ReLU → global average pool → linear(64 → classes).

    ``invariant=True`` (Li & Arora 2020, Sec. 5): :func:`explr.invariance.make_scale_invariant` freezes BN's affine
    parameters and the last layer, so L(cθ) = L(θ) up to BN's eps.  ``seed``: the same network on any device.
    """

    def __init__(self, depth: int = 32, classes: int = 10, invariant: bool = True, eps: float = 1e-5, seed=None):
        super().__init__()
        depth = int(checked("depth", depth, Int(8, modulo=(6, 2), note=" (8, 14, 20, 32, 56, 110, ...)")))
        classes = int(checked("classes", classes, Int(2)))
        eps = float(checked("eps", eps, Float(0)))
        _seed(seed)
        n = (depth - 2) // 6
        self.depth, self.invariant = depth, invariant
        self.conv = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        blocks, planes_in = [], 16
        for stage, planes in enumerate((16, 32, 64)):
            for i in range(n):
                blocks.append(PreActBlock(planes_in, planes, stride=2 if stage > 0 and i == 0 else 1, eps=eps))
                planes_in = planes
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(64, eps=eps)
        self.fc = nn.Linear(64, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        if invariant:
            make_scale_invariant(self, last_layer=self.fc)

    def forward(self, x):
        """The logits of images x (N, 3, H, W): conv → blocks → relu(bn) → global average pool → fc."""
        x = self.blocks(self.conv(x))
        x = torch.relu(self.bn(x))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


@torch.no_grad()
def rescale_running_statistics(model: nn.Module, c: float) -> None:
    """After θ → cθ: running_mean → c·mean, running_var → c²·var in every module that has both buffers, so an
    eval-mode network whose normalisation inputs are homogeneous in θ stays the same function."""
    for m in model.modules():
        mean, var = getattr(m, "running_mean", None), getattr(m, "running_var", None)
        if isinstance(mean, torch.Tensor) and isinstance(var, torch.Tensor):
            mean.mul_(c)
            var.mul_(c * c)
