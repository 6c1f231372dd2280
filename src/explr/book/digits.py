"""scikit-learn's 8×8 handwritten digits (1,797 images, 10 classes, no download): real data for runs that must be
exact (float64) or take seconds on a CPU."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Digits", "load_digits", "batch_schedule"]


@dataclass(frozen=True)
class Digits:
    """Standardised digits split into train and test tensors (flattened 64-pixel rows)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def load_digits(dtype=torch.float64, test_fraction: float = 0.25, seed: int = 0) -> Digits:
    """Load the digits, shuffle with ``seed``, split, and standardise each pixel with train statistics."""
    from sklearn.datasets import load_digits as _sklearn_digits

    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1); got {test_fraction!r}")
    data = _sklearn_digits()
    order = np.random.default_rng(seed).permutation(len(data.target))
    x, y = data.data[order].astype(np.float64), data.target[order].astype(np.int64)
    n_test = int(round(test_fraction * len(y)))
    x_train, x_test = x[n_test:], x[:n_test]
    mean, std = x_train.mean(0), x_train.std(0) + 1.0  # +1: some border pixels are always 0
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    as_x = lambda a: torch.as_tensor(a, dtype=dtype)  # noqa: E731
    return Digits(as_x(x_train), torch.as_tensor(y[n_test:]), as_x(x_test), torch.as_tensor(y[:n_test]))


def batch_schedule(n_examples: int, batch_size: int, steps: int, seed: int = 0) -> torch.Tensor:
    """(steps, batch_size) example indices, reshuffled each epoch, drop-last, from ``seed``: the batches that two
    runs compared step by step share."""
    if not 1 <= batch_size <= n_examples:
        raise ValueError(f"batch_size must be in [1, {n_examples}]; got {batch_size!r}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1; got {steps!r}")
    g = torch.Generator().manual_seed(seed)
    per_epoch = n_examples // batch_size
    epochs = -(-steps // per_epoch)
    perms = [torch.randperm(n_examples, generator=g)[: per_epoch * batch_size] for _ in range(epochs)]
    return torch.cat(perms).view(-1, batch_size)[:steps]
