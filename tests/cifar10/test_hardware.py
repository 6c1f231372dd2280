"""explr.cifar10.hardware: the CPUs and the memory really available, and one GPU per worker."""

import pytest
import torch

from explr.cifar10 import hardware

from cifar10_helpers import CLI_TINY

pytestmark = pytest.mark.usefixtures("one_thread")
CLI_TWO_EPOCHS = [*CLI_TINY, "--epochs", "2"]


def test_available_cpus_follow_affinity_and_cgroup_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs of quota
    assert hardware.cgroup_cpu_limit(tmp_path) == 1.5
    assert hardware.available_cpus(tmp_path) == 2
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert hardware.available_cpus(tmp_path) == 8
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert hardware.available_cpus(v1) == 3
    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda pid: {0, 1})
    assert hardware.available_cpus(tmp_path / "none") == 2
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


def test_available_memory_is_the_smaller_of_memavailable_and_the_cgroup_limit(tmp_path):
    (tmp_path / "meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n")
    (tmp_path / "memory.max").write_text("3000000000\n")
    (tmp_path / "memory.current").write_text("1000000000\n")
    assert hardware.available_memory(tmp_path, tmp_path / "meminfo") == 2_000_000_000
    (tmp_path / "memory.max").write_text("max\n")
    assert hardware.available_memory(tmp_path, tmp_path / "meminfo") == 4_096_000_000
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("1500000000")
    (v1 / "memory" / "memory.usage_in_bytes").write_text("500000000")
    assert hardware.available_memory(v1, tmp_path / "meminfo") == 1_000_000_000
    assert hardware.available_memory(tmp_path / "none", tmp_path / "none") is None
