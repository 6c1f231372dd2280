"""explr.cifar10.engine.Trainer: the hot loop on tiny generated data (PreResNet8, 192 images, batch 32)."""
import math

import numpy as np
import pytest

from explr.cifar10.config import TrainConfig
from explr.cifar10.arrays import CifarArrays
from explr.cifar10.sources import make_synthetic
from explr.cifar10.engine import Trainer
from explr.cifar10.played import played_schedule

from cifar10_helpers import tiny_arrays, tiny_npz

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


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
    assert 0 < trainer.optimizer.param_groups[0]["lr"] <= 1.0 and math.isfinite(trainer.norms())
