"""explr.cifar10.files: atomic writes (the ordinary file mode, a temporary name that says its host and pid) and the
temporary files a killed writer leaves: only the engine's own are removed, and never those of a writer still at work,
on this host or another sharing the folder."""
import os
import time

import pytest

from explr.cifar10 import files
from explr.cifar10.config import TrainConfig
from explr.cifar10.runs import train_run
from explr.cifar10.sources import make_synthetic

from cifar10_helpers import TINY, tiny_arrays

arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")


# ----------------------------------------------------------------------------- hostile run files
@pytest.mark.usefixtures("one_thread")
class TestHostileRunFiles:
    """Run folders and flags a hostile or careless user can hand the engine: each is one line naming the file or
    flag (exit code 2, or 6 for a full disk), and nothing outside the engine's own files is written or deleted."""

    def test_only_the_engines_own_temporary_files_are_removed(self, arrays, tmp_path):
        cfg = TrainConfig(**{**TINY, "epochs": 2}, schedule="step")
        train_run(cfg, tmp_path, arrays, progress=False, stop_after=1)
        leftover = tmp_path / f".checkpoint.pt.{os.getpid() + 1}.k2j4m7xa.tmp"  # the name form before the host
        leftover.write_bytes(b"half a checkpoint")
        users = [".notes.tmp", ".checkpoint.pt.tmp", ".a.12.short.tmp", ".a.x1.k2j4m7xa.tmp", ".a.12.K2J4M7XA.tmp"]
        for name in users:
            (tmp_path / name).write_text("mine")
        assert train_run(cfg, tmp_path, arrays, progress=False, resume=True).epochs_done == 2
        assert not leftover.exists() and all((tmp_path / name).read_text() == "mine" for name in users)
        assert files.remove_leftovers(tmp_path) == []


# ----------------------------------------------------------------------------- file modes
@pytest.mark.usefixtures("one_thread")
def test_run_files_and_the_data_cache_get_the_ordinary_file_mode(arrays, tmp_path, monkeypatch):
    from explr.cifar10.sources import load_cifar10
    from explr.cifar10.image_folder import write_image_folder

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))  # the decode cache's key, not in ~/.cache
    old = os.umask(0o022)
    try:
        train_run(TrainConfig(**{**TINY, "epochs": 1}, schedule="step"), tmp_path / "run", arrays, progress=False)
        tree = write_image_folder(tmp_path / "tree", make_synthetic(n_train=20, n_test=10))
        load_cifar10(str(tree), root=tmp_path / "root", progress=False)
    finally:
        os.umask(old)
    files = [tmp_path / "run" / n for n in ("manifest.json", "metrics.jsonl", "checkpoint.pt")]
    files += list((tmp_path / "root" / "cache").glob("*.npz"))
    assert len(files) == 4
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o644, f


# ----------------------------------------------------------------------------- a folder shared by hosts
DEAD_PID = 999_999_999  # no such process here


def test_another_hosts_fresh_temp_file_survives_this_hosts_cleanup(tmp_path, monkeypatch):
    """Item 4: host A deleted host B's fresh .tmp mid-write because B's pid was not alive on A, and B's write failed
    with "No such file or directory"."""
    cache = tmp_path / "cache"
    cache.mkdir()
    target = cache / "image-folder-b.npz"
    this_host_getpid, host_a = os.getpid, getattr(files, "HOST", None)

    def write_as_host_b(f):
        f.write(b"half a cache")
        with monkeypatch.context() as as_host_a:  # meanwhile on host A, which shares the folder
            as_host_a.setattr(os, "getpid", this_host_getpid)
            as_host_a.setattr(files, "HOST", host_a, raising=False)
            assert files.remove_stale_leftovers(cache) == []
        f.write(b", the other half")

    with monkeypatch.context() as as_host_b:
        as_host_b.setattr(os, "getpid", lambda: DEAD_PID)  # B's pid, not alive on A
        as_host_b.setattr(files, "HOST", "0123abcd" if host_a != "0123abcd" else "4567cdef", raising=False)
        files.atomic_write(target, write_as_host_b)
    assert target.read_bytes() == b"half a cache, the other half"


def test_the_pid_rule_applies_to_this_hosts_files_and_the_hour_rule_to_other_hosts(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    here, there = files.HOST, "0123abcd" if files.HOST != "0123abcd" else "4567cdef"
    names = {
        "dead here": f".image-folder-a.npz.{DEAD_PID}@{here}.k2j4m7xa.tmp",
        "alive here": f".image-folder-b.npz.{os.getpid()}@{here}.x8_qz3ab.tmp",
        "fresh there": f".image-folder-c.npz.{DEAD_PID}@{there}.q1w2e3r4.tmp",
        "old there": f".image-folder-d.npz.{os.getpid()}@{there}.t5y6u7i8.tmp",
        "fresh, no host": f".image-folder-e.npz.{DEAD_PID}.a1s2d3f4.tmp",
        "old, no host": f".image-folder-f.npz.{DEAD_PID}.g5h6j7k8.tmp",
    }
    for case, name in names.items():
        (cache / name).write_bytes(b"half a cache")
        if case.startswith("old"):
            os.utime(cache / name, (time.time() - 2 * files.STALE_AFTER_S,) * 2)
    removed = files.remove_stale_leftovers(cache)
    assert sorted(removed) == sorted(names[c] for c in ("dead here", "old there", "old, no host"))
    assert sorted(p.name for p in cache.iterdir()) == sorted(names[c] for c in ("alive here", "fresh there",
                                                                                "fresh, no host"))
    assert len(files.remove_leftovers(cache)) == 3, "a locked folder's cleanup takes every temporary file"


def test_atomic_write_names_its_temporary_file_with_this_host(tmp_path):
    seen = []
    files.atomic_write(tmp_path / "x.npz", lambda f: seen.extend(p.name for p in tmp_path.iterdir()))
    (name,) = seen
    match = files.TMP_NAME.fullmatch(name)
    assert match and match["target"] == "x.npz" and int(match["pid"]) == os.getpid() and match["host"] == files.HOST
