"""explr.cifar10.status: one vocabulary of a run's status and exit codes (and the lock's codes read back)."""
import signal

import pytest

from explr.cifar10.files import DiskFull
from explr.cifar10.lock import Terminated, exit_code
from explr.cifar10.status import RECORDED, RunState, Status


def test_each_nonzero_exit_code_reads_back_as_its_status():
    coded = [s for s in Status if s.exit_code]
    assert {s.exit_code for s in coded} == {3, 4, 5, 6} and len(coded) == 4  # one status per code
    assert [Status.from_exit_code(s.exit_code) for s in coded] == coded
    assert Status.from_exit_code(0) is Status.FINISHED


@pytest.mark.parametrize("err, code", [(KeyboardInterrupt(), 130), (Terminated(signal.SIGTERM), 143),
                                       (Terminated(signal.SIGHUP), 129), (Terminated(signal.SIGUSR2), 140),
                                       (DiskFull("x"), 6)])
def test_the_exit_code_of_an_interrupt_or_a_full_disk_reads_back_as_its_status(err, code):
    """What a worker exits with (:func:`explr.cifar10.lock.exit_code`) is what the pool reads back."""
    assert exit_code(err) == code
    assert Status.from_exit_code(code) is (Status.DISK_FULL if isinstance(err, DiskFull) else Status.INTERRUPTED)


@pytest.mark.parametrize("code", [1, 2, 7, 127, 128, 128 + 300, -9, -15])
def test_any_other_exit_code_is_a_failed_worker(code):
    """1: an uncaught exception; -9: ``multiprocessing``'s code for a worker killed by SIGKILL; 128: no signal."""
    assert Status.from_exit_code(code) is Status.FAILED


def test_a_manifest_records_a_full_disk_and_a_folder_state_is_no_status():
    assert Status.DISK_FULL in RECORDED and Status.FAILED not in RECORDED
    assert RunState.FINISHED != Status.FINISHED and RunState.FINISHED != "finished"  # compared with members only
