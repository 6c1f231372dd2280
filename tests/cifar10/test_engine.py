"""explr.cifar10.engine: the device sampler (crops, flips, reproducible epoch plans) and the Trainer's hot loop on tiny generated data (PreResNet8, 192 images, batch 32)."""
import math

import numpy as np
import pytest
import torch

from explr.cifar10.config import TrainConfig, played_schedule
from explr.cifar10.data import CifarArrays, make_synthetic
from explr.cifar10.engine import DeviceData, Trainer

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
    with pytest.raises(ValueError, match="std > 0"):
        DeviceData(small, mean=[0.5, 0.5, 0.5], std=[0.2, 0.0, 0.2])
    with pytest.raises(ValueError, match="n_train"):
        make_synthetic(n_train=0)
    assert isinstance(make_synthetic(20, 10), CifarArrays)
