"""explr.cifar10.runs: one run trained into its folder -- a writer killed around a checkpoint, a full disk, a stale
lock, signals, an exact resume, divergence.  (The checks before a run starts: test_runfolder.py, test_preflight.py;
the lock: test_lock.py.)

PreResNet8 on 192 generated images, batch 32 (6 steps per epoch): seconds per run on a CPU.  The
signal tests run the CLI as a subprocess and interrupt it after its first epoch.
"""
import errno
import json
from pathlib import Path
import signal
import subprocess
import sys

import pytest
import torch

from explr.cifar10 import files
from explr.cifar10.__main__ import main
from explr.cifar10.config import TrainConfig
from explr.cifar10.engine import TrainingDiverged
from explr.cifar10.lock import RunError
from explr.cifar10.metrics import read_metrics
from explr.cifar10.runfolder import load_runs
from explr.cifar10.runs import train_run
from explr.cifar10.status import Status
from explr.models import PreResNet

from cifar10_helpers import CLI_TINY, TINY, _cli, _wait_for_epochs, reproducible, tiny_arrays, tiny_npz

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")
CONFIG = TrainConfig(**{**TINY, "epochs": 2}).validate()


# ----------------------------------------------------------------------------- a writer killed, a full disk
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


# ----------------------------------------------------------------------------- a stale lock
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


# ----------------------------------------------------------------------------- divergence
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


# ----------------------------------------------------------------------------- an exact resume
@pytest.mark.slow
def test_interrupted_and_resumed_run_reproduces_the_uninterrupted_one_exactly(arrays, npz, tmp_path):
    cfg = dict(TINY, schedule="texp", wd=5e-3, rescale_above=0.102, epochs=4, data=npz)
    full = train_run(TrainConfig(**cfg), tmp_path / "full", arrays, progress=False)
    assert full.status == "finished" and full.metrics[-1]["rescale_count"] >= 1
    part = train_run(TrainConfig(**cfg), tmp_path / "part", arrays, progress=False, stop_after=2)
    assert part.status == "interrupted" and part.epochs_done == 2
    assert json.loads((tmp_path / "part" / "manifest.json").read_text())["status"] == "interrupted"
    with pytest.raises(RunError, match="already holds a run; pass --resume"):
        train_run(TrainConfig(**cfg), tmp_path / "part", arrays, progress=False)
    resumed = train_run(TrainConfig(**cfg), tmp_path / "part", arrays, progress=False, resume=True)
    assert resumed.status == "finished"
    assert reproducible(read_metrics(tmp_path / "part")) == reproducible(read_metrics(tmp_path / "full"))
    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)
    b = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=True)
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert a["scheduler"] == b["scheduler"]
    again = train_run(TrainConfig(**cfg), tmp_path / "part", arrays, progress=False, resume=True)
    assert again.message == "already finished" and again.epochs_done == 4
    with pytest.raises(ValueError, match="other settings: lr=0.1 \\(now 0.2\\)"):
        train_run(TrainConfig(**{**cfg, "lr": 0.2}), tmp_path / "part", arrays, progress=False, resume=True)
