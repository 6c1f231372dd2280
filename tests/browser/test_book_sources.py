"""Checks on the book's sources that need no browser: the Colab/Binder install cell, figure
captions and TeX macros. Chapters come from _toc.yml, so new chapters are checked as they land."""
from __future__ import annotations

import ast
import importlib.util
import json
import re

import pytest
from packaging.requirements import Requirement

from bookcheck import ROOT, config, toc_docnames

CHAPTERS = [d for d in toc_docnames()[1:] if (ROOT / f"{d}.ipynb").exists()]  # not the notation page

spec = importlib.util.spec_from_file_location("colab_cell", ROOT / ".ci" / "colab_cell.py")
colab_cell = importlib.util.module_from_spec(spec)
spec.loader.exec_module(colab_cell)


def cells(docname):
    return json.loads((ROOT / f"{docname}.ipynb").read_text())["cells"]


def test_install_cell_is_valid_and_pinned():
    source = colab_cell.cell_source()
    ast.parse(source)
    req = Requirement(colab_cell.requirement())
    assert req.name == colab_cell.distribution() and "book" in req.extras
    url = config()["repository"]["url"].rstrip("/")
    assert req.url == f"git+{url}@{colab_cell.release_tag()}", "pinned to the release tag of pyproject's version"
    assert re.fullmatch(r"v\d+\.\d+\.\d+", colab_cell.release_tag())


@pytest.mark.parametrize("docname", CHAPTERS)
def test_chapter_has_the_install_cell(docname):
    assert not colab_cell.problems(ROOT / f"{docname}.ipynb"), "\n".join(colab_cell.problems(ROOT / f"{docname}.ipynb"))


@pytest.mark.parametrize("docname", CHAPTERS)
def test_every_plot_is_a_numbered_figure_with_caption(docname):
    missing, extra = [], []
    for i, c in enumerate(cells(docname)):
        images = [o for o in c.get("outputs", []) if "image/png" in o.get("data", {}) or "image/svg+xml" in o.get("data", {})]
        if not images:
            continue
        fig = c.get("metadata", {}).get("mystnb", {}).get("figure", {})
        if not (fig.get("caption") and str(fig.get("name", "")).startswith("fig-")):
            missing.append(f"cell {i}")
        if len(images) > 1:
            missing.append(f"cell {i} draws {len(images)} images: one figure per cell")
        shown = [o for o in c.get("outputs", []) if o.get("output_type") in ("display_data", "execute_result")]
        if len(shown) > len(images):
            extra.append(f"cell {i} shows {len(shown) - len(images)} output(s) besides its plot (the value of its "
                           "last line?): myst-nb gives each the figure's name, and the build fails with "
                           "'Duplicate explicit target name'; end the cell with fig.tight_layout() or ';'")
    assert not missing, (f"{docname}: plot cells without cell metadata "
                         '`mystnb: {figure: {caption: ..., name: fig-...}}` (CONTRIBUTING.md): ' + ", ".join(missing))
    assert not extra, f"{docname}: " + "; ".join(extra)


def test_figure_names_are_unique_across_the_book():
    names = [c["metadata"]["mystnb"]["figure"]["name"] for d in CHAPTERS for c in cells(d)
             if c.get("metadata", {}).get("mystnb", {}).get("figure", {}).get("name")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_tex_macros_do_not_call_themselves():
    macros = config()["sphinx"]["config"]["mathjax3_config"]["tex"]["macros"]
    for name, body in macros.items():
        body = body[0] if isinstance(body, list) else body
        assert not re.search(rf"\\{name}(?![A-Za-z])", body), f"macro \\{name} expands to itself: {body}"
