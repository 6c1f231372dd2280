"""The hot loop of a CIFAR-10 run: :class:`DeviceData`, the dataset on the training device with its augmenting
sampler, and :class:`Trainer`, model, optimizer and schedule one epoch at a time.

The sampler crops a random 32×32 window of the zero-padded 40×40 image and flips it with probability ½ (He et al.
2016), one gather per batch; epoch ``e``'s randomness comes from ``(seed, e)`` alone, so a run resumes exactly.
The exponential schedules play through :class:`~explr.lr_scheduler.PerStepLR` with ``rescale_above``: (θ, v, lr) →
(cθ, v/c, c²lr), the same network (Li & Arora 2020, Lemma 2.6).  The loop syncs with the host every ``log_every``
steps; a mean loss that is not finite or exceeds :data:`EXPLODED` × the first one is :class:`TrainingDiverged`.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..invariance import flat_norm
from ..lr_scheduler import PerStepLR
from ..models import PreResNet
from ..params import is_int
from ..schedules import Schedule
from .config import TrainConfig, param_dtype, played_schedule, rescale_limit, resolve_device, resolve_precision
from .data import CifarArrays
from .runfolder import EpochMetrics

__all__ = ["DeviceData", "EXPLODED", "EpochPlan", "EpochState", "Trainer", "TrainingDiverged"]


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


#: a finite mean training loss above EXPLODED × the initial one counts as diverged.
EXPLODED = 100.0


class TrainingDiverged(RuntimeError):
    """The training loss became non-finite or exploded, or the weights non-finite; the last good checkpoint is kept."""


@dataclass
class EpochState:
    """One epoch in progress: its index, its plan (order, crops, flips) and the on-device metric sums."""

    epoch: int
    plan: EpochPlan
    loss_sum: torch.Tensor
    correct: torch.Tensor


def _exp(log_value: float) -> float | None:
    """e^x as a float, or None (JSON null) where it exceeds float64."""
    return math.exp(log_value) if log_value < 709.0 else None


def _ldexp(x: float, exponent: int) -> float | None:
    try:
        return math.ldexp(x, exponent)
    except OverflowError:
        return None


class Trainer:
    """Model, optimizer, scheduler and device data of one run; ``train_epoch`` is the hot loop.

    Built from a validated :class:`~explr.cifar10.config.TrainConfig` and in-memory
    :class:`~explr.cifar10.data.CifarArrays` (:func:`explr.cifar10.runs.train_prepared` adds the files,
    resume and progress bar).  ``device``, ``precision`` and ``schedule``: as the caller resolved and built them
    (:class:`~explr.cifar10.runs.PreparedRun`), else from ``config`` here; ``model``: the network to train
    instead of ``config``'s PreResNet (e.g. a PreResNet whose outputs break, to test divergence); it must be scale
    invariant for the exponential schedules.
    """

    def __init__(self, config: TrainConfig, arrays: CifarArrays, device: torch.device | None = None, *,
                 precision: str | None = None, schedule: Schedule | None = None,
                 model: torch.nn.Module | None = None):
        self.config = c = config
        self.device = device if device is not None else resolve_device(c.device)
        self.precision = precision if precision is not None else resolve_precision(c.precision, self.device)
        dtype = param_dtype(self.precision)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed shapes: let cuDNN pick the fastest convolutions
        self.data = DeviceData(arrays, self.device, dtype=dtype, channels_last=c.channels_last, augment=c.augment)
        self.steps_per_epoch = self.data.steps_per_epoch(c.batch_size)
        #: what the scheduler plays (``.log_lr``: ln of the schedule's lr, beyond float64's range if need be)
        self.schedule = schedule if schedule is not None else played_schedule(c, self.steps_per_epoch)
        limit = rescale_limit(c)
        if model is None:
            model = PreResNet(c.depth, invariant=c.invariant, eps=c.bn_eps, seed=c.seed)
        self.model = model.to(dtype)
        if c.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.model.to(self.device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        kwargs = {"fused": True} if self.device.type == "cuda" else {}
        self.optimizer = torch.optim.SGD(self.params, lr=self.schedule.first_lr, momentum=c.momentum, **kwargs)
        # the network is scale invariant by construction (validate() refuses exponential + --no-invariant)
        self.scheduler = PerStepLR(self.optimizer, self.schedule, rescale_above=limit, model=self.model,
                                   check_invariance=False)
        self.initial_loss = None  # mean training loss of the first log_every steps (divergence reference)
        self.forward = self.model if c.compile == "none" else torch.compile(
            self.model, mode=None if c.compile == "default" else c.compile)
        if self.precision == "bf16":
            self.autocast = lambda: torch.autocast(self.device.type, dtype=torch.bfloat16)
        else:
            self.autocast = contextlib.nullcontext
        self.acc_dtype = torch.float64 if self.precision == "fp64" else torch.float32

    def train_epoch(self, epoch: int, on_sync=None):
        """Train one epoch; returns (loss_sum, correct, n) as host numbers.

        ``on_sync(done_steps, loss_sum, correct, n)`` is called every ``log_every`` steps (the only host
        syncs inside the epoch besides the last one); divergence raises :class:`TrainingDiverged`.
        """
        state = self.begin_epoch(epoch)
        self.run_steps(state, 0, state.plan.steps, on_sync)
        return self.end_epoch(state)

    def begin_epoch(self, epoch: int) -> EpochState:
        """The epoch's plan (order, crops, flips) and zeroed on-device metric sums."""
        self.model.train()
        return EpochState(epoch, self.data.epoch_plan(self.config.seed, epoch, self.config.batch_size),
                          torch.zeros((), dtype=self.acc_dtype, device=self.device),
                          torch.zeros((), dtype=torch.int64, device=self.device))

    def run_steps(self, state: EpochState, start: int, stop: int, on_sync=None) -> None:
        """Steps ``start..stop-1`` of the epoch in ``state``: the hot loop, no host sync except every log_every."""
        c, data, plan = self.config, self.data, state.plan
        loss_sum, correct = state.loss_sum, state.correct
        forward, opt, scheduler = self.forward, self.optimizer, self.scheduler
        for k in range(start, stop):
            x, y = data.train_batch(plan, k)
            with self.autocast():
                out = forward(x)
                loss = F.cross_entropy(out, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            scheduler.step()
            loss_sum += loss.detach()
            correct += (out.detach().argmax(1) == y).sum()
            if (k + 1) % c.log_every == 0 and k + 1 < plan.steps:
                loss_now = loss_sum.item()
                self.check_loss(loss_now / (k + 1), f"epoch {state.epoch + 1} (by step {k + 1} of {plan.steps})")
                if on_sync is not None:
                    on_sync(k + 1, loss_now, correct.item(), (k + 1) * c.batch_size)

    def check_loss(self, mean_loss: float, where: str) -> None:
        """Raise :class:`TrainingDiverged` if ``mean_loss`` is non-finite or > EXPLODED × the initial loss."""
        if not math.isfinite(mean_loss):
            raise TrainingDiverged(f"non-finite training loss in {where}")
        if self.initial_loss is None:
            self.initial_loss = mean_loss
        elif mean_loss > EXPLODED * self.initial_loss:
            raise TrainingDiverged(f"the training loss exploded in {where}: mean {mean_loss:.3g}, more than "
                                   f"{EXPLODED:g} x the initial {self.initial_loss:.3g}")

    def end_epoch(self, state: EpochState):
        """(loss_sum, correct, n) of the epoch: the one host sync at its end."""
        plan = state.plan
        loss_total, correct_total = state.loss_sum.item(), state.correct.item()
        self.check_loss(loss_total / plan.steps, f"epoch {state.epoch + 1}")
        return loss_total, correct_total, plan.steps * plan.batch_size

    @torch.no_grad()
    def evaluate(self):
        """(mean loss, accuracy) on the test set, eval mode (BN running statistics)."""
        self.model.eval()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        for x, y in self.data.test_batches(self.config.eval_batch_size):
            with self.autocast():
                out = self.forward(x)
            loss_sum += F.cross_entropy(out.to(self.acc_dtype), y, reduction="sum").to(torch.float64)
            correct += (out.argmax(1) == y).sum()
        self.model.train()
        n = self.data.n_test
        return loss_sum.item() / n, correct.item() / n

    def norms(self) -> float:
        """‖θ_opt‖: the norm of the trainable parameters as the optimizer holds them (after rescalings)."""
        return flat_norm(self.params).item()

    def epoch_metrics(self, epoch: int, sums, evaluation) -> EpochMetrics:
        """The numbers of a finished epoch (``sums`` from :meth:`train_epoch`, ``evaluation`` from :meth:`evaluate`):
        epoch, step, train/test loss and accuracy, the schedule's lr (``None`` beyond float64, where only
        ``log_lr`` says it), the optimizer's lr (lr · R, R = 2^``log2_rescale``), the rescaling, ‖θ‖ in the
        schedule's units (‖θ_opt‖/√R) and as the optimizer holds it, and the effective lr lr_opt/‖θ_opt‖².
        Non-finite weights or test loss raise :class:`TrainingDiverged`."""
        (loss_sum, correct, n), (test_loss, test_acc) = sums, evaluation
        S, sched = self.steps_per_epoch, self.scheduler
        norm_opt = self.norms()
        if not math.isfinite(norm_opt) or not math.isfinite(test_loss):
            raise TrainingDiverged(f"non-finite weights or test loss after epoch {epoch + 1}")
        log_lr = float(self.schedule.log_lr[(epoch + 1) * S - 1])
        lr_sched = _exp(log_lr)
        lr_opt = (math.ldexp(lr_sched, sched.log2_rescale) if lr_sched is not None
                  else math.exp(log_lr + sched.log2_rescale * math.log(2)))
        norm = _ldexp(norm_opt, -sched.log2_rescale // 2)  # log2_rescale is even: √R is exact
        return EpochMetrics(
            epoch=epoch + 1, step=(epoch + 1) * S, train_loss=loss_sum / S, train_acc=correct / n,
            test_loss=test_loss, test_acc=test_acc, lr=lr_sched, log_lr=log_lr, lr_opt=lr_opt,
            rescale=sched.rescale, log2_rescale=sched.log2_rescale, rescale_count=sched.rescale_count,
            weight_norm=norm, weight_norm_opt=norm_opt, effective_lr=lr_opt / norm_opt**2,
        )

    def describe(self) -> dict:
        """What this trainer resolved: device, precision, steps, milestones, CPU threads, the schedule's lr range
        (``None`` beyond float64; ``log_max`` its ln) and the data's normalisation."""
        c, S, log_lr = self.config, self.steps_per_epoch, self.schedule.log_lr
        return {
            "device": str(self.device), "precision": self.precision, "steps_per_epoch": S,
            "total_steps": S * c.epochs, "milestones": c.milestones(), "threads": torch.get_num_threads(),
            "lr_schedule": {"first": _exp(log_lr[0]), "last": _exp(log_lr[-1]), "max": _exp(log_lr.max()),
                            "log_max": float(log_lr.max())},
            "normalisation": {"mean": self.data.mean.tolist(), "std": self.data.std.tolist()},
        }

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "initial_loss": self.initial_loss}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.initial_loss = state.get("initial_loss")
