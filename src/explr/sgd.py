"""SGD with momentum and weight decay in the paper's convention, and a trajectory recorder.

Li & Arora's heavy-ball SGD (Definition 1.2) is ``torch.optim.SGD(momentum=γ, dampening=0, nesterov=False)``:
v_{k+1} = γ v_k + ∇L(θ_k) + λ_k θ_k, θ_{k+1} = θ_k − η_k v_{k+1} (the derivation: docs/maths-notes.md, "SGD").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from .invariance import flat_norm, trainable_parameters
from .lr_scheduler import PerStepLR
from .params import Int, checked
from .schedules import MOMENTUM, EquivalentSchedule, PlainSchedule, alpha

__all__ = ["Trajectory", "train_sgd", "output_deviation", "prediction_agreement", "norm_recursion",
           "exp_lr_overflow_step"]


@dataclass(frozen=True)
class Trajectory:
    """What :func:`train_sgd` records."""

    #: (records, ...) ``model(probe)`` at the recorded steps (None without a probe).
    outputs: np.ndarray | None
    #: (records,) ‖θ_k‖ of the trainable parameters at the recorded steps.
    norms: np.ndarray
    #: (records,) the recorded step indices k (0 = before training, ``steps`` = the end).
    steps: np.ndarray
    #: (steps,) the training loss of every step's batch.
    losses: np.ndarray
    #: (steps,) the learning rate the optimizer actually used (after any rescaling).
    lrs: np.ndarray
    #: the final equivalent-rescaling factor R of the scheduler (1 without).
    rescale: float
    #: (records,) log2 R at the recorded steps: ``norms`` are ‖θ_k‖·√R, in the optimizer's units.
    log2_rescales: np.ndarray
    #: how many rescalings the scheduler applied.
    rescale_count: int
    #: (steps + 1,) ‖θ_k‖² at every step k = 0..steps (in the optimizer's units).
    sq_norms: np.ndarray
    #: (steps,) ‖θ_{k+1} − θ_k‖² of every step (a rescaling step includes the rescaling).
    sq_updates: np.ndarray


def train_sgd(model, loss_fn, batches, lr, wd=None, momentum: float = 0.0, *, probe=None, record_every: int = 1,
              rescale_above: float | None = None, progress: bool = False) -> Trajectory:
    """Train ``model`` in place with ``torch.optim.SGD`` for ``len(lr)`` steps and record the trajectory.

    ``batches``: (inputs, targets), one per step.  ``lr``, ``wd``: per-step arrays (``wd`` may be a scalar), or
    ``lr`` a :data:`~explr.schedules.Schedule` and ``wd`` omitted; ``rescale_above`` as
    :class:`~explr.lr_scheduler.PerStepLR`'s.  ``probe``: an input batch whose outputs are recorded every
    ``record_every`` steps and at the end, without gradient, in the model's current mode.
    """
    if not isinstance(lr, (EquivalentSchedule, PlainSchedule)):
        lr, wd = PlainSchedule(np.asarray(lr, dtype=np.float64), 0.0 if wd is None else wd), None
    steps = len(lr)
    if len(batches) < steps:
        raise ValueError(f"batches has {len(batches)} entries but the schedule has {steps} steps")
    record_every = int(checked("record_every", record_every, Int(1)))
    params = [p for _, p in trainable_parameters(model)]
    optimizer = torch.optim.SGD(params, lr=lr.first_lr, momentum=float(checked("momentum", momentum, MOMENTUM)))
    scheduler = PerStepLR(optimizer, lr, wd, rescale_above=rescale_above)

    outputs, norms, recorded, log2_rescales = [], [], [], []

    def record(k):
        if probe is not None:
            with torch.no_grad():
                outputs.append(model(probe).detach().cpu().numpy())
        norms.append(flat_norm(params).item())
        recorded.append(k)
        log2_rescales.append(scheduler.log2_rescale)

    losses, used_lrs = np.empty(steps), np.empty(steps)
    sq_norms, sq_updates = np.empty(steps + 1), np.empty(steps)
    previous = torch.cat([p.detach().reshape(-1) for p in params])
    sq_norms[0] = previous.square().sum().item()
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
        current = torch.cat([p.detach().reshape(-1) for p in params])
        sq_norms[k + 1] = current.square().sum().item()
        sq_updates[k] = (current - previous).square().sum().item()
        previous = current
    record(steps)
    return Trajectory(outputs=np.stack(outputs) if probe is not None else None, norms=np.asarray(norms),
                      steps=np.asarray(recorded), losses=losses, lrs=used_lrs, rescale=scheduler.rescale,
                      log2_rescales=np.asarray(log2_rescales), rescale_count=scheduler.rescale_count,
                      sq_norms=sq_norms, sq_updates=sq_updates)


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


def norm_recursion(sq_norms, sq_updates, lr, momentum: float) -> np.ndarray:
    """The norm growth Δ_t = ‖θ_{t+1}‖² − ‖θ_t‖² of momentum SGD without weight decay on a scale-invariant loss,
    t = 0..T−1 (Li & Arora, Lemma B.1; the proof: docs/maths-notes.md, "SGD"), with d_t = θ_{t+1} − θ_t:

        Δ_t = γ_t (Δ_{t−1} + ‖d_{t−1}‖²) + ‖d_t‖²,    γ_t = γ η_t / η_{t−1},    Δ_0 = ‖d_0‖²,

    each from the *measured* Δ_{t−1}: ``sq_norms`` ‖θ_t‖² (T + 1), ``sq_updates`` ‖d_t‖² and ``lr`` η_t (T each).
    """
    sq_norms, sq_updates, lr = (np.asarray(a, dtype=np.float64) for a in (sq_norms, sq_updates, lr))
    if not (len(sq_norms) == len(sq_updates) + 1 == len(lr) + 1):
        raise ValueError(f"need T + 1 squared norms and T updates and learning rates; got "
                         f"{len(sq_norms)}, {len(sq_updates)}, {len(lr)}")
    growth = np.diff(sq_norms)
    predicted = sq_updates.copy()
    predicted[1:] += momentum * lr[1:] / lr[:-1] * (growth[:-1] + sq_updates[:-1])
    return predicted


def exp_lr_overflow_step(lr: float, wd: float, momentum: float, limit: float = float(np.finfo(np.float32).max)):
    """First step k at which the exponential schedule η̃_k = η α^{−2k−1} (Thms 2.1/2.5) exceeds ``limit`` (float32's
    largest value by default): k = ⌊(ln(limit/η)/ln(1/α) − 1)/2⌋ + 1, in log space; ``None`` when wd = 0."""
    a = alpha(lr, wd, momentum)
    if wd == 0:
        return None
    return max(0, math.floor((math.log(limit / lr) / -math.log(a) - 1) / 2) + 1)
