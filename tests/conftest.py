import pytest
import torch

from explr.digits import load_digits


@pytest.fixture(scope="session")
def digits64():
    return load_digits(dtype=torch.float64)
