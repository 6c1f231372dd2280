"""explr.cifar10.runs: the device sampler (crops, flips, reproducible epoch plans) and the Trainer's hot loop on
tiny generated data (PreResNet8, 192 images, batch 32); one run prepared once and trained into its folder -- a
writer killed around a checkpoint, a full disk, a stale lock, the schedule built once."""
import errno
import json
import math
import pickle
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import explr.cifar10.config as config
import explr.cifar10.runs as runs_mod
from explr.cifar10 import runfolder, run_many, sweep
from explr.cifar10.__main__ import main
from explr.cifar10.config import TrainConfig, played_schedule
from explr.cifar10.data import CifarArrays, DataError, make_synthetic
from explr.cifar10.runfolder import RunError, RunState, Status
from explr.cifar10.runfolder import load_runs, read_metrics, run_dir
from explr.cifar10.runs import DeviceData, Trainer, TrainingDiverged, prepare_run, train_prepared, train_run
from explr.cifar10.sweep import prepare
from explr.invariance import flat_norm
from explr.lr_scheduler import PerStepLR
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
    real, calls = runfolder.atomic_write, []

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

    monkeypatch.setattr(runfolder, "atomic_write", write)
    cfg = TrainConfig(**TINY, schedule="step")
    with pytest.raises(Killed):
        train_run(cfg, tmp_path, arrays, progress=False)
    monkeypatch.undo()
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["epoch"] == (1 if when == "before" else 2)
    assert train_run(cfg, tmp_path, arrays, progress=False, resume=True).epochs_done == 3


