"""Learning-rate schedules and their exact weight-decay-free equivalents (Li & Arora, ICLR 2020).

SGD with momentum γ (v_{k+1} = γ v_k + ∇L(θ_k) + wd_k θ_k, θ_{k+1} = θ_k − lr_k v_{k+1}) on a scale-invariant loss
with weight decay equals, in function space, SGD without it whose lr grows exponentially (Theorems 2.1, 2.5, 2.12,
2.13).  Every converter returns an :class:`EquivalentSchedule`, built in log space (chapter 2 and
docs/maths-notes.md, "Schedules"); the checks of per-step inputs are written here once and name the first bad step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from .params import Float, Int, checked, is_real_type

__all__ = ["EquivalentSchedule", "PlainSchedule", "Schedule", "alpha", "exp_lr", "texp", "texp_plus_plus",
           "texp_minus_minus", "step_decay", "cosine", "CORRECTIONS"]


# ----------------------------------------------------------------------------- the checks of per-step inputs
#: the rules of per-step inputs (their errors quote them), by the bound they put on a value.
_RULES = {"> 0": "finite real numbers > 0", ">= 0": "finite real numbers >= 0", "": "finite real numbers"}
#: the heavy-ball momentum γ of every function here.
MOMENTUM = Float(0, 1, lo_open=False)


def check_milestones(milestones, epochs: int) -> np.ndarray:
    """``milestones`` as an int64 array: strictly increasing integer epochs in [1, epochs − 1] (a decay at epoch 0
    or at the end would change nothing); ``ValueError`` naming the rule otherwise."""
    try:
        ms = np.asarray([int(m) for m in milestones if int(m) == m], dtype=np.int64)
    except (TypeError, ValueError):
        ms = None
    if ms is None or len(ms) != len(list(milestones)):
        raise ValueError(f"milestones must be a sequence of integer epochs; got {milestones!r}")
    if ms.size and (np.any(np.diff(ms) <= 0) or ms[0] < 1 or ms[-1] >= epochs):
        raise ValueError(f"milestones must be strictly increasing epochs in [1, epochs-1] = [1, {epochs - 1}]; "
                         f"got {list(milestones)!r}")
    return ms


def per_step_array(name: str, value, steps: int | None, bound: str) -> np.ndarray:
    """``value`` as a new float64 array of ``steps`` entries (a scalar is broadcast; ``None``: one or more entries),
    each passing the rule ``_RULES[bound]``: else ``TypeError`` naming the first entry that is not a real number
    (``np.asarray`` would turn True into 1.0), or ``ValueError`` naming the shape or the first step that breaks the
    rule (``lr[3] = -0.1``)."""
    if isinstance(value, (list, tuple)):
        items = value
    else:
        value = np.asarray(value)
        items = None if value.dtype.kind in "fiu" else value.ravel()
    if items is not None and not all(map(is_real_type, set(map(type, items)))):
        k, x = next((k, x) for k, x in enumerate(items) if not is_real_type(type(x)))
        x = x.item() if isinstance(x, np.generic) else x
        where = f"{name}[{k}]" if np.ndim(value) else name
        raise TypeError(f"{where} = {x!r} ({type(x).__name__}) is not a real number: {name} must be {_RULES[bound]} "
                        "(floats or ints; not bools or strings)")
    arr = np.array(value, dtype=np.float64)
    if arr.ndim == 0 and steps is not None:
        arr = np.full(steps, float(arr))
    if arr.ndim != 1 or len(arr) == 0 or len(arr) != (steps or len(arr)):
        raise ValueError(f"{name} must be a per-step array of {steps or 'one or more'} entries"
                         f"{' or a scalar' if steps else ''}; got shape {np.shape(value)}")
    bad = ~np.isfinite(arr) | (arr <= 0 if bound == "> 0" else arr < 0 if bound == ">= 0" else False)
    if bad.any():
        k = int(np.argmax(bad))
        raise ValueError(f"{name} must be {_RULES[bound]} at every step; {name}[{k}] = {float(arr[k])!r}")
    return arr


#: Accepted values of the ``corrections`` argument of :func:`texp`.
CORRECTIONS = ("all", "start", "none")


@dataclass(frozen=True)
class EquivalentSchedule:
    """Per-step hyperparameters of a weight-decay-free run equivalent to an SGD+WD run, stored in log space;
    ``lr``, ``wd`` and ``scale`` are derived (float64: ``inf`` or 0 outside its range).

    Example: at λ = 1e-2 over 78,200 steps the lr leaves float64's range, its log and :meth:`parts` do not:

    >>> import numpy as np
    >>> from explr.schedules import exp_lr
    >>> schedule = exp_lr(0.1, 1e-2, 0.9, steps=78200)
    >>> mantissas, exponents, _, _ = schedule.parts()
    >>> print(f"{schedule.log_lr[-1]:.1f}", schedule.lr[-1], np.isfinite(mantissas).all())
    1747.7 inf True
    """

    #: (steps,) ln lr̃_k, the log learning rate of the equivalent run at step k.
    log_lr: np.ndarray
    #: (steps,) lr̃_k · wd̃_k, the momentum corrections 1 − â_{k+1}/α_{k+1} (zero where none): bounded, while
    #: wd̃_k alone can underflow.
    lr_wd: np.ndarray
    #: (steps + 1,) ln P_k, with θ̃_k = P_k θ_k for k = 0..steps.
    log_scale: np.ndarray
    #: the momentum γ that both runs use.
    momentum: float
    #: which construction made it (``"texp[all]"``, ...).
    name: str

    def __len__(self) -> int:
        return len(self.log_lr)

    @property
    def first_lr(self) -> float:
        """lr̃_0 = exp(``log_lr[0]``), the learning rate the run starts with."""
        return float(np.exp(self.log_lr[0]))

    def parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(m_lr, e_lr, m_wd, e_wd) with lr̃_k = m_lr·2^e_lr and wd̃_k = m_wd·2^e_wd: finite mantissas and
        integer exponents, what :class:`~explr.lr_scheduler.PerStepLR` plays (``.lr``/``.wd`` are exactly
        ``np.ldexp`` of them)."""
        log_lr = np.asarray(self.log_lr, dtype=np.float64)
        e_lr = np.floor(log_lr / math.log(2.0)).astype(np.int64) + 1  # m_lr in [1/2, 1) up to rounding
        m_lr = np.exp(log_lr - e_lr * math.log(2.0))
        return m_lr, e_lr, self.lr_wd / m_lr, -e_lr

    @cached_property
    def lr(self) -> np.ndarray:
        """(steps,) lr̃_k, the learning rate of the equivalent run (``inf`` beyond float64)."""
        m_lr, e_lr, _, _ = self.parts()
        with np.errstate(over="ignore"):
            return np.ldexp(m_lr, e_lr)

    @cached_property
    def wd(self) -> np.ndarray:
        """(steps,) wd̃_k, the weight decay it adds at step k (``wd[k] * θ`` to the gradient)."""
        _, _, m_wd, e_wd = self.parts()
        with np.errstate(under="ignore"):
            return np.ldexp(m_wd, e_wd)

    @cached_property
    def scale(self) -> np.ndarray:
        """(steps + 1,) P_k, with θ̃_k = P_k θ_k (``inf`` beyond float64)."""
        with np.errstate(over="ignore"):
            return np.exp(self.log_scale)


