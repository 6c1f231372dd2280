"""explr.cifar10.runfolder: where a run lives, the runs under a folder (load_runs), and every check made before a
run folder is used: links, a file where a folder goes, a path too long, damaged or hand-edited run files, a stale
lock, a resume with other settings or other data.

PreResNet8 on 192 generated images (:mod:`cifar10_helpers`): seconds per run on a CPU."""
import os
import struct
import zipfile

import pytest
import torch

from explr.cifar10.__main__ import main
from explr.cifar10.arrays import CifarArrays, write_npz
from explr.cifar10.config import TrainConfig
from explr.cifar10.lock import RunError
from explr.cifar10.runfolder import load_runs
from explr.cifar10.runs import train_run

from cifar10_helpers import (CLI_TINY, TINY, cli, edit_checkpoint, edit_manifest, fails_in_one_line, one_line, snapshot,
                             tiny_arrays, tiny_npz, tree_of)

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


# ----------------------------------------------------------------------------- hostile run files
class TestHostileRunFiles:
    """Run folders and flags a hostile or careless user can hand the engine: each is one line naming the file or
    flag (exit code 2, or 6 for a full disk), and nothing outside the engine's own files is written or deleted."""

    def test_a_symlinked_run_folder_is_refused_and_nothing_in_its_target_is_deleted(self, npz, tmp_path, capsys):
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / ".notes.tmp").write_text("mine")
        (tmp_path / "out" / "step").mkdir(parents=True)
        (tmp_path / "out" / "step" / "seed0").symlink_to(elsewhere, target_is_directory=True)
        one_line(cli(tmp_path / "out", npz), capsys, f"{tmp_path / 'out' / 'step' / 'seed0'} is a symbolic link")
        assert tree_of(elsewhere) == [".notes.tmp"]

    def test_an_out_path_component_too_long_is_one_line_naming_out(self, npz, arrays, tmp_path, capsys):
        out = tmp_path / ("a" * 300) / "runs"
        one_line(cli(out, npz), capsys, "--out")
        with pytest.raises(RunError, match="--out: .*File name too long"):
            train_run(TrainConfig(**TINY, schedule="step"), out / "step" / "seed0", arrays, progress=False)
        assert tree_of(tmp_path) == []

    def test_load_runs_refuses_a_config_whose_schedule_or_seed_is_not_what_the_engine_writes(self, finished):
        edit_manifest(finished, config={"schedule": ["step"], "seed": 0})
        with pytest.raises(RunError, match="manifest.json has no config with schedule and seed"):
            load_runs(finished.parents[1])

    def test_a_stale_lock_note_does_not_call_a_live_process_dead(self, unfinished, npz, capsys):
        (unfinished / ".lock").write_text("1\n")  # pid 1 is alive, but does not hold the lock
        assert main([*cli(unfinished.parents[1], npz, "--epochs", "2"), "--resume"]) == 0
        err = capsys.readouterr().err
        assert "no longer running" not in err, err
        assert f"{unfinished}: stale lock: {unfinished / '.lock'} names process 1, which does not hold it" in err, err


# ----------------------------------------------------------------------------- the output folder
def test_output_folder_that_is_a_file_or_unwritable(npz, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    fails_in_one_line(["--data", npz, "--out", str(tmp_path / "afile"), *CLI_TINY], capsys, "is a file")
    fails_in_one_line(["--data", npz, "--out", str(tmp_path / "afile" / "deeper"), *CLI_TINY], capsys, "is a file")
    fails_in_one_line(["--data", npz, "--out", "/proc/explr-runs", *CLI_TINY], capsys, "cannot create folders")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "texp").write_text("x")  # a run's schedule folder is a file: checked before any run starts
    for jobs in ("1", "2"):
        fails_in_one_line(["--data", npz, "--out", str(tmp_path / "out"), *CLI_TINY, "--schedule", "step", "texp",
                           "--jobs", jobs], capsys, f"{tmp_path / 'out' / 'texp'} is a file, not a folder")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["afile", "out", "texp"]


