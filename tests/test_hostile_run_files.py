"""Run folders and flags a hostile or careless user can hand the engine: links where files or folders should be,
files that are not regular files, hand-edited manifests and metrics, a path too long for the file system, a disk
already full when the lock is taken, and interrupts before any run started.  Each is one line naming the file or
flag (exit code 2, or 6 for a full disk), and nothing outside the engine's own files is written or deleted.

PreResNet8 on 192 generated images (:mod:`cifar10_helpers`): seconds per run on a CPU.
"""
import errno
import json
import os
import signal

import pytest

from explr.cifar10 import files, image_folder
from explr.cifar10.__main__ import main
from explr.cifar10.config import TrainConfig
from explr.cifar10.sources import make_synthetic
from explr.cifar10.image_folder import write_image_folder
from explr.cifar10.lock import RunError, RunLock, exit_code, handle_signals
from explr.cifar10.runfolder import load_runs
from explr.cifar10.runs import train_run

from cifar10_helpers import CLI_TINY, TINY, deadline, tiny_arrays, tiny_npz

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


def one_line(argv, capsys, match, code=2):
    """``main(argv)`` ends with ``code`` and one line on stderr holding ``match``; returns that line."""
    with pytest.raises(SystemExit) as exc:
        rc = main(argv)
        raise SystemExit(rc)
    err = capsys.readouterr().err
    assert exc.value.code == code, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert match in err, err
    return err


def cli(out, npz, *extra):
    return ["--schedule", "step", "--data", npz, "--out", str(out), *CLI_TINY, *extra]


