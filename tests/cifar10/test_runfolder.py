"""explr.cifar10.runfolder: a run folder's files (checkpoint, metrics, manifest: written, read and refused), atomic
writes, the lock (one writer at a time), the signals that end a run, one vocabulary of statuses and exit codes, where
a run lives, load_runs and every check before a folder is used."""
import errno
import hashlib
import json
import math
import os
import re
import signal
import struct
import time
import zipfile

import numpy as np
import pytest
import torch

from explr.cifar10 import runfolder
from explr.cifar10.__main__ import main
from explr.cifar10.config import RESOLVED_KEYS, TrainConfig
from explr.cifar10.data import CifarArrays, make_synthetic
from explr.cifar10.runfolder import (
    CHECKPOINT, CHECKPOINT_KEYS, FINAL_KEYS, FORMAT, MANIFEST, TIMING_KEYS, DiskFull, RunError, RunLock,
    RunLocked, RunState, Status, Terminated, checkpoint_of, checkpoint_state, exit_code,
    handle_signals, load_runs, new_manifest, read_manifest, read_metrics, record_end,
    serialize_checkpoint, write_manifest, write_metrics,
)
from explr.cifar10.runs import train_run

from cifar10_helpers import (
    CLI_TINY, EPOCH_KEYS, TINY, cli, deeply_nested, edit_checkpoint, fails_in_one_line, one_line,
    replace_by, snapshot, tiny_arrays, tiny_npz, tree_of, write_npz,
)

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


# ----------------------------------------------------------------------------- hostile run files
class TestHostileRunFolders:
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
    ("lock is a folder", ".lock is a symbolic link or a folder"),
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
    fails_in_one_line([*args, "--resume", "--precision", "fp64"], capsys, "precision='fp32' (now 'fp64'")
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


#: the fields of the run files (docs/cifar10-engine.md, "A run folder")
CHECKPOINT_FIELDS = ("model", "optimizer", "scheduler", "initial_loss", "epoch", "metrics", "config", "resolved",
                     "data_sha256", "elapsed", "format")
MANIFEST_FIELDS = ("format", "status", "message", "config", "resolved", "devices", "data", "environment", "started",
                   "updated", "epochs_done", "elapsed_seconds", "checkpoint_sha256", "checkpoint_sha256_writing",
                   "final")
CONFIG = TrainConfig(**{**TINY, "epochs": 2}).validate()


