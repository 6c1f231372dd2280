"""The round-off guard: every notebook kernel the suite starts runs with its arithmetic perturbed.

A committed output that depends on the last bits of a float passes on the machine that wrote it and fails on
another CPU (MKL and ATen pick their kernels by CPU; reductions split by thread count).  To fail it here
instead, the kernels that nbval starts (the committed notebooks, whose outputs it compares) get
:data:`PERTURBED` in their environment:

* ``ATEN_CPU_CAPABILITY=default``: ATen's kernels without AVX2/AVX-512 vectorisation;
* ``MKL_CBWR=COMPATIBLE``: MKL's conditional numerical reproducibility mode, another code path for torch's BLAS;
* ``OPENBLAS_CORETYPE=Sandybridge``: numpy's BLAS with its AVX kernel instead of this CPU's own;
* ``OMP_NUM_THREADS=2``: another thread count than ``make execute``'s one (the chapters pin torch to one
  thread, so this reaches numpy's BLAS);
* ``OPENBLAS_THREAD_TIMEOUT=4``: no change to the arithmetic; numpy's BLAS threads sleep after a call instead
  of spinning on the core another kernel runs on.

The chapter tests (papermill) get :func:`rerun_perturbed`: on an AVX-512 CPU ATen's and MKL's AVX2 paths, a
third arithmetic that is cheaper than MKL's compatible one; elsewhere :data:`PERTURBED`.

A pytest plugin (``-p roundoff_guard``, from ``addopts``): its hooks apply to ``book/`` as well as ``tests/``.
``tests/notebooks/test_roundoff_guard.py`` shows that it fails a deliberately fragile output.
"""
from __future__ import annotations

import functools
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


@functools.cache
def rerun_perturbed() -> dict:
    """:data:`PERTURBED` with ATen's and MKL's AVX2 paths where this CPU's own are AVX-512 (else itself).

    Imports torch (for its CPU capability), so only a chapter test calls it."""
    import torch

    if torch.backends.cpu.get_cpu_capability() == "AVX512":
        return {**PERTURBED, "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}
    return dict(PERTURBED)


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
    cell's setup), :func:`rerun_perturbed` for a chapter test (papermill starts the kernel in the test's
    call), None for any other test."""
    if item.path.suffix == ".ipynb":
        return PERTURBED
    return rerun_perturbed() if item.get_closest_marker("chapters") is not None else None


@pytest.hookimpl(wrapper=True)
def _perturbed_if_it_starts_a_kernel(item):
    perturbation = _perturbation(item)
    if perturbation is None:
        return (yield)
    with perturbed_arithmetic(perturbation):
        return (yield)


pytest_runtest_setup = pytest_runtest_call = _perturbed_if_it_starts_a_kernel
