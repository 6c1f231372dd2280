"""A drop-in PyTorch scheduler that plays a per-step (lr, weight decay) schedule into an optimizer.

:class:`PerStepLR` plays any schedule of :mod:`explr.schedules`; with ``rescale_above`` it applies the equivalent
rescaling (θ, v, lr, wd) → (cθ, v/c, c²·lr, wd/c²), c = 2^−j, of Li & Arora (Definition 2.3, momentum form of
Lemma 2.6) whenever the lr would exceed it, so an exponential schedule runs for any length in float32 or bf16.
Param groups, composition with other schedulers, the host-only schedule: docs/maths-notes.md, "PerStepLR".
"""
from __future__ import annotations

import copy
import hashlib
import math
import sys
import warnings

import numpy as np
import torch
from torch.optim.lr_scheduler import ChainedScheduler, LRScheduler

from .models import rescale_running_statistics
from .params import is_real
from .schedules import EquivalentSchedule, PlainSchedule, per_step_array

__all__ = ["PerStepLR", "INVARIANT_KEY", "check_rescale_above", "max_rescale_above"]

#: Param-group key: ``False`` keeps the group out of the schedule's weight decay and out of rescaling.
INVARIANT_KEY = "scale_invariant"
#: ``state_dict()``'s keys that hold the progress, which ``load_state_dict`` restores.
PROGRESS_KEYS = ("last_epoch", "_step_count", "_last_lr", "_own_weight_decay", "log2_rescale", "rescale_count")
#: ``state_dict()``'s keys: the progress, then the settings, which ``load_state_dict`` checks.
STATE_KEYS = PROGRESS_KEYS + ("steps", "fingerprint", "momentum", "rescale_above", "base_lrs")
#: Relative change of the model's outputs under θ → 2^8·θ above which the first rescaling warns that the
#: optimizer's parameters are not scale invariant (an invariant network changes only through BN's eps).
INVARIANCE_TOLERANCE = 1e-3
#: why PerStepLR cannot be combined with another scheduler acting at the same steps.
_COMPOSITION = ("PerStepLR writes absolute per-step values, so it cannot run in a ChainedScheduler or next to manual "
                "lr changes; use SequentialLR to run schedulers one after another")
_CHAINED_INIT = ChainedScheduler.__init__.__code__


def max_rescale_above(dtype) -> float:
    """The largest ``rescale_above`` for parameters of ``dtype``: a quarter of its largest value (a rescaling moves
    the lr by powers of 4, so one quantum of headroom keeps every played lr finite; float16: 65504 / 4 = 16376).

    Example:

    >>> import torch
    >>> from explr.lr_scheduler import max_rescale_above
    >>> max_rescale_above(torch.float16)
    16376.0
    >>> print(f"{max_rescale_above(torch.float32):.4g}")
    8.507e+37
    """
    return float(torch.finfo(dtype).max) / 4


def check_rescale_above(rescale_above, first_lr: float, dtype) -> None:
    """``ValueError`` unless ``rescale_above`` is a finite number in (``first_lr``, :func:`max_rescale_above`
    of ``dtype``]: the rule :class:`PerStepLR` applies, for a caller that checks a setting before building one
    (``dtype``: the parameters' smallest floating dtype; ``None``: no upper limit).

    Example:

    >>> import torch
    >>> from explr.lr_scheduler import check_rescale_above
    >>> check_rescale_above(1e3, 0.1, torch.float32)  # passes
    >>> check_rescale_above(0.05, 0.1, torch.float32)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: rescale_above must be a finite number > lr[0] = 0.1 and at most ...
    """
    limit = max_rescale_above(dtype) if dtype is not None else math.inf
    if not (is_real(rescale_above) and first_lr < rescale_above <= limit):
        raise ValueError(
            f"rescale_above must be a finite number > lr[0] = {first_lr:g} and at most {limit:g}, a quarter of "
            f"the largest value of the parameters' dtype ({dtype}: {limit * 4:g}; one rescaling step of "
            f"headroom); got {rescale_above!r}")


