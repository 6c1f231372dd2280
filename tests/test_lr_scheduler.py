"""explr.lr_scheduler.PerStepLR: drop-in use, exact resume, log-space playing, rescaling with param groups and
running statistics, guards, composition, and torch's generic scheduler conventions (ported checks).

PerStepLR relies on private parts of torch's scheduler machinery; these tests, run at the tested torch versions
(the pin and ``make compat``'s floor, which pyproject.toml declares), are what checks them: the initial step and
``step()`` through ``_update_lr`` with ``_is_initial`` (test_sets_lr_and_weight_decay_per_step,
test_last_epoch_resumes_like_torchs_lambda_lr), ``_last_lr`` (test_get_last_lr_types_follow_the_param_groups),
``SequentialLR``'s switch by ``_update_lr(0)`` (test_after_a_warm_up_in_sequential_lr) and the frame in which
``ChainedScheduler.__init__`` reads ``.optimizer`` (test_chained_scheduler_is_refused_with_a_message)."""
import copy
import dataclasses
import io
import math
import os
import pickle
import re
import subprocess
import sys
import tomllib
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from explr import PerStepLR, lr_scheduler
from explr.lr_scheduler import check_rescale_above
from explr.invariance import make_scale_invariant
from explr.models import bn_mlp, invariant_bn_mlp
from explr.schedules import PlainSchedule, step_decay, texp

from digits_helpers import digit_batches

LR = step_decay(0.1, 6, 50, [2, 4])  # phases start at steps 100 and 200
SCHEDULE = texp(LR, 5e-4, 0.9)


def train(model, opt, sched, batches, start, stop):
    for k in range(start, stop):
        x, y = batches[k]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()


def fresh(rescale_above=None, **kw):
    model = invariant_bn_mlp()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    return model, opt, PerStepLR.from_schedule(opt, SCHEDULE, rescale_above=rescale_above, **kw)


def one_param_sgd(lr=0.1, momentum=0.9, dtype=torch.float64, **kw):
    return torch.optim.SGD([torch.nn.Parameter(torch.ones(3, dtype=dtype))], lr=lr, momentum=momentum, **kw)


def play(opt, sched, steps):
    """Call optimizer.step() and scheduler.step() ``steps`` times (no gradients: only the schedule moves)."""
    seen = []
    for _ in range(steps):
        seen.append([(g["lr"], g["weight_decay"]) for g in opt.param_groups])
        opt.step()
        sched.step()
    return np.array(seen)


def test_sets_lr_and_weight_decay_per_step():
    _, opt, sched = fresh()
    lrs, wds = play(opt, sched, len(LR))[:, 0].T
    np.testing.assert_array_equal(lrs, SCHEDULE.lr)
    np.testing.assert_array_equal(wds, SCHEDULE.wd)
    assert wds[0] < 0  # the start correction is a negative one-step weight decay
    with pytest.raises(IndexError, match="300 steps"):
        sched.step()


def test_plain_arrays_are_played_exactly():
    opt = one_param_sgd(momentum=0.0)
    sched = PerStepLR(opt, LR, 5e-4)
    lrs, wds = play(opt, sched, len(LR))[:, 0].T
    np.testing.assert_array_equal(lrs, LR)  # no exp(log(lr)) rounding: 0.1 stays 0.1
    assert np.all(wds == 5e-4)


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
        assert sched3.log2_rescale == sched.log2_rescale < 0 and sched3.rescale_count == sched.rescale_count > 0


def test_resuming_with_another_schedule_is_refused():
    _, opt, sched = fresh()
    other_opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    other = PerStepLR(other_opt, LR, 5e-4)
    with pytest.raises(ValueError, match="different schedule"):
        other.load_state_dict(sched.state_dict())


@pytest.mark.parametrize(
    "lr,wd,kw,match",
    [
        ([], 0.0, {}, "lr must be a per-step array of one or more entries"),
        ([0.1, -0.1], 0.0, {}, "> 0"),
        ([0.1, float("nan")], 0.0, {}, "finite"),
        ([0.1, 0.1], [0.0, float("inf")], {}, "wd must be finite"),
        ([0.1, 0.1], [0.0, 0.0, 0.0], {}, "wd must be a per-step array of 2 entries or a scalar"),
        ([0.1, 0.1], 0.0, {"rescale_above": 0.05}, "rescale_above must be"),
        ([0.1, 0.1], 0.0, {"rescale_above": "1e3"}, "rescale_above must be"),
    ],
)
def test_bad_input(lr, wd, kw, match):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    with pytest.raises(ValueError, match=match):
        PerStepLR(opt, lr, wd, **kw)


