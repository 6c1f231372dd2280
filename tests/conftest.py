import pytest
import torch

from explr.book.digits import load_digits


@pytest.fixture(scope="session")
def digits64():
    return load_digits(dtype=torch.float64)


@pytest.fixture()
def one_thread():
    """Run a test on one thread: small tensors gain nothing from threads, and lose a lot when
    other processes share the cores (use with ``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
