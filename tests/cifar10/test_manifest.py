"""explr.cifar10.manifest: the manifest's schema and its rules, written, read and refused, and the checkpoint it
recorded."""
import json

import pytest
import torch

from explr.cifar10.checkpoint import CHECKPOINT, CHECKPOINT_KEYS, FORMAT, serialize_checkpoint
from explr.cifar10.lock import RunError
from explr.cifar10.manifest import (MANIFEST, MANIFEST_FIELDS, Manifest, checkpoint_of, new_manifest, read_manifest,
                                    record_end, record_epoch, write_manifest)
from explr.cifar10.metrics import FINAL_KEYS
from explr.cifar10.runfolder import load_runs
from explr.cifar10.status import RECORDED, Status

from cifar10_helpers import cli, deeply_nested, edit_manifest, one_line, replace_by, tiny_arrays, tiny_npz

arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


@pytest.fixture
def manifest():
    return new_manifest({}, {"schedule": "step", "seed": 0}, {"device": "cpu"}, torch.device("cpu"), "cpu",
                        {"name": "tiny", "kind": "synthetic", "sha256": "ab"}, 0, 0.0)


def test_a_new_manifest_holds_only_declared_fields_and_the_read_ones_are_declared(manifest):
    assert set(MANIFEST_FIELDS) <= set(Manifest.__annotations__)
    assert set(manifest) <= set(Manifest.__annotations__)
    assert manifest["format"] == FORMAT and manifest["status"] == Status.RUNNING and manifest["devices"] == ["cpu"]
    again = new_manifest(manifest, manifest["config"], {}, torch.device("cpu"), "cpu", {}, 2, 1.0)
    assert again["devices"] == ["cpu"] and again["started"] == manifest["started"] and again["epochs_done"] == 2


def test_a_written_manifest_reads_back_the_same(manifest, tmp_path):
    write_manifest(tmp_path / MANIFEST, manifest)
    assert read_manifest(tmp_path / MANIFEST) == json.loads(json.dumps(manifest))


def test_an_epoch_and_the_end_are_recorded(manifest, tmp_path):
    path = tmp_path / MANIFEST
    record_epoch(path, manifest, "d1", 1, 2.5)
    assert read_manifest(path)["checkpoint_sha256"] == "d1" and read_manifest(path)["epochs_done"] == 1
    last = {k: 0.5 for k in ("step", "lr", *FINAL_KEYS)} | {"epoch": 1}
    record_end(path, manifest, Status.DISK_FULL, "disk full", 2.5, [last])
    saved = read_manifest(path)
    assert saved["status"] == Status.DISK_FULL and saved["final"] == {k: last[k] for k in FINAL_KEYS}


@pytest.mark.parametrize("changes, match", [
    ({"status": 3}, "status is an integer, expected a string"),
    ({"status": "finished-ish"}, f"status is 'finished-ish', not one of {', '.join(RECORDED)}"),
    ({"devices": ["cpu", 1]}, "devices holds an integer, expected a list of strings"),
    ({"epochs_done": "2"}, "epochs_done is a string, expected an integer"),
    ({"epochs_done": 2.0}, "epochs_done is a number, expected an integer"),
    ({"config": []}, "config is a list, expected an object"),
    ({"checkpoint_sha256": 7}, "checkpoint_sha256 is an integer, expected a string or null"),
])
def test_a_field_of_another_type_is_one_line_naming_the_file(changes, match, manifest, tmp_path):
    write_manifest(tmp_path / MANIFEST, {**manifest, **changes})
    with pytest.raises(RunError, match=match) as err:
        read_manifest(tmp_path / MANIFEST)
    assert "\n" not in str(err.value) and f"delete the folder {tmp_path}" in str(err.value)


@pytest.mark.parametrize("text, match", [("[1, 2]", "is not a JSON object .it holds a list"),
                                         ("{", "is unreadable"), ("[" * 100_000, "nested too deeply")])