# ----------------------------------------------------------------------------- defect 1: log space, no overflow
LONG = texp(step_decay(0.1, 200, 391, [100, 150]), 1e-2, 0.9)  # lr̃ passes float64's range at step ~35,000


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_schedule_beyond_float64_plays_in_low_precision_with_rescaling(dtype):
    assert np.isinf(LONG.lr).any() and np.isfinite(LONG.log_lr).all()
    param = torch.nn.Parameter(torch.ones(3, dtype=dtype))
    opt = torch.optim.SGD([param], lr=0.1, momentum=0.9)
    sched = PerStepLR.from_schedule(opt, LONG, rescale_above=1e3)
    lrs, log2_r = np.empty(len(LONG)), np.empty(len(LONG))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # scheduler steps without optimizer steps
        for k in range(len(LONG)):
            lrs[k], log2_r[k] = opt.param_groups[0]["lr"], sched.log2_rescale
            sched.step()
    assert np.all(lrs <= 1e3) and np.all(lrs > 0)
    # the optimizer's lr is the schedule's lr̃_k times R = 2^log2_rescale, computed in log space
    np.testing.assert_allclose(np.log(lrs) - log2_r * math.log(2), LONG.log_lr, rtol=0, atol=1e-9)
    assert sched.rescale_count > 50 and torch.isfinite(param).all()
    assert sched.rescale == 0.0 and sched.log2_rescale < -1075  # R itself underflows float64; its log does not


def test_overflow_without_rescaling_is_an_error_naming_the_step():
    opt = one_param_sgd(dtype=torch.float32)
    sched = PerStepLR.from_schedule(opt, LONG)
    first = int(np.argmax(LONG.lr > np.finfo(np.float32).max))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(first - 1):
            sched.step()
        with pytest.raises(OverflowError, match=f"step {first}.*rescale_above"):
            sched.step()


# ----------------------------------------------------------------------------- defect 2: param groups
def groups_optimizer(model, head_lr=0.02):
    """Scale-invariant hidden layers at lr 0.05 and 0.01; the trainable last layer out of the schedule."""
    hidden = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("6.")]
    head = list(model[6].parameters())
    return torch.optim.SGD([
        {"params": hidden[:2], "lr": 0.05},
        {"params": hidden[2:], "lr": 0.01},
        {"params": head, "lr": head_lr, "weight_decay": 1e-4, "scale_invariant": False},
    ], lr=0.05, momentum=0.9)


def digits_mlp_with_trainable_head():
    model = invariant_bn_mlp()
    for p in model[6].parameters():  # make_scale_invariant froze the last layer: train it again
        p.requires_grad_(True)
    return model


def test_param_groups_keep_their_ratio_and_a_non_invariant_group_keeps_its_weight_decay():
    model = digits_mlp_with_trainable_head()
    opt = groups_optimizer(model)
    sched = PerStepLR.from_schedule(opt, SCHEDULE, rescale_above=0.105)
    seen = play(opt, sched, len(LR))
    lr = seen[:, :, 0]
    np.testing.assert_allclose(lr[:, 1] / lr[:, 0], 0.2, rtol=1e-14)
    np.testing.assert_allclose(lr[:, 2], 0.4 * SCHEDULE.lr, rtol=1e-14)  # schedule units: never rescaled
    assert sched.rescale_count > 0 and lr[:, 0].max() <= 0.105
    assert np.all(seen[:, :2, 1] == seen[:, :1, 1]) and np.all(seen[:, 2, 1] == 1e-4)


def test_rescaling_leaves_a_non_invariant_group_on_its_trajectory(digits64):
    """A trainable last layer in a group with "scale_invariant": False: rescaling the other groups does not
    change the run (float64, exact up to BN's eps and rounding)."""
    batches = digit_batches(digits64, 150)
    final = []
    for rescale_above in (None, 0.105):
        model = digits_mlp_with_trainable_head()
        opt = groups_optimizer(model, head_lr=5e-4)
        sched = PerStepLR(opt, 0.05 * 1.03 ** np.arange(150), rescale_above=rescale_above)
        train(model, opt, sched, batches, 0, 150)
        final.append(model(digits64.x_test[:256]).detach())
    assert sched.rescale_count >= 3
    assert ((final[1] - final[0]).abs().max() / final[0].abs().max()).item() < 1e-9


# ----------------------------------------------------------------------------- defect 3: running statistics
def bn_model_with_running_stats():
    model = bn_mlp(eps=1e-300, running_stats=True, seed=0).double()
    make_scale_invariant(model)
    return model


