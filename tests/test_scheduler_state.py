"""explr.scheduler_state: PerStepLR's state, checked with or without a scheduler (``PerStepLR.check_state_dict``
refuses exactly what ``load_state_dict`` refuses, with the same line)."""
import math

import numpy as np
import pytest
import torch

from explr import PerStepLR
from explr.lr_scheduler import check_rescale_above
from explr.scheduler_state import fingerprint, log2_at, played_arrays
from explr.schedules import PlainSchedule, step_decay, texp

LR = step_decay(0.1, 6, 50, [2, 4])
SCHEDULE = texp(LR, 5e-4, 0.9)


def _sgd():
    return torch.optim.SGD([torch.nn.Parameter(torch.ones(3))], lr=0.1, momentum=0.9)


@pytest.fixture(scope="module")
def state():
    """A state after 120 steps, past a rescaling."""
    opt = _sgd()
    sched = PerStepLR.from_schedule(opt, SCHEDULE, rescale_above=0.105)
    for _ in range(120):
        opt.step()
        sched.step()
    saved = sched.state_dict()
    assert saved["log2_rescale"] < 0
    return saved


def refusal(check, state):
    """The ValueError line of ``check(state)``, or None if it passes."""
    try:
        check(state)
    except ValueError as err:
        return str(err)
    return None


@pytest.mark.parametrize("changes", [
    {}, {"log2_rescale": -3}, {"log2_rescale": 2}, {"last_epoch": 5.0}, {"last_epoch": 10**6}, {"rescale_count": -1},
    {"fingerprint": "0" * 16}, {"rescale_above": 0.2}, {"momentum": 0.5}, {"steps": 7}, {"base_lrs": [0.1, 0.1]},
    {"_last_lr": []}, {"surprise": 1},
])
def test_check_state_dict_refuses_exactly_what_load_state_dict_refuses(changes, state):
    changed = {**state, **changes}
    loaded = refusal(PerStepLR.from_schedule(_sgd(), SCHEDULE, rescale_above=0.105).load_state_dict, changed)
    checked = refusal(lambda s: PerStepLR.check_state_dict(s, SCHEDULE, rescale_above=0.105), changed)
    assert checked == loaded and (checked is None) == (not changes)


@pytest.mark.parametrize("key, value", [("log2_rescale", -3), ("log2_rescale", 2), ("log2_rescale", 1.0),
                                        ("last_epoch", 5.0), ("last_epoch", True), ("last_epoch", -2),
                                        ("last_epoch", 10**6), ("rescale_count", -1), ("rescale_count", 10**6)])
def test_load_state_dict_refuses_odd_or_non_integer_progress(key, value, state):
    assert state["log2_rescale"] < 0 and state["rescale_count"] >= 1
    fresh = PerStepLR.from_schedule(_sgd(), SCHEDULE, rescale_above=0.105)
    with pytest.raises(ValueError, match=f"PerStepLR.load_state_dict: {key}"):
        fresh.load_state_dict({**state, key: value})
    assert fresh.last_epoch == 0 and fresh.log2_rescale == 0  # left as it was


def test_a_state_of_another_schedule_or_setting_is_refused_without_a_scheduler(state):
    other = texp(step_decay(0.1, 6, 50, [3, 4]), 5e-4, 0.9)
    with pytest.raises(ValueError, match="the saved state has fingerprint = .* it belongs to a different schedule"):
        PerStepLR.check_state_dict(state, other, rescale_above=0.105)
    with pytest.raises(ValueError, match="rescale_above = 0.105, this scheduler None"):
        PerStepLR.check_state_dict(state, SCHEDULE)


def test_the_played_arrays_are_what_the_scheduler_plays():
    sched = PerStepLR.from_schedule(_sgd(), SCHEDULE)
    momentum, lr, wd, exponents = played_arrays(SCHEDULE, None)
    assert momentum == 0.9 and fingerprint(lr, wd, exponents) == sched.fingerprint
    assert [log2_at(lr, exponents, k) for k in (0, 149, 299)] == pytest.approx(np.log2(SCHEDULE.lr[[0, 149, 299]]))
    plain = PlainSchedule(LR, np.full(len(LR), 5e-4))
    assert played_arrays(plain, None)[0] is None and log2_at(LR, None, 0) == math.log2(0.1)
    with pytest.raises(ValueError, match="wd must be omitted when lr is a PlainSchedule"):
        played_arrays(plain, 5e-4)


def test_check_rescale_above_is_the_rule_the_scheduler_applies():
    for value in (0.1, 0.05, math.nan, True, 1e39):
        with pytest.raises(ValueError, match=r"rescale_above must be a finite number > lr\[0\] = 0.1"):
            check_rescale_above(value, 0.1, torch.float32)
        with pytest.raises(ValueError, match=r"rescale_above must be a finite number > lr\[0\] = 0.1"):
            PerStepLR.from_schedule(_sgd(), SCHEDULE, rescale_above=value)
    check_rescale_above(1e39, 0.1, torch.float64)
    check_rescale_above(0.105, 0.1, None)
