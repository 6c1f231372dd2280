"""explr.cifar10.config: every setting declared once (parser, validation, resume keys) and the schedules it names."""
import argparse
import dataclasses

import numpy as np
import pytest

from explr.cifar10.__main__ import build_parser
from explr.cifar10.config import RESOLVED_KEYS, TRAJECTORY_KEYS, TrainConfig, add_config_arguments

from cifar10_helpers import CLI_TINY
from explr.cifar10.config import default_decay_epochs
from explr.cifar10.schedule import played_schedule
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
