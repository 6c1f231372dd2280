"""Hostile inputs that once escaped the checks (the defects of the hostile-input probe, numbered as there).

Bad command-line values (4-8, 11, 12) are exit code 2 with one line naming the flag and its valid range, and
nothing created; crafted checkpoints (weights only, their sha256 re-recorded in the manifest) and metrics that
disagree with the checkpoint (14, 15) are one line naming the file, with the run folder untouched;
``PerStepLR`` (18) refuses a ChainedScheduler, odd or non-integer progress in a state and a ``rescale_above``
its parameters' dtype cannot hold, before any step runs.

PreResNet8 on 192 generated images, batch 32 (6 steps per epoch), in-process calls of ``main(argv)``.
"""

import numpy as np
import pytest
import torch

from explr import PerStepLR
from explr.cifar10.__main__ import main
from explr.cifar10.config import TrainConfig
from explr.cifar10.runfolder import load_runs
from explr.cifar10.runs import train_run
from explr.schedules import step_decay, texp

from cifar10_helpers import CLI_TINY, TINY, edit_checkpoint, tiny_arrays, tiny_npz

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


def refused(argv, capsys, *words):
    """``main(argv)`` exits 2 with one line on stderr, no traceback, naming every one of ``words``."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


def files_of(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- 4-8, 11, 12: the command line
@pytest.mark.parametrize("argv, flag, valid", [
    (["--schedule", "step", "--wd", "1e39"], "--wd", "[0, 3.40282e+38]"),  # 4
    (["--schedule", "cosine", "--wd", "1e39"], "--wd", "[0, 3.40282e+38]"),
    (["--device", "cuda:99999999999999999999"], "--device", "cuda:N with N in [0, 127]"),  # 5
    (["--device", "cuda:128"], "--device", "cuda:N with N in [0, 127]"),  # torch reads it as cuda:-128
    (["--threads", "99999999999"], "--threads", "[1, 1024]"),  # 6
    (["--threads", "1025"], "--threads", "[1, 1024]"),
    (["--depth", "6000002"], "--depth", "n in [1, 200]"),  # 7
    (["--depth", "1208"], "--depth", "n in [1, 200]"),
    (["--bn-eps", "1e39"], "--bn-eps", "(0, 0.1]"),  # 11
    (["--bn-eps", "0.5"], "--bn-eps", "(0, 0.1]"),
    (["--time", "30"], "--time", "--launcher submitit"),  # 12
    (["--cluster", "local"], "--cluster", "--launcher submitit"),
    (["--cluster", "slurm"], "--cluster", "--launcher submitit"),
])
def test_a_value_out_of_range_is_one_line_naming_the_flag_and_its_range(argv, flag, valid, npz, tmp_path, capsys):
    out = tmp_path / "out"
    refused(["--data", npz, "--out", str(out), *CLI_TINY, *argv], capsys, flag, valid)
    assert not any(tmp_path.iterdir())


def test_an_empty_out_is_refused_like_an_empty_data(npz, tmp_path, capsys, monkeypatch):
    """8: ``--out ''`` once trained into ./step/seed0."""
    monkeypatch.chdir(tmp_path)
    refused(["--data", npz, "--out", "", *CLI_TINY], capsys, "--out", "must be a folder")
    refused(["--data", "", "--out", "x", *CLI_TINY], capsys, "--data", "must be a data source")
    assert not any(tmp_path.iterdir())


def test_the_largest_values_in_range_are_accepted(npz, tmp_path):
    """The new upper bounds do not refuse what they allow: depth 1202 (He et al.'s deepest CIFAR ResNet) parses,
    and so does wd at float32's largest value; wd just below the stability limit 2(1 + momentum)/lr = 38, bn_eps 0.1
    and 1024 threads validate."""
    from explr.cifar10.__main__ import build_parser
    from explr.cifar10.config import configs_from_args

    assert build_parser().parse_args(["--wd", "3.4e38"]).wd == 3.4e38
    args = build_parser().parse_args(["--depth", "1202", "--wd", "37.99", "--bn-eps", "0.1", "--threads", "1024",
                                      "--device", "cuda:127"])
    (config,) = configs_from_args(args)
    assert config.validate().depth == 1202 and config.threads == 1024


# ----------------------------------------------------------------------------- 14, 15: checkpoints and metrics
def _set(*keys, value):
    def edit(saved):
        target = saved
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return edit


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
def test_every_field_of_a_crafted_checkpoint_that_resume_reads_is_checked(edit, words, npz, arrays, tmp_path,
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


def test_the_metrics_of_a_finished_run_must_be_the_checkpoints(npz, arrays, tmp_path, capsys):
    """15: a duplicated metrics line is refused, naming the file; a metrics file that lost its last rows (killed
    between the last checkpoint and its metrics) is rewritten from the checkpoint."""
    config = TrainConfig(**{**TINY, "epochs": 2}, schedule="step", data=npz)
    out = tmp_path / "out"
    run = out / "step" / "seed0"
    train_run(config, run, arrays, progress=False)
    argv = ["--data", npz, "--out", str(out), *CLI_TINY, "--epochs", "2", "--schedule", "step", "--resume"]
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join(lines + lines[-1:]))
    before = files_of(run)
    refused(argv, capsys, str(run / "metrics.jsonl"), "checkpoint.pt")
    assert files_of(run) == before
    (run / "metrics.jsonl").write_text(lines[0])
    assert main(argv) == 0
    assert (run / "metrics.jsonl").read_text() == "".join(lines)
    np.testing.assert_array_equal(load_runs(out)[0]["metrics"]["epoch"], [1, 2])


# ----------------------------------------------------------------------------- 18: PerStepLR
LR = step_decay(0.1, 6, 50, [2, 4])
SCHEDULE = texp(LR, 5e-4, 0.9)


def _sgd(dtype=torch.float32):
    return torch.optim.SGD([torch.nn.Parameter(torch.ones(3, dtype=dtype))], lr=0.1, momentum=0.9)


@pytest.mark.parametrize("first", [True, False])
def test_a_chained_scheduler_with_per_step_lr_is_refused_at_construction(first):
    opt = _sgd()
    sched = PerStepLR.from_schedule(opt, SCHEDULE)
    other = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    lr = opt.param_groups[0]["lr"]
    with pytest.raises(RuntimeError, match="cannot run in a ChainedScheduler.*SequentialLR"):
        torch.optim.lr_scheduler.ChainedScheduler([sched, other] if first else [other, sched])
    assert opt.param_groups[0]["lr"] == lr and sched.last_epoch == 0  # nothing was stepped
    seq = torch.optim.lr_scheduler.SequentialLR(opt, [other, sched], milestones=[3])  # still allowed
    assert seq.optimizer is opt


@pytest.mark.parametrize("key, value", [("log2_rescale", -3), ("log2_rescale", 2), ("log2_rescale", 1.0),
                                        ("last_epoch", 5.0), ("last_epoch", True), ("last_epoch", -2),
                                        ("last_epoch", 10**6), ("rescale_count", -1), ("rescale_count", 10**6)])
def test_load_state_dict_refuses_odd_or_non_integer_progress(key, value):
    opt = _sgd()
    sched = PerStepLR.from_schedule(opt, SCHEDULE, rescale_above=0.105)
    for _ in range(120):
        opt.step()
        sched.step()
    state = sched.state_dict()
    assert state["log2_rescale"] < 0 and state["rescale_count"] >= 1
    state[key] = value
    fresh_opt = _sgd()
    fresh = PerStepLR.from_schedule(fresh_opt, SCHEDULE, rescale_above=0.105)
    with pytest.raises(ValueError, match=f"PerStepLR.load_state_dict: {key}"):
        fresh.load_state_dict(state)
    assert fresh.last_epoch == 0 and fresh.log2_rescale == 0  # left as it was


def test_a_rescale_above_the_parameters_dtype_cannot_hold_is_refused_at_construction():
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
