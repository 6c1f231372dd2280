"""explr.cifar10.prepared: a run built and checked once (its schedule, its PerStepLR, its folder's state), then
trained by whatever takes it; under the lock its folder is checked again only where its files changed."""
import pickle

import numpy as np
import pytest

import explr.cifar10.engine as engine
import explr.cifar10.played as played
from explr.cifar10 import cluster, run_many
from explr.cifar10.config import TrainConfig
from explr.cifar10.engine import Trainer
from explr.cifar10.lock import RunError
from explr.cifar10.preflight import prepare
from explr.cifar10.prepared import prepare_run
from explr.cifar10.runfolder import run_dir
from explr.cifar10.runs import train_run
from explr.cifar10.sources import make_synthetic
from explr.cifar10.status import RunState
from explr.lr_scheduler import PerStepLR

from cifar10_helpers import TINY, tiny_arrays, tiny_npz

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")
CONFIG = TrainConfig(**{**TINY, "schedule": "texp", "epochs": 2, "rescale_above": 0.102}).validate()


@pytest.fixture()
def built(monkeypatch):
    """Counts of what a run builds: its schedules (each played_schedule builds one base schedule) and PerStepLRs;
    and of the device resolutions its trainer makes itself (the run resolved it already)."""
    counts = {"schedule": 0, "PerStepLR": 0}
    base, init = played.step_decay, PerStepLR.__init__
    resolve = engine.resolve_device

    def resolve_device(*args, **kwargs):
        counts["trainer resolves"] = counts.get("trainer resolves", 0) + 1
        return resolve(*args, **kwargs)

    def step_decay(*args, **kwargs):
        counts["schedule"] += 1
        return base(*args, **kwargs)

    def counted_init(self, *args, **kwargs):
        counts["PerStepLR"] += 1
        init(self, *args, **kwargs)

    monkeypatch.setattr(played, "step_decay", step_decay)
    monkeypatch.setattr(engine, "resolve_device", resolve_device)
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
    _, runs, _ = prepare(configs, tmp_path / "jobs", resume=True, progress=False)
    assert [r.state for r in runs] == [RunState.RESUME] * 2
    before = dict(built)
    results = [cluster.RunJob(run)() for run in runs]  # what a submitit job calls (it loads the data itself)
    assert [r.epochs_done for r in results] == [2, 2]
    assert built == {"schedule": before["schedule"], "PerStepLR": before["PerStepLR"] + 2}


def test_an_unchanged_folder_is_not_checked_again_and_a_changed_one_is(arrays, tmp_path):
    run = prepare_run(CONFIG, tmp_path, arrays)
    assert run.state is RunState.NEW and run.confirmed() is run
    train_run(CONFIG, tmp_path, arrays, progress=False, stop_after=1)  # another process, after the preflight
    with pytest.raises(RunError, match="already holds a run; pass --resume"):
        run.confirmed()
    resumed = prepare_run(CONFIG, tmp_path, arrays, resume=True)
    assert (resumed.state, resumed.check.epochs_done) == (RunState.RESUME, 1)
    train_run(CONFIG, tmp_path, arrays, progress=False, resume=True)
    assert resumed.confirmed().state is RunState.FINISHED


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
        run.check_data(other)
    run.check_data(arrays)


@pytest.mark.parametrize("changes, match", [
    ({"batch_size": 512}, r"batch_size \(--batch-size\) 512 exceeds the 192 training images"),
    ({"rescale_above": 0.05}, r"schedule texp \(seed 0; .*--rescale-above 0.05\) cannot be played: rescale_above "
                              r"must be a finite number > lr\[0\] = 0.1"),
])
def test_a_run_that_cannot_be_played_is_one_line_naming_the_flag(changes, match, arrays, tmp_path):
    with pytest.raises(ValueError, match=match) as err:
        prepare_run(TrainConfig(**{**CONFIG.__dict__, **changes}), tmp_path, arrays)
    assert "\n" not in str(err.value) and not any(tmp_path.iterdir())
