"""The torch that PerStepLR runs on: every private scheduler name it relies on is tried at import
(explr.torch_support.missing_torch_internals), and a torch without one is refused there in one line naming the
tested versions; those versions are the floor that ``make compat`` tests and the pin of requirements.txt."""
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from torch.optim.lr_scheduler import ChainedScheduler, LRScheduler, SequentialLR

from explr import torch_support

ROOT = Path(__file__).resolve().parents[1]


def test_this_torch_has_every_internal_that_per_step_lr_uses():
    assert torch_support.missing_torch_internals() == []


class InlineStep(LRScheduler):
    """An LRScheduler whose step() updates the lr itself, with no _update_lr to override (as older torch did)."""

    def step(self, epoch=None):
        self._step_count += 1
        self.last_epoch += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


class WritingSequential(SequentialLR):
    """A SequentialLR that switches to the next scheduler by writing its lrs itself, not through _update_lr(0)."""

    def step(self):
        self.last_epoch += 1
        index = sum(m <= self.last_epoch for m in self._milestones)
        scheduler = self._schedulers[index]
        if index and self._milestones[index - 1] == self.last_epoch:
            scheduler.last_epoch = 0
            for group, lr in zip(self.optimizer.param_groups, scheduler.get_lr()):
                group["lr"] = lr
        else:
            scheduler.step()


class HelperChained(ChainedScheduler):
    """A ChainedScheduler that reads the schedulers' optimizers in a helper, not in its own __init__."""

    def __init__(self, schedulers, optimizer=None):
        self._schedulers = list(schedulers)
        self.optimizer = optimizer or _first_optimizer(self._schedulers)


def _first_optimizer(schedulers):
    return schedulers[0].optimizer


@pytest.mark.parametrize("torch_like, missing", [
    (dict(base=InlineStep), ["the initial step calls _update_lr() with _is_initial set",
                             "step() counts _step_count and calls _update_lr()"]),
    (dict(sequential=WritingSequential), ["SequentialLR switches to a scheduler with _update_lr(0)"]),
    (dict(chained=HelperChained), ["ChainedScheduler.__init__ reads each scheduler's optimizer itself"]),
])
def test_a_torch_without_them_is_named_what_it_lacks(torch_like, missing):
    """Deliberately old or changed torch schedulers: the probe names each internal they lack."""
    assert torch_support.missing_torch_internals(**torch_like) == missing


def test_a_missing_internal_is_one_import_error_naming_the_tested_versions():
    with pytest.raises(ImportError) as err:
        torch_support.check_torch(["step() counts _step_count and calls _update_lr()"])
    message = str(err.value)
    assert "\n" not in message and "torch 2.13.0 and 2.14.1 (the tested versions)" in message
    assert message.endswith("calls _update_lr(). Install a tested one: pip install 'torch>=2.13.0,<=2.14.1'")
    torch_support.check_torch([])


def test_the_check_runs_when_explr_is_imported():
    """In a fresh interpreter whose SequentialLR only steps its schedulers, ``import explr`` fails with the one-line
    ImportError (and not later, in a run)."""
    code = ("import torch.optim.lr_scheduler as m\n"
            "m.SequentialLR.step = lambda self: [s.step() for s in self._schedulers]\n"
            "import explr\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"ImportError: explr\.lr_scheduler: PerStepLR relies on .* torch 2\.13\.0 and 2\.14\.1 .*: "
                        r"SequentialLR switches to a scheduler with _update_lr\(0\)\. Install a tested one: "
                        r"pip install 'torch>=2\.13\.0,<=2\.14\.1'", last)


def test_the_tested_versions_are_the_compat_floor_and_the_pin():
    pin = re.search(r"^torch==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M).group(1)
    floor = re.search(r"^COMPAT_TORCH\s*\?=\s*(\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert torch_support.TORCH_TESTED == (floor, pin)


def test_the_declared_floor_is_the_oldest_tested_torch():
    """pyproject.toml declares only what ``make compat`` passed: its torch floor is TORCH_TESTED's first entry."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floor = next(re.fullmatch(r"torch>=(\S+)", d).group(1) for d in dependencies if d.startswith("torch"))
    oldest = torch_support.TORCH_TESTED[0]
    assert oldest == floor or oldest.startswith(floor + "."), (floor, oldest)
