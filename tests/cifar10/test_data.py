"""explr.cifar10.data: the device sampler -- crops and flips of the padded images, reproducible epoch plans,
normalised batches, and its input checks."""
import numpy as np
import pytest
import torch

from explr.cifar10.arrays import CifarArrays
from explr.cifar10.data import DeviceData
from explr.cifar10.sources import make_synthetic


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