@pytest.fixture(scope="module")
def run(arrays, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    train_run(CONFIG, out, arrays, progress=False)
    return out


@pytest.fixture
def saved(run):
    return checkpoint_of(run, {})


def test_a_written_checkpoint_holds_the_declared_fields_and_its_sha256(run, saved):
    assert set(saved) == set(CHECKPOINT_FIELDS) and set(CHECKPOINT_KEYS) <= set(saved)
    assert saved["format"] == FORMAT and saved["epoch"] == 2 and len(saved["metrics"]) == 2
    assert set(saved["resolved"]) == set(RESOLVED_KEYS)
    recorded = json.loads((run / MANIFEST).read_text())["checkpoint_sha256"]
    assert recorded == hashlib.sha256((run / CHECKPOINT).read_bytes()).hexdigest()


def test_the_state_serializes_to_what_loads_back(saved):
    resolved = {**saved["resolved"], "not recorded": 1}
    trainer_state = {k: saved[k] for k in ("model", "optimizer", "scheduler", "initial_loss")}
    state = checkpoint_state(trainer_state, 2, saved["metrics"], saved["config"], resolved, saved["data_sha256"],
                             saved["elapsed"])
    assert list(state) == list(saved) and state["resolved"] == saved["resolved"]
    data, digest = serialize_checkpoint(state)
    assert digest == hashlib.sha256(data).hexdigest() and serialize_checkpoint(state)[1] == digest


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
        checkpoint_of(tmp_path, {})
    assert "\n" not in str(err.value) and f"delete the folder {tmp_path}" in str(err.value)


@pytest.fixture
def manifest():
    return new_manifest({}, {"schedule": "step", "seed": 0}, {"device": "cpu"}, torch.device("cpu"),
                        {"name": "tiny", "kind": "synthetic", "sha256": "ab"}, 0, 0.0)


def test_a_new_manifest_holds_only_declared_fields_and_the_read_ones_are_declared(manifest):
    assert set(manifest) <= set(MANIFEST_FIELDS)
    assert manifest["format"] == FORMAT and manifest["status"] == Status.RUNNING
    assert len(manifest["devices"]) == 1 and manifest["devices"][0].startswith("cpu (")
    again = new_manifest(manifest, manifest["config"], {}, torch.device("cpu"), {}, 2, 1.0)
    assert again["devices"] == manifest["devices"] and again["started"] == manifest["started"]
    assert again["epochs_done"] == 2


def test_a_written_manifest_reads_back_the_same(manifest, tmp_path):
    write_manifest(tmp_path / MANIFEST, manifest)
    assert read_manifest(tmp_path / MANIFEST) == json.loads(json.dumps(manifest))


def test_an_epoch_and_the_end_are_recorded(manifest, tmp_path):
    path = tmp_path / MANIFEST
    write_manifest(path, manifest, checkpoint_sha256="d1", epochs_done=1)
    assert read_manifest(path)["checkpoint_sha256"] == "d1" and read_manifest(path)["epochs_done"] == 1
    last = {k: 0.5 for k in ("step", "lr", *FINAL_KEYS)} | {"epoch": 1}
    record_end(path, manifest, Status.DISK_FULL, "disk full", 2.5, [last])
    saved = read_manifest(path)
    assert saved["status"] == Status.DISK_FULL and saved["final"] == {k: last[k] for k in FINAL_KEYS}


@pytest.mark.parametrize("text, match", [("[1, 2]", "is not a JSON object .it holds a list"),
                                         ("{", "is unreadable"), ("[" * 100_000, "is unreadable .maximum recursion")])
def test_a_file_that_is_no_manifest_is_one_line(text, match, tmp_path):
    (tmp_path / MANIFEST).write_text(text)
    with pytest.raises(RunError, match=match) as err:
        read_manifest(tmp_path / MANIFEST)
    assert "\n" not in str(err.value) and "delete it: --resume rebuilds it" in str(err.value)


def test_the_checkpoint_must_be_the_one_the_manifest_recorded(manifest, tmp_path):
    state = {k: {} for k in CHECKPOINT_KEYS} | {"epoch": 1, "metrics": [], "data_sha256": "ab"}
    data, digest = serialize_checkpoint(state)
    (tmp_path / CHECKPOINT).write_bytes(data)
    assert checkpoint_of(tmp_path, {})["epoch"] == 1  # nothing recorded: nothing to compare
    assert checkpoint_of(tmp_path, {**manifest, "checkpoint_sha256": "old", "checkpoint_sha256_writing": digest})
    with pytest.raises(RunError, match=f"is not the file {tmp_path / MANIFEST} recorded .its sha256 differs"):
        checkpoint_of(tmp_path, {**manifest, "checkpoint_sha256": "0" * 64})


# ----------------------------------------------------------------------------- hostile run files
@pytest.mark.parametrize("kind", ["nested", "/dev/zero", "fifo"])
@pytest.mark.parametrize("name, state, epochs, remedy", [("manifest.json", "unfinished", "2", "delete"),
                                                         ("metrics.jsonl", "finished", "1", "delete the file")])
def test_a_hostile_run_file_is_one_line_naming_it_and_what_to_delete(name, state, epochs, remedy, kind, request, npz,
                                                                      capsys, no_hang):
    """A run file nested too deeply to parse, or replaced by /dev/zero or a FIFO: one line, exit 2, no hang; load_runs
    refuses it in one line too."""
    run = request.getfixturevalue(state)
    out, path = run.parents[1], run / name
    if kind == "nested":
        path.write_text(deeply_nested() + "\n")
        match = f"{name} line 1 is not a JSON" if name == "metrics.jsonl" else f"{name} is unreadable (maximum"
    else:
        replace_by(path, kind)
        match = f"{name} is unreadable (not a regular file"
    err = one_line([*cli(out, npz, "--epochs", epochs), "--resume"], capsys, match)
    assert str(path) in err and remedy in err
    with pytest.raises(RunError, match=re.escape(match)) as raised:
        load_runs(out)
    assert "\n" not in str(raised.value)


@pytest.mark.usefixtures("one_thread")
class TestDamagedManifest:
    """A manifest.json the engine never writes is one line naming it, exit code 2."""

    def test_a_manifest_larger_than_any_the_engine_writes_is_refused_unread(self, unfinished, npz, capsys, monkeypatch):
        with open(unfinished / "manifest.json", "ab") as f:
            f.truncate(1 << 40)  # sparse: a terabyte that takes no space
        one_line([*cli(unfinished.parents[1], npz, "--epochs", "2"), "--resume"], capsys, "manifest.json is unreadable "
                 "(larger than")


def row(epoch, **changes):
    """A row as the engine writes it (every key), with ``changes``."""
    values = {k: 0.5 for k in (*EPOCH_KEYS, *TIMING_KEYS)}
    values.update(epoch=epoch, step=6 * epoch, lr=None, log2_rescale=0, rescale_count=0)
    return {**values, **changes}


def test_the_timings_and_the_final_keys_are_keys_of_a_row():
    assert TIMING_KEYS == ("seconds", "train_seconds", "eval_seconds", "images_per_s")
    assert set(FINAL_KEYS) <= set(EPOCH_KEYS)


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


# ----------------------------------------------------------------------------- hostile input
@pytest.mark.usefixtures("one_thread")
class TestMetricsOfAFinishedRun:
    """A finished run's metrics.jsonl that differs from its checkpoint's rows is rewritten from the checkpoint."""

    def test_the_metrics_of_a_finished_run_are_rewritten_from_its_checkpoint(self, npz, arrays, tmp_path):
        """A duplicated line, or rows lost at the end (killed between the last checkpoint and its metrics): the
        resume rewrites the file from the checkpoint."""
        config = TrainConfig(**{**TINY, "epochs": 2}, schedule="step", data=npz)
        out = tmp_path / "out"
        run = out / "step" / "seed0"
        train_run(config, run, arrays, progress=False)
        argv = ["--data", npz, "--out", str(out), *CLI_TINY, "--epochs", "2", "--schedule", "step", "--resume"]
        lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
        for damaged in (lines + lines[-1:], lines[:1]):
            (run / "metrics.jsonl").write_text("".join(damaged))
            assert main(argv) == 0
            assert (run / "metrics.jsonl").read_text() == "".join(lines)
        np.testing.assert_array_equal(load_runs(out)[0]["metrics"]["epoch"], [1, 2])


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



# ----------------------------------------------------------------------------- hostile run files
@pytest.mark.usefixtures("one_thread")
class TestHostileFiles:
    """Run folders and flags a hostile or careless user can hand the engine: each is one line naming the file or
    flag (exit code 2, or 6 for a full disk), and nothing outside the engine's own files is written or deleted."""

    def test_only_the_engines_own_temporary_files_are_removed(self, arrays, tmp_path):
        cfg = TrainConfig(**{**TINY, "epochs": 2}, schedule="step")
        train_run(cfg, tmp_path, arrays, progress=False, stop_after=1)
        leftover = tmp_path / f".checkpoint.pt.{os.getpid() + 1}.k2j4m7xa.tmp"  # the name form before the host
        leftover.write_bytes(b"half a checkpoint")
        users = [".notes.tmp", ".checkpoint.pt.tmp", ".a.12.short.tmp", ".a.x1.k2j4m7xa.tmp", ".a.12.K2J4M7XA.tmp"]
        for name in users:
            (tmp_path / name).write_text("mine")
        assert train_run(cfg, tmp_path, arrays, progress=False, resume=True).epochs_done == 2
        assert not leftover.exists() and all((tmp_path / name).read_text() == "mine" for name in users)
        assert runfolder.remove_leftovers(tmp_path) == []


# ----------------------------------------------------------------------------- file modes
@pytest.mark.usefixtures("one_thread")
def test_run_files_and_the_data_cache_get_the_ordinary_file_mode(arrays, tmp_path, monkeypatch):
    from explr.cifar10.data import load_cifar10
    from cifar10_helpers import write_image_folder

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))  # the decode cache's key, not in ~/.cache
    old = os.umask(0o022)
    try:
        train_run(TrainConfig(**{**TINY, "epochs": 1}, schedule="step"), tmp_path / "run", arrays, progress=False)
        tree = write_image_folder(tmp_path / "tree", make_synthetic(n_train=20, n_test=10))
        load_cifar10(str(tree), root=tmp_path / "root", progress=False)
    finally:
        os.umask(old)
    files = [tmp_path / "run" / n for n in ("manifest.json", "metrics.jsonl", "checkpoint.pt")]
    files += list((tmp_path / "root" / "cache").glob("*.npz"))
    assert len(files) == 4
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o644, f


