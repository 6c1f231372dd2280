"""Run folders that are never lost or half-started: checks before start, lock, signals, resume, divergence, a full
disk, hand-edited and damaged files, modes.

PreResNet8 on 192 generated images, batch 32 (6 steps per epoch): seconds per run on a CPU.  The
signal tests run the CLI as a subprocess and interrupt it after its first epoch.
"""
import errno
import json
import os
import struct
import zipfile
from pathlib import Path
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from explr.cifar10 import files
from explr.cifar10.__main__ import main
from explr.cifar10.config import TrainConfig
from explr.cifar10.arrays import CifarArrays, write_npz
from explr.cifar10.sources import make_synthetic
from explr.cifar10.engine import TrainingDiverged
from explr.cifar10.lock import RunError, RunLock, RunLocked
from explr.cifar10.metrics import read_metrics
from explr.cifar10.runfolder import load_runs
from explr.cifar10.runs import train_run
from explr.cifar10.status import Status
from explr.models import PreResNet

from cifar10_helpers import CLI_TINY, TINY, alive, edit_checkpoint, reproducible, tiny_arrays, tiny_npz

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


def snapshot(folder):
    """{relative path: bytes} of every file under ``folder``."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def fails_in_one_line(argv, capsys, match):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert match in err, err
    return err


def flip_a_tensor_byte(path):
    """Flip one bit in the middle of the largest tensor's data (torch.load still reads the file)."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    name_length, extra_length = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    data[info.header_offset + 30 + name_length + extra_length + info.file_size // 2] ^= 0x10
    path.write_bytes(bytes(data))


