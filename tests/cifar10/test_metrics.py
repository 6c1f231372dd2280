"""explr.cifar10.metrics: the metrics row's schema, its rules, and metrics.jsonl written, read and refused (also in a
run folder: a partial line of a killed epoch, hand-edited or hostile files, rows that disagree with the checkpoint)."""
import json
import math

import numpy as np
import pytest

from explr.cifar10.__main__ import main
from explr.cifar10.config import TrainConfig
from explr.cifar10.lock import RunError
from explr.cifar10.metrics import (FINAL_KEYS, SHOWN, TIMING_KEYS, EpochMetrics, MetricsRow, Timings,
                                   check_metrics_file, check_rows, read_metrics, write_metrics)
from explr.cifar10.runfolder import load_runs
from explr.cifar10.runs import train_run

from cifar10_helpers import (CLI_TINY, TINY, cli, deeply_nested, files_of, one_line, refused, replace_by, tiny_arrays,
                             tiny_npz)

arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


def row(epoch, **changes):
    """A row as the engine writes it (every key of :class:`MetricsRow`), with ``changes``."""
    values = {k: 0.5 for k in MetricsRow.__annotations__}
    values.update(epoch=epoch, step=6 * epoch, lr=None, log2_rescale=0, rescale_count=0)
    return {**values, **changes}


def test_the_row_is_the_epochs_numbers_then_the_timings():
    assert tuple(MetricsRow.__annotations__) == (*EpochMetrics.__annotations__, *Timings.__annotations__)
    assert TIMING_KEYS == ("seconds", "train_seconds", "eval_seconds", "images_per_s")
    assert set(SHOWN) <= set(EpochMetrics.__annotations__) and FINAL_KEYS == ("epoch", *SHOWN)


def test_rows_that_keep_the_rules_pass():
    check_rows([row(1), row(2, train_acc=1.0, test_acc=0.0, lr=0.1)], "ckpt")
    check_rows([], "ckpt")


@pytest.mark.parametrize("rows, match", [
    ([["not", "a", "row"]], "metrics row 1 = .* not a JSON object"),
    ([row(1, lr="0.1")], "metrics row 1 whose 'lr' = '0.1' is not a number or null"),
    ([row(1), row(3)], "metrics row 2 of epoch 3, not of epoch 2"),
    ([{**row(1), "epoch": 1.0}], "metrics row 1 of epoch 1.0, not of epoch 1"),
    ([row(1, train_acc=1.5)], r"train_acc = 1.5 is not a finite number in \[0, 1\]"),
    ([row(1, test_loss=math.nan)], "test_loss = nan is not a finite number"),
    ([row(1, train_loss=-1.0)], "train_loss = -1.0 is not a finite number"),
    ([{k: v for k, v in row(1).items() if k != "test_acc"}], "test_acc = None is not a finite number"),
])
def test_a_row_that_breaks_a_rule_is_one_line_naming_the_checkpoint(rows, match, tmp_path):
    with pytest.raises(RunError, match=match) as err:
        check_rows(rows, tmp_path / "checkpoint.pt")
    assert "\n" not in str(err.value) and str(err.value).startswith(str(tmp_path / "checkpoint.pt"))


def test_written_rows_read_back_the_same_from_the_file_or_its_folder(tmp_path):
    rows = [row(1), row(2, lr=math.inf)]
    write_metrics(tmp_path / "metrics.jsonl", rows)
    assert read_metrics(tmp_path / "metrics.jsonl") == read_metrics(tmp_path) == rows
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2


def test_a_line_that_is_not_an_object_is_one_line_naming_the_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(row(1)) + "\n[1, 2]\n" + json.dumps(row(3)) + "\n")
    with pytest.raises(RunError, match=r"metrics.jsonl line 2 is not a JSON object") as err:
        read_metrics(path)
    assert "\n" not in str(err.value)


def test_a_partial_last_line_is_dropped_only_when_asked(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(row(1)) + "\n" + json.dumps(row(2))[:20])
    assert read_metrics(path, drop_partial_last=True) == [row(1)]
    with pytest.raises(RunError, match="line 2 is not a JSON object"):
        read_metrics(path)