# ----------------------------------------------------------------------------- a folder several processes write
DEAD_PID = 999_999_999  # no such process here


def test_a_shared_folders_cleanup_takes_only_temp_files_untouched_for_an_hour(tmp_path):
    """Another process (on this host or another sharing the folder) may be writing a fresh temporary file: only
    those untouched for an hour go, whatever their pid says; a user's own ``.notes.tmp`` never."""
    cache = tmp_path / "cache"
    cache.mkdir()
    names = {
        "fresh, dead pid": f".image-folder-a.npz.{DEAD_PID}.k2j4m7xa.tmp",
        "fresh, live pid": f".image-folder-b.npz.{os.getpid()}.x8_qz3ab.tmp",
        "old, live pid": f".image-folder-c.npz.{os.getpid()}.t5y6u7i8.tmp",
        "old, a user's": ".notes.tmp",
    }
    for case, name in names.items():
        (cache / name).write_bytes(b"half a cache")
        if case.startswith("old"):
            os.utime(cache / name, (time.time() - 2 * 3600,) * 2)
    removed = runfolder.remove_leftovers(cache, 3600)
    assert removed == [names["old, live pid"]]
    assert len(runfolder.remove_leftovers(cache)) == 2, "a locked folder's cleanup takes every temporary file of ours"
    assert [p.name for p in cache.iterdir()] == [".notes.tmp"]


