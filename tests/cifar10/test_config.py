"""explr.cifar10.config: every setting declared once (parser, validation, resume keys) and the schedules it names."""
import argparse
import dataclasses

import numpy as np
import pytest
import torch

from explr.cifar10 import preflight
from explr.cifar10.__main__ import build_parser, main
from explr.cifar10.config import RESOLVED_KEYS, TRAJECTORY_KEYS, TrainConfig, add_config_arguments, lr_wd_limit

from cifar10_helpers import CLI_TINY
from explr.cifar10.config import default_decay_epochs
from explr.cifar10.played import played_schedule
from explr.schedules import EquivalentSchedule, PlainSchedule, cosine, step_decay, texp, texp_minus_minus

pytestmark = pytest.mark.usefixtures("one_thread")
CLI_TWO_EPOCHS = [*CLI_TINY, "--epochs", "2"]


def test_parser_validation_and_resume_keys_come_from_the_fields():
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    parser = build_parser()
    dests = {a.dest: a for a in parser._actions}
    for name, f in fields.items():
        assert name in dests and dests[name].help.startswith(f.metadata["help"][:20]), name
    assert set(TRAJECTORY_KEYS) | set(RESOLVED_KEYS) == {n for n, f in fields.items() if f.metadata["trajectory"]}
    assert set(RESOLVED_KEYS) == {"device", "precision", "threads"} and "lr" in TRAJECTORY_KEYS
    # the same rule refuses a value in the parser and in validate(), with the same words
    for flag, value in (("--depth", "21"), ("--momentum", "1"), ("--lr", "nan")):
        with pytest.raises(SystemExit):
            parser.parse_args([flag, value])
        with pytest.raises(ValueError, match=f"\\({flag}\\) must be"):
            TrainConfig(**{flag[2:]: float(value) if flag != "--depth" else int(value)}).validate()
    # a subset for another tool (the benchmark), with a field swept
    p = argparse.ArgumentParser()
    add_config_arguments(p, names=("depth", "precision"), sweep=("precision",))
    args = p.parse_args(["--precision", "fp32", "bf16"])
    assert args.precision == ["fp32", "bf16"] and args.depth == 32


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


# ----------------------------------------------------------------------------- what the maths says can train
@pytest.mark.parametrize("schedule, lr, wd, momentum, words", [
    ("step", 0.1, 100.0, 0.9, ("wd (--wd) 100", "lr*wd = 10", "2(1 + momentum) = 3.8")),
    ("cosine", 1.0, 2.0, 0.0, ("wd (--wd) 2", "lr*wd = 2", "2(1 + momentum) = 2")),  # the limit itself diverges
    ("step", 0.1, 3.4e38, 0.9, ("lr*wd = 3.4e+37",)),
    ("texp", 0.1, 0.03, 0.9, ("schedule texp", "wd (--wd) 0.03", "no positive real root")),
    ("cosine-texp", 1.0, 1.0, 0.0, ("schedule cosine-texp", "no positive real root")),
])
def test_a_weight_decay_at_which_sgd_must_diverge_is_refused(schedule, lr, wd, momentum, words):
    """Issue 41 item 18: such a run started, left its folder and ended diverged (exit 3)."""
    config = TrainConfig(schedule=schedule, lr=lr, wd=wd, momentum=momentum)
    with pytest.raises(ValueError) as raised:
        config.validate()
    assert "\n" not in str(raised.value)
    for word in words:
        assert word in str(raised.value)


def test_the_largest_weight_decays_below_the_limits_validate():
    limit = lr_wd_limit(0.9)
    assert limit == pytest.approx(3.8)
    TrainConfig(schedule="step", lr=0.1, wd=np.nextafter(limit, 0) / 0.1, momentum=0.9).validate()
    TrainConfig(schedule="texp", lr=0.1, wd=(1 - np.sqrt(0.9)) ** 2 / 0.1 * (1 - 1e-12), momentum=0.9).validate()


@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
def test_the_limit_is_where_sgd_with_momentum_blows_the_weights_up(momentum):
    """torch's SGD on a scale-invariant loss, in float64.  3 % above :func:`lr_wd_limit` the weight norm grows from
    the first step: by more than 10^4 in 200 steps from a unit norm (the predicted root -1.06^200 = 1e5 for momentum
    0, more for the others).  3 % below it the weight decay shrinks the norm, seen where it dominates the gradient
    (a norm of 10^30, 50 steps; nearer the unit sphere the gradient, ~1/norm, makes the norm fluctuate)."""
    torch.manual_seed(0)
    x, target = torch.randn(64, 8, dtype=torch.float64), torch.randn(64, dtype=torch.float64)

    def growth(lr_wd, norm, steps, lr=1e-3):
        w = torch.randn(8, dtype=torch.float64)
        w = (w * (norm / w.norm())).requires_grad_()
        opt = torch.optim.SGD([w], lr=lr, weight_decay=lr_wd / lr, momentum=momentum)
        for _ in range(steps):
            opt.zero_grad()
            ((x @ (w / w.norm()) - target) ** 2).mean().backward()  # L(c w) = L(w): scale invariant
            opt.step()
        return w.detach().norm().item() / norm

    assert growth(1.03 * lr_wd_limit(momentum), 1.0, 200) > 1e4
    assert growth(0.97 * lr_wd_limit(momentum), 1e30, 50) < 1


def test_the_cli_refuses_such_a_weight_decay_before_the_data_and_creates_nothing(tmp_path, capsys, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the data was loaded before the settings were checked")

    monkeypatch.setattr(preflight, "load_cifar10", never)
    for argv, word in ((["--schedule", "step", "--wd", "100"], "2(1 + momentum)"),
                       (["--schedule", "texp", "--wd", "0.03"], "no positive real root")):
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--out", str(tmp_path / "out"), "--data-root", str(tmp_path / "data"), *CLI_TINY])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and word in err and "--wd" in err, err
    assert not any(tmp_path.iterdir())