# ----------------------------------------------------------------------------- validated before anything starts
def test_every_run_is_checked_before_the_first_starts(npz, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    base = ["--data", npz, "--out", str(out), *CLI_TINY]
    # texp cannot be built at lr 1, wd 0.01: step must not have trained first
    fails_in_one_line([*base, "--schedule", "step", "texp", "--lr", "1", "--wd", "0.01"], capsys, "schedule texp")
    fails_in_one_line([*base, "--schedule", "step", "texp", "--rescale-above", "0.05"], capsys, "--rescale-above")
    fails_in_one_line([*base, "--jobs", "2", "--seed", "0", "1", "--batch-size", "500"], capsys, "--batch-size")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    fails_in_one_line([*base, "--device", "cuda"], capsys, "CUDA is not available")
    assert not out.exists()


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


def test_truncated_npz_and_constant_images_are_refused_before_start(arrays, tmp_path, capsys):
    good = write_npz(tmp_path / "good.npz", arrays).read_bytes()
    (tmp_path / "cut.npz").write_bytes(good[: len(good) // 2])
    fails_in_one_line(["--data", str(tmp_path / "cut.npz"), "--out", str(tmp_path / "o"), *CLI_TINY], capsys,
                      "truncated or damaged")
    for value in (0, 77):
        flat = CifarArrays(np.full_like(arrays.x_train, value), arrays.y_train, arrays.x_test, arrays.y_test,
                           source="flat", kind="npz")
        write_npz(tmp_path / "flat.npz", flat)
        fails_in_one_line(["--data", str(tmp_path / "flat.npz"), "--out", str(tmp_path / "o"), *CLI_TINY], capsys,
                          "constant")  # the words are data.py's
    assert not (tmp_path / "o").exists()


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


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs, nothing records it."""


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_process_killed_around_a_checkpoint_write_leaves_a_run_that_resumes(when, arrays, tmp_path, monkeypatch):
    """The manifest records the new checkpoint's sha256 before it is written: either checkpoint is accepted."""
    real, calls = files.atomic_write, []

    def write(path, fn):
        if Path(path).name == "checkpoint.pt":
            calls.append(path)
            if len(calls) == 2 and when == "before":
                raise Killed()
            real(path, fn)
            if len(calls) == 2:
                raise Killed()
        else:
            real(path, fn)

    monkeypatch.setattr(files, "atomic_write", write)
    cfg = TrainConfig(**TINY, schedule="step")
    with pytest.raises(Killed):
        train_run(cfg, tmp_path, arrays, progress=False)
    monkeypatch.undo()
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["epoch"] == (1 if when == "before" else 2)
    assert train_run(cfg, tmp_path, arrays, progress=False, resume=True).epochs_done == 3


def full_disk(monkeypatch, name, nth, stays_full):
    """The ``nth`` write of ``name`` fails as torch's zip writer fails on a full disk; ``stays_full``: every later
    write fails too (else the space freed by the failed write lets the manifest through)."""
    real, counts, full = files.atomic_write, {}, []

    def write(path, fn):
        counts[Path(path).name] = counts.get(Path(path).name, 0) + 1
        if (Path(path).name == name and counts[name] == nth) or (full and stays_full):
            full.append(path)
            try:
                raise OSError(errno.ENOSPC, "No space left on device")
            except OSError as err:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 320 vs 0") from err
        real(path, fn)

    monkeypatch.setattr(files, "atomic_write", write)


@pytest.mark.parametrize("name, nth, stays_full, kept", [  # metrics.jsonl and manifest.json are written at the
    ("checkpoint.pt", 2, False, 1), ("metrics.jsonl", 3, False, 2),  # start, the manifest twice per epoch
    ("manifest.json", 3, False, 1), ("checkpoint.pt", 2, True, 1)])
def test_a_full_disk_is_one_line_exit_6_and_the_run_resumes_once_there_is_space(name, nth, stays_full, kept, npz,
                                                                                 tmp_path, capsys, monkeypatch):
    args = ["--schedule", "step", "--data", npz, "--out", str(tmp_path), *CLI_TINY]
    run = tmp_path / "step" / "seed0"
    full_disk(monkeypatch, name, nth, stays_full)
    assert main(args) == 6
    err = capsys.readouterr().err
    assert err.strip() == (f"disk full while writing {run / name}; the checkpoint of epoch {kept} is intact; free "
                           "space and rerun with --resume"), err
    manifest = json.loads((run / "manifest.json").read_text())  # "interrupted" on main f49cb6e
    assert manifest["status"] == (Status.RUNNING if stays_full else Status.DISK_FULL), manifest
    assert stays_full or manifest["message"] == err.strip()
    assert torch.load(run / "checkpoint.pt", weights_only=True)["epoch"] == kept
    monkeypatch.undo()
    assert main([*args, "--resume"]) == 0
    assert [r["epoch"] for r in read_metrics(run)] == [1, 2, 3]


# ----------------------------------------------------------------------------- the lock
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


def test_a_stale_lock_of_a_dead_process_is_reported_and_the_run_resumes(arrays, tmp_path, capsys):
    cfg = TrainConfig(**TINY, schedule="step")
    train_run(cfg, tmp_path, arrays, progress=False, stop_after=1)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".lock").write_text(f"{dead.pid}\n")
    (tmp_path / f".checkpoint.pt.{dead.pid}.abc123de.tmp").write_bytes(b"half a checkpoint")  # a write killed midway
    r = train_run(cfg, tmp_path, arrays, progress=False, resume=True)
    assert r.status == "finished" and r.epochs_done == 3
    assert f"stale lock of process {dead.pid}" in capsys.readouterr().err
    assert not list(tmp_path.glob(".*.tmp"))
    assert (tmp_path / ".lock").read_text() == ""  # released cleanly


# ----------------------------------------------------------------------------- signals
def _cli(tmp_path, npz, *extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "explr.cifar10", "--schedule", "texp", "--data", npz, "--out", str(tmp_path),
           *CLI_TINY, "--epochs", "40", "--wd", "5e-3", "--rescale-above", "0.102", *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_epochs(run, n, proc, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if (run / "metrics.jsonl").exists() and len(read_metrics(run)) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("no epoch finished in time")


@pytest.mark.slow  # separate processes (spawn: each imports torch)
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129),
                                       (signal.SIGUSR2, 140)])  # a closed terminal; SLURM's preemption signal
def test_a_signal_records_interrupted_keeps_the_checkpoint_and_resume_continues_exactly(sig, code, arrays, npz,
                                                                                        tmp_path):
    run = tmp_path / "texp" / "seed0"
    proc = _cli(tmp_path, npz)
    _wait_for_epochs(run, 1, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and f"interrupted by {signal.Signals(sig).name} " in manifest["message"]
    done = torch.load(run / "checkpoint.pt", weights_only=True)["epoch"]
    assert done >= 1 and len(read_metrics(run)) == done
    # --resume to a shorter run is refused (epochs differ); the same settings continue exactly
    cfg = TrainConfig(**{**TINY, "epochs": 40}, schedule="texp", wd=5e-3, rescale_above=0.102, data=npz)
    resumed = train_run(cfg, run, arrays, resume=True, progress=False, stop_after=done + 1)
    full = train_run(cfg, tmp_path / "full", arrays, progress=False, stop_after=done + 1)
    assert reproducible(resumed.metrics) == reproducible(full.metrics)


@pytest.mark.slow  # separate processes (spawn: each imports torch)
def test_a_killed_run_reads_as_interrupted_and_resumes(npz, tmp_path):
    run = tmp_path / "texp" / "seed0"
    proc = _cli(tmp_path, npz)
    _wait_for_epochs(run, 1, proc)
    proc.kill()  # SIGKILL: nothing can be recorded
    proc.communicate()
    assert json.loads((run / "manifest.json").read_text())["status"] == "running"
    (r,) = load_runs(tmp_path)
    assert r["manifest"]["status"] == "interrupted" and "killed" in r["manifest"]["message"]
    done = torch.load(run / "checkpoint.pt", weights_only=True)["epoch"]
    cfg = TrainConfig(**{**TINY, "epochs": 40}, schedule="texp", wd=5e-3, rescale_above=0.102, data=npz)
    resumed = train_run(cfg, run, resume=True, progress=False, stop_after=done + 1)
    assert resumed.epochs_done == done + 1 and json.loads((run / "manifest.json").read_text())["status"] == "interrupted"


@pytest.mark.slow  # separate processes (spawn: each imports torch)
def test_jobs_workers_die_with_their_parent(npz, tmp_path):
    proc = _cli(tmp_path, npz, "--seed", "0", "1", "--jobs", "2")
    runs = [tmp_path / "texp" / f"seed{s}" for s in (0, 1)]
    for run in runs:
        _wait_for_epochs(run, 1, proc)
    workers = [int((run / ".lock").read_text()) for run in runs]
    assert proc.pid not in workers
    proc.kill()  # SIGKILL: the parent cannot forward anything
    proc.communicate()
    t0 = time.time()
    while time.time() - t0 < 30 and any(os.path.exists(f"/proc/{pid}") and alive(pid) for pid in workers):
        time.sleep(0.1)
    assert not any(alive(pid) for pid in workers)
    for run in runs:  # each worker recorded its interruption (SIGTERM from PR_SET_PDEATHSIG)
        assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"


# ----------------------------------------------------------------------------- divergence and file modes
class BreakAfter(PreResNet):
    """A PreResNet whose training logits are multiplied by ``factor`` from the 8th call on (epoch 2 of 6 steps):
    NaN, or 1e20 (a loss of ~1e20, finite in float32)."""

    calls, factor = 0, float("nan")

    def forward(self, x):
        out = super().forward(x)
        if self.training:
            BreakAfter.calls += 1
            if BreakAfter.calls >= 8:
                return out * BreakAfter.factor
        return out


@pytest.mark.parametrize("factor, match", [(float("nan"), "non-finite training loss in epoch 2"),
                                           (1e20, "training loss exploded in epoch 2.*more than 100 x the initial")])
def test_divergence_stops_the_run_and_keeps_the_last_good_checkpoint(factor, match, arrays, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setattr(BreakAfter, "factor", factor)
    BreakAfter.calls = 0
    with pytest.raises(TrainingDiverged, match=match + ".*last good checkpoint \\(epoch 1\\)"):
        train_run(TrainConfig(**TINY, schedule="step"), tmp_path / "api", arrays, progress=False,
                  model=BreakAfter(TINY["depth"], seed=0))
    ckpt = torch.load(tmp_path / "api" / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == 1 and all(torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point())
    assert len(read_metrics(tmp_path / "api")) == 1
    manifest = json.loads((tmp_path / "api" / "manifest.json").read_text())
    assert manifest["status"] == "diverged" and manifest["epochs_done"] == 1
    assert "last good checkpoint" in manifest["message"]


def test_the_command_line_exits_3_with_the_divergence_line(npz, tmp_path, capsys):
    """A run that really diverges: lr = 1e30 without weight decay (inside float32's range, and lr*wd = 0 below the
    stability limit, so the config accepts it) overflows the weights within the first epoch; the CLI names the epoch
    and the remedy, and exits 3."""
    assert main(["--schedule", "step", "--data", npz, "--out", str(tmp_path / "cli"), *CLI_TINY, "--lr", "1e30",
                 "--wd", "0"]) == 3
    err = capsys.readouterr().err
    assert "non-finite" in err and "epoch 1" in err and "Lower --lr" in err, err
    manifest = json.loads((tmp_path / "cli" / "step" / "seed0" / "manifest.json").read_text())
    assert manifest["status"] == "diverged" and manifest["epochs_done"] == 0


def test_run_files_and_the_data_cache_get_the_ordinary_file_mode(arrays, tmp_path, monkeypatch):
    from explr.cifar10.sources import load_cifar10
    from explr.cifar10.image_folder import write_image_folder

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


def test_run_error_is_a_value_error_with_one_line():
    assert issubclass(RunError, ValueError) and issubclass(RunLocked, RunError)