def test_atomic_write_names_its_temporary_file_with_its_pid(tmp_path):
    seen = []
    runfolder.atomic_write(tmp_path / "x.npz", lambda f: seen.extend(p.name for p in tmp_path.iterdir()))
    (name,) = seen
    match = runfolder.TMP_NAME.fullmatch(name)
    assert match and match["target"] == "x.npz" and int(match["pid"]) == os.getpid()


# ----------------------------------------------------------------------------- hostile locks
class TestHostileLocks:
    """Run folders and flags a hostile or careless user can hand the engine: each is one line naming the file or
    flag (exit code 2, or 6 for a full disk), and nothing outside the engine's own files is written or deleted."""

    def test_a_lock_that_is_a_symlink_is_refused_and_its_target_left_alone(self, npz, tmp_path, capsys):
        victim = tmp_path / "victim"
        victim.write_text("precious\n")
        run = tmp_path / "out" / "step" / "seed0"
        run.mkdir(parents=True)
        (run / ".lock").symlink_to(victim)
        one_line(cli(tmp_path / "out", npz), capsys, f"{run / '.lock'} is a symbolic link")
        with pytest.raises(RunError, match=r"\.lock is a symbolic link"):  # linked after the checks: still refused
            RunLock(run).__enter__()
        assert victim.read_text() == "precious\n" and tree_of(run) == [".lock"]

    def test_a_disk_full_when_the_pid_is_written_is_one_line_exit_6_and_the_same_command_then_trains(
            self, npz, tmp_path, capsys, monkeypatch):
        def full(*_):  # os.pwrite(fd, data, offset)
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "pwrite", full)
        run = tmp_path / "out" / "step" / "seed0"
        one_line(cli(tmp_path / "out", npz), capsys, f"disk full while writing {run / '.lock'}", code=6)
        assert tree_of(run) == [".lock"]  # the empty lock file, kept (unlinking it would let two writers in)
        monkeypatch.undo()
        assert main(cli(tmp_path / "out", npz)) == 0 and (run / "checkpoint.pt").exists()

    @pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129),
                                           (signal.SIGUSR2, 140)])
    def test_sighup_and_sigusr2_interrupt_like_sigterm(self, sig, code):
        before = signal.getsignal(sig)
        with pytest.raises(KeyboardInterrupt) as raised:
            with handle_signals():
                os.kill(os.getpid(), sig)
        assert exit_code(raised.value) == code and signal.getsignal(sig) == before