def test_model_running_statistics_follow_a_rescaling(digits64):
    """Eval mode (running statistics): outputs unchanged by a rescaling with model=, changed without it."""
    x = digits64.x_test[:256]
    outputs = {}
    for with_model in (False, True):
        model = bn_model_with_running_stats()
        for _ in range(3):  # some running statistics
            model(digits64.x_train[:128])
        model.eval()
        before = model(x).detach()
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
        seen = []
        sched = PerStepLR(opt, [0.1, 100.0], rescale_above=1.0, model=model if with_model else None,
                          on_rescale=seen.append)
        opt.step()
        sched.step()  # rescales θ by c = 2^-5 (100 → 100/1024 <= 0.1)
        assert seen == [2.0**-5] and sched.log2_rescale == -10
        outputs[with_model] = (model(x).detach() - before).abs().max().item() / before.abs().max().item()
    assert outputs[True] < 1e-12 and outputs[False] > 1e-2


def test_first_rescaling_warns_when_the_model_is_not_scale_invariant(digits64):
    """The optimizer holds every parameter; the frozen ones (BN affine, last layer) are not rescaled."""
    for invariant in (True, False):
        model = invariant_bn_mlp() if invariant else digits_mlp_with_trainable_head()
        frozen_head = model[6].weight.detach().clone()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched = PerStepLR(opt, [0.1, 100.0, 100.0], rescale_above=1.0, model=model)
        x, y = digits64.x_train[:128], digits64.y_train[:128]
        F.cross_entropy(model(x), y).backward()
        opt.step()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sched.step()
        messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        if invariant:
            assert messages == [] and torch.equal(model[6].weight, frozen_head)
        else:
            assert len(messages) == 1 and "not scale invariant" in messages[0] and "scale_invariant" in messages[0]
        assert sched._probe is None and sched._probe_hook is None  # checked once, hook removed


# ----------------------------------------------------------------------------- defect 4: guards
@pytest.mark.parametrize("optimizer", [torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop, torch.optim.Adagrad])
def test_rescaling_is_refused_for_other_optimizers(optimizer):
    opt = optimizer([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    with pytest.raises(TypeError, match=f"rescale_above needs torch.optim.SGD; got {optimizer.__name__}"):
        PerStepLR(opt, [0.1, 0.2], rescale_above=1.0)
    PerStepLR(opt, [0.1, 0.2])  # playing a plain schedule without rescaling is fine
    with pytest.raises(TypeError, match="exact equivalent for torch.optim.SGD"):
        PerStepLR.from_schedule(opt, SCHEDULE)


@pytest.mark.parametrize("kw", [dict(momentum=0.0), dict(momentum=0.99), dict(momentum=0.9, nesterov=True),
                                dict(momentum=0.9, dampening=0.1)])
def test_the_optimizer_must_use_the_schedules_momentum(kw):
    with pytest.raises(ValueError, match="built for momentum=0.9"):
        PerStepLR.from_schedule(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1, **kw), SCHEDULE)


def test_an_equivalent_schedule_brings_its_own_weight_decay():
    with pytest.raises(ValueError, match="wd must be omitted when lr is a EquivalentSchedule"):
        PerStepLR(one_param_sgd(), SCHEDULE, 5e-4)
    with pytest.raises(ValueError, match="wd must be omitted when lr is a PlainSchedule"):
        PerStepLR(one_param_sgd(), PlainSchedule(LR, 5e-4), 5e-4)


# ----------------------------------------------------------------------------- defect 5: composition
def test_after_a_warm_up_in_sequential_lr():
    warm = 20
    opt = one_param_sgd(lr=0.1)
    warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=warm)
    sched = PerStepLR.from_schedule(opt, SCHEDULE, rescale_above=0.105)
    seq = torch.optim.lr_scheduler.SequentialLR(opt, [warmup, sched], milestones=[warm])
    seen = play(opt, seq, warm + len(LR))[:, 0]
    assert np.all(seen[:warm, 1] == 0.0)  # the optimizer's own weight decay, not the schedule's wd[0] < 0
    np.testing.assert_allclose(seen[:warm, 0], 0.1 * np.minimum(1, 0.1 + 0.9 * np.arange(warm) / warm), rtol=1e-12)

    alone_opt = one_param_sgd(lr=0.1)
    alone = play(alone_opt, PerStepLR.from_schedule(alone_opt, SCHEDULE, rescale_above=0.105), len(LR))[:, 0]
    np.testing.assert_array_equal(seen[warm:], alone)  # from the switch on, exactly the schedule alone
    assert seen[warm, 1] == SCHEDULE.wd[0] and seen[warm:, 0].max() <= 0.105 and sched.rescale_count > 0


