"""explr.cifar10.checkpoint: the checkpoint's schema and its rules, written, read and refused (one tiny run of
PreResNet8, 2 epochs of 6 steps)."""
import copy
import hashlib
import math

import pytest
import torch

from explr.cifar10.checkpoint import (CHECKPOINT, CHECKPOINT_KEYS, FORMAT, Checkpoint, check_checkpoint, check_epoch,
                                      check_progress, check_states, checkpoint_state, load_checkpoint,
                                      serialize_checkpoint)
from explr.cifar10.config import RESOLVED_KEYS, TrainConfig
from explr.cifar10.lock import RunError
from explr.cifar10.played import played_schedule
from explr.cifar10.runs import train_run

from cifar10_helpers import CLI_TINY, TINY, edit_checkpoint, files_of, refused, tiny_arrays, tiny_npz

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")
CONFIG = TrainConfig(**{**TINY, "epochs": 2}).validate()


@pytest.fixture(scope="module")
def run(arrays, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    train_run(CONFIG, out, arrays, progress=False)
    return out


@pytest.fixture
def saved(run):
    return load_checkpoint(run)[0]


def test_a_written_checkpoint_holds_the_declared_fields_and_its_sha256(run, saved):
    assert set(saved) == set(Checkpoint.__annotations__) and set(CHECKPOINT_KEYS) <= set(saved)
    assert saved["format"] == FORMAT and saved["epoch"] == 2 and len(saved["metrics"]) == 2
    assert set(saved["resolved"]) == set(RESOLVED_KEYS)
    assert load_checkpoint(run)[1] == hashlib.sha256((run / CHECKPOINT).read_bytes()).hexdigest()


def test_the_state_serializes_to_what_loads_back(saved):
    resolved = {**saved["resolved"], "not recorded": 1}
    trainer_state = {k: saved[k] for k in ("model", "optimizer", "scheduler", "initial_loss")}
    state = checkpoint_state(trainer_state, 2, saved["metrics"], saved["config"], resolved, saved["data_sha256"],
                             saved["elapsed"])
    assert list(state) == list(saved) and state["resolved"] == saved["resolved"]
    data, digest = serialize_checkpoint(state)
    assert digest == hashlib.sha256(data).hexdigest() and serialize_checkpoint(state)[1] == digest


def test_a_sound_checkpoint_passes_every_check(saved, run, arrays):
    path = run / CHECKPOINT
    check_checkpoint(saved, path)
    check_checkpoint({**saved, "initial_loss": None, "resolved": None}, path)
    check_epoch(saved, CONFIG, path)
    check_states(saved, CONFIG, path)
    steps = len(arrays.y_train) // CONFIG.batch_size
    check_progress(saved, CONFIG, steps, path, schedule=played_schedule(CONFIG, steps))


@pytest.mark.parametrize("changes, match", [
    ({"data_sha256": 5}, "holds data_sha256 = 5, not the data's sha256"),
    ({"data_sha256": ""}, "holds data_sha256 = '', not the data's sha256"),
    ({"elapsed": -1.0}, r"holds elapsed = -1.0, not a finite number in \[0, "),
    ({"initial_loss": math.inf}, "holds initial_loss = inf, not a finite number"),
    ({"initial_loss": "2.3"}, "holds initial_loss = '2.3', not a finite number"),
    ({"resolved": ["cpu"]}, r"holds resolved = \['cpu'\], not a dict of settings"),
])
def test_a_field_that_breaks_its_rule_is_one_line_naming_the_file(changes, match, saved, run):
    with pytest.raises(RunError, match=match) as err:
        check_checkpoint({**saved, **changes}, run / CHECKPOINT)
    assert "\n" not in str(err.value) and f"delete the folder {run} to train this run again" in str(err.value)


# ----------------------------------------------------------------------------- hostile input
def _set(*keys, value):
    def edit(saved):
        target = saved
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return edit


class TestHostileInput:
    """A crafted checkpoint (the hostile-input probe's defect 14: weights only, its sha256 re-recorded in the
    manifest) is one line naming the file, with the run folder untouched."""

    @pytest.mark.parametrize("edit, words", [
        (_set("scheduler", "last_epoch", value=10**6), "last_epoch"),
        (_set("scheduler", "last_epoch", value=6.0), "last_epoch"),
        (_set("scheduler", "last_epoch", value=5), "last_epoch"),  # in range, but not epoch 1's 6 steps
        (_set("scheduler", "log2_rescale", value="x"), "log2_rescale"),
        (_set("scheduler", "log2_rescale", value=-10**6), "log2_rescale"),
        (_set("scheduler", "log2_rescale", value=-1), "log2_rescale"),
        (_set("scheduler", "rescale_count", value=-1), "rescale_count"),
        (_set("scheduler", "base_lrs", value=["abc"]), "base_lrs"),
        (_set("initial_loss", value="abc"), "initial_loss"),
        (_set("data_sha256", value=5), "data_sha256"),
        (_set("elapsed", value="abc"), "elapsed"),
        (_set("metrics", value=[1]), "metrics"),
        (_set("metrics", 0, "epoch", value=2), "metrics"),
        (_set("metrics", 0, "train_loss", value="abc"), "metrics"),
        (_set("metrics", 0, "test_acc", value=torch.zeros(1)), "metrics"),
    ])
    def test_every_field_of_a_crafted_checkpoint_that_resume_reads_is_checked(self, edit, words, npz, arrays, tmp_path,
                                                                             capsys):
        """14: a checkpoint that loads (weights only) and matches its manifest is still refused in one line naming it,
        before anything is written."""
        config = TrainConfig(**{**TINY, "epochs": 2}, schedule="texp", data=npz)
        out = tmp_path / "out"
        run = out / "texp" / "seed0"
        train_run(config, run, arrays, progress=False, stop_after=1)
        edit_checkpoint(run, edit)
        before = files_of(run)
        refused(["--data", npz, "--out", str(out), *CLI_TINY, "--epochs", "2", "--schedule", "texp", "--resume"], capsys,
                str(run / "checkpoint.pt"), words)
        assert files_of(run) == before


# ----------------------------------------------------------------------------- the epoch, the tensors, the step, the file
def test_an_epoch_without_its_rows_or_beyond_the_run_is_refused(saved, run):
    with pytest.raises(RunError, match=r"records epoch 3 with 2 metrics rows, not an epoch in \[1, 2\]"):
        check_epoch({**saved, "epoch": 3}, CONFIG, run / CHECKPOINT)
    with pytest.raises(RunError, match="records epoch 1 with 2 metrics rows"):
        check_epoch({**saved, "epoch": 1}, CONFIG, run / CHECKPOINT)


def test_tensors_of_another_network_are_refused(saved, run):
    with pytest.raises(RunError, match="does not fit this run's PreResNet14") as err:
        check_states(saved, TrainConfig(**{**TINY, "depth": 14}).validate(), run / CHECKPOINT)
    assert "\n" not in str(err.value)


def test_a_scheduler_at_another_step_is_refused(saved, run, arrays):
    steps = len(arrays.y_train) // CONFIG.batch_size
    moved = copy.deepcopy(saved)
    moved["scheduler"]["last_epoch"] -= 1
    with pytest.raises(RunError, match=f"holds a scheduler at step last_epoch = {2 * steps - 1}, not at the "
                                       f"{2 * steps} steps of its 2 epochs"):
        check_progress(moved, CONFIG, steps, run / CHECKPOINT, schedule=played_schedule(CONFIG, steps))


@pytest.mark.parametrize("content, match", [
    (b"not a checkpoint", "is not a readable checkpoint"),
    (None, r"is not a checkpoint of this engine \(expected the keys model, optimizer"),
])
def test_a_file_that_is_no_checkpoint_of_this_engine_is_one_line(content, match, tmp_path):
    if content is None:
        torch.save({"model": {}}, tmp_path / CHECKPOINT)
    else:
        (tmp_path / CHECKPOINT).write_bytes(content)
    with pytest.raises(RunError, match=match) as err:
        load_checkpoint(tmp_path)
    assert "\n" not in str(err.value) and f"delete the folder {tmp_path}" in str(err.value)
