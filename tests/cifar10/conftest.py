"""Run folders shared by the run-file tests of several modules here (test_runfolder, test_sweep, test_main):
a run stopped after its first epoch, a finished run, and a deadline for a test that could block.
They train into the test's folder with the ``npz`` of the requesting module."""
import pytest

from explr.cifar10.config import TrainConfig
from explr.cifar10.runs import train_run

from cifar10_helpers import TINY, deadline


@pytest.fixture()
def unfinished(npz, tmp_path):
    """A run of 2 epochs stopped after the first (its manifest is read again by --resume)."""
    run = tmp_path / "step" / "seed0"
    train_run(TrainConfig(**{**TINY, "epochs": 2}, schedule="step", data=npz), run, progress=False, stop_after=1)
    return run


@pytest.fixture()
def finished(npz, tmp_path):
    """A finished run of 1 epoch (its metrics are read by --resume)."""
    run = tmp_path / "step" / "seed0"
    train_run(TrainConfig(**{**TINY, "epochs": 1}, schedule="step", data=npz), run, progress=False)
    return run


@pytest.fixture()
def no_hang():
    """Fail (instead of hanging) if the test blocks for 60 s, as opening a FIFO for reading does."""
    with deadline(60):
        yield