@pytest.mark.parametrize("first", [True, False])
def test_chained_scheduler_is_refused_with_a_message(first):
    opt = one_param_sgd()
    if first:
        sched = PerStepLR.from_schedule(opt, SCHEDULE)
        other = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    else:
        other = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
        sched = PerStepLR.from_schedule(opt, SCHEDULE)
    with pytest.raises(RuntimeError, match="cannot run in a ChainedScheduler.*SequentialLR"):
        torch.optim.lr_scheduler.ChainedScheduler([sched, other] if first else [other, sched])
    opt.step()
    other.step()  # another scheduler writing the lr between two steps is refused at the next step
    with pytest.raises(RuntimeError, match="cannot run in a ChainedScheduler.*SequentialLR"):
        sched.step()


# ----------------------------------------------------------------------------- torch's generic checks, ported
def test_state_dict_round_trip_and_weights_only_load():
    _, opt, sched = fresh(rescale_above=0.105)
    play(opt, sched, 150)
    buffer = io.BytesIO()
    torch.save(sched.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    _, opt2, sched2 = fresh(rescale_above=0.105)
    sched2.load_state_dict(state)
    assert sched2.state_dict() == sched.state_dict()
    for key in ("optimizer", "model", "_parts"):
        assert key not in state
    # load_state_dict alone (no optimizer state) puts the lr and weight decay back into the optimizer
    assert [g["lr"] for g in opt2.param_groups] == [g["lr"] for g in opt.param_groups] == sched2.get_last_lr()
    assert opt2.param_groups[0]["weight_decay"] == opt.param_groups[0]["weight_decay"]
    np.testing.assert_array_equal(play(opt2, sched2, 150), play(opt, sched, 150))


def test_call_order_warnings():
    opt = one_param_sgd()
    sched = PerStepLR.from_schedule(opt, SCHEDULE)
    with pytest.warns(UserWarning, match=r"lr_scheduler.step\(\)` before `optimizer.step\(\)"):
        sched.step()
    opt = one_param_sgd()
    sched = PerStepLR.from_schedule(opt, SCHEDULE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.step()
        sched.step()
    opt = one_param_sgd()
    sched = PerStepLR.from_schedule(opt, SCHEDULE)
    opt.step = lambda: None  # overridden after the scheduler was built
    with pytest.warns(UserWarning, match="overridden"):
        sched.step()


def test_pickling_keeps_the_state_and_the_schedule(digits64):
    model, opt, sched = fresh(rescale_above=0.105, model=None)
    train(model, opt, sched, digit_batches(digits64, 120), 0, 120)
    copied = pickle.loads(pickle.dumps(sched))
    assert copied.state_dict() == sched.state_dict() and copied.steps == sched.steps
    deep = copy.deepcopy(sched)
    assert deep.get_last_lr() == sched.get_last_lr()


def test_get_last_lr_types_follow_the_param_groups():
    opt = one_param_sgd()
    sched = PerStepLR.from_schedule(opt, SCHEDULE)
    opt.step()
    sched.step()
    assert [type(v) for v in sched.get_last_lr()] == [float]
    tensor_opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(3, dtype=torch.float64))], lr=torch.tensor(0.1, dtype=torch.float64),
                                 momentum=0.9, foreach=False)
    tensor_sched = PerStepLR.from_schedule(tensor_opt, SCHEDULE)
    tensor_opt.step()
    tensor_sched.step()
    last = tensor_sched.get_last_lr()
    assert isinstance(last[0], torch.Tensor) and last[0].item() == SCHEDULE.lr[1]
    last[0].fill_(7.0)  # a copy, never an alias of the group's lr
    assert tensor_opt.param_groups[0]["lr"].item() == SCHEDULE.lr[1]


def test_closed_form_equals_the_chainable_form():
    opt = one_param_sgd()
    sched = PerStepLR.from_schedule(opt, SCHEDULE)
    for k in range(1, 40):
        opt.step()
        sched.step()
        assert sched._get_closed_form_lr() == sched.get_last_lr() == [SCHEDULE.lr[k]]
    jumped_opt = one_param_sgd()
    jumped = PerStepLR.from_schedule(jumped_opt, SCHEDULE)
    jumped_opt.step()
    with pytest.warns(UserWarning, match="epoch parameter"):  # torch's deprecated step(epoch): the closed form
        jumped.step(39)
    assert jumped.get_last_lr() == sched.get_last_lr() and jumped.last_epoch == 39


