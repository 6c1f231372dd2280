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


@pytest.fixture(autouse=True, scope="session")
def _private_cache_home(tmp_path_factory):
    """The engine's per-user cache key (``$XDG_CACHE_HOME/explr``) in a temporary folder, not the user's."""
    import os

    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache-home"))
    yield
    if saved is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = saved