# ----------------------------------------------------------------------------- the lock and its errors
def test_a_second_writer_is_refused_and_never_touches_the_first_ones_runs(npz, tmp_path, capsys):
    args = ["--schedule", "step", "texp", "--data", npz, "--out", str(tmp_path), *CLI_TINY, "--epochs", "1"]
    assert main(args[:2] + args[3:]) == 0  # step finished
    finished = snapshot(tmp_path / "step")
    (tmp_path / "texp" / "seed0").mkdir(parents=True)
    with RunLock(tmp_path / "texp" / "seed0"):  # another writer is training texp
        err = fails_in_one_line([*args, "--resume"], capsys, f"is being trained by process {os.getpid()}")
        assert "texp" in err
        with pytest.raises(RunLocked):
            train_run(TrainConfig(**TINY, schedule="texp", data=npz), tmp_path / "texp" / "seed0", resume=True,
                      progress=False)
    assert snapshot(tmp_path / "step") == finished
    assert not (tmp_path / "texp" / "seed0" / "checkpoint.pt").exists()


def test_run_error_is_a_value_error_with_one_line():
    assert issubclass(RunError, ValueError) and issubclass(RunLocked, RunError)


def test_each_nonzero_exit_code_reads_back_as_its_status():
    coded = [s for s in Status if s.exit_code]
    assert {s.exit_code for s in coded} == {3, 4, 5, 6} and len(coded) == 4  # one status per code
    assert [Status.from_exit_code(s.exit_code) for s in coded] == coded
    assert Status.from_exit_code(0) is Status.FINISHED


@pytest.mark.parametrize("err, code", [(KeyboardInterrupt(), 130), (Terminated(signal.SIGTERM), 143),
                                       (Terminated(signal.SIGHUP), 129), (Terminated(signal.SIGUSR2), 140),
                                       (DiskFull("disk full while writing x"), 6)])
def test_the_exit_code_of_an_interrupt_or_a_full_disk_reads_back_as_its_status(err, code):
    """What a worker exits with (:func:`explr.cifar10.runfolder.exit_code`) is what the pool reads back."""
    assert exit_code(err) == code
    assert Status.from_exit_code(code) is (Status.DISK_FULL if isinstance(err, DiskFull) else Status.INTERRUPTED)


@pytest.mark.parametrize("code", [1, 2, 7, 127, 128, 128 + 300, -9, -15])
def test_any_other_exit_code_is_a_failed_worker(code):
    """1: an uncaught exception; -9: ``multiprocessing``'s code for a worker killed by SIGKILL; 128: no signal."""
    assert Status.from_exit_code(code) is Status.FAILED


def test_a_folder_state_is_no_status():
    assert RunState.FINISHED != Status.FINISHED and RunState.FINISHED != "finished"  # compared with members only
