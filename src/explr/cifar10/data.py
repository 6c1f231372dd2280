"""CIFAR-10 on the training device: :class:`DeviceData`, the augmenting sampler, and :class:`EpochPlan`.

Loading the arrays is :mod:`~explr.cifar10.sources`' (:func:`~explr.cifar10.sources.load_cifar10`), with
:mod:`~explr.cifar10.arrays` (:class:`~explr.cifar10.arrays.CifarArrays`, ``.npz``, the decode cache) and
:mod:`~explr.cifar10.image_folder` (image-folder trees and their archives).

:class:`DeviceData` keeps the whole dataset on the training device as uint8 and produces normalised,
augmented batches there (random 32×32 crop of the zero-padded 40×40 image, horizontal flip with
probability ½, a fresh permutation every epoch -- the standard CIFAR recipe of He et al. 2016), with
one gather per batch and no per-image Python.  The randomness of epoch ``e`` is drawn on the CPU
from ``(seed, e)`` alone, so a run is reproducible across devices and resumes exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..params import is_int
from .arrays import CifarArrays

__all__ = ["DeviceData", "EpochPlan"]


# ----------------------------------------------------------------------------- on-device sampler
@dataclass(frozen=True)
class EpochPlan:
    """One epoch's randomness on the device: example order, crop offsets and flips (length ``steps·batch``)."""

    epoch: int
    index: torch.Tensor  # (n,) example ids, in the order they are used
    base: torch.Tensor  # (n,) pixel offset of each example's crop window in the padded uint8 store
    flip: torch.Tensor  # (n, 1) bool
    steps: int
    batch_size: int


def _epoch_seed(seed: int, epoch: int) -> int:
    return int(np.random.SeedSequence([int(seed), int(epoch), 0xC1FA]).generate_state(1, np.uint64)[0] >> 1)


class DeviceData:
    """The dataset on ``device`` as uint8, batched, augmented and normalised there.

    ``mean``/``std`` (per channel, in [0, 1] units) default to the training set's own statistics.
    Training batches: ``x = (crop_flip(x_uint8) / 255 − mean) / std``, returned as ``(B, 3, H, W)``
    in channels_last memory format (or contiguous NCHW with ``channels_last=False``), in ``dtype``.
    Each epoch uses ``steps = n_train // batch_size`` full batches (the remainder of the permutation
    is skipped, so every step has the same shape).
    """

    def __init__(self, arrays: CifarArrays, device="cpu", dtype=torch.float32, channels_last=True,
                 pad: int = 4, augment: bool = True, mean=None, std=None):
        if not (is_int(pad) and pad >= 0):
            raise ValueError(f"pad must be an integer >= 0; got {pad!r}")
        self.device = torch.device(device)
        self.dtype, self.channels_last, self.pad, self.augment = dtype, channels_last, pad, augment
        x = arrays.x_train
        self.n_train, self.h, self.w, self.c = x.shape
        self.n_test = len(arrays.y_test)
        if mean is None or std is None:
            mean, std = arrays.channel_stats
        self.mean = np.asarray(mean, dtype=np.float64)
        self.std = np.asarray(std, dtype=np.float64)
        if self.mean.shape != (self.c,) or self.std.shape != (self.c,) or not np.all(self.std > 0):
            raise ValueError(f"mean and std must have {self.c} entries, std > 0; got {mean!r}, {std!r}")
        # (x/255 − mean)/std = x·scale + shift
        self._scale = torch.tensor(1.0 / (255.0 * self.std), dtype=dtype, device=self.device)
        self._shift = torch.tensor(-self.mean / self.std, dtype=dtype, device=self.device)
        p = pad
        padded = np.zeros((self.n_train, self.h + 2 * p, self.w + 2 * p, self.c), dtype=np.uint8)
        padded[:, p:p + self.h, p:p + self.w] = x
        self.hp, self.wp = self.h + 2 * p, self.w + 2 * p
        self._train = torch.from_numpy(padded).to(self.device).reshape(-1, self.c)  # one row per padded pixel
        self._y_train = torch.from_numpy(arrays.y_train).to(self.device)
        self._test = torch.from_numpy(np.ascontiguousarray(arrays.x_test)).to(self.device)
        self._y_test = torch.from_numpy(arrays.y_test).to(self.device)
        # pixel offsets inside one crop window of the padded store: rows (1, H, 1), columns (1, W)
        ar_h = torch.arange(self.h, device=self.device)
        ar_w = torch.arange(self.w, device=self.device)
        self._rows = (ar_h * self.wp).view(1, self.h, 1)
        self._cols = ar_w.view(1, self.w)
        self._cols_flipped = (self.w - 1 - ar_w).view(1, self.w)

    def steps_per_epoch(self, batch_size: int) -> int:
        if not (is_int(batch_size) and 1 <= batch_size <= self.n_train):
            raise ValueError(f"batch_size must be an integer in [1, n_train = {self.n_train}]; got {batch_size!r}")
        return self.n_train // batch_size

    def epoch_plan(self, seed: int, epoch: int, batch_size: int) -> EpochPlan:
        """The permutation, crop offsets and flips of ``epoch``, drawn on the CPU from ``(seed, epoch)``."""
        steps = self.steps_per_epoch(batch_size)
        n = self.n_train
        g = torch.Generator().manual_seed(_epoch_seed(seed, epoch))
        index = torch.randperm(n, generator=g)
        if self.augment:
            oy = torch.randint(0, 2 * self.pad + 1, (n,), generator=g)
            ox = torch.randint(0, 2 * self.pad + 1, (n,), generator=g)
            flip = torch.randint(0, 2, (n,), generator=g).bool()
        else:
            oy = ox = torch.full((n,), self.pad)
            flip = torch.zeros(n, dtype=torch.bool)
        base = index * (self.hp * self.wp) + oy * self.wp + ox
        dev = self.device
        return EpochPlan(epoch, index.to(dev), base.to(dev), flip.view(n, 1).to(dev), steps, batch_size)

    def _normalise(self, x_uint8: torch.Tensor) -> torch.Tensor:
        x = torch.addcmul(self._shift, x_uint8.to(self.dtype), self._scale)  # (B, H, W, C)
        x = x.permute(0, 3, 1, 2)  # NCHW view with channels_last strides
        return x if self.channels_last else x.contiguous()

    def train_batch(self, plan: EpochPlan, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch ``step`` of ``plan``: augmented, normalised images and their labels (one pixel gather)."""
        s = slice(step * plan.batch_size, (step + 1) * plan.batch_size)
        cols = torch.where(plan.flip[s], self._cols_flipped, self._cols)  # (B, W), reversed where flipped
        idx = plan.base[s].view(-1, 1, 1) + self._rows + cols.view(-1, 1, self.w)  # (B, H, W) pixel ids
        x = self._train.index_select(0, idx.view(-1)).view(-1, self.h, self.w, self.c)
        return self._normalise(x), self._y_train[plan.index[s]]

    def test_batches(self, batch_size: int = 1000):
        """The test set in order, normalised, no augmentation."""
        for i in range(0, self.n_test, batch_size):
            yield self._normalise(self._test[i:i + batch_size]), self._y_test[i:i + batch_size]
