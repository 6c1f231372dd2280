"""The CIFAR-10 training engine: schedules of Li & Arora (2020, Sec. 5) on a PreResNet, resumable runs.

One run = one (schedule, seed) pair trained for ``epochs`` epochs, written to its own directory::

    manifest.json    full config, resolved device/precision, data source and checksum, git commit,
                     torch version, status ("running", "finished", "diverged", "interrupted")
    metrics.jsonl    one JSON object per finished epoch (see ``METRIC_KEYS``); rewritten atomically
    checkpoint.pt    model, optimizer, scheduler and the metrics so far, after every epoch (atomic)

The five schedules (``SCHEDULES``), for base lr η₀, weight decay λ, momentum γ, E epochs of S steps:

* ``step``        -- step decay (η₀, ×``decay_factor`` at ``decay_epochs``) with weight decay λ;
* ``texp``        -- its exact weight-decay-free equivalent, TEXP (Theorem 2.12, with the momentum
                     corrections of :func:`explr.schedules.texp`), no weight decay;
* ``texp--``      -- TEXP-- (Sec. 5): TEXP without the instant LR drops, no weight decay;
* ``cosine``      -- cosine annealing per epoch, η_e = η₀(1 + cos(πe/E))/2, with weight decay λ;
* ``cosine-texp`` -- TEXP of that per-epoch cosine (one phase per epoch, corrections on): the
                     paper's cosine/exponential hybrid, no weight decay.

The exponential ones run through :class:`explr.scheduler.PerStepLR` with ``rescale_above``: when
the learning rate would exceed it, (θ, v, lr) → (cθ, v/c, c²lr) -- the same network function -- and
the BN running statistics are rescaled with θ (:meth:`explr.models.PreResNet.rescale_bn_statistics`),
so float32/bf16 never overflow.  Metrics report the schedule's lr (``lr``), the optimizer's actual
lr (``lr_opt``), the accumulated factor R = lr_opt/lr (``rescale``), ‖θ‖ in the schedule's units
(``weight_norm`` = ‖θ_opt‖/√R) and the effective lr, lr/‖θ‖² = lr_opt/‖θ_opt‖² (Lemma 1.3).

The hot loop keeps everything on the device (data, augmentation, metric sums) and synchronises with
the host only every ``log_every`` steps (progress bar, NaN/inf check) and at the end of an epoch.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .data import CifarArrays, DeviceData, load_cifar10
from .invariance import flat_norm
from .models import PreResNet
from .scheduler import PerStepLR
from .schedules import CORRECTIONS, cosine, step_decay, texp, texp_minus_minus

__all__ = [
    "SCHEDULES",
    "EXPONENTIAL",
    "METRIC_KEYS",
    "TrainConfig",
    "TrainingDiverged",
    "Trainer",
    "RunResult",
    "schedule_arrays",
    "default_decay_epochs",
    "train_run",
    "resume_mismatch",
    "run_many",
    "run_dir",
    "read_metrics",
    "load_runs",
]

SCHEDULES = ("step", "texp", "texp--", "cosine", "cosine-texp")
EXPONENTIAL = ("texp", "texp--", "cosine-texp")
PRECISIONS = ("auto", "fp32", "bf16", "fp64")
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune")
METRIC_KEYS = (
    "epoch", "step", "train_loss", "train_acc", "test_loss", "test_acc", "lr", "lr_opt", "rescale",
    "rescale_count", "weight_norm", "weight_norm_opt", "effective_lr", "seconds", "train_seconds",
    "eval_seconds", "images_per_s",
)
#: metrics that depend on wall-clock time (everything else is reproducible bit for bit on a CPU).
TIMING_KEYS = ("seconds", "train_seconds", "eval_seconds", "images_per_s")
#: config fields that define the trajectory; a resumed run must agree on all of them.
TRAJECTORY_KEYS = (
    "schedule", "epochs", "seed", "lr", "wd", "momentum", "batch_size", "decay_epochs", "decay_factor",
    "depth", "invariant", "bn_eps", "corrections", "rescale_above", "augment", "precision",
)
CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
MANIFEST = "manifest.json"


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite; the last good checkpoint is kept."""


