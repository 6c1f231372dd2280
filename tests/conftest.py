import os
import re
from collections import Counter

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
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache-home"))
    yield
    if saved is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = saved


def ci() -> bool:
    """Whether this is a CI run (GitHub Actions and ``.ci/run`` set ``CI=true``): ``CI`` set to anything
    but empty, ``0`` or ``false``. The Makefile's ``lint`` reads ``CI`` by the same rule."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


@pytest.fixture(scope="session")
def missing():
    """``missing(piece, how)`` for a test whose ``piece`` (Chromium, a SLURM cluster) is not on this machine:
    it skips, with one line naming the piece and how to get it, so that ``make test`` on a newcomer's
    machine runs the rest and lists what it skipped; under CI, where every test must run, it fails."""

    def missing(piece: str, how: str):
        if ci():
            pytest.fail(f"{piece} is missing, and CI={os.environ['CI']} requires it: {how}", pytrace=False)
        pytest.skip(f"{piece}{MISSING}{how}")

    return missing


MISSING = " is missing: "
#: (piece, how) -> how many tests skipped for it, from the reports (also those of pytest-xdist's workers)
SKIPPED_FOR: Counter = Counter()


def pytest_runtest_logreport(report):
    if report.skipped and isinstance(report.longrepr, tuple):
        m = re.fullmatch(rf"(?:Skipped: )?(.+?){MISSING}(.+)", report.longrepr[2])
        if m:
            SKIPPED_FOR[m.groups()] += 1


def pytest_terminal_summary(terminalreporter):
    """One line per missing piece after the run: what it is, how many tests skipped, how to install it."""
    if SKIPPED_FOR:
        terminalreporter.write_sep("-", "not on this machine (CI requires them)")
        for (piece, how), n in SKIPPED_FOR.items():
            terminalreporter.write_line(f"{piece}: {n} test{'s' * (n != 1)} skipped; {how}")