# ----------------------------------------------------------------------------- damaged files, resume checks
def flip_a_tensor_byte(path):
    """Flip one bit in the middle of the largest tensor's data (torch.load still reads the file)."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    name_length, extra_length = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    data[info.header_offset + 30 + name_length + extra_length + info.file_size // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _damage(run, damage):
    if damage == "empty checkpoint":
        (run / "checkpoint.pt").write_bytes(b"")
    elif damage == "garbage checkpoint":
        (run / "checkpoint.pt").write_bytes(os.urandom(300))
    elif damage == "foreign checkpoint":
        torch.save({"state_dict": {"w": torch.zeros(2)}}, run / "checkpoint.pt")
    elif damage == "truncated manifest":
        (run / "manifest.json").write_text((run / "manifest.json").read_text()[:40])
    elif damage == "manifest []":
        (run / "manifest.json").write_text("[]")
    elif damage == "flipped byte":
        flip_a_tensor_byte(run / "checkpoint.pt")
    elif damage == "wrong shapes":
        edit_checkpoint(run, lambda saved: saved["model"].update({"conv.weight": torch.zeros(4, 3, 3, 3)}))
    elif damage == "epoch -5":
        edit_checkpoint(run, lambda saved: saved.update(epoch=-5))
    elif damage == "epoch without its metrics":
        edit_checkpoint(run, lambda saved: saved.update(metrics=[]))
    elif damage == "lock is a folder":
        (run / ".lock").unlink()
        (run / ".lock").mkdir()
    elif damage == "metrics cut mid-line":
        (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text()[:60])


@pytest.mark.parametrize("damage, match", [
    ("empty checkpoint", "is not a readable checkpoint"),
    ("garbage checkpoint", "is not a readable checkpoint"),
    ("foreign checkpoint", "is not a checkpoint of this engine"),
    ("truncated manifest", "manifest.json is unreadable"),
    ("manifest []", "manifest.json is not a JSON object"),
    ("flipped byte", "checkpoint.pt is not the file"),
    ("wrong shapes", "checkpoint.pt does not fit this run's PreResNet8 (Error(s) in loading state_dict"),
    ("epoch -5", "checkpoint.pt records epoch -5 with 1 metrics rows"),
    ("epoch without its metrics", "checkpoint.pt records epoch 1 with 0 metrics rows"),
    ("lock is a folder", ".lock is not a file"),
    ("metrics cut mid-line", "metrics.jsonl line 1 is not a JSON object"),
])
def test_damaged_or_hand_edited_run_files_are_one_line_naming_the_file_and_what_to_delete(damage, match, npz,
                                                                                          tmp_path, capsys):
    args = ["--schedule", "step", "--data", npz, "--out", str(tmp_path), *CLI_TINY, "--epochs", "1"]
    assert main(args) == 0
    run = tmp_path / "step" / "seed0"
    _damage(run, damage)
    before = snapshot(run)
    err = fails_in_one_line([*args, "--resume"], capsys, match)
    assert "delete" in err
    assert snapshot(run) == before and (run / ".lock").exists()  # nothing written, a finished run stays finished


def test_resume_compares_resolved_values_and_checks_data_of_finished_runs(arrays, npz, tmp_path, capsys):
    args = ["--schedule", "step", "--data", npz, "--out", str(tmp_path), *CLI_TINY, "--epochs", "1"]
    assert main(args) == 0  # precision auto = fp32 on the CPU, 1 thread
    run = tmp_path / "step" / "seed0"
    before = snapshot(run)
    assert main([*args, "--resume", "--precision", "fp32"]) == 0  # auto meant fp32: the same run
    assert "already finished" not in capsys.readouterr().err
    fails_in_one_line([*args, "--resume", "--precision", "fp64"], capsys, "precision='fp32' (now 'fp64')")
    fails_in_one_line([*args, "--resume", "--threads", "2"], capsys, "threads=1 (now 2")
    other = CifarArrays(255 - arrays.x_train, arrays.y_train, arrays.x_test, arrays.y_test, source="o", kind="npz")
    write_npz(tmp_path / "other.npz", other)
    other_args = [a if a != npz else str(tmp_path / "other.npz") for a in args]
    fails_in_one_line([*other_args, "--resume"], capsys, "trained on other data")  # a finished run, too
    assert snapshot(run) == before


def test_a_resumed_run_counts_a_setting_its_checkpoint_lacks_as_that_settings_default(arrays, tmp_path):
    """A field added to TrainConfig later must not make every older checkpoint refuse to resume."""
    cfg = TrainConfig(**{**TINY, "epochs": 2}, schedule="step")
    train_run(cfg, tmp_path, arrays, progress=False, stop_after=1)
    edit_checkpoint(tmp_path, lambda saved: saved["config"].pop("corrections"))  # as if written before it existed
    assert train_run(cfg, tmp_path, arrays, progress=False, resume=True).epochs_done == 2
    with pytest.raises(RunError, match="other settings: corrections='all' \\(now 'none'\\)"):
        train_run(TrainConfig(**{**TINY, "epochs": 2}, schedule="step", corrections="none"), tmp_path, arrays,
                  resume=True, progress=False)