def full_disk(monkeypatch, name, nth, stays_full):
    """The ``nth`` write of ``name`` fails as torch's zip writer fails on a full disk; ``stays_full``: every later
    write fails too (else the space freed by the failed write lets the manifest through)."""
    real, counts, full = runfolder.atomic_write, {}, []

    def write(path, fn):
        counts[Path(path).name] = counts.get(Path(path).name, 0) + 1
        if (Path(path).name == name and counts[name] == nth) or (full and stays_full):
            full.append(path)
            try:
                raise OSError(errno.ENOSPC, "No space left on device")
            except OSError as err:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 320 vs 0") from err
        real(path, fn)

    monkeypatch.setattr(runfolder, "atomic_write", write)


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
    assert err.strip() == (f"disk full while writing {run / name}; the checkpoint of epoch {kept} is kept; free "
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
    assert f"stale lock: {tmp_path / '.lock'} names process {dead.pid}, which" in capsys.readouterr().err
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
    assert resumed.epochs_done == done + 1
    assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"


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
    with pytest.raises(TrainingDiverged, match=match + ".*; the checkpoint of epoch 1 is kept; Lower --lr"):
        train_run(TrainConfig(**TINY, schedule="step"), tmp_path / "api", arrays, progress=False,
                  model=BreakAfter(TINY["depth"], seed=0))
    ckpt = torch.load(tmp_path / "api" / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == 1 and all(torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point())
    assert len(read_metrics(tmp_path / "api")) == 1
    manifest = json.loads((tmp_path / "api" / "manifest.json").read_text())
    assert manifest["status"] == "diverged" and manifest["epochs_done"] == 1
    assert re.search(match + ".*; the checkpoint of epoch 1 is kept", manifest["message"]), manifest["message"]


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


CONFIG = TrainConfig(**{**TINY, "schedule": "texp", "epochs": 2, "rescale_above": 0.102}).validate()


@pytest.fixture()
def built(monkeypatch):
    """Counts of what a run builds: its schedules (each played_schedule builds one base schedule) and PerStepLRs;
    and of the device resolutions its trainer makes itself (the run resolved it already)."""
    counts = {"schedule": 0, "PerStepLR": 0}
    base, init = config.step_decay, PerStepLR.__init__
    resolve = runs_mod.resolve_device

    def resolve_device(*args, **kwargs):
        counts["trainer resolves"] = counts.get("trainer resolves", 0) + 1
        return resolve(*args, **kwargs)

    def step_decay(*args, **kwargs):
        counts["schedule"] += 1
        return base(*args, **kwargs)

    def counted_init(self, *args, **kwargs):
        counts["PerStepLR"] += 1
        init(self, *args, **kwargs)

    monkeypatch.setattr(config, "step_decay", step_decay)
    monkeypatch.setattr(runs_mod, "resolve_device", resolve_device)
    monkeypatch.setattr(PerStepLR, "__init__", counted_init)
    return counts


def test_train_run_builds_the_schedule_and_the_scheduler_once_fresh_and_on_resume(arrays, tmp_path, built):
    train_run(CONFIG, tmp_path, arrays, progress=False, stop_after=1)
    assert built == {"schedule": 1, "PerStepLR": 1}
    result = train_run(CONFIG, tmp_path, arrays, progress=False, resume=True)
    assert result.epochs_done == 2 and built == {"schedule": 2, "PerStepLR": 2}
    Trainer(CONFIG, arrays)  # the control: a trainer given no schedule or device builds and resolves them itself
    assert built == {"schedule": 3, "PerStepLR": 3, "trainer resolves": 1}


def test_a_sweep_and_a_submitit_job_build_each_runs_schedule_and_scheduler_once(arrays, npz, tmp_path, built):
    configs = [TrainConfig(**{**CONFIG.__dict__, "data": npz}),
               TrainConfig(**{**TINY, "schedule": "step", "epochs": 2, "data": npz}).validate()]
    run_many(configs, tmp_path / "sweep", arrays=arrays, progress=False)
    assert built == {"schedule": 2, "PerStepLR": 2}
    for c in configs:  # another process trained one epoch meanwhile: the folders are checked again, not rebuilt
        train_run(c, run_dir(tmp_path / "jobs", c.schedule, c.seed), arrays, progress=False, stop_after=1)
    _, runs = prepare(configs, tmp_path / "jobs", resume=True, progress=False)
    assert [r.check.state for r in runs] == [RunState.RESUME] * 2
    before = dict(built)
    results = [sweep.RunJob(run)() for run in runs]  # what a submitit job calls (it loads the data itself)
    assert [r.epochs_done for r in results] == [2, 2]
    assert built == {"schedule": before["schedule"], "PerStepLR": before["PerStepLR"] + 2}


def test_a_folder_that_changed_since_the_run_was_prepared_is_checked_again_under_the_lock(arrays, tmp_path):
    run = prepare_run(CONFIG, tmp_path, arrays)
    assert run.check.state is RunState.NEW
    train_run(CONFIG, tmp_path, arrays, progress=False, stop_after=1)  # another process, after the preflight
    with pytest.raises(RunError, match="already holds a run; pass --resume"):
        train_prepared(run, arrays, progress=False)
    resumed = prepare_run(CONFIG, tmp_path, arrays, resume=True)
    assert (resumed.check.state, resumed.check.epochs_done) == (RunState.RESUME, 1)
    train_run(CONFIG, tmp_path, arrays, progress=False, resume=True)
    result = train_prepared(resumed, arrays, progress=False)  # finished meanwhile: returned as it is
    assert (result.status, result.message, result.epochs_done) == (Status.FINISHED, "already finished", 2)


def test_a_prepared_run_travels_to_a_worker_whole(arrays, tmp_path):
    """The local pool and submitit send the prepared run to another process: it arrives with its schedule."""
    run = prepare_run(CONFIG, tmp_path, arrays)
    copy = pickle.loads(pickle.dumps(run))
    assert (copy.config, copy.folder, copy.resolved, copy.data, copy.check) == (
        run.config, run.folder, run.resolved, run.data, run.check)
    assert np.array_equal(copy.schedule.log_lr, run.schedule.log_lr)


def test_a_run_is_trained_only_on_the_data_it_was_prepared_with(arrays, tmp_path):
    run = prepare_run(CONFIG, tmp_path, arrays)
    other = make_synthetic(n_train=192, n_test=64, seed=3)
    with pytest.raises(RunError, match=r"prepared for the data synthetic\(.*seed=2\) \(sha256 [0-9a-f]{12}…\), "
                                 r"not synthetic\(.*seed=3\) \([0-9a-f]{12}…\); prepare it again"):
        train_prepared(run, other, progress=False)
    assert not tmp_path.exists() or not any(tmp_path.iterdir()), "refused before the folder is touched"


@pytest.mark.parametrize("changes, match", [
    ({"batch_size": 512}, r"batch_size \(--batch-size\) 512 exceeds the 192 training images"),
    ({"rescale_above": 0.05}, r"schedule texp \(seed 0; .*--rescale-above 0.05\) cannot be played: rescale_above "
                              r"must be a finite number > lr\[0\] = 0.1"),
])
def test_a_run_that_cannot_be_played_is_one_line_naming_the_flag(changes, match, arrays, tmp_path):
    with pytest.raises(ValueError, match=match) as err:
        prepare_run(TrainConfig(**{**CONFIG.__dict__, **changes}), tmp_path, arrays)
    assert "\n" not in str(err.value) and not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- the device sampler and the hot loop
@pytest.mark.slow
def test_texp_run_trains_the_same_networks_as_step_decay_in_float64(arrays):
    """Engine-level Theorem 2.12: same seed, same batches; texp (no WD, rescaled on the way) ≡ step decay + WD.

    Training losses use batch statistics, which are scale invariant; with BN eps ~ 0 in float64 the
    per-epoch mean losses agree to 1e-9.  (Eval-mode test losses use running averages over steps at
    different scales, so they agree only approximately.)  12×12 crops of the images keep float64 fast.
    """
    small = CifarArrays(arrays.x_train[:, :12, :12].copy(), arrays.y_train, arrays.x_test[:, :12, :12].copy(),
                        arrays.y_test, source="crop", kind="synthetic")
    base = dict(epochs=3, batch_size=32, depth=8, precision="fp64", bn_eps=1e-300, wd=5e-3, decay_epochs=(2,),
                channels_last=False, threads=1, eval_batch_size=64)
    step = Trainer(TrainConfig(schedule="step", **base).validate(), small)
    exp = Trainer(TrainConfig(schedule="texp", rescale_above=0.102, **base).validate(), small)
    for epoch in range(3):
        a, b = step.train_epoch(epoch), exp.train_epoch(epoch)
        assert abs(a[0] - b[0]) <= 1e-9 * abs(a[0]) and a[1] == b[1]
    assert exp.scheduler.rescale_count >= 1
    assert abs(step.evaluate()[0] - exp.evaluate()[0]) < 0.05


@pytest.mark.slow
def test_a_schedule_beyond_float64_trains_from_log_space():
    """TEXP at wd 1e-2 over 80,000 steps: its lr passes float64's range (e^1600), yet the engine plays it."""
    arrays = make_synthetic(n_train=400, n_test=20, seed=0)
    config = TrainConfig(schedule="texp", epochs=200, batch_size=1, depth=8, wd=1e-2, device="cpu",
                         precision="fp32", rescale_above=1.0).validate()
    lr = played_schedule(config, 400).lr
    assert np.isinf(lr).any(), "the schedule's lr exceeds float64 somewhere"
    trainer = Trainer(config, arrays)
    assert trainer.schedule.log_lr.max() > 709 and np.isfinite(trainer.schedule.log_lr).all()
    state = trainer.begin_epoch(0)
    trainer.run_steps(state, 0, 20)
    assert 0 < trainer.optimizer.param_groups[0]["lr"] <= 1.0 and math.isfinite(flat_norm(trainer.params).item())


@pytest.fixture(scope="module")
def small():
    return make_synthetic(n_train=60, n_test=20, seed=1)


# ----------------------------------------------------------------------------- device sampler
def denormalise(data, x):
    mean = torch.tensor(data.mean).view(1, 3, 1, 1)
    std = torch.tensor(data.std).view(1, 3, 1, 1)
    return torch.round((x.double() * std + mean) * 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def test_batches_are_crops_and_flips_of_the_padded_images(small):
    data = DeviceData(small)
    plan = data.epoch_plan(seed=3, epoch=0, batch_size=16)
    assert plan.steps == 3
    idx = plan.index.numpy()
    assert sorted(idx) == list(range(60))  # a permutation: every image once per epoch
    base = plan.base.numpy() - idx * 40 * 40
    oy, ox, flip = base // 40, base % 40, plan.flip.numpy().ravel()
    padded = np.pad(small.x_train, ((0, 0), (4, 4), (4, 4), (0, 0)))
    for step in range(plan.steps):
        x, y = data.train_batch(plan, step)
        assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32
        assert x.is_contiguous(memory_format=torch.channels_last)
        got = denormalise(data, x)
        for b in range(16):
            k = step * 16 + b
            want = padded[idx[k], oy[k]:oy[k] + 32, ox[k]:ox[k] + 32]
            np.testing.assert_array_equal(got[b], want[:, ::-1] if flip[k] else want)
            assert y[b] == small.y_train[idx[k]]
    assert oy.min() >= 0 and max(oy.max(), ox.max()) <= 8 and len(np.unique(ox)) > 4 and 0 < flip.mean() < 1


def test_plans_are_reproducible_and_change_with_seed_and_epoch(small):
    data = DeviceData(small)
    a, b = data.epoch_plan(0, 5, 10), data.epoch_plan(0, 5, 10)
    assert torch.equal(a.base, b.base) and torch.equal(a.flip, b.flip)
    assert not torch.equal(a.index, data.epoch_plan(0, 6, 10).index)
    assert not torch.equal(a.index, data.epoch_plan(1, 5, 10).index)


def test_no_augmentation_gives_normalised_originals_and_test_set(small):
    data = DeviceData(small, augment=False, channels_last=False)
    plan = data.epoch_plan(0, 0, 20)
    x, y = data.train_batch(plan, 1)
    assert x.is_contiguous()
    np.testing.assert_array_equal(denormalise(data, x), small.x_train[plan.index[20:40].numpy()])
    xs = torch.cat([data.train_batch(plan, k)[0] for k in range(3)])
    assert xs.mean(dim=(0, 2, 3)).abs().max() < 1e-5  # train statistics: mean 0, std 1 per channel
    assert (xs.std(dim=(0, 2, 3), unbiased=False) - 1).abs().max() < 1e-5
    tests = list(data.test_batches(batch_size=8))
    assert [len(t[1]) for t in tests] == [8, 8, 4]
    np.testing.assert_array_equal(denormalise(data, torch.cat([t[0] for t in tests])), small.x_test)
    np.testing.assert_array_equal(torch.cat([t[1] for t in tests]).numpy(), small.y_test)


def test_sampler_and_generator_reject_bad_input(small):
    data = DeviceData(small)
    for bad in (0, 61, 2.5):
        with pytest.raises(ValueError, match=r"batch_size must be an integer in \[1, n_train = 60\]"):
            data.epoch_plan(0, 0, bad)
    flat = small.x_train.copy()
    flat[..., 1] = 7  # a constant channel: normalising would divide by zero
    with pytest.raises(DataError, match="channel 1 is 7 everywhere"):
        DeviceData(CifarArrays(flat, small.y_train, small.x_test, small.y_test, "flat", "npz"))
    with pytest.raises(ValueError, match="n_train"):
        make_synthetic(n_train=0)
    assert isinstance(make_synthetic(20, 10), CifarArrays)
