"""explr.cifar10.hardware: the CPUs (affinity) and the memory available, and one GPU per worker."""

import pytest
import torch

from explr.cifar10 import hardware

from cifar10_helpers import CLI_TINY

pytestmark = pytest.mark.usefixtures("one_thread")
CLI_TWO_EPOCHS = [*CLI_TINY, "--epochs", "2"]


def test_available_cpus_follow_the_affinity_mask_and_threads_leave_one_free(monkeypatch):
    """SLURM, taskset and Docker's --cpuset-cpus show in the affinity mask: 2 of the host's CPUs are 2 CPUs."""
    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda pid: {3, 5})
    assert hardware.available_cpus() == 2
    monkeypatch.setattr(hardware, "available_cpus", lambda: 8)
    assert hardware.default_threads(torch.device("cpu")) == 7  # one CPU left for everything else
    assert hardware.default_threads(torch.device("cpu"), jobs=3) == 2
    assert hardware.default_threads(torch.device("cuda")) == 1
    monkeypatch.setattr(hardware, "available_cpus", lambda: 1)
    assert hardware.default_threads(torch.device("cpu")) == 1
    assert hardware.resolve_threads(5, torch.device("cpu")) == 5  # --threads overrides


def test_worker_i_gets_gpu_i_mod_g(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert hardware.worker_gpus(7) == ["0", "1", "2", "0", "1", "2", "0"]
    assert hardware.worker_gpus(4, visible="5,6,7") == ["5", "6", "7", "5"]  # the parent's own subset
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert hardware.worker_gpus(2) == [None, None]


def test_available_memory_is_memavailable():
    with open("/proc/meminfo") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    assert abs(hardware.available_memory() - kib * 1024) < 256 << 20  # read again a moment later
