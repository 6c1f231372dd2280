"""What a run runs on: the device, its precision, the CPU threads this process may really use, one GPU per worker.

``os.cpu_count()`` reports the host's cores, not what a process may use.  A container (Binder, a
SLURM job, Docker with ``--cpus``) limits a process by CPU affinity (``os.sched_getaffinity``) or by a
cgroup quota (``cpu.max`` of cgroup v2: ``"<quota> <period>"``, or ``cpu.cfs_quota_us`` /
``cpu.cfs_period_us`` of v1).  :func:`available_cpus` takes the smaller of the two.

Thread count (:func:`default_threads`).  torch's OpenMP threads meet at a barrier after every
parallel operator, so one thread that loses its core to another process stalls all the others
(docs/cifar10-engine.md, "CPU threads", gives the speeds).  The default therefore leaves one CPU free,
``max(1, available − 1)`` threads, and on a GPU, where the CPU only launches kernels, 1 thread per run;
``--threads`` overrides.

A sweep's pool (:func:`workers`) has no more worker processes than runs, and on the CPU no more than the CPUs.

Memory (:func:`available_memory`) is limited the same two ways: the host's ``MemAvailable`` and a
cgroup's limit (``memory.max`` of v2, ``memory.limit_in_bytes`` of v1) minus what the cgroup uses.
"""
from __future__ import annotations

import math
import os
import platform
from pathlib import Path

import torch

__all__ = [
    "available_cpus",
    "available_memory",
    "cgroup_cpu_limit",
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


def cgroup_cpu_limit(root: str | Path = "/sys/fs/cgroup") -> float | None:
    """CPUs allowed by the cgroup quota of this process (``None``: no quota), cgroup v2 or v1."""
    root = Path(root)
    try:
        fields = (root / "cpu.max").read_text().split()
        if fields and fields[0] != "max":
            return int(fields[0]) / int(fields[1])
        if fields:
            return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def available_cpus(cgroup_root: str | Path = "/sys/fs/cgroup") -> int:
    """min(CPUs in this process's affinity mask, ⌈cgroup quota⌉), at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        n = os.cpu_count() or 1
    quota = cgroup_cpu_limit(cgroup_root)
    if quota is not None:
        n = min(n, math.ceil(quota))
    return max(1, n)


def available_memory(cgroup_root: str | Path = "/sys/fs/cgroup", meminfo: str | Path = "/proc/meminfo") -> int | None:
    """Bytes this process may still allocate: min(``MemAvailable``, cgroup limit − usage); ``None`` if unknown."""
    sizes = []
    try:
        fields = dict(line.split(":", 1) for line in Path(meminfo).read_text().splitlines() if ":" in line)
        sizes.append(int(fields["MemAvailable"].split()[0]) * 1024)
    except (OSError, ValueError, KeyError, IndexError):
        pass
    root = Path(cgroup_root)
    for limit, usage in (("memory.max", "memory.current"),
                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            text = (root / limit).read_text().strip()
            if text != "max":
                sizes.append(max(0, int(text) - int((root / usage).read_text())))
            break
        except (OSError, ValueError):
            continue
    return min(sizes) if sizes else None


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