# ----------------------------------------------------------------------------- configuration
@dataclass
class TrainConfig:
    """Everything that defines a run (the CLI flag of a field is ``--`` + its name with ``-``).

    ``decay_epochs=None`` means the step-decay milestones at 50 % and 75 % of ``epochs`` (100 and
    150 of 200, the usual CIFAR recipe).  ``precision="auto"``: bf16 autocast on CUDA, float32
    elsewhere.  ``device="auto"``: CUDA if available, else CPU.
    """

    schedule: str = "step"
    epochs: int = 200
    seed: int = 0
    lr: float = 0.1
    wd: float = 5e-4
    momentum: float = 0.9
    batch_size: int = 128
    decay_epochs: tuple | None = None
    decay_factor: float = 0.1
    depth: int = 32
    invariant: bool = True
    bn_eps: float = 1e-5
    corrections: str = "all"
    rescale_above: float = 100.0
    augment: bool = True
    data: str = "auto"
    data_root: str = "data"
    device: str = "auto"
    precision: str = "auto"
    channels_last: bool = True
    compile: str = "none"
    threads: int | None = None
    eval_batch_size: int = 1000
    log_every: int = 25

    def validate(self) -> "TrainConfig":
        """Raise ``ValueError`` naming the field (and its CLI flag) for any invalid value."""

        def bad(name, rule, value):
            raise ValueError(f"{name} (--{name.replace('_', '-')}) must be {rule}; got {value!r}")

        def pos_int(name, minimum=1):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
                bad(name, f"an integer >= {minimum}", v)

        def finite(name, lo=None, hi=None, lo_open=False, hi_open=False):
            v = getattr(self, name)
            ok = isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool) and math.isfinite(v)
            if ok and lo is not None:
                ok = v > lo if lo_open else v >= lo
            if ok and hi is not None:
                ok = v < hi if hi_open else v <= hi
            if not ok:
                rule = f"a finite number in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
                bad(name, rule, v)

        if self.schedule not in SCHEDULES:
            bad("schedule", f"one of {', '.join(SCHEDULES)}", self.schedule)
        pos_int("epochs")
        pos_int("seed", 0)
        pos_int("batch_size")
        pos_int("eval_batch_size")
        pos_int("log_every")
        finite("lr", 0, math.inf, lo_open=True, hi_open=True)
        finite("wd", 0, math.inf, hi_open=True)
        finite("momentum", 0, 1, hi_open=True)
        finite("decay_factor", 0, 1, lo_open=True)
        finite("bn_eps", 0, math.inf, lo_open=True, hi_open=True)
        finite("rescale_above", 0, math.inf, lo_open=True, hi_open=True)
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 8 or (self.depth - 2) % 6:
            bad("depth", "6n + 2 with n >= 1 (20, 32, 56, ...)", self.depth)
        if self.decay_epochs is not None:
            ms = list(self.decay_epochs)
            if any(isinstance(m, bool) or not isinstance(m, (int, np.integer)) for m in ms) or any(
                b <= a for a, b in zip(ms, ms[1:])
            ) or (ms and (ms[0] < 1 or ms[-1] >= self.epochs)):
                bad("decay_epochs", f"strictly increasing integers in [1, epochs - 1] = [1, {self.epochs - 1}]", ms)
        if self.corrections not in CORRECTIONS:
            bad("corrections", f"one of {', '.join(CORRECTIONS)}", self.corrections)
        if self.precision not in PRECISIONS:
            bad("precision", f"one of {', '.join(PRECISIONS)}", self.precision)
        if self.compile not in COMPILE_MODES:
            bad("compile", f"one of {', '.join(COMPILE_MODES)}", self.compile)
        if self.threads is not None:
            pos_int("threads")
        if self.schedule in EXPONENTIAL and not self.invariant:
            raise ValueError(
                f"schedule (--schedule) {self.schedule!r} is an exponential schedule, exact only for a scale-invariant "
                "network and rescaled during training; it needs invariant=True (drop --no-invariant)"
            )
        try:
            torch.device("cuda" if self.device == "auto" else self.device)
        except (RuntimeError, TypeError):
            bad("device", "'auto', 'cpu', 'cuda', 'cuda:N', 'mps' or another torch device", self.device)
        return self

    def milestones(self) -> list[int]:
        return list(self.decay_epochs) if self.decay_epochs is not None else default_decay_epochs(self.epochs)


