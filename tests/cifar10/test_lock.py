"""explr.cifar10.lock: a run folder's lock (never taken through a link, one writer at a time, a full disk when its
pid is written), the signals that end a run and their exit codes, and the one-line run errors."""
import errno
import os
import signal

import pytest

from explr.cifar10.__main__ import main
from explr.cifar10.config import TrainConfig
from explr.cifar10.lock import RunError, RunLock, RunLocked, exit_code, handle_signals
from explr.cifar10.runs import train_run

from cifar10_helpers import (CLI_TINY, TINY, cli, fails_in_one_line, one_line, snapshot, tiny_arrays, tiny_npz,
                             tree_of)

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


# ----------------------------------------------------------------------------- hostile run files
class TestHostileRunFiles:
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

    def test_a_disk_full_when_the_pid_is_written_is_one_line_exit_6_and_leaves_nothing(self, npz, tmp_path, capsys,
                                                                                        monkeypatch):
        def full(fd, data, offset):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "pwrite", full)
        out = tmp_path / "out"
        one_line(cli(out, npz), capsys, f"disk full while writing {out / 'step' / 'seed0' / '.lock'}", code=6)
        assert tree_of(tmp_path) == []
        out.mkdir()  # an existing --out stays, and so does an existing run folder's own content
        one_line(cli(out, npz), capsys, "disk full", code=6)
        assert tree_of(tmp_path) == ["out"]

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
