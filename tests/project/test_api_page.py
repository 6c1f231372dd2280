"""The API page (book/api.md, sphinxext/apiref.py): its summary table names every public name of the scheduler and the
schedules, its quick start runs as written, and every public schedule builder and PerStepLR gets its LR curve."""
import importlib
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from test_examples import MODULES, WIDTH

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- the API page
API = ROOT / "book" / "api.md"


def api_section(title: str) -> str:
    text = API.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    return text[start:text.index("\n## ", start + 1)]


def test_the_api_page_opens_with_a_table_of_every_public_name_of_the_scheduler_and_the_schedules():
    text = API.read_text(encoding="utf-8")
    table = text[:text.index("\n## ")]
    listed = set(re.findall(r"\{py:\w+\}`~([\w.]+)`", table))
    for module in MODULES:
        for public in importlib.import_module(module).__all__:
            assert f"{module}.{public}" in listed, f"{module}.{public} is not in the API page's summary table"
    assert text.index("\n## Quick start\n") < text.index("\n## The schedules")


def test_the_api_pages_quick_start_runs_as_written(one_thread):
    blocks = re.findall(r"```python\n(.*?)```", api_section("Quick start"), re.S)
    assert len(blocks) == 1
    namespace: dict = {}
    exec(compile(blocks[0], "book/api.md (Quick start)", "exec"), namespace)
    scheduler = namespace["scheduler"]
    assert scheduler.last_epoch == scheduler.steps == 200
    assert namespace["optimizer"].param_groups[0]["lr"] == scheduler.get_last_lr()[0]
    assert all(len(line) <= WIDTH for line in blocks[0].splitlines()), "a quick-start line wider than the column"


@pytest.fixture(scope="module")
def apiref():
    pytest.importorskip("sphinx")
    sys.path.insert(0, str(ROOT / "sphinxext"))
    try:
        yield importlib.import_module("apiref")
    finally:
        sys.path.remove(str(ROOT / "sphinxext"))


def test_every_schedule_builder_and_the_scheduler_get_an_lr_curve(apiref, one_thread):
    """Every public function of explr.schedules but alpha (a number, not a schedule) and PerStepLR; the curves are
    the recipe's 78,200 steps, and PerStepLR's played lr stays at most rescale_above, a power of 4 below texp's."""
    from explr.schedules import __all__ as public

    builders = {f"explr.schedules.{n}" for n in public if n[0].islower() and n != "alpha"}
    curves = apiref.lr_curves()
    assert set(curves) == builders | {"explr.lr_scheduler.PerStepLR"}
    for name, (caption, lrs) in curves.items():
        assert caption and all(len(lr) == 78_200 and np.all(np.asarray(lr) > 0) for lr in lrs.values()), name
    _, played = curves["explr.lr_scheduler.PerStepLR"]
    ratio = np.log2(played["texp's lr"] / played["played"]) / 2
    assert played["played"].max() <= apiref.RESCALE_ABOVE < played["texp's lr"].max()
    np.testing.assert_allclose(ratio, np.round(ratio), atol=1e-9)
    assert np.all(np.diff(np.round(ratio)) >= 0) and ratio[-1] >= 10


def test_the_hook_appends_a_figure_only_to_those_names(apiref, tmp_path):
    class Env:
        docname = "book/api"

        def note_dependency(self, path):
            pass

    class App:
        doctreedir, srcdir, env = str(tmp_path / "_build" / ".doctrees"), str(tmp_path), Env()

    lines = ["A docstring."]
    apiref.append_lr_curve(App(), "function", "explr.schedules.alpha", None, {}, lines)
    assert lines == ["A docstring."]
    apiref.append_lr_curve(App(), "function", "explr.schedules.step_decay", None, {}, lines)
    assert lines[2] == ".. figure:: ../_build/api_figures/explr.schedules.step_decay.svg"
    svg = (tmp_path / "_build" / "api_figures" / "explr.schedules.step_decay.svg").read_text()
    assert svg.startswith("<?xml") and "learning rate" in svg and "explr.schedules.step_decay" in apiref.SHOWN
