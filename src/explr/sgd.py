"""SGD with momentum and weight decay in the paper's convention, and a trajectory recorder.

Li & Arora (Definition 1.2, after Sutskever et al. 2013) write heavy-ball SGD as

    (θ_t − θ_{t−1}) / η_{t−1} = γ (θ_{t−1} − θ_{t−2}) / η_{t−2} − ∇(L + (λ_{t−1}/2)‖θ‖²)(θ_{t−1}),

with θ_{−1} = θ_0 for a zero initial momentum.  With v_t = (θ_{t−1} − θ_t)/η_{t−1} this is exactly
``torch.optim.SGD(momentum=γ, dampening=0, nesterov=False)``:

    v_{k+1} = γ v_k + ∇L(θ_k) + λ_k θ_k,      θ_{k+1} = θ_k − η_k v_{k+1}.

:func:`paper_sgd_step` implements the first form literally (the tests check it against
``torch.optim.SGD``); :func:`train_sgd` runs ``torch.optim.SGD`` with per-step (lr, wd) through
:class:`explr.scheduler.PerStepLR` and records what the chapters plot.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from .invariance import flat_norm, trainable_parameters
from .scheduler import PerStepLR

__all__ = ["paper_sgd_step", "Trajectory", "train_sgd", "output_deviation", "prediction_agreement"]


def paper_sgd_step(theta, theta_prev, lr, lr_prev, grad, wd, momentum):
    """One step of the paper's recursion; returns θ_t from θ_{t−1} = ``theta``, θ_{t−2} = ``theta_prev``.

    ``grad`` = ∇L(θ_{t−1}), ``lr`` = η_{t−1}, ``lr_prev`` = η_{t−2}, ``wd`` = λ_{t−1}.
    """
    velocity = momentum * (theta - theta_prev) / lr_prev - (grad + wd * theta)
    return theta + lr * velocity


@dataclass(frozen=True)
class Trajectory:
    """What :func:`train_sgd` records.

    outputs : (records, ...) -- ``model(probe)`` at the recorded steps (None without a probe).
    norms : (records,) -- ‖θ_k‖ of the trainable parameters at the recorded steps.
    steps : (records,) -- the recorded step indices k (0 = before training, ``steps`` = the end).
    losses : (steps,) -- the training loss of every step's batch.
    lrs : (steps,) -- the learning rate the optimizer actually used (after any rescaling).
    rescale : float -- the final equivalent-rescaling factor R of the scheduler (1 without).
    """

    outputs: np.ndarray | None
    norms: np.ndarray
    steps: np.ndarray
    losses: np.ndarray
    lrs: np.ndarray
    rescale: float


def train_sgd(
    model,
    loss_fn,
    batches,
    lr,
    wd=0.0,
    momentum: float = 0.0,
    *,
    probe=None,
    record_every: int = 1,
    rescale_above: float | None = None,
    progress: bool = False,
) -> Trajectory:
    """Train ``model`` in place with ``torch.optim.SGD`` for ``len(lr)`` steps and record the trajectory.

    ``batches``: a sequence of (inputs, targets), one per step (``len(batches) >= len(lr)``).
    ``lr``, ``wd``: per-step arrays (``wd`` may be a scalar), e.g. ``schedule.lr, schedule.wd`` of
    an :class:`~explr.schedules.EquivalentSchedule`.  ``probe``: an input batch whose outputs are
    recorded every ``record_every`` steps and at the end, in the model's current mode, without
    gradient (with batch-statistics BN this is a deterministic function of θ).
    ``rescale_above``: see :class:`~explr.scheduler.PerStepLR`.
    """
    lr = np.asarray(lr, dtype=np.float64)
    steps = len(lr)
    if len(batches) < steps:
        raise ValueError(f"batches has {len(batches)} entries but the schedule has {steps} steps")
    if record_every < 1:
        raise ValueError(f"record_every must be >= 1; got {record_every!r}")
    params = [p for _, p in trainable_parameters(model)]
    optimizer = torch.optim.SGD(params, lr=float(lr[0]), momentum=momentum)
    scheduler = PerStepLR(optimizer, lr, wd, rescale_above=rescale_above)

    outputs, norms, recorded = [], [], []

    def record(k):
        if probe is not None:
            with torch.no_grad():
                outputs.append(model(probe).detach().cpu().numpy())
        norms.append(flat_norm(params).item())
        recorded.append(k)

    losses, used_lrs = np.empty(steps), np.empty(steps)
    for k in tqdm(range(steps), disable=not progress, desc="SGD", leave=False):
        if k % record_every == 0:
            record(k)
        inputs, targets = batches[k]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        used_lrs[k] = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        losses[k] = loss.item()
    record(steps)
    return Trajectory(
        outputs=np.stack(outputs) if probe is not None else None,
        norms=np.asarray(norms),
        steps=np.asarray(recorded),
        losses=losses,
        lrs=used_lrs,
        rescale=scheduler.rescale,
    )


def output_deviation(a: Trajectory, b: Trajectory) -> np.ndarray:
    """Relative deviation of two runs' probe outputs per recorded step: max|f_b − f_a| / max|f_a|."""
    if a.outputs is None or b.outputs is None or a.outputs.shape != b.outputs.shape:
        raise ValueError("both trajectories need probe outputs of the same shape (train_sgd(..., probe=...))")
    axes = tuple(range(1, a.outputs.ndim))
    return np.abs(b.outputs - a.outputs).max(axis=axes) / np.abs(a.outputs).max(axis=axes)


def prediction_agreement(a: Trajectory, b: Trajectory) -> np.ndarray:
    """Fraction of probe inputs whose predicted class (argmax of the output) agrees, per recorded step."""
    output_deviation(a, b)  # same validation
    return (a.outputs.argmax(-1) == b.outputs.argmax(-1)).mean(axis=-1)
