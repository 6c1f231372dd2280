"""explr.cifar10.files: atomic writes, a run folder's lock (one writer at a time), the signals that end a run and
one vocabulary of statuses and exit codes."""
import errno
import os
import signal
import time

import pytest

from explr.cifar10 import files
from explr.cifar10.__main__ import main
from explr.cifar10.config import TrainConfig
from explr.cifar10.data import make_synthetic
from explr.cifar10.files import (
    DiskFull, RunError, RunLock, RunLocked, RunState, Status, Terminated, exit_code, handle_signals,
)
from explr.cifar10.runs import train_run

from cifar10_helpers import CLI_TINY, TINY, cli, fails_in_one_line, one_line, snapshot, tiny_arrays, tiny_npz, tree_of

arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
pytestmark = pytest.mark.usefixtures("one_thread")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


# ----------------------------------------------------------------------------- hostile run files
@pytest.mark.usefixtures("one_thread")
class TestHostileFiles:
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
    from explr.cifar10.data import load_cifar10
    from cifar10_helpers import write_image_folder

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


# ----------------------------------------------------------------------------- a folder several processes write
DEAD_PID = 999_999_999  # no such process here


def test_a_shared_folders_cleanup_takes_only_temp_files_untouched_for_an_hour(tmp_path):
    """Another process (on this host or another sharing the folder) may be writing a fresh temporary file: only
    those untouched for an hour go, whatever their pid says; a user's own ``.notes.tmp`` never."""
    cache = tmp_path / "cache"
    cache.mkdir()
    names = {
        "fresh, dead pid": f".image-folder-a.npz.{DEAD_PID}.k2j4m7xa.tmp",
        "fresh, live pid": f".image-folder-b.npz.{os.getpid()}.x8_qz3ab.tmp",
        "old, live pid": f".image-folder-c.npz.{os.getpid()}.t5y6u7i8.tmp",
        "old, a user's": ".notes.tmp",
    }
    for case, name in names.items():
        (cache / name).write_bytes(b"half a cache")
        if case.startswith("old"):
            os.utime(cache / name, (time.time() - 2 * 3600,) * 2)
    removed = files.remove_stale_leftovers(cache)
    assert removed == [names["old, live pid"]]
    assert len(files.remove_leftovers(cache)) == 2, "a locked folder's cleanup takes every temporary file of ours"
    assert [p.name for p in cache.iterdir()] == [".notes.tmp"]


def test_atomic_write_names_its_temporary_file_with_its_pid(tmp_path):
    seen = []
    files.atomic_write(tmp_path / "x.npz", lambda f: seen.extend(p.name for p in tmp_path.iterdir()))
    (name,) = seen
    match = files.TMP_NAME.fullmatch(name)
    assert match and match["target"] == "x.npz" and int(match["pid"]) == os.getpid()


# ----------------------------------------------------------------------------- hostile run files
class TestHostileLocks:
    """Run folders and flags a hostile or careless user can hand the engine: each is one line naming the file or
    flag (exit code 2, or 6 for a full disk), and nothing outside the engine's own files is written or deleted."""

    def test_a_lock_that_is_a_symlink_is_refused_and_its_target_left_alone(self, npz, tmp_path, capsys):
        victim = tmp_path / "victim"
        victim.write_text("precious\n")
        run = tmp_path / "out" / "step" / "seed0"
        run.mkdir(parents=True)
        (run / ".lock").symlink_to(victim)
        one_line(cli(tmp_path / "out", npz), capsys, f"{run / '.lock'} is a symbolic link")
        with pytest.raises(RunError, match=r"\.lock is a symbolic link"):  # linked after the checks: still refused
            RunLock(run).__enter__()
        assert victim.read_text() == "precious\n" and tree_of(run) == [".lock"]

    def test_a_disk_full_when_the_pid_is_written_is_one_line_exit_6_and_the_same_command_then_trains(
            self, npz, tmp_path, capsys, monkeypatch):
        def full(*_):  # os.pwrite(fd, data, offset)
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "pwrite", full)
        run = tmp_path / "out" / "step" / "seed0"
        one_line(cli(tmp_path / "out", npz), capsys, f"disk full while writing {run / '.lock'}", code=6)
        assert tree_of(run) == [".lock"]  # the empty lock file, kept (unlinking it would let two writers in)
        monkeypatch.undo()
        assert main(cli(tmp_path / "out", npz)) == 0 and (run / "checkpoint.pt").exists()

    @pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129),
                                           (signal.SIGUSR2, 140)])
    def test_sighup_and_sigusr2_interrupt_like_sigterm(self, sig, code):
        before = signal.getsignal(sig)
        with pytest.raises(KeyboardInterrupt) as raised:
            with handle_signals():
                os.kill(os.getpid(), sig)
        assert exit_code(raised.value) == code and signal.getsignal(sig) == before


# ----------------------------------------------------------------------------- the lock and its errors
def test_a_second_writer_is_refused_and_never_touches_the_first_ones_runs(npz, tmp_path, capsys):
    args = ["--schedule", "step", "texp", "--data", npz, "--out", str(tmp_path), *CLI_TINY, "--epochs", "1"]
    assert main(args[:2] + args[3:]) == 0  # step finished
    finished = snapshot(tmp_path / "step")
    (tmp_path / "texp" / "seed0").mkdir(parents=True)
    with RunLock(tmp_path / "texp" / "seed0"):  # another writer is training texp
        err = fails_in_one_line([*args, "--resume"], capsys, f"is being trained by process {os.getpid()}")
        assert "texp" in err
        with pytest.raises(RunLocked):
            train_run(TrainConfig(**TINY, schedule="texp", data=npz), tmp_path / "texp" / "seed0", resume=True,
                      progress=False)
    assert snapshot(tmp_path / "step") == finished
    assert not (tmp_path / "texp" / "seed0" / "checkpoint.pt").exists()


def test_run_error_is_a_value_error_with_one_line():
    assert issubclass(RunError, ValueError) and issubclass(RunLocked, RunError)


def test_each_nonzero_exit_code_reads_back_as_its_status():
    coded = [s for s in Status if s.exit_code]
    assert {s.exit_code for s in coded} == {3, 4, 5, 6} and len(coded) == 4  # one status per code
    assert [Status.from_exit_code(s.exit_code) for s in coded] == coded
    assert Status.from_exit_code(0) is Status.FINISHED


@pytest.mark.parametrize("err, code", [(KeyboardInterrupt(), 130), (Terminated(signal.SIGTERM), 143),
                                       (Terminated(signal.SIGHUP), 129), (Terminated(signal.SIGUSR2), 140),
                                       (DiskFull("x"), 6)])
def test_the_exit_code_of_an_interrupt_or_a_full_disk_reads_back_as_its_status(err, code):
    """What a worker exits with (:func:`explr.cifar10.files.exit_code`) is what the pool reads back."""
    assert exit_code(err) == code
    assert Status.from_exit_code(code) is (Status.DISK_FULL if isinstance(err, DiskFull) else Status.INTERRUPTED)


@pytest.mark.parametrize("code", [1, 2, 7, 127, 128, 128 + 300, -9, -15])
def test_any_other_exit_code_is_a_failed_worker(code):
    """1: an uncaught exception; -9: ``multiprocessing``'s code for a worker killed by SIGKILL; 128: no signal."""
    assert Status.from_exit_code(code) is Status.FAILED


def test_a_folder_state_is_no_status():
    assert RunState.FINISHED != Status.FINISHED and RunState.FINISHED != "finished"  # compared with members only