def test_a_folder_in_place_of_the_file_is_refused_unread(tmp_path):
    (tmp_path / "run" / "metrics.jsonl").mkdir(parents=True)
    with pytest.raises(RunError, match=r"metrics.jsonl is unreadable \(.*; delete the file and rerun with --resume"):
        read_metrics(tmp_path / "run")


def test_a_finished_runs_file_must_be_its_checkpoints_rows_or_their_first(tmp_path):
    saved = [row(1), row(2), row(3)]
    check_metrics_file(saved, saved, "metrics.jsonl", "checkpoint.pt")
    check_metrics_file(saved[:2], saved, "metrics.jsonl", "checkpoint.pt")  # killed before its metrics were written
    with pytest.raises(RunError, match=r"is not the 3 metrics rows of checkpoint.pt \(its row 2 of 3 differs"):
        check_metrics_file([row(1), row(2, test_acc=0.9), row(3)], saved, "metrics.jsonl", "checkpoint.pt")
    with pytest.raises(RunError, match="its row 4 of 4 differs"):
        check_metrics_file(saved + [row(3)], saved, "metrics.jsonl", "checkpoint.pt")


# ----------------------------------------------------------------------------- hostile input
@pytest.mark.usefixtures("one_thread")
class TestHostileInput:
    """Metrics that disagree with the checkpoint (the hostile-input probe's defect 15): one line naming the file,
    the run folder untouched; rows lost at the end are rewritten from the checkpoint."""

    def test_the_metrics_of_a_finished_run_must_be_the_checkpoints(self, npz, arrays, tmp_path, capsys):
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


# ----------------------------------------------------------------------------- hostile run files
@pytest.mark.usefixtures("one_thread")
class TestHostileRunFiles:
    """Run folders and flags a hostile or careless user can hand the engine: each is one line naming the file or
    flag (exit code 2, or 6 for a full disk), and nothing outside the engine's own files is written or deleted."""

    @pytest.mark.parametrize("edit, match", [
        (lambda run: (run / "metrics.jsonl").write_text(deeply_nested() + "\n"), "metrics.jsonl line 1 is not a JSON"),
        (lambda run: replace_by(run / "metrics.jsonl", "/dev/zero"), "metrics.jsonl is unreadable (not a regular file"),
        (lambda run: replace_by(run / "metrics.jsonl", "fifo"), "metrics.jsonl is unreadable (not a regular file"),
    ], ids=["nested", "/dev/zero", "fifo"])
    def test_a_hostile_metrics_file_is_one_line_naming_it(self, edit, match, finished, npz, capsys, no_hang):
        out = finished.parents[1]
        edit(finished)
        err = one_line([*cli(out, npz, "--epochs", "1"), "--resume"], capsys, match)
        assert "delete the file" in err
        with pytest.raises(RunError, match=match.replace("(", r"\(")):
            load_runs(out)


# ----------------------------------------------------------------------------- metrics.jsonl in a run folder
@pytest.mark.usefixtures("one_thread")
def test_metrics_lines_that_do_not_parse_are_named_and_a_killed_epochs_partial_line_is_dropped(arrays, tmp_path):
    cfg = TrainConfig(**{**TINY, "epochs": 2}, schedule="step")
    run = tmp_path / "step" / "seed0"
    train_run(cfg, run, arrays, progress=False, stop_after=1)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 2, "step": 12, "train_lo')  # the partial write of a killed epoch
    (r,) = load_runs(tmp_path)
    assert list(r["metrics"]["epoch"]) == [1]
    assert train_run(cfg, run, arrays, progress=False, resume=True).epochs_done == 2
    assert [row["epoch"] for row in read_metrics(run)] == [1, 2]
    good = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(good[:len(good) - 30])  # a finished run's metrics cut mid-line
    with pytest.raises(RunError, match="metrics.jsonl line 2 is not a JSON object .*delete the file and rerun with "
                                       "--resume"):
        load_runs(tmp_path)
    (run / "metrics.jsonl").unlink()  # as the message says: rewritten from the checkpoint
    assert train_run(cfg, run, arrays, progress=False, resume=True).message == "already finished"
    assert (run / "metrics.jsonl").read_text() == good
    (run / "manifest.json").write_text("null")
    with pytest.raises(RunError, match="manifest.json is not a JSON object"):
        load_runs(tmp_path)
