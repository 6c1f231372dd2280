"""Networks used in the book.

``bn_mlp``: a small batch-normalised MLP for the 8×8 digits (chapters 1--3 and 5).
"""
from __future__ import annotations

from torch import nn

__all__ = ["bn_mlp"]


def bn_mlp(in_features=64, hidden=(64, 64), classes=10, eps=1e-5, running_stats=False, seed=None):
    """Linear → BatchNorm1d → ReLU blocks, then a linear classifier.

    ``eps``: BN's epsilon (1e-5 by default; the exactness experiments use ~1e-300 in float64,
    since torch refuses exactly 0).  ``running_stats=False`` makes BN use batch statistics in
    eval mode too (``track_running_stats=False``), which keeps the network scale invariant;
    ``True`` gives the usual running averages.  ``seed`` makes the initialisation reproducible.
    Call :func:`explr.invariance.make_scale_invariant` on it to freeze what breaks invariance.
    """
    import torch

    if seed is not None:
        torch.manual_seed(seed)
    layers, width = [], in_features
    for h in hidden:
        layers += [nn.Linear(width, h), nn.BatchNorm1d(h, eps=eps, track_running_stats=running_stats), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)
