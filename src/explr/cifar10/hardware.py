"""What a run runs on: the device, its precision, the CPU threads this process may really use, one GPU per worker.

``os.cpu_count()`` reports the host's cores, not what a process may use; a SLURM job, ``taskset`` or Docker's
``--cpuset-cpus`` limit a process by its CPU affinity, which :func:`available_cpus` counts
(``os.sched_getaffinity``).  The default threads leave one CPU free (docs/cifar10-engine.md, "CPU threads").
"""
from __future__ import annotations

import os
import platform

import torch

__all__ = [
    "available_cpus",
    "available_memory",
    "default_threads",
    "resolve_device",
    "resolve_precision",
    "param_dtype",
    "resolve_threads",
    "resolved_settings",
    "device_name",
    "worker_gpus",
    "workers",
]


def available_cpus() -> int:
    """The CPUs in this process's affinity mask (``os.sched_getaffinity``; ``os.cpu_count()`` where there is none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """Bytes the host can still give (``MemAvailable`` of ``/proc/meminfo``); ``None`` where unknown."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def default_threads(device: torch.device, jobs: int = 1) -> int:
    """Threads per run: 1 on a GPU; on a CPU ``max(1, (available_cpus() − 1) // jobs)`` (module docstring)."""
    if device.type != "cpu":
        return 1
    return max(1, (available_cpus() - 1) // max(1, jobs))


def workers(jobs: int, runs: int, device: torch.device) -> int:
    """The worker processes of a sweep of ``runs`` runs, ``jobs`` at a time: never more than the runs, and on the CPU
    never more than :func:`available_cpus` (each worker trains with at least one thread of its own, and threads
    beyond the CPUs only wait for one another: module docstring).  On a GPU, where a worker's CPU mostly waits for its
    kernels, ``jobs`` is not capped by the CPUs.  The threads of each run come from ``jobs``
    (:func:`default_threads`), not from this number, so that they do not depend on how many runs a sweep holds."""
    n = min(jobs, runs)
    return min(n, available_cpus()) if device.type == "cpu" else n


def resolve_device(name: str) -> torch.device:
    """``auto`` → CUDA if available, else CPU; an unavailable CUDA is a ``ValueError`` naming ``--device``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device (--device) {name!r}: CUDA is not available on this machine (use --device cpu "
                             "or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device (--device) {name!r}: this machine has {torch.cuda.device_count()} CUDA "
                             f"device(s), cuda:0..cuda:{torch.cuda.device_count() - 1}")
    if device.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ValueError(f"device (--device) {name!r}: MPS is not available on this machine")
    return device


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto`` → bf16 autocast on CUDA, fp32 elsewhere."""
    if precision != "auto":
        return precision
    return "bf16" if device.type == "cuda" else "fp32"


def resolve_threads(threads: int | None, device: torch.device, jobs: int = 1) -> int:
    return threads if threads is not None else default_threads(device, jobs)


def param_dtype(precision: str) -> torch.dtype:
    """The dtype of the weights under a resolved ``precision``: float64 for fp64, float32 otherwise (bf16 autocasts
    the computation, not the weights)."""
    return torch.float64 if precision == "fp64" else torch.float32


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def worker_gpus(workers: int, visible: str | None = None, count: int | None = None) -> list[str | None]:
    """``CUDA_VISIBLE_DEVICES`` for each of ``workers`` processes: worker i gets GPU i mod G.

    ``visible`` is the parent's ``CUDA_VISIBLE_DEVICES`` (its entries are reused, so a parent limited
    to GPUs 2,3 hands out 2 and 3); ``count`` the number of GPUs (``torch.cuda.device_count()``).
    With no GPU every entry is ``None`` (nothing to set).
    """
    count = torch.cuda.device_count() if count is None else count
    if count < 1:
        return [None] * workers
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else []
    ids = ids[:count] if len(ids) >= count else [str(i) for i in range(count)]
    return [ids[i % count] for i in range(workers)]


def resolved_settings(config, jobs: int = 1, *, here: bool = True) -> dict:
    """The values of :data:`~explr.cifar10.config.RESOLVED_KEYS` of a :class:`~explr.cifar10.config.TrainConfig`
    on this machine, one run of ``jobs`` at a time: device, precision, CPU threads.  ``here=False``: the run trains
    on another machine (a cluster job), which resolves them itself; they stay as given (``auto``, ``None``)."""
    if not here:
        return {"device": config.device, "precision": config.precision, "threads": config.threads}
    device = resolve_device(config.device)
    return {"device": str(device), "precision": resolve_precision(config.precision, device),
            "threads": resolve_threads(config.threads, device, jobs)}
