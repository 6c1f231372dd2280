"""A run's ``checkpoint.pt``: :class:`Checkpoint`, written after every epoch (:func:`checkpoint_state`,
:func:`serialize_checkpoint`), read (:func:`load_checkpoint`) and checked before a resume reads it
(:func:`check_checkpoint`, :func:`check_epoch`, :func:`check_states`, :func:`check_progress`; its metrics rows:
:func:`explr.cifar10.metrics.check_rows`; its sha256 against the manifest's:
:func:`explr.cifar10.manifest.checkpoint_of`).  Each refusal is one :class:`~explr.cifar10.lock.RunError` line
naming the file, raised before anything is written.  The scheduler's part is
:class:`~explr.lr_scheduler.PerStepLR`'s own ``state_dict``, checked by its own ``load_state_dict``.
"""
from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import TypedDict

import torch

from ..lr_scheduler import PerStepLR
from ..models import PreResNet
from ..params import Float, Text, is_int
from .config import RESOLVED_KEYS, TrainConfig
from .files import read_run_file
from .lock import RunError
from .played import rescale_limit

__all__ = ["CHECKPOINT", "CHECKPOINT_KEYS", "FORMAT", "Checkpoint", "check_checkpoint", "check_epoch",
           "check_progress", "check_states", "checkpoint_state", "load_checkpoint", "refuse", "serialize_checkpoint",
           "shown"]

#: the checkpoint's name in a run folder
CHECKPOINT = "checkpoint.pt"
#: the format of the run files (the checkpoint's and the manifest's ``format``)
FORMAT = "explr.cifar10/1"


class Checkpoint(TypedDict, total=False):
    """What checkpoint.pt holds: :meth:`~explr.cifar10.engine.Trainer.state_dict` (model, optimizer, scheduler,
    initial_loss), the epochs done and their metrics rows, the config as recorded, the resolved settings, the data's
    sha256, the seconds trained and :data:`FORMAT`."""

    model: dict
    optimizer: dict
    scheduler: dict
    initial_loss: float | None
    epoch: int
    metrics: list
    config: dict
    resolved: dict | None
    data_sha256: str
    elapsed: float
    format: str


#: the keys every checkpoint of this engine holds (older ones lack initial_loss, resolved, elapsed and format)
CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "epoch", "metrics", "config", "data_sha256")
#: the rules of the checkpoint's own fields (the settings are compared with the run's by runfolder.check_run)
_SAVED = {"data_sha256": Text("the data's sha256 (a string)"), "elapsed": Float(0, lo_open=False),
          "initial_loss": Float(0, lo_open=False)}


def refuse(path: Path, what: str) -> RunError:
    """The refusal of the run file ``path`` that ``what`` is wrong with."""
    return RunError(f"{path} {what} (hand-edited?); restore it, or delete the folder {path.parent} to train this run "
                    "again from the start")


def shown(value) -> str:
    """``repr(value)`` on one line of at most 40 characters, for an error message."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 40 else text[:37] + "..."


def checkpoint_state(trainer_state: dict, epoch: int, metrics: list, config: dict, resolved: dict, data_sha256: str,
                     elapsed: float) -> Checkpoint:
    """The checkpoint after ``epoch`` epochs (``config`` as recorded; of ``resolved``, :data:`RESOLVED_KEYS`)."""
    return Checkpoint(**trainer_state, epoch=epoch, metrics=metrics, config=config,
                      resolved={k: resolved[k] for k in RESOLVED_KEYS}, data_sha256=data_sha256, elapsed=elapsed,
                      format=FORMAT)


def serialize_checkpoint(state: Checkpoint) -> tuple[bytes, str]:
    """The bytes ``torch.save`` makes of ``state``, and their sha256 (recorded in the manifest)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def load_checkpoint(folder) -> tuple[Checkpoint, str]:
    """``folder/checkpoint.pt`` and its sha256, checked: readable and this engine's keys.  :class:`RunError` saying
    what to do otherwise."""
    folder = Path(folder)
    path = folder / CHECKPOINT
    try:
        data = read_run_file(path)
        saved = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, empty, not a torch file, or a pickle with foreign objects
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'empty'}"
        raise RunError(f"{path} is not a readable checkpoint ({reason[:160]}); delete the folder {folder} to train "
                       "this run again from the start") from None
    if (not isinstance(saved, dict) or any(k not in saved for k in CHECKPOINT_KEYS)
            or not isinstance(saved["config"], dict) or not isinstance(saved["metrics"], list)):
        raise RunError(f"{path} is not a checkpoint of this engine (expected the keys {', '.join(CHECKPOINT_KEYS)}); "
                       f"delete the folder {folder} to train this run again from the start")
    return saved, hashlib.sha256(data).hexdigest()


