"""Run folders that are never lost or half-started: checks before start, lock, signals, resume, divergence, modes.

PreResNet8 on 192 generated images, batch 32 (6 steps per epoch): seconds per run on a CPU.  The
signal tests run the CLI as a subprocess and interrupt it after its first epoch.
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import explr.cifar10.engine as engine_mod
from explr.cifar10.__main__ import main
from explr.cifar10.config import TrainConfig
from explr.cifar10.data import CifarArrays, make_synthetic, write_npz
from explr.cifar10.engine import TrainingDiverged
from explr.cifar10.runs import RunError, RunLock, RunLocked, load_runs, read_metrics, train_run
from explr.models import PreResNet

from cifar10_helpers import CLI_TINY, TINY, reproducible, tiny_arrays, tiny_npz

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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


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
                          "constant in channel(s) [0, 1, 2] (std 0)")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("damage, match", [
    ("empty checkpoint", "is not a readable checkpoint"),
    ("garbage checkpoint", "is not a readable checkpoint"),
    ("foreign checkpoint", "is not a checkpoint of this engine"),
    ("truncated manifest", "manifest.json is unreadable"),
])
def test_corrupt_run_files_name_what_to_delete(damage, match, npz, tmp_path, capsys):
    args = ["--schedule", "step", "--data", npz, "--out", str(tmp_path), *CLI_TINY, "--epochs", "1"]
    assert main(args) == 0
    run = tmp_path / "step" / "seed0"
    if damage == "empty checkpoint":
        (run / "checkpoint.pt").write_bytes(b"")
    elif damage == "garbage checkpoint":
        (run / "checkpoint.pt").write_bytes(os.urandom(300))
    elif damage == "foreign checkpoint":
        torch.save({"state_dict": {"w": torch.zeros(2)}}, run / "checkpoint.pt")
    else:
        (run / "manifest.json").write_text((run / "manifest.json").read_text()[:40])
    before = snapshot(run)
    err = fails_in_one_line([*args, "--resume"], capsys, match)
    assert "delete" in err
    assert snapshot(run) == before


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
    (tmp_path / ".checkpoint.pt.abc123.tmp").write_bytes(b"half a checkpoint")  # a write killed midway
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
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
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
    assert manifest["status"] == "interrupted" and ("SIGINT" if code == 130 else "SIGTERM") in manifest["message"]
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
    while time.time() - t0 < 30 and any(os.path.exists(f"/proc/{pid}") and _alive(pid) for pid in workers):
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers)
    for run in runs:  # each worker recorded its interruption (SIGTERM from PR_SET_PDEATHSIG)
        assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


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
def test_divergence_stops_the_run_and_keeps_the_last_good_checkpoint(factor, match, arrays, npz, tmp_path,
                                                                     monkeypatch, capsys):
    monkeypatch.setattr(engine_mod, "PreResNet", BreakAfter)
    monkeypatch.setattr(BreakAfter, "factor", factor)
    BreakAfter.calls = 0
    with pytest.raises(TrainingDiverged, match=match + ".*last good checkpoint \\(epoch 1\\)"):
        train_run(TrainConfig(**TINY, schedule="step"), tmp_path / "api", arrays, progress=False)
    ckpt = torch.load(tmp_path / "api" / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == 1 and all(torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point())
    assert len(read_metrics(tmp_path / "api")) == 1
    manifest = json.loads((tmp_path / "api" / "manifest.json").read_text())
    assert manifest["status"] == "diverged" and manifest["epochs_done"] == 1
    assert "last good checkpoint" in manifest["message"]
    BreakAfter.calls = 0
    assert main(["--schedule", "step", "--data", npz, "--out", str(tmp_path / "cli"), *CLI_TINY]) == 3
    assert match.split(".*")[0] in capsys.readouterr().err


def test_run_files_and_the_data_cache_get_the_ordinary_file_mode(arrays, tmp_path):
    from explr.cifar10.data import load_cifar10, write_image_folder

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
