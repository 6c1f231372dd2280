"""The round-off guard: every notebook the suite executes runs with its arithmetic perturbed.

A committed output that depends on the last bits of a float passes on the machine that wrote it and fails
on another CPU (MKL and ATen pick their kernels by CPU; reductions split by thread count).  To fail it here
instead, the kernels started by nbval (the committed notebooks, whose outputs it compares) get
:data:`PERTURBED` in their environment:

* ``ATEN_CPU_CAPABILITY=default``: ATen's kernels without AVX2/AVX-512 vectorisation;
* ``MKL_CBWR=COMPATIBLE``: MKL's conditional numerical reproducibility mode, another code path for
  torch's BLAS (measured here: the last digits of a 300×300 float64 matmul change);
* ``OPENBLAS_CORETYPE=Sandybridge``: numpy's BLAS with its AVX kernel (any x86-64 CPU of the last decade has
  AVX; this machine would pick an AVX-512 one);
* ``OMP_NUM_THREADS=2``: another thread count than ``make execute``'s one (the chapters pin torch to one
  thread, so this reaches numpy's BLAS and the code before that call);
* ``OPENBLAS_THREAD_TIMEOUT=4``: no change to the arithmetic, but numpy's BLAS threads sleep after a call
  instead of spinning for about 0.1 s.  Two kernels of two threads each share this machine's two cores
  under ``make test``, and the spinning threads took the other kernel's time: two chapter 5 runs side by
  side took 23 s each, 17 s with the timeout and 16 s with one thread (measured here).

The chapter tests (papermill, whose runs assert the claims at other parameters) get :data:`RERUN_PERTURBED`.
On a CPU with AVX-512 (this one) it has the same thread count and numpy BLAS, with ATen's and MKL's AVX2
code paths instead of the unvectorised ones: another arithmetic again, which costs less.  MKL's compatible
path makes the float64 matmuls of the chapters' small networks about twice as slow (chapter 5's order-2
field: 18 → 38 ms an evaluation, measured here), and the papermill runs are much of the suite's time.  A
claim asserted at a reader's parameters thus runs under a third arithmetic, besides ``make execute``'s and
nbval's.  On a CPU without AVX-512, AVX2 is its own path, and the chapter tests get :data:`PERTURBED`.

``tests/test_roundoff_guard.py`` shows that a deliberately fragile output fails under :data:`PERTURBED`,
and that :data:`RERUN_PERTURBED` changes a float64 matmul's last digits.  This module is a pytest plugin
(``-p arithmetic``, from ``addopts``): its hooks apply to ``book/`` as well as ``tests/``.  It also tells
pytest-xdist which tests must share a worker (:func:`pytest_xdist_make_scheduler`).
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import pytest

PERTURBED = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "OPENBLAS_CORETYPE": "Sandybridge",
    "OMP_NUM_THREADS": "2",
    "OPENBLAS_THREAD_TIMEOUT": "4",
}


def _rerun_perturbed() -> dict:
    """:data:`PERTURBED` with ATen's and MKL's AVX2 paths where this CPU's own are AVX-512 (else itself)."""
    import torch

    if torch.backends.cpu.get_cpu_capability() == "AVX512":
        return {**PERTURBED, "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}
    return dict(PERTURBED)


RERUN_PERTURBED = _rerun_perturbed()


@contextmanager
def perturbed_arithmetic(perturbation=PERTURBED):
    """``os.environ`` with ``perturbation`` while the block runs (a kernel started there inherits it)."""
    saved = {name: os.environ.get(name) for name in perturbation}
    os.environ.update(perturbation)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _perturbation(item) -> dict | None:
    """:data:`PERTURBED` for an nbval cell of a committed notebook (its file's kernel starts in the first
    cell's setup), :data:`RERUN_PERTURBED` for a chapter test (papermill starts the kernel in the test's
    call), None for any other test."""
    if item.path.suffix == ".ipynb":
        return PERTURBED
    return RERUN_PERTURBED if item.get_closest_marker("chapters") is not None else None


@pytest.hookimpl(wrapper=True)
def _perturbed_if_it_starts_a_kernel(item):
    perturbation = _perturbation(item)
    if perturbation is None:
        return (yield)
    with perturbed_arithmetic(perturbation):
        return (yield)


pytest_runtest_setup = pytest_runtest_call = _perturbed_if_it_starts_a_kernel


#: tests that share one thing, so one worker runs them, one after another: the SLURM tests one cluster, the
#: browser check one build of the book (a session fixture)
SHARED = ("tests/test_slurm.py", "tests/browser/")


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # a hook of pytest-xdist, absent under -p no:xdist
def pytest_xdist_make_scheduler(config, log):
    """For ``-n N`` (pytest-xdist, ``--dist load``, its default): every test is a unit of its own, except
    that the cells of one notebook share a kernel, so they go to one worker, in order, and so do the tests
    of each of :data:`SHARED`.  Units with more tests go first (xdist's
    ``loadscopereorder``), so the committed notebooks start at once and the short tests fill in around them.

    (xdist's own ``--dist loadgroup`` does this with a mark, but under pytest 9 it no longer groups: it
    renames ``item._nodeid``, which ``nodeid`` no longer reads.)"""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class NotebookScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path.endswith(".ipynb"):
                return path
            return next((shared for shared in SHARED if path.startswith(shared)), nodeid)

    return NotebookScheduling(config, log)
