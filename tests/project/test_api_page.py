"""The API page (book/api.md, sphinxext/apiref.py): its summary table names every public name of the scheduler and the
schedules, its quick start runs as written, every public schedule builder and PerStepLR gets its LR curve, and,
built alone with Sphinx, it documents what a user calls: the maths floor in full, the engine by the names of
``explr.cifar10.__all__`` and its command line (at most 40 % of the entries), every entry with a description."""
import importlib
import io
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


# ----------------------------------------------------------------------------- what the page documents
#: the maths floor, documented in full (every name of each module's __all__)
FLOOR = ["explr.schedules", "explr.lr_scheduler", "explr.invariance", "explr.sgd", "explr.models", "explr.params"]
ENGINE = "explr.cifar10"
#: the largest share of the page's entries that the engine may take (its public names and CLI options)
ENGINE_SHARE = 0.40
#: a page that breaks every rule: an engine internal, an entry without a description
WRONG_PAGE = """# Wrong

```{eval-rst}
.. py:function:: explr.cifar10.an_internal_helper(x)

.. py:function:: explr.schedules.a_described_function(x)

   It has a line of description.
```
"""


def build_pages(tmp: Path, pages: dict[str, str]) -> tuple[dict, str]:
    """Build ``pages`` ({name: MyST text}) with the book's Sphinx settings (_config.yml) and extensions for the API
    page, without the rest of the book: ({name: doctree}, the warnings)."""
    from jupyter_book.config import get_final_config
    from sphinx.application import Sphinx

    conf, _ = get_final_config(user_yaml=ROOT / "_config.yml", cli_config={"latex_individualpages": False},
                               sourcedir=ROOT, use_external_toc=False)
    settings = {k: v for k, v in conf.items()
                if k.startswith(("autodoc_", "nitpick", "python_", "myst_")) or k in ("smartquotes", "suppress_warnings")}
    (tmp / "src").mkdir(parents=True)
    for name, text in pages.items():
        (tmp / "src" / f"{name}.md").write_text(text, encoding="utf-8")
    warnings = io.StringIO()
    sys.path.insert(0, str(ROOT / "sphinxext"))
    try:
        app = Sphinx(str(tmp / "src"), None, str(tmp / "out"), str(tmp / "doctrees"), "dummy", status=None,
                     warning=warnings, freshenv=True,
                     confoverrides={**settings, "extensions": ["myst_parser", "sphinx.ext.autodoc", "apiref"],
                                    "nitpicky": True, "root_doc": "api", "project": "api"})
        app.build()
    finally:
        sys.path.remove(str(ROOT / "sphinxext"))
    return {name: app.env.get_doctree(name) for name in pages}, warnings.getvalue()


def entries(doctree) -> list[tuple[str, str, bool]]:
    """(domain, full name, described?) of every entry of a built page: each documented object or CLI option, described
    when its body has a paragraph of text (a docstring, a ``#:`` comment, an option's help)."""
    from sphinx import addnodes

    found = []
    for desc in doctree.findall(addnodes.desc):
        signature = next(iter(desc.findall(addnodes.desc_signature)))
        module, name = signature.get("module"), signature.get("fullname") or signature.astext()
        body = next(iter(desc.findall(addnodes.desc_content)))
        described = any(c.tagname == "paragraph" and c.astext().strip() for c in body.children)
        found.append((desc["domain"], f"{module}.{name}" if module else name, described))
    return found


def engine_share(found) -> float:
    """The engine's share of the entries: its Python names and the options of its command line."""
    return sum(domain == "std" or name.startswith(f"{ENGINE}.") for domain, name, _ in found) / len(found)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("jupyter_book")
    return build_pages(tmp_path_factory.mktemp("api"), {"api": API.read_text(encoding="utf-8"), "wrong": WRONG_PAGE})


def test_the_page_documents_the_maths_floor_in_full_and_the_engine_by_its_public_names(built):
    doctrees, _ = built
    names = {name for domain, name, _ in entries(doctrees["api"]) if domain == "py"}
    floor = {f"{m}.{n}" for m in FLOOR for n in importlib.import_module(m).__all__}
    public = {f"{ENGINE}.{n}" for n in importlib.import_module(ENGINE).__all__}
    assert floor <= names, f"maths floor names missing from the page: {sorted(floor - names)}"
    assert public <= names, f"engine names missing from the page: {sorted(public - names)}"
    internals = {n for n in names if n.startswith(f"{ENGINE}.")} - public
    assert not internals, f"engine internals (or members) on the page: {sorted(internals)}"


def test_every_entry_is_described_and_the_engine_takes_at_most_40_percent(built):
    """Counted on the built page (a8d6ad0: 427 Python entries, 331 of them the engine's, 176 undescribed)."""
    doctrees, warnings = built
    found = entries(doctrees["api"])
    undescribed = [name for _, name, described in found if not described]
    options = [name for domain, name, _ in found if domain == "std"]
    assert not undescribed, f"entries without a description: {undescribed}"
    assert len(options) >= 30 and engine_share(found) <= ENGINE_SHARE, (len(found), engine_share(found))
    # the page alone may not resolve the other chapters' labels; every explr name it mentions must resolve
    other = [w for w in warnings.splitlines() if "WARNING" in w and "undefined label" not in w
             and "wrong.md" not in w and "toctree" not in w]
    assert not other, "\n".join(other)


def test_the_counts_catch_an_internal_an_undescribed_entry_and_an_engine_heavy_page(built):
    doctrees, _ = built
    found = entries(doctrees["wrong"])
    assert [(name, described) for _, name, described in found] == [
        ("explr.cifar10.an_internal_helper", False), ("explr.schedules.a_described_function", True)]
    assert engine_share(found) == 0.5 > ENGINE_SHARE
