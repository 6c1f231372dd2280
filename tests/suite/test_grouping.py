"""The grouping plugin (tests/suite/grouping.py) sends a notebook's cells, and each shared group, to one worker.

A small suite laid out like this repository's (a notebook, ``tests/slurm/``, ``tests/browser/`` and
tests of their own) runs on two xdist workers; the verbose report names the worker of every test.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grouping import SHARED, unit

TESTS = Path(__file__).resolve().parent

# a stand-in for nbval: one item per cell of a .ipynb file (no kernel), node ids "<path>::Cell <i>"
CONFTEST = """\
import pytest

class Cell(pytest.Item):
    def runtest(self):
        pass

class Notebook(pytest.File):
    def collect(self):
        for i in range(4):
            yield Cell.from_parent(self, name=f"Cell {i}")

def pytest_collect_file(file_path, parent):
    if file_path.suffix == ".ipynb":
        return Notebook.from_parent(parent, path=file_path)
"""
FOUR_TESTS = "".join(f"def test_{i}():\n    pass\n" for i in range(4))
SUITE = {
    "conftest.py": CONFTEST,
    "pytest.ini": "[pytest]\n",
    "book/chapter.ipynb": "{}",
    "tests/slurm/test_slurm.py": FOUR_TESTS,
    "tests/browser/test_book.py": FOUR_TESTS,
    "tests/browser/test_pages.py": FOUR_TESTS,
    "tests/test_units.py": FOUR_TESTS,
}
GROUPS = ("book/chapter.ipynb", *SHARED)


def workers(folder: Path, *plugins: str) -> dict[str, str]:
    """Run the suite in ``folder`` on two workers: the worker that ran each test, by node id."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTEST_ADDOPTS", None)
    args = [sys.executable, "-m", "pytest", "-n", "2", "-v", "-p", "no:cacheprovider",
            *[a for p in plugins for a in ("-p", p)]]
    run = subprocess.run(args, cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ran = {nodeid: worker for worker, nodeid in re.findall(r"^\[(gw\d)\] \[\s*\d+%\] PASSED (.+)$", run.stdout,
                                                          re.MULTILINE)}
    assert len(ran) == 20, run.stdout[-3000:]
    return ran


def workers_of(ran: dict[str, str], group: str) -> set[str]:
    return {worker for nodeid, worker in ran.items() if nodeid.startswith(group)}


@pytest.fixture
def suite(tmp_path) -> Path:
    for name, text in SUITE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_a_notebook_and_each_shared_group_run_on_one_worker(suite):
    ran = workers(suite, "grouping")
    for group in GROUPS:
        assert len(workers_of(ran, group)) == 1, (group, ran)
    assert set(ran.values()) == {"gw0", "gw1"}, ran  # the units are spread, not all sent to one worker


def test_without_the_plugin_xdist_splits_the_groups(suite):
    """The control: xdist's own ``--dist load`` sends a group's tests to both workers."""
    ran = workers(suite)
    assert any(len(workers_of(ran, group)) == 2 for group in GROUPS), ran


def test_the_unit_of_a_test():
    assert unit("book/01_x.ipynb::Cell 3") == "book/01_x.ipynb"
    assert unit("tests/slurm/test_slurm.py::test_submit[2]") == "tests/slurm/"
    assert unit("tests/browser/test_book_sources.py::test_x") == "tests/browser/"
    assert unit("tests/slurm_notes/test_x.py::test_x") == "tests/slurm_notes/test_x.py::test_x"
    assert unit("tests/test_units.py::test_x") == "tests/test_units.py::test_x"
