#!/usr/bin/env python3
"""The install cell that lets a chapter run in Colab or Binder, the same in every chapter.

A chapter opened through a launch button runs in a fresh kernel that has no ``explr``. Its first
code cell therefore installs ``explr`` from the book's repository, pinned to the release tag
``v<version in pyproject.toml>``, from the URL in ``_config.yml`` (``repository.url``). Where
``explr`` is already importable (a clone after ``make install``: ``make book``, nbval, papermill)
the cell does nothing. It is tagged ``remove-cell``, so the HTML book does not show it.

    python .ci/colab_cell.py            # print the cell in jupytext percent format (for chapter sources)
    python .ci/colab_cell.py --check    # does every chapter in _toc.yml carry the current cell? (exit 1 if not)
    python .ci/colab_cell.py --fix      # insert or update it in every chapter notebook

``--fix`` updates an existing cell in place (no re-execution needed: it has no output). A newly
inserted cell has no execution count: re-execute that chapter afterwards (``make execute N=NN``).
"""
from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "browser"))
from bookcheck import toc_docnames  # noqa: E402  (the one reader of _toc.yml's page list)
MARKER = "# Colab / Binder: install the explr library"
TAG = "remove-cell"


def repository_url() -> str:
    return yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")


def release_tag() -> str:
    return "v" + tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def requirement() -> str:
    """pip requirement of the pinned release, e.g. ``explr[book] @ git+https://github.com/o/r@v0.1.0``."""
    return f"explr[book] @ git+{repository_url()}@{release_tag()}"


def cell_source() -> str:
    return (
        f"{MARKER} this chapter imports, pinned to the\n"
        "# book's release. Does nothing where explr is installed already (a clone after\n"
        "# `make install`).\n"
        "import importlib.util\n"
        "import subprocess\n"
        "import sys\n"
        "\n"
        'if "google.colab" in sys.modules or importlib.util.find_spec("explr") is None:\n'
        f'    requirement = "{requirement()}"\n'
        '    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", requirement],\n'
        "                   check=True)\n"
        "    importlib.invalidate_caches()"
    )


def percent_cell() -> str:
    return f'# %% tags=["{TAG}"]\n{cell_source()}\n'


def toc_chapters() -> list[Path]:
    """Every notebook listed in _toc.yml (chapters, sections, parts), in order."""
    paths = [ROOT / f"{name}.ipynb" for name in toc_docnames()]
    return [p for p in paths if p.exists()]


def install_cells(nb) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.startswith(MARKER)]


def problems(path: Path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    found = install_cells(nb)
    if not found:
        return [f"{path.name}: no install cell (python .ci/colab_cell.py --fix, then make execute)"]
    out = []
    if len(found) > 1:
        out.append(f"{path.name}: {len(found)} install cells, expected one")
    i = found[0]
    cell = nb.cells[i]
    if cell.source != cell_source():
        out.append(f"{path.name}: install cell differs from the current one (python .ci/colab_cell.py --fix)")
    if TAG not in cell.metadata.get("tags", []):
        out.append(f"{path.name}: install cell is not tagged {TAG!r}")
    first_code = next(j for j, c in enumerate(nb.cells) if c.cell_type == "code")
    if i != first_code:
        out.append(f"{path.name}: the install cell must be the first code cell")
    if cell.get("outputs"):
        out.append(f"{path.name}: the install cell printed something in the committed notebook")
    return out


def fix(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    found = install_cells(nb)
    if found:
        cell = nb.cells[found[0]]
        if cell.source == cell_source() and TAG in cell.metadata.get("tags", []):
            return "up to date"
        cell.source = cell_source()
        cell.metadata["tags"] = sorted(set(cell.metadata.get("tags", [])) | {TAG})
        msg = "updated"
    else:
        first_code = next((j for j, c in enumerate(nb.cells) if c.cell_type == "code"), len(nb.cells))
        cell = nbformat.v4.new_code_cell(cell_source(), metadata={"tags": [TAG]})
        if nb.get("nbformat_minor", 0) < 5:  # cell ids exist from nbformat 4.5 on
            cell.pop("id", None)
        nb.cells.insert(first_code, cell)
        msg = "inserted: re-execute this chapter (make execute N=...)"
    nbformat.write(nb, path)
    return msg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="check every chapter in _toc.yml")
    ap.add_argument("--fix", action="store_true", help="insert or update the cell in every chapter")
    ap.add_argument("notebooks", nargs="*", type=Path, help="default: every chapter in _toc.yml")
    args = ap.parse_args()
    paths = [p.resolve() for p in args.notebooks] or toc_chapters()
    if args.fix:
        for p in paths:
            print(f"{p.name}: {fix(p)}")
        return 0
    if args.check:
        issues = [m for p in paths for m in problems(p)]
        print("\n".join(issues) or f"install cell up to date in {len(paths)} chapters")
        return 1 if issues else 0
    print(percent_cell(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