class PerStepLR(LRScheduler):
    """Set ``lr`` and ``weight_decay`` of every param group from a per-step schedule.

    :param optimizer: any ``torch.optim`` optimizer, every group's lr a finite number > 0 (``torch.optim.SGD`` with
        the schedule's momentum for ``rescale_above`` or an ``EquivalentSchedule``).
    :param lr: (steps,) array of learning rates > 0, or an :class:`~explr.schedules.EquivalentSchedule` or a
        :class:`~explr.schedules.PlainSchedule` (``wd`` omitted).
    :param wd: a real number or (steps,) array of weight decays (default 0; negative values allowed).
    :param rescale_above: optional float in (lr[0], :func:`max_rescale_above` of the parameters' dtype]: once the lr
        would pass it, the rescaling by c = 2^−j; without it, an lr beyond the dtype is an ``OverflowError``.
    :param model: optional ``nn.Module`` whose running statistics follow every rescaling (``check_invariance``:
        warn at the first one if its outputs at θ and 2^8·θ differ by more than ``INVARIANCE_TOLERANCE``).
    :param on_rescale: optional callable ``on_rescale(c)``, called after every rescaling.
    :param last_epoch: as torch's.  ``state_dict()`` holds ``STATE_KEYS``; ``load_state_dict`` resumes exactly and
        refuses another schedule or other settings.  More: docs/maths-notes.md, "PerStepLR's parameters".

    Example: an exponential schedule whose lr reaches 3,709, played below ``rescale_above``: eight rescalings by
    c = 1/2 leave the weights at 2^−8 and the lr at 4^−8 of the schedule's (a full loop: the API page's quick start):

    >>> import torch
    >>> from explr import PerStepLR
    >>> from explr.schedules import exp_lr
    >>> weight = torch.nn.Parameter(torch.ones(3))
    >>> opt = torch.optim.SGD([weight], lr=0.1, momentum=0.9)  # no weight_decay here
    >>> schedule = exp_lr(0.1, 5e-3, 0.9, steps=1000)  # the schedule has it
    >>> sched = PerStepLR.from_schedule(opt, schedule, rescale_above=0.2)
    >>> for k in range(1000):  # loss.backward() before each opt.step() in a real loop
    ...     opt.step()
    ...     sched.step()
    >>> print(f"{schedule.lr[-1]:.1f} {opt.param_groups[0]['lr']:.4f}")  # schedule, played
    3708.6 0.0566
    >>> sched.rescale_count, sched.rescale == 4.0**-8
    (8, True)
    >>> weight.tolist()
    [0.00390625, 0.00390625, 0.00390625]
    """

    def __init__(self, optimizer, lr, wd=None, *, rescale_above: float | None = None, model=None,
                 on_rescale=None, check_invariance: bool = True, last_epoch: int = -1):
        if isinstance(lr, (PlainSchedule, EquivalentSchedule)) and wd is not None:
            raise ValueError(f"wd must be omitted when lr is a {type(lr).__name__}: its weight decay is part of it")
        if isinstance(lr, PlainSchedule):
            lr, wd = lr.lr, lr.wd
        self.momentum, self._exponents = None, None
        if isinstance(lr, EquivalentSchedule):
            self.momentum, (self._lr, e_lr, self._wd, e_wd) = float(lr.momentum), lr.parts()
            self._exponents = (e_lr, e_wd)
            _check_sgd_momentum(optimizer, self.momentum)
        else:  # lr > 0 per step; wd any finite number or per-step array
            self._lr, wd = per_step_array("lr", lr, None, "> 0"), 0.0 if wd is None else wd
            self._wd = float(per_step_array("wd", wd, 1, "")[0]) if np.ndim(wd) == 0 else per_step_array(
                "wd", wd, len(self._lr), "")
        dtypes = {p.dtype for g in optimizer.param_groups for p in g["params"] if p.is_floating_point()}
        dtype = min(dtypes, key=lambda d: torch.finfo(d).max, default=None)  # the smallest largest value
        if rescale_above is not None:
            if not isinstance(optimizer, torch.optim.SGD):
                raise TypeError(
                    f"rescale_above needs torch.optim.SGD; got {type(optimizer).__name__}: the equivalent "
                    "rescaling (θ, v) → (cθ, v/c) keeps only SGD's trajectory (other optimizers keep other "
                    "state, and Adam-type updates are not homogeneous in θ)")
            check_rescale_above(rescale_above, math.ldexp(*self._parts_at(0)[:2]), dtype)
        # every group keeps its ratio to the first one; torch's base_lrs are the groups' 'initial_lr' when set
        groups = optimizer.param_groups
        bases = [_group_number(g, i, "initial_lr" if "initial_lr" in g else "lr") for i, g in enumerate(groups)]
        self._ratios = [base / bases[0] for base in bases]
        if last_epoch == -1:  # torch copies 'lr' into 'initial_lr': a Python float, so checkpoints load weights_only
            for group, base in zip(groups, bases):
                if not isinstance(group["lr"], torch.Tensor):
                    group.setdefault("initial_lr", base)
        nonzero = np.flatnonzero(np.atleast_1d(self._wd))  # a group that takes the schedule's decay must have one
        for i, group in enumerate(groups):
            if nonzero.size and group.get(INVARIANT_KEY, True) is not False and "weight_decay" not in group:
                k = int(nonzero[0])
                where = f"wd[{k}] = {float(self._wd[k])!r}" if np.ndim(self._wd) else f"wd = {float(self._wd)!r}"
                raise ValueError(
                    f"wd must be 0 for {type(optimizer).__name__}: its param group {i} has no 'weight_decay', so the "
                    f"optimizer would ignore the schedule's weight decay; got {where} (add the decay to the loss, or "
                    "use an optimizer with weight_decay)")
        if on_rescale is not None and not callable(on_rescale):
            raise TypeError(f"on_rescale must be callable as on_rescale(c); got {on_rescale!r}")
        self.rescale_above = None if rescale_above is None else float(rescale_above)
        self.log2_rescale = 0  # R = 2**log2_rescale: the optimizer runs with lr_k·R and wd_k/R
        self.rescale_count = 0
        self.model, self.on_rescale = model, on_rescale
        self._probe, self._probe_hook = None, None
        if model is not None and rescale_above is not None and check_invariance:
            # a reference to the last training input, dropped at the first rescaling
            self._probe_hook = model.register_forward_pre_hook(lambda _, args: setattr(self, "_probe", args))
        digest = hashlib.sha256()  # names the schedule in a state: the first 16 hex digits of the played arrays'
        for array in (self._lr, self._wd, *(self._exponents or ())):
            digest.update(np.ascontiguousarray(array))
        self.fingerprint = digest.hexdigest()[:16]
        self._own_weight_decay = [_group_number(g, i, "weight_decay") if "weight_decay" in g else None
                                  for i, g in enumerate(groups)]
        self._dtype_max = float(torch.finfo(dtype).max) if dtype is not None else math.inf
        super().__init__(optimizer, last_epoch)

    @classmethod
    def from_schedule(cls, optimizer, schedule, **kwargs) -> "PerStepLR":
        """Build from an ``EquivalentSchedule`` (played from log space), a ``PlainSchedule`` or any object with
        ``.lr``/``.wd``."""
        if isinstance(schedule, (EquivalentSchedule, PlainSchedule)):
            return cls(optimizer, schedule, **kwargs)
        if not (hasattr(schedule, "lr") and hasattr(schedule, "wd")):
            raise TypeError(f"from_schedule takes an EquivalentSchedule or an object with per-step .lr and .wd; got "
                            f"{type(schedule).__name__} (for plain arrays, use PerStepLR(optimizer, lr, wd))")
        return cls(optimizer, schedule.lr, schedule.wd, **kwargs)

    # ------------------------------------------------------------------ position and values
    @property
    def optimizer(self):
        """The optimizer (torch's attribute); ``ChainedScheduler.__init__``'s read of it, before it stores any
        scheduler, is refused with ``RuntimeError`` (docs/maths-notes.md, PerStepLR, *Composition*)."""
        if sys._getframe(1).f_code is _CHAINED_INIT:
            raise RuntimeError(f"PerStepLR: {_COMPOSITION}")
        return self._optimizer

    @optimizer.setter
    def optimizer(self, optimizer) -> None:
        self._optimizer = optimizer

    @property
    def steps(self) -> int:
        """The schedule's length: ``step()`` may follow this many optimizer steps."""
        return len(self._lr)

    def _parts_at(self, k: int) -> tuple[float, int, float, int]:
        """(m_lr, e_lr, m_wd, e_wd) of step k, lr_k = m_lr·2^e_lr and wd_k = m_wd·2^e_wd: stored for a schedule
        in log space, ``math.frexp`` (exact) of plain values."""
        lr, wd = float(self._lr[k]), float(self._wd[k] if isinstance(self._wd, np.ndarray) else self._wd)
        if self._exponents is None:
            return (*math.frexp(lr), *math.frexp(wd))
        return lr, int(self._exponents[0][k]), wd, int(self._exponents[1][k])

    @property
    def last_epoch(self) -> int:
        """Index of the step the optimizer takes next (torch's name); −1 before the scheduler starts."""
        return self._last_epoch

    @last_epoch.setter
    def last_epoch(self, value: int) -> None:
        # SequentialLR "undoes" a later scheduler's initial step by setting last_epoch back to -1: the
        # weight decay written at construction must not leak into the steps before this one starts.
        self._last_epoch = value
        if value < 0 and hasattr(self, "_optimizer"):
            for group, own, invariant in zip(self._optimizer.param_groups, self._own_weight_decay, self._invariant()):
                if invariant and own is not None:
                    group["weight_decay"] = own

    @property
    def rescale(self) -> float:
        """R = lr_optimizer / lr_schedule (0.0 once it is below float64's range; ``log2_rescale`` is exact)."""
        return math.ldexp(1.0, self.log2_rescale)

    def _invariant(self) -> list[bool]:
        return [group.get(INVARIANT_KEY, True) is not False for group in self._optimizer.param_groups]

    def _lrs_at(self, k: int) -> list[float]:
        """Every group's lr at step k: ratio × lr_k × (R for scale-invariant groups)."""
        m_lr, e_lr, _, _ = self._parts_at(k)
        lrs = []
        for ratio, invariant in zip(self._ratios, self._invariant()):
            shift = self.log2_rescale if invariant else 0
            try:
                lr = ratio * math.ldexp(m_lr, e_lr + shift)
            except OverflowError:
                lr = math.inf
            if not lr <= self._dtype_max:
                raise OverflowError(
                    f"PerStepLR: the learning rate of step {k} is 2^{math.log2(m_lr) + e_lr + shift:.1f}, beyond the "
                    f"largest value of the parameters' dtype ({self._dtype_max:.3g}); pass rescale_above (e.g. "
                    "1e3) to keep it bounded by equivalent rescaling")
            lrs.append(lr)
        return lrs

    def get_lr(self) -> list[float]:
        """Every group's lr at the current step (torch's hook; ``get_last_lr()`` returns what was written)."""
        return self._lrs_at(min(self.last_epoch, self.steps - 1))

    _get_closed_form_lr = get_lr  # the schedule is given per step: its closed form is the chainable form

    # ------------------------------------------------------------------ stepping
    def _update_lr(self, epoch=None) -> None:
        """One scheduler step (or a jump to ``epoch``, as ``SequentialLR`` does when it switches to this one)."""
        if (groups := len(self._optimizer.param_groups)) != len(self._ratios):
            raise RuntimeError(f"PerStepLR: the optimizer has {groups} param groups, PerStepLR was built for "
                               f"{len(self._ratios)}; build the scheduler after adding every group")
        if epoch is None and self.last_epoch >= 0 and not self._is_initial:
            self._check_lr_is_ours()
        k = self.last_epoch + 1 if epoch is None else int(epoch)
        if not 0 <= k <= self.steps:
            raise IndexError(f"PerStepLR: the schedule has {self.steps} steps, so step() can follow its {self.steps} "
                             f"optimizer steps; this one would move to step {k}, past its end" if k > 0 else
                             f"PerStepLR: step index {k} < 0")
        position = min(k, self.steps - 1)
        log2_lr = self._log2_lr(position) + self.log2_rescale
        if self.rescale_above is not None and log2_lr > math.log2(self.rescale_above):
            self._apply_rescaling(math.ceil((log2_lr - self._log2_lr(0)) / 2))
        lrs = self._lrs_at(position)
        self.last_epoch = k
        _, _, m_wd, e_wd = self._parts_at(position)
        wd = math.ldexp(m_wd, e_wd - self.log2_rescale)
        for group, lr, invariant in zip(self._optimizer.param_groups, lrs, self._invariant()):
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
            if invariant and "weight_decay" in group:
                group["weight_decay"] = wd
        self._last_lr = [g["lr"].clone() if isinstance(g["lr"], torch.Tensor) else g["lr"]
                         for g in self._optimizer.param_groups]
        self._written = [(g["lr"], g["lr"]._version) if isinstance(g["lr"], torch.Tensor) else (None, None)
                         for g in self._optimizer.param_groups]

    def _check_lr_is_ours(self) -> None:
        """Refuse an lr changed since the last step.  A tensor lr that is the one written then, with the same
        version counter (no in-place write since), is not read: the host compares values only after a change."""
        for i, (group, ours, (tensor, version)) in enumerate(
                zip(self._optimizer.param_groups, self._last_lr, self._written)):
            if group["lr"] is tensor and tensor._version == version:
                continue
            if float(group["lr"]) != float(ours):
                raise RuntimeError(
                    f"PerStepLR: the lr of param group {i} was changed to {float(group['lr']):g} since PerStepLR set "
                    f"it to {float(ours):g}. {_COMPOSITION}")

    def _log2_lr(self, k: int) -> float:
        m_lr, e_lr, _, _ = self._parts_at(k)
        return math.log2(m_lr) + e_lr

    @torch.no_grad()
    def _apply_rescaling(self, j: int) -> None:
        """(θ, v, lr, wd) → (cθ, v/c, c²lr, wd/c²) with c = 2^−j on every scale-invariant group, and the
        model's running statistics (mean ×c, var ×c²); then ``on_rescale(c)``."""
        if self._probe_hook is not None:  # the first rescaling: check invariance once, then stop watching
            self._probe_hook.remove()
            self._probe_hook = None
            if self._probe is not None:
                self._warn_if_not_invariant()
            self._probe = None
        c = math.ldexp(1.0, -j)
        for p, invariant in self._parameters():
            if invariant:
                p.mul_(c)
                buf = self._optimizer.state.get(p, {}).get("momentum_buffer")
                if buf is not None:
                    buf.div_(c)
        if self.model is not None:
            rescale_running_statistics(self.model, c)
        self.log2_rescale -= 2 * j
        self.rescale_count += 1
        if self.on_rescale is not None:
            self.on_rescale(c)

    def _parameters(self):
        """(p, rescaled?) for every parameter of the optimizer: trainable ones of scale-invariant groups are."""
        for group, invariant in zip(self._optimizer.param_groups, self._invariant()):
            for p in group["params"]:
                yield p, invariant and p.requires_grad

    # ------------------------------------------------------------------ the cheap invariance check
    def _warn_if_not_invariant(self) -> None:
        """Warn unless the train-mode outputs on the last input at θ and 2^8·θ (an exact scaling, undone exactly) agree
        within ``INVARIANCE_TOLERANCE``; the running statistics are restored, so training is untouched."""
        model, up = self.model, 2.0**8
        buffers = [(b, b.clone()) for b in model.buffers()]
        training = model.training
        model.train()
        try:
            before = model(*self._probe)
            for p, invariant in self._parameters():
                if invariant:
                    p.mul_(up)
            after = model(*self._probe)
            for p, invariant in self._parameters():
                if invariant:
                    p.div_(up)
        finally:
            model.train(training)
            for b, saved in buffers:
                b.copy_(saved)
        if not (isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor)):
            return
        before, after = before.double(), after.double()
        change = ((after - before).abs().max() / before.abs().max().clamp_min(1e-300)).item()
        if not change <= INVARIANCE_TOLERANCE:
            warnings.warn(
                f"PerStepLR: the model's outputs change by {change:.3g} (relative) when the optimizer's parameters "
                f"are scaled by {up:g}: they are not scale invariant, so rescaling changes the training. Freeze the "
                f"others (explr.invariance.make_scale_invariant) or put them in a param group with "
                f"'{INVARIANT_KEY}': False", RuntimeWarning, stacklevel=5)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """Exactly ``STATE_KEYS`` (lists copied): a new attribute never enters checkpoints by itself.  The settings
        are Python numbers (a tensor lr's ``base_lrs`` too), so the state loads with ``weights_only=True``."""
        state = {key: copy.copy(getattr(self, key)) for key in STATE_KEYS}
        state["base_lrs"] = [float(base) for base in self.base_lrs]
        return state

    def load_state_dict(self, state_dict) -> None:
        """Restore the position and the rescaling; refuse a state of other keys or other settings (the schedule, its
        momentum, ``rescale_above``, the groups' lr ratios) with ``ValueError`` before anything is changed."""
        keys = set(state_dict) if isinstance(state_dict, dict) else set()
        if keys != set(STATE_KEYS):
            missing = sorted(set(STATE_KEYS) - keys)
            raise ValueError(f"PerStepLR.load_state_dict: not a PerStepLR state: missing {missing}"
                             f", unexpected {sorted(keys - set(STATE_KEYS))}")
        saved = _trajectory(state_dict)
        for name, value in _trajectory(self.state_dict()).items():
            if saved[name] != value:
                raise ValueError(
                    f"PerStepLR.load_state_dict: the saved state has {name} = {saved[name]!r}, this scheduler "
                    f"{value!r}: it belongs to a different schedule or setup; build the scheduler as the saved "
                    "one was built before resuming")
        for key in PROGRESS_KEYS[1:]:
            setattr(self, key, copy.copy(state_dict[key]))
        self._last_epoch = state_dict["last_epoch"]
        if self._last_epoch >= 0:  # the optimizer's lr and weight decay as they were when the state was saved
            self._update_lr(self._last_epoch)


