"""Which tests share one pytest-xdist worker under ``-n N`` (a pytest plugin: ``-p grouping``, from ``addopts``).

Every test is a unit of its own, except that the cells of one notebook share a kernel, so they go to one worker,
in order, and so do the tests of each of :data:`SHARED`.  Units with more tests go first (xdist's
``--loadscope-reorder``), so the committed notebooks start at once and the short tests fill in around them.

xdist's own ``--dist loadgroup`` (an ``xdist_group`` mark) would do this, but under pytest 9.2 it no longer
groups: it appends the group to ``item._nodeid``, which ``nodeid`` no longer reads
(https://github.com/pytest-dev/pytest-xdist/issues/1386, open; fix proposed in pytest-xdist#1388).  Until it is
fixed, this plugin subclasses xdist's ``LoadScopeScheduling`` and overrides ``_split_scope``, its semi-private
method that maps a test's node id to its unit.  ``tests/suite/test_grouping.py`` runs a small suite on two
workers.
"""
from __future__ import annotations

import pytest

#: tests that share one thing, so one worker runs them, one after another: the SLURM tests one cluster, the
#: browser check one build of the book (a session fixture)
SHARED = ("tests/slurm/", "tests/browser/")


def unit(nodeid: str) -> str:
    """The work unit of the test ``nodeid``: its notebook, the prefix of :data:`SHARED` it starts with, or itself."""
    path = nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):
        return path
    return next((shared for shared in SHARED if path.startswith(shared)), nodeid)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # a hook of pytest-xdist, absent under -p no:xdist
def pytest_xdist_make_scheduler(config, log):
    """For ``-n N`` with ``--dist load`` (xdist's default): xdist's scope scheduler, with :func:`unit` as the
    scope of a test."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit(nodeid)

    return GroupScheduling(config, log)
