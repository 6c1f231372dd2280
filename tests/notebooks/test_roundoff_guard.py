"""The round-off guard fails an output that depends on the last bits, and passes one shown by the rule.

A two-cell notebook is executed here with the arithmetic as ``make execute`` has it, like a committed
chapter.  Its first cell prints raw sums (a float32 reduction and a float64 matmul), whose last digits
depend on the thread count and on MKL's code path; its second prints a round-off deviation through
:func:`explr.book.checks.shown`.  nbval then compares the outputs: without the guard both pass (the run is
deterministic on one machine), with it (``-p roundoff_guard``, as ``make test`` has it) the raw sums fail and
the rule's output passes.
"""
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from roundoff_guard import PERTURBED, rerun_perturbed

TESTS = Path(__file__).resolve().parent

SETUP = """\
import torch
g = torch.Generator().manual_seed(0)
x = torch.rand(10**6, generator=g)                          # float32
a = torch.randn(300, 300, generator=g, dtype=torch.float64)
"""
FRAGILE = "print(repr(float(x.sum())), repr(float((a @ a).sum())))"
ROBUST = """\
from explr.book.checks import shown
n = a.numpy()  # the same product by numpy's BLAS: the two differ at round-off, by how much depends on both
deviation = abs(float((a @ a).sum()) - float((n @ n).sum())) / float(abs(n @ n).sum())
print("torch vs numpy matmul, relative:", shown(deviation, 1e-9))
"""

@contextmanager
def native_arithmetic():
    """The environment a chapter is committed from: one thread, no perturbation."""
    saved = dict(os.environ)
    for name in PERTURBED:
        os.environ.pop(name, None)
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def committed_notebook(folder: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    tag = {"tags": ["nbval-check-output"]}
    nb.cells = [nbformat.v4.new_code_cell(SETUP + FRAGILE, metadata=tag),
                nbformat.v4.new_code_cell(ROBUST, metadata=tag)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    with native_arithmetic():
        NotebookClient(nb, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
    path = folder / "committed.ipynb"
    nbformat.write(nb, path)
    return path


def nbval(path: Path, *plugins: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    for name in PERTURBED:
        env.pop(name, None)
    env["OMP_NUM_THREADS"] = "1"  # the guard, not this environment, must bring the perturbation
    args = [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "-p", "no:cacheprovider",
            "-p", "no:xdist", "-q", "-rA", *[a for p in plugins for a in ("-p", p)], path.name]
    return subprocess.run(args, cwd=path.parent, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_raw_sum_fails_the_guard_and_the_rounded_deviation_passes(tmp_path):
    path = committed_notebook(tmp_path)
    outputs = [json.dumps(c["outputs"]) for c in nbformat.read(path, as_version=4).cells]
    assert "torch vs numpy matmul, relative: < 1e-10" in outputs[1]

    plain = nbval(path)
    assert plain.returncode == 0, plain.stdout[-3000:]  # deterministic on one machine: nbval alone cannot tell

    guarded = nbval(path, "roundoff_guard")
    assert guarded.returncode == 1, guarded.stdout[-3000:]
    assert "FAILED committed.ipynb::Cell 0" in guarded.stdout, guarded.stdout[-3000:]
    assert "PASSED committed.ipynb::Cell 1" in guarded.stdout, guarded.stdout[-3000:]


@pytest.mark.slow
def test_the_chapter_tests_perturbation_changes_a_float64_matmul():
    """The papermill runs' :func:`rerun_perturbed` is a perturbation too: the matmul's last digits move."""
    def matmul(env):
        code = SETUP + "print(repr(float((a @ a).sum())))"
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        return run.stdout.strip()

    with native_arithmetic():
        native = matmul(dict(os.environ))
    perturbed = matmul({**os.environ, **rerun_perturbed()})
    assert native != perturbed, f"{rerun_perturbed()} leaves the matmul at {native}"


def test_loading_the_plugins_imports_no_torch():
    """torch is imported for a chapter test's perturbation only, not by every pytest run that loads the plugins."""
    code = "import sys, grouping, roundoff_guard; print('torch' in sys.modules)"
    plugins = os.pathsep.join([str(TESTS), str(TESTS.parent / "suite")])  # roundoff_guard here, grouping there
    run = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": plugins},
                         capture_output=True, text=True, timeout=60)
    assert run.stdout.split() == ["False"], run.stdout + run.stderr[-2000:]