# ----------------------------------------------------------------------------- issue 23: param groups, state, input
def test_a_param_group_added_after_construction_is_refused_before_anything_is_rescaled():
    opt = one_param_sgd(momentum=0.0)
    sched = PerStepLR(opt, [0.1, 100.0, 100.0], rescale_above=1.0)
    late = torch.nn.Parameter(torch.full((4,), 1.0, dtype=torch.float64))
    opt.add_param_group({"params": [late], "lr": 0.01})
    opt.step()
    with pytest.raises(RuntimeError, match="optimizer has 2 param groups, PerStepLR was built for 1; build the "
                                           "scheduler after adding every group"):
        sched.step()
    assert torch.equal(late, torch.ones(4, dtype=torch.float64)) and sched.rescale_count == 0


def two_group_sgd(second_lr=0.05):
    return torch.optim.SGD([{"params": [torch.nn.Parameter(torch.ones(2, dtype=torch.float64))]},
                            {"params": [torch.nn.Parameter(torch.ones(2, dtype=torch.float64))], "lr": second_lr}],
                           lr=0.1, momentum=0.9)


@pytest.mark.parametrize("saved, built, match", [
    (lambda: PerStepLR(one_param_sgd(), LR), lambda: PerStepLR(two_group_sgd(), LR), r"param groups = 1, this .* 2"),
    (lambda: PerStepLR(one_param_sgd(), LR), lambda: PerStepLR(one_param_sgd(), LR, rescale_above=1.0),
     "rescale_above = None, this scheduler 1.0"),
    (lambda: PerStepLR(two_group_sgd(0.05), LR), lambda: PerStepLR(two_group_sgd(0.2), LR),
     r"lr ratios of the param groups = \[1.0, 0.5\], this scheduler \[1.0, 2.0\]"),
    (lambda: PerStepLR(one_param_sgd(), LR), lambda: PerStepLR(one_param_sgd(), LR[:200]), "steps = 300, this .* 200"),
    (lambda: PerStepLR(one_param_sgd(), SCHEDULE),
     lambda: PerStepLR(one_param_sgd(momentum=0.5), dataclasses.replace(SCHEDULE, momentum=0.5)),
     "momentum = 0.9, this scheduler 0.5"),
])
def test_load_state_dict_refuses_other_settings(saved, built, match):
    """The constructor's settings stay: a state built otherwise is refused, naming the setting and both values."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        state, sched = saved().state_dict(), built()
    before = sched.state_dict()
    with pytest.raises(ValueError, match=match):
        sched.load_state_dict(state)
    assert sched.state_dict() == before


def test_state_dict_holds_exactly_the_declared_keys():
    _, opt, sched = fresh(rescale_above=0.105)
    play(opt, sched, 120)
    sched.some_new_attribute = 1  # a new attribute does not silently enter checkpoints
    state = sched.state_dict()
    assert list(state) == list(lr_scheduler.STATE_KEYS)
    _, opt2, sched2 = fresh(rescale_above=0.105)
    sched2.load_state_dict(pickle.loads(pickle.dumps(state)))
    assert pickle.dumps(sched2.state_dict()) == pickle.dumps(state)  # bit-identical
    with pytest.raises(ValueError, match=r"not a PerStepLR state: missing \['log2_rescale'\], unexpected \['x'\]"):
        sched2.load_state_dict({**{k: v for k, v in state.items() if k != "log2_rescale"}, "x": 0})


@pytest.mark.parametrize("lr, wd, match", [
    ([0.1, True], 0.0, r"lr\[1\] = True \(bool\)"),
    (["0.1", 0.2], 0.0, r"lr\[0\] = '0.1' \(str\)"),
    ([0.1, None], 0.0, r"lr\[1\] = None \(NoneType\)"),
    (np.array([True, True]), 0.0, r"lr\[0\] = True \(bool\)"),
    (np.array(["0.1"]), 0.0, r"lr\[0\] = '0.1' \(str\)"),
    ([0.1, 0.1], [0.0, "1e-4"], r"wd\[1\] = '1e-4' \(str\)"),
    ([0.1, 0.1], False, r"wd = False \(bool\)"),
])
def test_learning_rates_and_weight_decays_must_be_real_numbers(lr, wd, match):
    opt = one_param_sgd()
    name = "wd" if "wd" in match else "lr"
    rule = "finite real numbers > 0" if name == "lr" else "finite real numbers"
    with pytest.raises(TypeError, match=f"{match} is not a real number: {name} must be {rule}"):
        PerStepLR(opt, lr, wd)


def test_check_rescale_above_is_the_rule_the_scheduler_applies():
    for value in (0.1, 0.05, math.nan, True, 1e39):
        with pytest.raises(ValueError, match=r"rescale_above must be a finite number > lr\[0\] = 0.1"):
            check_rescale_above(value, 0.1, torch.float32)
        with pytest.raises(ValueError, match=r"rescale_above must be a finite number > lr\[0\] = 0.1"):
            PerStepLR.from_schedule(_sgd(), SCHEDULE, rescale_above=value)
    check_rescale_above(1e39, 0.1, torch.float64)
    check_rescale_above(0.105, 0.1, None)


def test_from_schedule_names_the_types_it_accepts():
    with pytest.raises(TypeError, match=r"an EquivalentSchedule or an object with per-step \.lr and \.wd; got list.*"
                                        r"PerStepLR\(optimizer, lr, wd\)"):
        PerStepLR.from_schedule(one_param_sgd(), [0.1] * 5)


def test_a_long_plain_schedule_is_stored_compactly():
    """10^6 steps: the stored schedule is one float64 array (8 bytes per step) and building it peaks at
    about twice the input."""
    lr = np.full(10**6, 0.1)
    opt = one_param_sgd()
    tracemalloc.start()
    try:
        sched = PerStepLR(opt, lr, 5e-4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    stored = sum(v.nbytes for v in vars(sched).values() if isinstance(v, np.ndarray))
    assert stored == lr.nbytes and peak < 2.5 * lr.nbytes


# ----------------------------------------------------------------------------- issue 24: torch conventions
def test_last_epoch_resumes_like_torchs_lambda_lr():
    """torch: a scheduler built with last_epoch=N needs 'initial_lr' in every group and moves to step N+1."""
    lrs = LR * 10  # 1.0 at the start, so LambdaLR's base_lr · λ(k) is exact
    opt, oracle_opt, stepped_opt = (one_param_sgd(lr=1.0, momentum=0.0) for _ in range(3))
    with pytest.raises(KeyError, match="initial_lr"):
        PerStepLR(opt, lrs, last_epoch=41)
    for o in (opt, oracle_opt):
        o.param_groups[0]["initial_lr"] = 1.0
    sched = PerStepLR(opt, lrs, 5e-4, last_epoch=41)
    oracle = torch.optim.lr_scheduler.LambdaLR(oracle_opt, lambda k: lrs[k], last_epoch=41)
    stepped = PerStepLR(stepped_opt, lrs, 5e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(42):
            stepped.step()
    assert sched.last_epoch == oracle.last_epoch == stepped.last_epoch == 42
    for _ in range(len(lrs) - 43):
        assert sched.get_last_lr() == oracle.get_last_lr() == stepped.get_last_lr()
        assert opt.param_groups[0]["weight_decay"] == 5e-4
        for o, s in ((opt, sched), (oracle_opt, oracle), (stepped_opt, stepped)):
            o.step()
            s.step()


def test_stepping_past_the_end_names_the_length_and_the_step():
    opt = one_param_sgd()
    sched = PerStepLR(opt, [0.1, 0.2])
    for _ in range(2):
        opt.step()
        sched.step()
    opt.step()
    with pytest.raises(IndexError, match=r"the schedule has 2 steps.*step 3, past its end"):
        sched.step()


# ----------------------------------------------------------------------------- issue 22: no host read of a tensor lr
def no_host_reads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a tensor was read on the host")
    for name in ("item", "tolist", "numpy", "__float__", "__int__", "__index__", "__bool__", "__format__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)


def test_a_tensor_lr_is_written_without_host_reads(monkeypatch):
    """lr as a tensor (on an accelerator): step() writes it in place with fill_ and never reads it back,
    rescaling included; the lr check of ChainedScheduler still sees another scheduler's writes."""
    def tensor_sgd():
        return torch.optim.SGD([torch.nn.Parameter(torch.ones(3, dtype=torch.float64))], momentum=0.9, foreach=False,
                               lr=torch.tensor(0.1, dtype=torch.float64))
    opt = tensor_sgd()
    sched = PerStepLR.from_schedule(opt, SCHEDULE, rescale_above=0.105)
    lr, seen = opt.param_groups[0]["lr"], []
    with monkeypatch.context() as patch:
        for _ in range(len(LR)):
            opt.step()
            no_host_reads(patch)
            sched.step()
            patch.undo()
            seen.append(lr.item())
    float_opt = one_param_sgd()
    expected = play(float_opt, PerStepLR.from_schedule(float_opt, SCHEDULE, rescale_above=0.105), len(LR))[1:, 0, 0]
    assert opt.param_groups[0]["lr"] is lr and sched.rescale_count > 0
    np.testing.assert_array_equal(seen[:-1], expected)
    opt = tensor_sgd()
    sched, other = PerStepLR.from_schedule(opt, SCHEDULE), torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    opt.step()
    other.step()  # writes the tensor lr in place
    with pytest.raises(RuntimeError, match="cannot run in a ChainedScheduler"):
        sched.step()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_tensor_lr_steps_without_synchronising():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(3, device="cuda"))], lr=torch.tensor(0.1, device="cuda"),
                          momentum=0.9, foreach=False)
    sched = PerStepLR.from_schedule(opt, SCHEDULE, rescale_above=0.105)
    for _ in range(len(LR)):
        opt.step()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # a host read of a CUDA tensor now raises
        try:
            sched.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert sched.rescale_count > 0


