"""Shared helpers of the tests that train the digits BN MLP (imported by name: a conftest.py
cannot be imported reliably once tests/ holds more than one)."""
from explr.book.digits import batch_schedule


def digit_batches(data, steps, batch_size=128, seed=0):
    """The same (x, y) batch sequence for every run that is compared step by step."""
    return [(data.x_train[i], data.y_train[i]) for i in batch_schedule(len(data.y_train), batch_size, steps, seed)]