@dataclass(frozen=True, eq=False)
class PlainSchedule:
    """Per-step (lr, wd) of an ordinary run (step decay, cosine, ... with weight decay), played as given, with the
    interface of :class:`EquivalentSchedule`; ``momentum`` is ``None``: it fits any optimizer.

    Example: step decay with weight decay 5e-4, the ordinary run that :func:`texp` makes an equivalent of:

    >>> from explr.schedules import PlainSchedule, step_decay
    >>> lr = step_decay(0.1, epochs=3, steps_per_epoch=100, milestones=[2])
    >>> plain = PlainSchedule(lr, 5e-4, name="step")
    >>> len(plain), plain.first_lr, plain.wd, plain.momentum
    (300, 0.1, 0.0005, None)
    """

    #: (steps,) the learning rate of every step.
    lr: np.ndarray
    #: the weight decay: a number or a (steps,) array.
    wd: np.ndarray | float
    #: what the schedule is (``"step"``, ...).
    name: str = "plain"
    #: None: a plain schedule fits any optimizer.
    momentum = None

    def __len__(self) -> int:
        return len(self.lr)

    @property
    def first_lr(self) -> float:
        """``lr[0]``, the learning rate the run starts with."""
        return float(self.lr[0])

    @cached_property
    def log_lr(self) -> np.ndarray:
        """ln lr_k (−inf where an lr underflowed to 0)."""
        with np.errstate(divide="ignore"):
            return np.log(np.asarray(self.lr, dtype=np.float64))

    def parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(m_lr, e_lr, m_wd, e_wd), ``np.frexp`` of lr and wd (exact), as :meth:`EquivalentSchedule.parts`."""
        m_lr, e_lr = np.frexp(np.asarray(self.lr, dtype=np.float64))
        m_wd, e_wd = np.frexp(np.broadcast_to(np.asarray(self.wd, dtype=np.float64), m_lr.shape))
        return m_lr, e_lr.astype(np.int64), m_wd, e_wd.astype(np.int64)

    @cached_property
    def scale(self) -> np.ndarray:
        """P_k = 1: a plain schedule is its own run."""
        return np.ones(len(self) + 1)


#: what :class:`~explr.lr_scheduler.PerStepLR`, :func:`explr.sgd.train_sgd` and the CIFAR-10 engine play.
Schedule = EquivalentSchedule | PlainSchedule


# ----------------------------------------------------------------------------- the root α
def alpha(lr: float, wd: float, momentum: float = 0.0) -> float:
    """Per-step weight-shrink factor α of SGD with constant ``lr`` = η, ``wd`` = λ, ``momentum`` = γ: the larger root
    of x² − (1 + γ − λη) x + γ = 0 (Theorem 2.5; 1 − λη for γ = 0, Theorem 2.1), real iff λη ≤ (1 − √γ)², then in
    [√γ, 1] (Appendix A.1); ``ValueError`` outside that range, never NaN.

    Example: the standard values, and a weight decay too large for any equivalent:

    >>> from explr.schedules import alpha
    >>> round(alpha(0.1, 5e-4, 0.9), 7)
    0.9994977
    >>> alpha(0.1, 0.1, 0.9)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: lr*wd = 0.01 (lr=0.1, wd=0.1) is outside the valid range ...
    """
    lr, wd = float(checked("lr", lr, Float(0))), float(checked("wd", wd, Float(0, lo_open=False)))
    gamma = float(checked("momentum", momentum, MOMENTUM))
    product, limit = lr * wd, (1.0 - math.sqrt(gamma)) ** 2
    if product > limit or (gamma == 0.0 and product >= 1.0):
        raise ValueError(
            f"lr*wd = {product:.6g} (lr={lr!r}, wd={wd!r}) is outside the valid range "
            f"0 <= lr*wd {'<' if gamma == 0 else '<='} (1 - sqrt(momentum))^2 = {limit:.6g} for "
            f"momentum={gamma!r}: x^2 - (1 + momentum - lr*wd) x + momentum = 0 has no positive "
            "real root, so no exponential-LR equivalent exists")
    b = 1.0 + gamma - product
    disc = max(b * b - 4.0 * gamma, 0.0)  # may round to a tiny negative at the boundary
    return (b + math.sqrt(disc)) / 2.0


# ----------------------------------------------------------------------------- core construction
def _equivalent(lr, wd, gamma, name, target=None, correct=None) -> EquivalentSchedule:
    """The shared construction in log space (docs/maths-notes.md, "Schedules"): ``target[k]`` is the chosen α_{k+1}
    (``None``: TEXP++'s â_{k+1}), ``correct[k]`` whether step k applies lr̃_k c_k = 1 − â_{k+1}/α_{k+1}."""
    steps = len(lr)
    lr_wd = np.zeros(steps)
    log_p = np.zeros(steps + 1)  # ln P_k
    a_prev = 1.0
    for k in range(steps):
        a_hat = 1.0 - lr[k] * wd[k]
        if k > 0:
            a_hat += gamma * (lr[k] / lr[k - 1]) * (1.0 - 1.0 / a_prev)
        a_next = a_hat if target is None else target[k]
        if not a_next > 0:
            raise ValueError(
                f"{name}: the weight-shrink factor of step {k} is {a_next:.6g} <= 0 "
                f"(lr={lr[k]!r}, wd={wd[k]!r}, momentum={gamma!r}); lr*wd is too large for an "
                "equivalent schedule to exist")
        log_p[k + 1] = log_p[k] - math.log(a_next)
        if correct is not None and correct[k]:
            lr_wd[k] = (a_next - a_hat) / a_next
        a_prev = a_next
    log_lr = log_p[:-1] + log_p[1:] + np.log(lr)
    return EquivalentSchedule(log_lr=log_lr, lr_wd=lr_wd, log_scale=log_p, momentum=gamma, name=name)


# ----------------------------------------------------------------------------- public converters
def exp_lr(lr: float, wd: float, momentum: float, steps: int, *, start_correction: bool = True) -> EquivalentSchedule:
    """Constant LR η + WD λ ≡ exponential LR without WD (Theorems 2.1 and 2.5): lr̃_k = η α^{−2k−1}, θ̃_k = α^{−k} θ_k,
    α = :func:`alpha` (η, λ, γ); with PyTorch's zero initial buffer the paper's start θ̃_{−1} = α θ_0 is a one-step
    weight decay c_0 = (α − (1 − λη)) / (lr̃_0 α) at step 0, which ``start_correction=False`` drops.

    Example: 1,000 steps at η = 0.1, λ = 5e-4, γ = 0.9; the lr grows by α⁻² a step; wd[0] is the start correction:

    >>> from explr.schedules import alpha, exp_lr
    >>> schedule = exp_lr(0.1, 5e-4, 0.9, steps=1000)
    >>> lr = schedule.lr
    >>> print(f"{lr[0]:.6f} {lr[-1]:.6f} {lr[1] / lr[0]:.7f}")
    0.100050 0.272998 1.0010053
    >>> print(f"{alpha(0.1, 5e-4, 0.9) ** -2:.7f}")
    1.0010053
    >>> print(f"{schedule.wd[0]:.5f}", float(schedule.wd[1:].max()))
    -0.00452 0.0
    """
    steps = int(checked("steps", steps, Int(1)))
    a = alpha(lr, wd, momentum)
    gamma = float(momentum)
    lr_arr, wd_arr = np.full(steps, float(lr)), np.full(steps, float(wd))
    correct = np.zeros(steps, dtype=bool)
    correct[0] = start_correction
    return _equivalent(lr_arr, wd_arr, gamma, "exp_lr", target=np.full(steps, a), correct=correct)


def texp(lr, wd, momentum: float, *, corrections: str = "all") -> EquivalentSchedule:
    """Tapered exponential LR (TEXP, Theorem 2.12) of a piecewise-constant ``lr`` per step and ``wd`` (scalar or per
    step): lr̃_0 = η*_0 / α*_0 grows by (α*_I)^{−2} a step inside phase I, α*_I = :func:`alpha` (η*_I, λ_I, γ), and
    by (η*_I / η*_{I−1}) / (α*_{I−1} α*_I) where it starts.  ``corrections``: the one-step weight decays at every
    phase's start (``"all"``, exact), at step 0 only (``"start"``) or none (``"none"``).

    Example: step decay ÷10 at epoch 2 of 3 with weight decay 5e-4: the twin's lr grows inside each phase, drops
    where one starts, and the corrections sit there:

    >>> from explr.schedules import step_decay, texp
    >>> lr = step_decay(0.1, epochs=3, steps_per_epoch=100, milestones=[2])
    >>> schedule = texp(lr, wd=5e-4, momentum=0.9)
    >>> print(*(f"{schedule.lr[k]:.5f}" for k in (0, 199, 200, 299)))
    0.10005 0.12220 0.01223 0.01235
    >>> [int(k) for k in (schedule.wd != 0).nonzero()[0]]
    [0, 200]
    """
    if corrections not in CORRECTIONS:
        raise ValueError(f"corrections must be one of {CORRECTIONS}; got {corrections!r}")
    gamma = float(checked("momentum", momentum, MOMENTUM))
    lr_arr = per_step_array("lr", lr, None, "> 0")
    wd_arr = per_step_array("wd", wd, len(lr_arr), ">= 0")
    starts = np.ones(len(lr_arr), dtype=bool)  # where (lr_k, wd_k) differs from step k − 1
    starts[1:] = (lr_arr[1:] != lr_arr[:-1]) | (wd_arr[1:] != wd_arr[:-1])
    target = np.empty(len(lr_arr))
    for k in np.flatnonzero(starts):
        try:
            a = alpha(lr_arr[k], wd_arr[k], gamma)
        except ValueError as err:
            raise ValueError(f"texp: phase starting at step {k}: {err}") from None
        target[k:] = a  # overwritten by the next phase
    correct = starts.copy() if corrections == "all" else np.zeros(len(lr_arr), dtype=bool)
    correct[0] = corrections != "none"
    return _equivalent(lr_arr, wd_arr, gamma, f"texp[{corrections}]", target=target, correct=correct)


def texp_plus_plus(lr, wd, momentum: float) -> EquivalentSchedule:
    """TEXP++ (Theorem 2.13): exact for any per-step ``lr`` > 0 and ``wd`` ≥ 0 (scalar or per step) whose α_k stay > 0
    (a ``ValueError`` otherwise), with no correction: α_1 = 1 − lr_0 wd_0,
    α_{k+1} = 1 − lr_k wd_k + γ (lr_k / lr_{k−1}) (1 − 1/α_k), P_k = ∏_{i≤k} 1/α_i, lr̃_k = P_k P_{k+1} lr_k.

    Example: a per-step cosine schedule (its lr changes every step), exact without any weight decay:

    >>> from explr.schedules import cosine, texp_plus_plus
    >>> lr = cosine(0.1, epochs=3, steps_per_epoch=100, per="step")
    >>> schedule = texp_plus_plus(lr, wd=5e-4, momentum=0.9)
    >>> print(*(f"{schedule.lr[k]:.5f}" for k in (0, 150, 250)))
    0.10001 0.05608 0.00771
    >>> print(schedule.wd.min(), schedule.wd.max())
    0.0 0.0
    """
    gamma = float(checked("momentum", momentum, MOMENTUM))
    lr_arr = per_step_array("lr", lr, None, "> 0")
    wd_arr = per_step_array("wd", wd, len(lr_arr), ">= 0")
    return _equivalent(lr_arr, wd_arr, gamma, "texp++")


def texp_minus_minus(lr, wd, momentum: float, *, corrections: str = "all") -> EquivalentSchedule:
    """TEXP-- (Section 5): TEXP without the lr drops, only the growth rate changing between phases; exactly TEXP of
    the constant lr η*_0 with the weight decay cut to λ_I η*_I / η*_0 in phase I, the run ``scale`` relates to.

    Example: the step decay of :func:`texp`'s example: where TEXP drops its lr at step 200, TEXP-- grows slower:

    >>> from explr.schedules import step_decay, texp_minus_minus
    >>> lr = step_decay(0.1, epochs=3, steps_per_epoch=100, milestones=[2])
    >>> schedule = texp_minus_minus(lr, wd=5e-4, momentum=0.9)
    >>> print(*(f"{schedule.lr[k]:.5f}" for k in (0, 199, 200, 299)))
    0.10005 0.12220 0.12226 0.12348
    """
    lr_arr = per_step_array("lr", lr, None, "> 0")
    wd_arr = per_step_array("wd", wd, len(lr_arr), ">= 0")
    constant = np.full(len(lr_arr), lr_arr[0])
    result = texp(constant, wd_arr * lr_arr / lr_arr[0], momentum, corrections=corrections)
    return replace(result, name=f"texp--[{corrections}]")


# ----------------------------------------------------------------------------- ordinary schedules
def step_decay(lr: float, epochs: int, steps_per_epoch: int, milestones=(), factor: float = 0.1) -> np.ndarray:
    """Per-step LR of Step Decay (Definition 2.11): ``lr × factor^m``, m the number of ``milestones`` (strictly
    increasing epochs in 1..epochs−1) ≤ the epoch, ``factor`` ∈ (0, 1].

    Example: the usual CIFAR-10 recipe, 200 epochs of 391 steps, ÷10 at epochs 100 and 150:

    >>> from explr.schedules import step_decay
    >>> lr = step_decay(0.1, epochs=200, steps_per_epoch=391, milestones=[100, 150])
    >>> len(lr)
    78200
    >>> print(*(f"{lr[k]:g}" for k in (0, 100 * 391 - 1, 100 * 391, 150 * 391)))
    0.1 0.1 0.01 0.001
    """
    epochs = int(checked("epochs", epochs, Int(1)))
    steps_per_epoch = int(checked("steps_per_epoch", steps_per_epoch, Int(1)))
    lr = float(checked("lr", lr, Float(0)))
    checked("factor", factor, Float(0, 1, hi_open=False))
    ms = check_milestones(milestones, epochs)
    epoch_of_step = np.arange(epochs * steps_per_epoch) // steps_per_epoch
    drops = np.searchsorted(ms, epoch_of_step, side="right")
    return float(lr) * float(factor) ** drops


def cosine(lr: float, epochs: int, steps_per_epoch: int, per: str = "epoch") -> np.ndarray:
    """Per-step cosine LR (Loshchilov & Hutter 2016) without restarts: η_t = lr (1 + cos(π t / T)) / 2, with t the
    epoch and T ``epochs`` (``per="epoch"``, what TEXP converts) or t the step and T the steps (``per="step"``).

    Example: 4 epochs of 2 steps, constant inside each epoch:

    >>> from explr.schedules import cosine
    >>> print(*(f"{x:.4f}" for x in cosine(0.1, epochs=4, steps_per_epoch=2)))
    0.1000 0.1000 0.0854 0.0854 0.0500 0.0500 0.0146 0.0146
    """
    epochs = int(checked("epochs", epochs, Int(1)))
    steps_per_epoch = int(checked("steps_per_epoch", steps_per_epoch, Int(1)))
    lr = float(checked("lr", lr, Float(0)))
    steps = np.arange(epochs * steps_per_epoch)
    if per == "epoch":
        t, total = steps // steps_per_epoch, epochs
    elif per == "step":
        t, total = steps, epochs * steps_per_epoch
    else:
        raise ValueError(f"per must be 'epoch' or 'step'; got {per!r}")
    return float(lr) * (1.0 + np.cos(np.pi * t / total)) / 2.0