# ----------------------------------------------------------------------------- issue 41: tensor lrs, numpy numbers
@pytest.mark.parametrize("optimizer", [
    lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9, foreach=False),
    lambda params, lr: torch.optim.Adam(params, lr=lr, foreach=False),
], ids=["SGD", "Adam"])
def test_a_tensor_lr_resumes_from_its_state(optimizer):
    """A tensor lr (a compiled or capturable optimizer's): the state's settings are Python numbers, it loads with
    weights_only, and a fresh scheduler resumes the same lrs."""
    def build():
        opt = optimizer([torch.nn.Parameter(torch.ones(3, dtype=torch.float64))], torch.tensor(0.1, dtype=torch.float64))
        return opt, PerStepLR(opt, LR, 5e-4)
    opt, sched = build()
    play(opt, sched, 120)
    buffer = io.BytesIO()
    torch.save(sched.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert state["base_lrs"] == [0.1] and type(state["base_lrs"][0]) is float
    opt2, sched2 = build()
    sched2.load_state_dict(state)
    assert sched2.last_epoch == 120 and opt2.param_groups[0]["lr"].item() == LR[120]
    following = [[float(lr) for lr, _ in row] for row in play(opt2, sched2, 30)]
    np.testing.assert_array_equal(following, [[float(lr) for lr, _ in row] for row in play(opt, sched, 30)])
    assert isinstance(opt2.param_groups[0]["lr"], torch.Tensor)


def test_numpy_numbers_are_stored_as_python_floats():
    """rescale_above, the optimizer's lr and weight decay as numpy floats: the scheduler's state (and the optimizer's
    'initial_lr', which the scheduler writes) hold Python floats, so both load with weights_only."""
    param = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    opt = torch.optim.SGD([param], lr=np.float64(0.1), momentum=0.9, weight_decay=np.float64(1e-4))
    sched = PerStepLR.from_schedule(opt, SCHEDULE, rescale_above=np.float64(0.105))
    play(opt, sched, 150)
    assert sched.rescale_count > 0
    buffer = io.BytesIO()
    torch.save({"scheduler": sched.state_dict(), "optimizer": opt.state_dict()}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert loaded["scheduler"] == sched.state_dict()
    for key in ("rescale_above", "momentum"):
        assert type(loaded["scheduler"][key]) is float
    assert [type(x) for x in loaded["scheduler"]["_own_weight_decay"] + loaded["scheduler"]["base_lrs"]] == [float] * 2
    assert type(opt.param_groups[0]["initial_lr"]) is float


@pytest.mark.parametrize("second_lr, shown", [(float("nan"), "nan"), (-0.1, "-0.1"), (0.0, "0.0"),
                                              (torch.tensor(float("nan")), r"tensor\(nan\)")])
def test_a_param_group_lr_must_be_finite_and_positive(second_lr, shown):
    """A NaN group lr is named in one line (not an OverflowError about 2^-3.3); a negative one is refused."""
    opt = two_group_sgd(second_lr)
    with pytest.raises(ValueError, match=rf"^PerStepLR: param group 1 has lr = {shown}; it must be a finite number "
                                         r"> 0 \(every group keeps its lr ratio to the first one\)$"):
        PerStepLR(opt, LR)


def test_a_param_group_weight_decay_must_be_finite():
    opt = two_group_sgd()
    opt.param_groups[1]["weight_decay"] = float("inf")
    with pytest.raises(ValueError, match=r"^PerStepLR: param group 1 has weight_decay = inf; it must be a finite "
                                         r"number$"):
        PerStepLR(opt, LR)


@pytest.mark.parametrize("optimizer", [torch.optim.LBFGS, torch.optim.SparseAdam, torch.optim.Rprop])
def test_a_weight_decay_that_the_optimizer_would_ignore_is_refused(optimizer):
    """LBFGS, SparseAdam and Rprop have no weight_decay: a schedule's weight decay is refused, naming the optimizer;
    without one the schedule plays its lrs and adds no weight_decay key."""
    def build():
        return optimizer([torch.nn.Parameter(torch.ones(3, dtype=torch.float64))], lr=0.1)
    for wd, where in ((5e-4, r"wd = 0\.0005"), (np.r_[np.zeros(299), 1e-4], r"wd\[299\] = 0\.0001")):
        with pytest.raises(ValueError, match=rf"^wd must be 0 for {optimizer.__name__}: its param group 0 has no "
                                             rf"'weight_decay', .* got {where} \("):
            PerStepLR(build(), LR, wd)
    opt = build()
    sched = PerStepLR(opt, LR)
    for k in range(1, 5):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # no optimizer.step(): LBFGS's needs a closure
            sched.step()
        assert opt.param_groups[0]["lr"] == LR[k] and "weight_decay" not in opt.param_groups[0]
    kept = build()
    kept.param_groups[0][lr_scheduler.INVARIANT_KEY] = False  # a group out of the schedule's weight decay is fine
    PerStepLR(kept, LR, 5e-4)


# ----------------------------------------------------------------------------- hostile input
def _sgd(dtype=torch.float32):
    return torch.optim.SGD([torch.nn.Parameter(torch.ones(3, dtype=dtype))], lr=0.1, momentum=0.9)


@pytest.mark.usefixtures("one_thread")
class TestHostileInput:
    """The hostile-input probe's defect 18: PerStepLR refuses a ChainedScheduler and a ``rescale_above`` its
    parameters' dtype cannot hold, before any step runs."""

    @pytest.mark.parametrize("first", [True, False])
    def test_a_chained_scheduler_with_per_step_lr_is_refused_at_construction(self, first):
        opt = _sgd()
        sched = PerStepLR.from_schedule(opt, SCHEDULE)
        other = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        lr = opt.param_groups[0]["lr"]
        with pytest.raises(RuntimeError, match="cannot run in a ChainedScheduler.*SequentialLR"):
            torch.optim.lr_scheduler.ChainedScheduler([sched, other] if first else [other, sched])
        assert opt.param_groups[0]["lr"] == lr and sched.last_epoch == 0  # nothing was stepped
        seq = torch.optim.lr_scheduler.SequentialLR(opt, [other, sched], milestones=[3])  # still allowed
        assert seq.optimizer is opt

    def test_a_rescale_above_the_parameters_dtype_cannot_hold_is_refused_at_construction(self):
        """float16's largest value is 65504: a rescale_above of 1e5 once failed at step 249."""
        lr = 0.05 * 1.03 ** np.arange(800)
        with pytest.raises(ValueError, match="rescale_above.*65504"):
            PerStepLR(_sgd(torch.float16), lr, rescale_above=1e5)
        opt = _sgd(torch.float16)
        sched = PerStepLR(opt, lr, rescale_above=65504 / 4)
        for _ in range(799):
            opt.step()
            sched.step()
        assert sched.rescale_count > 0 and opt.param_groups[0]["lr"] <= 65504 / 4


# ----------------------------------------------------------------------------- the torch it runs on
ROOT = Path(__file__).resolve().parents[1]
FLOOR_MODULES = "explr, explr.invariance, explr.lr_scheduler, explr.models, explr.params, explr.sgd"


def dynamo_loaded_after(code: str) -> bool:
    """Whether ``torch._dynamo`` (about a second of imports) is loaded after ``code`` runs in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    probe = f"{code}\nimport sys\nprint('torch._dynamo' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()[-1] == "True"


def test_importing_the_maths_floor_loads_no_dynamo():
    """No optimizer is built at import: ``torch.optim.SGD(...)`` loads ``torch._dynamo``, as the import-time probe of
    torch's internals that was here did (the second case shows the check sees it)."""
    assert not dynamo_loaded_after(f"import {FLOOR_MODULES}")
    assert dynamo_loaded_after(f"import {FLOOR_MODULES}\n"
                               "import torch\ntorch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)")


def test_the_declared_torch_range_is_the_compat_floor_to_the_pin():
    """pyproject.toml declares exactly the tested torch versions: from ``make compat``'s floor to the pin of
    requirements.txt, which the lock installs."""
    pin = re.search(r"^torch==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M).group(1)
    locked = re.search(r"^torch==(\S+)$", (ROOT / "requirements.lock").read_text(), re.M).group(1)
    floor = re.search(r"^COMPAT_TORCH\s*\?=\s*(\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = [d for d in dependencies if re.match(r"torch\b", d)]
    assert declared == [f"torch>={floor},<={pin}"] and locked == pin, (declared, floor, pin, locked)