def _trajectory(state: dict) -> dict:
    """The settings of a state that define the trajectory (the groups' lrs enter only through their ratios)."""
    bases = [float(base) for base in state["base_lrs"]]
    return {"steps": state["steps"], "fingerprint": state["fingerprint"], "momentum": state["momentum"],
            "rescale_above": state["rescale_above"], "param groups": len(bases),
            "lr ratios of the param groups": [base / bases[0] for base in bases]}


def _group_number(group: dict, i: int, key: str) -> float:
    """``group[key]`` (a number or a one-element tensor) as a float: > 0 for an lr, finite for a weight decay;
    ``ValueError`` naming the group, the key and the value otherwise."""
    value = group[key]
    number = value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
    lr = key != "weight_decay"
    ok, rule = is_real(number) and (number > 0 or not lr), "a finite number > 0" if lr else "a finite number"
    if not ok:
        shown = value if isinstance(value, torch.Tensor) else number
        raise ValueError(f"PerStepLR: param group {i} has {key} = {shown!r}; it must be {rule}"
                         + (" (every group keeps its lr ratio to the first one)" if lr else ""))
    return float(number)


def _check_sgd_momentum(optimizer, momentum: float) -> None:
    """An equivalent schedule is exact for ``torch.optim.SGD`` with its momentum, no dampening, no Nesterov."""
    if not isinstance(optimizer, torch.optim.SGD):
        raise TypeError(f"the schedule is an exact equivalent for torch.optim.SGD with momentum={momentum!r}; "
                        f"got {type(optimizer).__name__} (play plain lr/wd arrays into other optimizers)")
    for i, group in enumerate(optimizer.param_groups):
        if group.get(INVARIANT_KEY, True) is False:
            continue
        if group["momentum"] != momentum or group.get("dampening", 0) != 0 or group.get("nesterov", False):
            raise ValueError(
                f"the schedule was built for momentum={momentum!r} (no dampening, no Nesterov), but param group {i} "
                f"of the optimizer has momentum={group['momentum']!r}, dampening={group.get('dampening', 0)!r}, "
                f"nesterov={group.get('nesterov', False)!r}: build both with the same momentum")
