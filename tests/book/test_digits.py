"""explr.book.digits: the split and the batch schedule are reproducible and validated."""
import pytest
import torch

from explr.book.digits import batch_schedule, load_digits


def test_digits_split_and_batches_are_reproducible():
    a, b = load_digits(seed=3), load_digits(seed=3)
    assert a.x_train.shape == (1348, 64) and a.x_test.shape == (449, 64)
    assert torch.equal(a.x_train, b.x_train)
    assert abs(a.x_train.mean().item()) < 1e-12
    s = batch_schedule(1348, 128, 25, seed=1)
    assert s.shape == (25, 128) and torch.equal(s, batch_schedule(1348, 128, 25, seed=1))
    assert len(set(s[:10].flatten().tolist())) == 1280  # no repeats within an epoch
    with pytest.raises(ValueError, match="batch_size"):
        batch_schedule(10, 20, 1)
    with pytest.raises(ValueError, match="test_fraction"):
        load_digits(test_fraction=1.5)