def default_decay_epochs(epochs: int) -> list[int]:
    """Step-decay milestones at 50 % and 75 % of training ([100, 150] for 200 epochs)."""
    return sorted({m for m in (round(0.5 * epochs), round(0.75 * epochs)) if 1 <= m <= epochs - 1})


def schedule_arrays(config: TrainConfig, steps_per_epoch: int):
    """Per-step (lr, wd) arrays of ``config.schedule``, and whether it is exponential (module docstring)."""
    c = config
    E, S = c.epochs, steps_per_epoch
    if c.schedule in ("step", "texp", "texp--"):
        base = step_decay(c.lr, E, S, c.milestones(), c.decay_factor)
    else:
        base = cosine(c.lr, E, S, per="epoch")
    if c.schedule in ("step", "cosine"):
        return base, np.full(len(base), float(c.wd)), False
    if c.schedule == "texp--":
        eq = texp_minus_minus(base, c.wd, c.momentum, corrections=c.corrections)
    else:
        eq = texp(base, c.wd, c.momentum, corrections=c.corrections)
    return eq.lr, eq.wd, True


# ----------------------------------------------------------------------------- small utilities
def _atomic_write(path: Path, write) -> None:
    """Write via a temporary file in the same folder, fsync, then os.replace (never a torn file)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _write_json(path, obj) -> None:
    _atomic_write(path, lambda f: f.write((json.dumps(obj, indent=2) + "\n").encode()))


def _write_metrics(path, rows) -> None:
    _atomic_write(path, lambda f: f.write("".join(json.dumps(r) + "\n" for r in rows).encode()))


def read_metrics(path) -> list[dict]:
    """The per-epoch rows of a run (``path``: its directory or its metrics.jsonl)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_dir(out, schedule: str, seed: int) -> Path:
    """Where a run lives: ``<out>/<schedule>/seed<seed>``."""
    return Path(out) / schedule / f"seed{seed}"


def load_runs(out) -> list[dict]:
    """Every run under ``out``: dicts with ``schedule, seed, dir, manifest`` and ``metrics`` (key → np.array)."""
    runs = []
    for manifest_path in sorted(Path(out).glob(f"*/seed*/{MANIFEST}")):
        manifest = json.loads(manifest_path.read_text())
        rows = read_metrics(manifest_path.parent) if (manifest_path.parent / METRICS).exists() else []
        metrics = {k: np.array([r[k] for r in rows]) for k in (rows[0] if rows else {})}
        cfg = manifest["config"]
        runs.append({"schedule": cfg["schedule"], "seed": cfg["seed"], "dir": manifest_path.parent,
                     "manifest": manifest, "metrics": metrics})
    return runs


