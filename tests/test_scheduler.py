"""explr.scheduler.PerStepLR: drop-in use with torch.optim.SGD, exact resume, rescaling, bad input."""
import io

import numpy as np
import pytest
import torch

from explr.scheduler import PerStepLR
from explr.schedules import step_decay, texp

from digits_helpers import digit_batches, invariant_mlp, loss_fn

LR = step_decay(0.1, 6, 50, [2, 4])  # phases start at steps 100 and 200
SCHEDULE = texp(LR, 5e-4, 0.9)


def train(model, opt, sched, batches, start, stop):
    for k in range(start, stop):
        x, y = batches[k]
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        sched.step()


def fresh(rescale_above=None):
    model = invariant_mlp()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    return model, opt, PerStepLR.from_schedule(opt, SCHEDULE, rescale_above=rescale_above)


def test_sets_lr_and_weight_decay_per_step():
    _, opt, sched = fresh()
    seen = []
    for k in range(len(LR)):
        g = opt.param_groups[0]
        seen.append((g["lr"], g["weight_decay"]))
        opt.step()
        sched.step()
    lrs, wds = np.array(seen).T
    np.testing.assert_array_equal(lrs, SCHEDULE.lr)
    np.testing.assert_array_equal(wds, SCHEDULE.wd)
    assert wds[0] < 0  # the start correction is a negative one-step weight decay
    with pytest.raises(IndexError, match="300 steps"):
        sched.step()


@pytest.mark.parametrize("rescale_above", [None, 0.105])
def test_resume_at_a_phase_boundary_reproduces_the_trajectory(digits64, rescale_above):
    batches = digit_batches(digits64, len(LR))
    model, opt, sched = fresh(rescale_above)
    train(model, opt, sched, batches, 0, len(LR))

    interrupted, opt2, sched2 = fresh(rescale_above)
    train(interrupted, opt2, sched2, batches, 0, 100)  # stop right before phase 1 starts
    buffer = io.BytesIO()
    torch.save({"model": interrupted.state_dict(), "opt": opt2.state_dict(), "sched": sched2.state_dict()}, buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)

    resumed, opt3, sched3 = fresh(rescale_above)
    resumed.load_state_dict(state["model"])
    opt3.load_state_dict(state["opt"])
    sched3.load_state_dict(state["sched"])
    assert opt3.param_groups[0]["lr"] == opt2.param_groups[0]["lr"]
    train(resumed, opt3, sched3, batches, 100, len(LR))
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    if rescale_above is not None:
        assert sched3.rescale == sched.rescale < 1 and sched3.rescale_count == sched.rescale_count > 0


def test_resuming_with_another_schedule_is_refused():
    _, opt, sched = fresh()
    other_opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    other = PerStepLR(other_opt, LR, 5e-4)
    with pytest.raises(ValueError, match="different schedule"):
        other.load_state_dict(sched.state_dict())


@pytest.mark.parametrize(
    "lr,wd,kw,match",
    [
        ([], 0.0, {}, "non-empty"),
        ([0.1, -0.1], 0.0, {}, "> 0"),
        ([0.1, float("nan")], 0.0, {}, "finite"),
        ([0.1, 0.1], [0.0, float("inf")], {}, "wd must be finite"),
        ([0.1, 0.1], 0.0, {"rescale_above": 0.05}, "rescale_above must be"),
    ],
)
def test_bad_input(lr, wd, kw, match):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    with pytest.raises(ValueError, match=match):
        PerStepLR(opt, lr, wd, **kw)


def test_step_takes_no_epoch():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    with pytest.raises(TypeError, match="no epoch"):
        PerStepLR(opt, [0.1, 0.1]).step(3)