def test_a_file_that_is_no_manifest_is_one_line(text, match, tmp_path):
    (tmp_path / MANIFEST).write_text(text)
    (tmp_path / CHECKPOINT).write_bytes(b"")  # then the remedy is to delete the manifest only
    with pytest.raises(RunError, match=match) as err:
        read_manifest(tmp_path / MANIFEST)
    assert "\n" not in str(err.value) and f"--resume rebuilds it from {CHECKPOINT}" in str(err.value)


def test_the_checkpoint_must_be_the_one_the_manifest_recorded(manifest, tmp_path):
    state = {k: {} for k in CHECKPOINT_KEYS} | {"epoch": 1, "metrics": [], "data_sha256": "ab"}
    data, digest = serialize_checkpoint(state)
    (tmp_path / CHECKPOINT).write_bytes(data)
    assert checkpoint_of(tmp_path, {})["epoch"] == 1  # nothing recorded: nothing to compare
    assert checkpoint_of(tmp_path, {**manifest, "checkpoint_sha256": "old", "checkpoint_sha256_writing": digest})
    with pytest.raises(RunError, match=f"is not the file {tmp_path / MANIFEST} recorded .its sha256 differs"):
        checkpoint_of(tmp_path, {**manifest, "checkpoint_sha256": "0" * 64})


# ----------------------------------------------------------------------------- hostile run files
@pytest.mark.usefixtures("one_thread")
class TestHostileRunFiles:
    """Run folders and flags a hostile or careless user can hand the engine: each is one line naming the file or
    flag (exit code 2, or 6 for a full disk), and nothing outside the engine's own files is written or deleted."""

    @pytest.mark.parametrize("edit, match", [
        (lambda run: (run / "manifest.json").write_text(deeply_nested()), "manifest.json is unreadable (nested"),
        (lambda run: edit_manifest(run, checkpoint_sha256=[1]), "checkpoint_sha256 is a list, expected a string or null"),
        (lambda run: edit_manifest(run, checkpoint_sha256_writing={}), "checkpoint_sha256_writing is an object, expected"),
        (lambda run: edit_manifest(run, devices=5), "manifest.json: devices is an integer, expected a list of strings"),
        (lambda run: edit_manifest(run, devices=["cpu", 5]), "devices holds an integer, expected a list of strings"),
        (lambda run: edit_manifest(run, status=["running"]), "manifest.json: status is a list, expected a string"),
        (lambda run: edit_manifest(run, status="bogus"), "manifest.json: status is 'bogus', not one of running, "),
        (lambda run: edit_manifest(run, resolved=[]), "manifest.json: resolved is a list, expected an object"),
        (lambda run: replace_by(run / "manifest.json", "/dev/zero"), "manifest.json is unreadable (not a regular file"),
        (lambda run: replace_by(run / "manifest.json", "fifo"), "manifest.json is unreadable (not a regular file"),
    ], ids=["nested", "sha list", "sha writing dict", "devices 5", "devices [cpu, 5]", "status list", "status bogus",
            "resolved list",
            "/dev/zero", "fifo"])
    def test_a_hostile_manifest_is_one_line_naming_it(self, edit, match, unfinished, npz, capsys, no_hang):
        out = unfinished.parents[1]
        edit(unfinished)
        err = one_line([*cli(out, npz, "--epochs", "2"), "--resume"], capsys, match)
        assert str(unfinished / "manifest.json") in err and "delete" in err
        with pytest.raises(RunError, match=r"manifest\.json") as raised:
            load_runs(out)
        assert "\n" not in str(raised.value)

    def test_a_manifest_larger_than_any_the_engine_writes_is_refused_unread(self, unfinished, npz, capsys, monkeypatch):
        with open(unfinished / "manifest.json", "ab") as f:
            f.truncate(1 << 40)  # sparse: a terabyte that takes no space
        one_line([*cli(unfinished.parents[1], npz, "--epochs", "2"), "--resume"], capsys, "manifest.json is unreadable "
                 "(larger than")