def _git_commit() -> dict:
    """The commit of the source tree; a copy without ``.git`` may name it in ``EXPLR_GIT_COMMIT``."""
    here = Path(__file__).resolve().parent
    if os.environ.get("EXPLR_GIT_COMMIT"):
        return {"commit": os.environ["EXPLR_GIT_COMMIT"], "dirty": None, "from": "EXPLR_GIT_COMMIT"}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return {"commit": None, "dirty": None}
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "."],
                               cwd=here, capture_output=True, text=True, timeout=10)
        return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device (--device) {name!r}: CUDA is not available on this machine")
    return device


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision != "auto":
        return precision
    return "bf16" if device.type == "cuda" else "fp32"


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ----------------------------------------------------------------------------- the trainer
class Trainer:
    """Model, optimizer, scheduler and device data of one run; ``train_epoch`` is the hot loop.

    Built from a validated :class:`TrainConfig` and in-memory :class:`~explr.data.CifarArrays`
    (use :func:`train_run` for the full run with files, resume and progress bar).
    """

    def __init__(self, config: TrainConfig, arrays: CifarArrays, device: torch.device | None = None):
        self.config = c = config
        self.device = device if device is not None else resolve_device(c.device)
        self.precision = resolve_precision(c.precision, self.device)
        dtype = torch.float64 if self.precision == "fp64" else torch.float32
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed shapes: let cuDNN pick the fastest convolutions
        self.data = DeviceData(arrays, self.device, dtype=dtype, channels_last=c.channels_last, augment=c.augment)
        self.steps_per_epoch = self.data.steps_per_epoch(c.batch_size)
        lr, wd, exponential = schedule_arrays(c, self.steps_per_epoch)
        self.schedule_lr = lr
        self.model = PreResNet(c.depth, invariant=c.invariant, eps=c.bn_eps, seed=c.seed).to(dtype)
        if c.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.model.to(self.device)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.params = params
        kwargs = {"fused": True} if self.device.type == "cuda" else {}
        self.optimizer = torch.optim.SGD(params, lr=float(lr[0]), momentum=c.momentum, **kwargs)
        self.scheduler = PerStepLR(self.optimizer, lr, wd, rescale_above=c.rescale_above if exponential else None)
        self._seen_rescale = self.scheduler.rescale
        self.forward = self.model if c.compile == "none" else torch.compile(
            self.model, mode=None if c.compile == "default" else c.compile)
        if self.precision == "bf16":
            self.autocast = lambda: torch.autocast(self.device.type, dtype=torch.bfloat16)
        else:
            self.autocast = contextlib.nullcontext
        self.acc_dtype = torch.float64 if self.precision == "fp64" else torch.float32

    # -- one step, exactly as the benchmark's bare loop plus data, scheduler and metric sums
    def _after_step(self) -> None:
        self.scheduler.step()
        r = self.scheduler.rescale
        if r != self._seen_rescale:  # θ was just multiplied by c = sqrt(r / r_old): follow with BN stats
            self.model.rescale_bn_statistics(math.sqrt(r / self._seen_rescale))
            self._seen_rescale = r

    def train_epoch(self, epoch: int, on_sync=None):
        """Train one epoch; returns (loss_sum, correct, n) as host numbers.

        ``on_sync(done_steps, loss_sum, correct, n)`` is called every ``log_every`` steps (the only host
        syncs inside the epoch besides the last one); a non-finite loss raises :class:`TrainingDiverged`.
        """
        state = self.begin_epoch(epoch)
        self.run_steps(state, 0, state["plan"].steps, on_sync)
        return self.end_epoch(state)

    def begin_epoch(self, epoch: int) -> dict:
        """The epoch's plan (order, crops, flips) and zeroed on-device metric sums."""
        self.model.train()
        return {
            "epoch": epoch,
            "plan": self.data.epoch_plan(self.config.seed, epoch, self.config.batch_size),
            "loss_sum": torch.zeros((), dtype=self.acc_dtype, device=self.device),
            "correct": torch.zeros((), dtype=torch.int64, device=self.device),
        }

    def run_steps(self, state: dict, start: int, stop: int, on_sync=None) -> None:
        """Steps ``start..stop-1`` of the epoch in ``state``: the hot loop, no host sync except every log_every."""
        c, data, plan = self.config, self.data, state["plan"]
        loss_sum, correct = state["loss_sum"], state["correct"]
        forward, opt = self.forward, self.optimizer
        for k in range(start, stop):
            x, y = data.train_batch(plan, k)
            with self.autocast():
                out = forward(x)
                loss = F.cross_entropy(out, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            self._after_step()
            loss_sum += loss.detach()
            correct += (out.detach().argmax(1) == y).sum()
            if (k + 1) % c.log_every == 0 and k + 1 < plan.steps:
                loss_now = loss_sum.item()
                if not math.isfinite(loss_now):
                    raise TrainingDiverged(f"non-finite training loss in epoch {state['epoch'] + 1} (by step "
                                           f"{k + 1} of {plan.steps})")
                if on_sync is not None:
                    on_sync(k + 1, loss_now, correct.item(), (k + 1) * c.batch_size)

    def end_epoch(self, state: dict):
        """(loss_sum, correct, n) of the epoch: the one host sync at its end."""
        plan = state["plan"]
        loss_total, correct_total = state["loss_sum"].item(), state["correct"].item()
        if not math.isfinite(loss_total):
            raise TrainingDiverged(f"non-finite training loss in epoch {state['epoch'] + 1}")
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

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._seen_rescale = self.scheduler.rescale


# ----------------------------------------------------------------------------- a full run
@dataclass
class RunResult:
    """What :func:`train_run` returns: ``status`` is finished, diverged, interrupted or skipped."""

    out: Path
    status: str
    epochs_done: int
    metrics: list = field(default_factory=list)
    message: str = ""


def _config_dict(config: TrainConfig) -> dict:
    """The config as recorded: resolved milestones, and no path of this machine (the data is identified by
    name, kind and sha256 in the manifest's ``data``)."""
    d = asdict(config)
    d["decay_epochs"] = config.milestones()
    if d["data"] not in ("auto", "synthetic"):
        d["data"] = Path(d["data"]).name
    d["data_root"] = None
    return d


def _mismatch(saved: dict, current: dict) -> list[str]:
    return [k for k in TRAJECTORY_KEYS if saved.get(k) != current.get(k)]


def resume_mismatch(config: TrainConfig, out) -> list[str]:
    """Trajectory-defining settings on which ``config`` differs from the run saved in ``out`` (its manifest)."""
    path = Path(out) / MANIFEST
    if not (Path(out) / CHECKPOINT).exists() or not path.exists():
        return []
    saved = json.loads(path.read_text()).get("config", {})
    cfg = _config_dict(config)
    return [f"{k}={saved.get(k)!r} (now {cfg.get(k)!r})" for k in _mismatch(saved, cfg)]


def train_run(config: TrainConfig, out, arrays: CifarArrays | None = None, *, resume: bool = False,
              progress: bool = True, position: int = 0, stop_after: int | None = None) -> RunResult:
    """Train one run into the directory ``out`` (created); see the module docstring for the files.

    ``resume=True`` continues from ``out/checkpoint.pt`` if there is one (the trajectory-defining
    config must match; a finished run is returned as is) and starts fresh otherwise; without it an
    existing checkpoint is an error.  ``stop_after=k`` stops after epoch k (status "interrupted";
    to test resuming).  Raises :class:`TrainingDiverged` when the loss becomes NaN/inf: the
    checkpoint of the last finished epoch stays, the manifest says what happened.
    """
    from tqdm import tqdm

    config.validate()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_path, manifest_path = out / CHECKPOINT, out / MANIFEST
    cfg = _config_dict(config)
    saved = None
    if ckpt_path.exists():
        if not resume:
            raise FileExistsError(f"{out} already holds a run ({CHECKPOINT}); pass --resume to continue it or "
                                  "choose another --out")
        saved = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        diff = _mismatch(saved["config"], cfg)
        if diff:
            raise ValueError(f"--resume: the run in {out} was made with other settings: "
                             + ", ".join(f"{k}={saved['config'].get(k)!r} (now {cfg.get(k)!r})" for k in diff))
        if saved["epoch"] >= config.epochs:
            return RunResult(out, "finished", saved["epoch"], saved["metrics"], "already finished")
    elif (out / METRICS).exists() and not resume:
        raise FileExistsError(f"{out} already holds metrics; pass --resume or choose another --out")

    arrays = load_cifar10(config.data, config.data_root) if arrays is None else arrays
    if saved is not None and saved["data_sha256"] != arrays.sha256:
        raise ValueError(f"--resume: the run in {out} was trained on other data (sha256 {saved['data_sha256'][:12]}…, "
                         f"now {arrays.sha256[:12]}…)")
    trainer = Trainer(config, arrays)
    history, start, elapsed = [], 0, 0.0
    if saved is not None:
        trainer.load_state_dict(saved)
        history, start, elapsed = list(saved["metrics"]), int(saved["epoch"]), float(saved.get("elapsed", 0.0))
    S, B = trainer.steps_per_epoch, config.batch_size
    manifest = json.loads(manifest_path.read_text()) if (saved is not None and manifest_path.exists()) else {}
    devices = manifest.get("devices", [])
    dev_name = _device_name(trainer.device)
    if dev_name not in devices:
        devices.append(dev_name)
    manifest.update({
        "format": "explr.cifar10/1",
        "status": "running",
        "message": "",
        "config": cfg,
        "resolved": {
            "device": str(trainer.device), "precision": trainer.precision, "steps_per_epoch": S,
            "total_steps": S * config.epochs, "milestones": config.milestones(), "threads": torch.get_num_threads(),
            "lr_schedule": {"first": float(trainer.schedule_lr[0]), "last": float(trainer.schedule_lr[-1]),
                            "max": float(trainer.schedule_lr.max())},
            "normalisation": {"mean": trainer.data.mean.tolist(), "std": trainer.data.std.tolist()},
        },
        "devices": devices,
        "data": arrays.describe(),
        "environment": {
            "torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "git": _git_commit(),
            "cuda": torch.version.cuda if trainer.device.type == "cuda" else None,
        },
        "started": manifest.get("started", _now()),
        "updated": _now(),
        "epochs_done": start,
        "elapsed_seconds": elapsed,
    })
    _write_json(manifest_path, manifest)
    _write_metrics(out / METRICS, history)  # the checkpoint's history is authoritative

    bar = tqdm(total=config.epochs * S, initial=start * S, desc=f"{config.schedule} seed {config.seed}",
               disable=not progress, position=position, leave=True, dynamic_ncols=True, unit="step",
               file=sys.stderr)
    last_test = history[-1]["test_acc"] if history else None
    status, message = "finished", ""
    try:
        for epoch in range(start, config.epochs):
            shown = [0]

            def on_sync(steps, loss_sum, correct, n):
                bar.update(steps - shown[0])
                shown[0] = steps
                post = {"loss": f"{loss_sum / steps:.3f}", "acc": f"{correct / n:.3f}"}
                if last_test is not None:
                    post["test"] = f"{last_test:.3f}"
                bar.set_postfix(post, refresh=False)

            t0 = time.perf_counter()
            loss_sum, correct, n = trainer.train_epoch(epoch, on_sync if progress else None)
            t1 = time.perf_counter()
            test_loss, test_acc = trainer.evaluate()
            t2 = time.perf_counter()
            norm_opt = trainer.norms()
            sched = trainer.scheduler
            k_last = (epoch + 1) * S - 1
            lr_sched = float(trainer.schedule_lr[k_last])
            lr_opt = lr_sched * sched.rescale
            norm = norm_opt / math.sqrt(sched.rescale)
            if not math.isfinite(norm_opt) or not math.isfinite(test_loss):
                raise TrainingDiverged(f"non-finite weights or test loss after epoch {epoch + 1}")
            row = {
                "epoch": epoch + 1, "step": (epoch + 1) * S,
                "train_loss": loss_sum / S, "train_acc": correct / n,
                "test_loss": test_loss, "test_acc": test_acc,
                "lr": lr_sched, "lr_opt": lr_opt, "rescale": sched.rescale, "rescale_count": sched.rescale_count,
                "weight_norm": norm, "weight_norm_opt": norm_opt, "effective_lr": lr_opt / norm_opt**2,
                "seconds": None, "train_seconds": t1 - t0, "eval_seconds": t2 - t1, "images_per_s": n / (t1 - t0),
            }
            elapsed += time.perf_counter() - t0
            row["seconds"] = time.perf_counter() - t0
            history.append(row)
            state = trainer.state_dict()
            state.update({"epoch": epoch + 1, "metrics": history, "config": cfg, "data_sha256": arrays.sha256,
                          "elapsed": elapsed})
            _atomic_write(ckpt_path, lambda f: torch.save(state, f))  # first the checkpoint, then the metrics:
            _write_metrics(out / METRICS, history)  # a resume rewrites them from the checkpoint anyway
            manifest.update({"updated": _now(), "epochs_done": epoch + 1, "elapsed_seconds": elapsed})
            _write_json(manifest_path, manifest)
            last_test = test_acc
            bar.update((epoch + 1) * S - bar.n)
            bar.set_postfix({"loss": f"{row['train_loss']:.3f}", "acc": f"{row['train_acc']:.3f}",
                             "test": f"{test_acc:.3f}"})
            if stop_after is not None and epoch + 1 >= stop_after and epoch + 1 < config.epochs:
                status, message = "interrupted", f"stopped after epoch {epoch + 1} (stop_after)"
                break
    except TrainingDiverged as err:
        done = len(history)
        message = (f"{err}; stopped. The last good checkpoint ({'epoch ' + str(done) if done else 'none: no epoch finished'}) "
                   f"is kept in {ckpt_path if done else out}. Lower --lr or check the data.")
        manifest.update({"status": "diverged", "message": message, "updated": _now()})
        _write_json(manifest_path, manifest)
        raise TrainingDiverged(message) from None
    finally:
        bar.close()
    manifest.update({"status": status, "message": message, "updated": _now(), "elapsed_seconds": elapsed})
    if history:
        manifest["final"] = {k: history[-1][k] for k in ("epoch", "train_loss", "train_acc", "test_loss", "test_acc")}
    _write_json(manifest_path, manifest)
    return RunResult(out, status, len(history), history, message)


# ----------------------------------------------------------------------------- several runs
def _worker(config_dict: dict, out: str, resume: bool, progress: bool, position: int) -> dict:
    config = TrainConfig(**config_dict)
    try:
        r = train_run(config, out, resume=resume, progress=progress, position=position)
        return {"out": str(r.out), "status": r.status, "epochs_done": r.epochs_done, "message": r.message,
                "final": r.metrics[-1] if r.metrics else None}
    except TrainingDiverged as err:
        return {"out": out, "status": "diverged", "message": str(err), "final": None}


def run_many(configs: list[TrainConfig], out, *, arrays: CifarArrays | None = None, jobs: int = 1,
             resume: bool = False, progress: bool = True) -> list[dict]:
    """Train every config into ``run_dir(out, schedule, seed)``; ``jobs > 1`` runs that many at once.

    Sequential runs share one in-memory copy of the data.  Concurrent runs are separate processes
    (each loads the data and its model onto the device; on a GPU they overlap each other's kernel
    launches, which is where small-batch ResNet training loses most of its time).  A diverged run is
    reported and the others go on.  Returns one summary dict per run, in order.
    """
    for c in configs:
        c.validate()
    dirs = [str(run_dir(out, c.schedule, c.seed)) for c in configs]
    if len(set(dirs)) != len(dirs):
        raise ValueError("two runs would share a directory: give each (schedule, seed) once")
    if jobs <= 1 or len(configs) == 1:
        if arrays is None:
            arrays = load_cifar10(configs[0].data, configs[0].data_root)
        results = []
        for c, d in zip(configs, dirs):
            try:
                r = train_run(c, d, arrays, resume=resume, progress=progress)
                results.append({"out": d, "status": r.status, "epochs_done": r.epochs_done, "message": r.message,
                                "final": r.metrics[-1] if r.metrics else None})
            except TrainingDiverged as err:
                results.append({"out": d, "status": "diverged", "message": str(err), "final": None})
        return results
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    if arrays is not None:
        raise ValueError("jobs > 1: every worker process loads config.data itself; do not pass arrays")
    load_cifar10(configs[0].data, configs[0].data_root)  # download/check once before the workers start
    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(_worker, dataclasses.asdict(c), d, resume, progress, i % jobs)
                   for i, (c, d) in enumerate(zip(configs, dirs))]
        return [f.result() for f in futures]
