"""explr.cifar10.played: the schedule a config plays, named as the paper names it, and checked against the memory
available before it is built."""
import numpy as np
import pytest

import explr.cifar10.played as played_mod
from explr.cifar10 import hardware
from explr.cifar10.config import TrainConfig, default_decay_epochs
from explr.cifar10.played import played_schedule
from explr.schedules import EquivalentSchedule, PlainSchedule, cosine, step_decay, texp, texp_minus_minus

from cifar10_helpers import CLI_TINY, refused, tiny_arrays, tiny_npz

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


# ----------------------------------------------------------------------------- memory
def test_the_schedule_must_fit_in_memory_and_is_checked_before_it_is_built(npz, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(hardware, "available_memory", lambda: 10 * 2**20)  # 10 MiB

    def never(*args, **kwargs):
        raise AssertionError("the schedule was built before its size was checked")

    monkeypatch.setattr(played_mod, "step_decay", never)
    # 10,000 epochs x 6 steps x 256 bytes = 15 MB
    refused(["--data", npz, "--out", str(tmp_path), *CLI_TINY, "--epochs", "10000"], capsys, "--epochs",
            "0.0143 GiB of memory, more than the 0.00977 GiB available")
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- the paper's schedules
def test_schedule_names_map_to_the_papers_schedules():
    c = TrainConfig(epochs=8, decay_epochs=(4, 6), wd=5e-4, momentum=0.9)
    S = 5
    base = step_decay(0.1, 8, S, [4, 6])
    expected = {
        "step": (base, np.full(40, 5e-4), False),
        "texp": (texp(base, 5e-4, 0.9).lr, texp(base, 5e-4, 0.9).wd, True),
        "texp--": (texp_minus_minus(base, 5e-4, 0.9).lr, texp_minus_minus(base, 5e-4, 0.9).wd, True),
        "cosine": (cosine(0.1, 8, S), np.full(40, 5e-4), False),
        "cosine-texp": (texp(cosine(0.1, 8, S), 5e-4, 0.9).lr, texp(cosine(0.1, 8, S), 5e-4, 0.9).wd, True),
    }
    for name, (lr, wd, exponential) in expected.items():
        c.schedule = name
        got = played_schedule(c, S)
        np.testing.assert_array_equal(got.lr, lr)
        np.testing.assert_array_equal(got.wd, wd)
        assert isinstance(got, EquivalentSchedule) == exponential
        assert isinstance(got, EquivalentSchedule if exponential else PlainSchedule)
    assert default_decay_epochs(200) == [100, 150] and default_decay_epochs(20) == [10, 15]
    assert default_decay_epochs(1) == []