def check_checkpoint(saved: Checkpoint, path) -> None:
    """The fields of the checkpoint at ``path`` that a resume reads and that need no run to check: ``data_sha256``
    (a string), ``elapsed`` (seconds >= 0, if present), ``initial_loss`` (None or a finite loss >= 0, if present)
    and ``resolved`` (None or a dict, if present).  Anything else is a :class:`RunError` naming ``path``."""
    path = Path(path)
    for key, rule in _SAVED.items():
        if key in saved and not (key == "initial_loss" and saved[key] is None) and not rule.ok(saved[key]):
            raise refuse(path, f"holds {key} = {shown(saved[key])}, not {rule.rule()}")
    if saved.get("resolved") is not None and not isinstance(saved["resolved"], dict):
        raise refuse(path, f"holds resolved = {shown(saved['resolved'])}, not a dict of settings")


def check_epoch(saved: Checkpoint, config: TrainConfig, path: Path) -> None:
    """The checkpoint's epoch is an integer in [1, epochs] with one metrics row per epoch."""
    epoch, rows = saved["epoch"], len(saved["metrics"])
    if not (is_int(epoch) and 1 <= epoch <= config.epochs and rows == epoch):
        raise RunError(f"{path} records epoch {epoch!r} with {rows} metrics rows, not an epoch in [1, "
                       f"{config.epochs}] with one row each (hand-edited?); restore it, or delete the folder "
                       f"{path.parent} to train this run again from the start")


def check_states(saved: Checkpoint, config: TrainConfig, path: Path) -> None:
    """The model and optimizer states load into this run's network (built on the meta device, then given the
    saved tensors themselves: nothing is allocated or copied)."""
    try:
        with torch.device("meta"):
            model = PreResNet(config.depth, invariant=config.invariant, eps=config.bn_eps)
        model.load_state_dict(saved["model"], assign=True)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(params, lr=1.0, momentum=config.momentum)
        optimizer.load_state_dict(saved["optimizer"])
        for p in params:
            buf = optimizer.state.get(p, {}).get("momentum_buffer")
            if buf is not None and buf.shape != p.shape:
                raise ValueError(f"a momentum buffer of shape {tuple(buf.shape)} for a weight of shape {tuple(p.shape)}")
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as err:
        reason = " ".join(str(err).split())[:160]
        raise RunError(f"{path} does not fit this run's PreResNet{config.depth} ({reason}); restore it, or delete "
                       f"the folder {path.parent} to train this run again from the start") from None


def check_progress(saved: Checkpoint, config: TrainConfig, steps_per_epoch: int, path, *, schedule) -> None:
    """The scheduler state of the checkpoint at ``path`` (of a run whose settings, epoch and tensors were checked)
    is one that ``config``'s scheduler, playing ``schedule`` (``config``'s played schedule), loads
    (:meth:`PerStepLR.check_state_dict`, the checks of its ``load_state_dict``) at the checkpoint's epoch:
    ``last_epoch`` = epoch × ``steps_per_epoch``.  Otherwise a :class:`RunError` naming ``path``."""
    path = Path(path)
    state = saved["scheduler"]
    try:
        PerStepLR.check_state_dict(state, schedule, rescale_above=rescale_limit(config))
    except (ValueError, TypeError, OverflowError) as err:
        reason = " ".join(str(err).split())[:200]
        raise refuse(path, f"holds a scheduler state this run's schedule cannot resume from ({reason})") from None
    steps = saved["epoch"] * steps_per_epoch
    if state["last_epoch"] != steps:
        raise refuse(path, f"holds a scheduler at step last_epoch = {state['last_epoch']}, not at the {steps} steps of "
                     f"its {saved['epoch']} epochs")