def tree_of(folder):
    """Every path under ``folder`` (links not followed)."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


# ----------------------------------------------------------------------------- links
def test_a_lock_that_is_a_symlink_is_refused_and_its_target_left_alone(npz, tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    run = tmp_path / "out" / "step" / "seed0"
    run.mkdir(parents=True)
    (run / ".lock").symlink_to(victim)
    one_line(cli(tmp_path / "out", npz), capsys, f"{run / '.lock'} is a symbolic link")
    with pytest.raises(RunError, match=r"\.lock is a symbolic link"):  # linked after the checks: still refused
        RunLock(run).__enter__()
    assert victim.read_text() == "precious\n" and tree_of(run) == [".lock"]


def test_a_symlinked_run_folder_is_refused_and_nothing_in_its_target_is_deleted(npz, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".notes.tmp").write_text("mine")
    (tmp_path / "out" / "step").mkdir(parents=True)
    (tmp_path / "out" / "step" / "seed0").symlink_to(elsewhere, target_is_directory=True)
    one_line(cli(tmp_path / "out", npz), capsys, f"{tmp_path / 'out' / 'step' / 'seed0'} is a symbolic link")
    assert tree_of(elsewhere) == [".notes.tmp"]


def test_only_the_engines_own_temporary_files_are_removed(arrays, tmp_path):
    cfg = TrainConfig(**{**TINY, "epochs": 2}, schedule="step")
    train_run(cfg, tmp_path, arrays, progress=False, stop_after=1)
    leftover = tmp_path / f".checkpoint.pt.{os.getpid() + 1}.k2j4m7xa.tmp"  # the name form before the host
    leftover.write_bytes(b"half a checkpoint")
    users = [".notes.tmp", ".checkpoint.pt.tmp", ".a.12.short.tmp", ".a.x1.k2j4m7xa.tmp", ".a.12.K2J4M7XA.tmp"]
    for name in users:
        (tmp_path / name).write_text("mine")
    assert train_run(cfg, tmp_path, arrays, progress=False, resume=True).epochs_done == 2
    assert not leftover.exists() and all((tmp_path / name).read_text() == "mine" for name in users)
    assert files.remove_leftovers(tmp_path) == []


# ----------------------------------------------------------------------------- paths and a full disk
def test_an_out_path_component_too_long_is_one_line_naming_out(npz, arrays, tmp_path, capsys):
    out = tmp_path / ("a" * 300) / "runs"
    one_line(cli(out, npz), capsys, "--out")
    with pytest.raises(RunError, match="--out: .*File name too long"):
        train_run(TrainConfig(**TINY, schedule="step"), out / "step" / "seed0", arrays, progress=False)
    assert tree_of(tmp_path) == []


def test_a_disk_full_when_the_pid_is_written_is_one_line_exit_6_and_leaves_nothing(npz, tmp_path, capsys,
                                                                                    monkeypatch):
    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    out = tmp_path / "out"
    one_line(cli(out, npz), capsys, f"disk full while writing {out / 'step' / 'seed0' / '.lock'}", code=6)
    assert tree_of(tmp_path) == []
    out.mkdir()  # an existing --out stays, and so does an existing run folder's own content
    one_line(cli(out, npz), capsys, "disk full", code=6)
    assert tree_of(tmp_path) == ["out"]


# ----------------------------------------------------------------------------- hand-edited run files
@pytest.fixture()
def unfinished(npz, tmp_path):
    """A run of 2 epochs stopped after the first (its manifest is read again by --resume)."""
    run = tmp_path / "step" / "seed0"
    train_run(TrainConfig(**{**TINY, "epochs": 2}, schedule="step", data=npz), run, progress=False, stop_after=1)
    return run


@pytest.fixture()
def finished(npz, tmp_path):
    """A finished run of 1 epoch (its metrics are read by --resume)."""
    run = tmp_path / "step" / "seed0"
    train_run(TrainConfig(**{**TINY, "epochs": 1}, schedule="step", data=npz), run, progress=False)
    return run


def deeply_nested(depth=200_000):
    return "[" * depth + "]" * depth


def edit_manifest(run, **changes):
    manifest = json.loads((run / "manifest.json").read_text())
    manifest.update(changes)
    (run / "manifest.json").write_text(json.dumps(manifest))


def replace_by(path, what):
    path.unlink()
    if what == "/dev/zero":
        path.symlink_to("/dev/zero")
    else:
        os.mkfifo(path)


@pytest.fixture()
def no_hang():
    """Fail (instead of hanging) if the test blocks for 60 s, as opening a FIFO for reading does."""
    with deadline(60):
        yield


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
def test_a_hostile_manifest_is_one_line_naming_it(edit, match, unfinished, npz, capsys, no_hang):
    out = unfinished.parents[1]
    edit(unfinished)
    err = one_line([*cli(out, npz, "--epochs", "2"), "--resume"], capsys, match)
    assert str(unfinished / "manifest.json") in err and "delete" in err
    with pytest.raises(RunError, match=r"manifest\.json") as raised:
        load_runs(out)
    assert "\n" not in str(raised.value)


def test_a_bogus_status_of_a_finished_run_is_one_line_naming_it_before_the_other_runs_train(finished, npz, capsys):
    """Issue 41 item 16: it was noticed after the other runs trained, as an exit 2 naming no file."""
    out = finished.parents[1]
    edit_manifest(finished, status="bogus")
    err = one_line([*cli(out, npz, "--epochs", "1", "--seed", "0", "1"), "--resume"], capsys, "'bogus'")
    assert str(finished / "manifest.json") in err, err
    assert not (out / "step" / "seed1").exists()


@pytest.mark.parametrize("edit, match", [
    (lambda run: (run / "metrics.jsonl").write_text(deeply_nested() + "\n"), "metrics.jsonl line 1 is not a JSON"),
    (lambda run: replace_by(run / "metrics.jsonl", "/dev/zero"), "metrics.jsonl is unreadable (not a regular file"),
    (lambda run: replace_by(run / "metrics.jsonl", "fifo"), "metrics.jsonl is unreadable (not a regular file"),
], ids=["nested", "/dev/zero", "fifo"])
def test_a_hostile_metrics_file_is_one_line_naming_it(edit, match, finished, npz, capsys, no_hang):
    out = finished.parents[1]
    edit(finished)
    err = one_line([*cli(out, npz, "--epochs", "1"), "--resume"], capsys, match)
    assert "delete the file" in err
    with pytest.raises(RunError, match=match.replace("(", r"\(")):
        load_runs(out)


def test_a_manifest_larger_than_any_the_engine_writes_is_refused_unread(unfinished, npz, capsys, monkeypatch):
    with open(unfinished / "manifest.json", "ab") as f:
        f.truncate(1 << 40)  # sparse: a terabyte that takes no space
    one_line([*cli(unfinished.parents[1], npz, "--epochs", "2"), "--resume"], capsys, "manifest.json is unreadable "
             "(larger than")


def test_load_runs_refuses_a_config_whose_schedule_or_seed_is_not_what_the_engine_writes(finished):
    edit_manifest(finished, config={"schedule": ["step"], "seed": 0})
    with pytest.raises(RunError, match="manifest.json has no config with schedule and seed"):
        load_runs(finished.parents[1])


# ----------------------------------------------------------------------------- messages
def test_a_stale_lock_note_does_not_call_a_live_process_dead(unfinished, npz, capsys):
    (unfinished / ".lock").write_text("1\n")  # pid 1 is alive, but does not hold the lock
    assert main([*cli(unfinished.parents[1], npz, "--epochs", "2"), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "no longer running" not in err, err
    assert f"{unfinished}: stale lock: {unfinished / '.lock'} names process 1, which does not hold it" in err, err


def test_an_interrupt_while_decoding_says_no_run_started(tmp_path, capsys, monkeypatch):
    tree = write_image_folder(tmp_path / "tree", make_synthetic(n_train=40, n_test=20, seed=3))

    def interrupted(*args):
        raise KeyboardInterrupt()

    monkeypatch.setattr(image_folder, "_decode_tree", interrupted)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))  # the decode cache's key, not in ~/.cache
    argv = ["--schedule", "step", "--data", str(tree), "--data-root", str(tmp_path / "root"), "--out",
            str(tmp_path / "out"), *CLI_TINY]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "last checkpoints" not in err and "interrupted before any run started" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129),
                                       (signal.SIGUSR2, 140)])
def test_sighup_and_sigusr2_interrupt_like_sigterm(sig, code):
    before = signal.getsignal(sig)
    with pytest.raises(KeyboardInterrupt) as raised:
        with handle_signals():
            os.kill(os.getpid(), sig)
    assert exit_code(raised.value) == code and signal.getsignal(sig) == before
