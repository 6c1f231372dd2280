#!/usr/bin/env python3
"""The one setting a fork makes, ``repository.url`` in ``_config.yml``, and everything derived from it.

A fork sets its GitHub URL there once; Jupyter Book makes the Colab and Binder buttons and the repository
button from it, and this script writes the other copies (``--fix``) and checks them (``--check``):

* the install cell, the first code cell of every chapter in ``_toc.yml``: a chapter opened through a launch
  button runs in a fresh kernel without ``explr``, so the cell pip-installs the distribution
  ``<name of pyproject.toml>[book] @ git+<repository.url>@v<version>``, pinned to the release tag of
  ``explr.__version__`` (the README tells the maintainer to push it). Where ``explr`` is importable already
  (a clone after ``make install``: ``make book``, nbval, papermill) the cell does nothing, offline. It is
  tagged ``remove-cell``, so the HTML book does not show it;
* ``[project.urls]`` of ``pyproject.toml``, which the wheel's metadata carries (chapter 6's download of the
  committed results reads its ``Repository`` where pip recorded no URL: ``explr.cifar10.results``);
* ``repository-code``, ``url`` and ``version`` of ``CITATION.cff``;
* the README's install line and its line that says where to read the book (the GitHub Pages address
  ``https://<owner>.github.io/<repository>/`` once the URL is set, the local build while it is the
  placeholder).

    python .ci/colab_cell.py              # print the install cell in jupytext percent format
    python .ci/colab_cell.py --check      # is every derived copy current? (exit 1, one line each, if not)
    python .ci/colab_cell.py --fix        # rewrite every derived copy
    python .ci/colab_cell.py --published  # exit 1 with one line while repository.url is the placeholder

``--fix`` updates an existing install cell in place (no re-execution needed: it has no output). A newly
inserted cell has no execution count: re-execute that chapter afterwards (``make execute N=NN``).
"""
from __future__ import annotations

import argparse
import ast
import re
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
#: ``repository.url`` until a maintainer sets it; ``--published`` (pages.yml) refuses it.
PLACEHOLDER = "https://github.com/OWNER/explr-book"
SETTING = "repository.url in _config.yml"
#: the README's line that says where to read the book, found by this prefix
ONLINE = "**Online:**"


def repository_url(root: Path = ROOT) -> str:
    return yaml.safe_load((root / "_config.yml").read_text())["repository"]["url"].rstrip("/")


def is_placeholder(root: Path = ROOT) -> bool:
    return repository_url(root) == PLACEHOLDER


def version(root: Path = ROOT) -> str:
    """``explr.__version__``, read from ``src/explr/__init__.py`` without importing it (pyproject's version is
    that attribute too: ``dynamic = ["version"]``)."""
    tree = ast.parse((root / "src" / "explr" / "__init__.py").read_text())
    return next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets))


def release_tag(root: Path = ROOT) -> str:
    return "v" + version(root)


def distribution(root: Path = ROOT) -> str:
    return tomllib.loads((root / "pyproject.toml").read_text())["project"]["name"]


def book_url(repository: str) -> str:
    """GitHub Pages' address of a repository's site: ``https://github.com/o/r`` -> ``https://o.github.io/r/``
    (a repository named ``<o>.github.io`` is served at the root)."""
    match = re.fullmatch(r"https://github\.com/([A-Za-z0-9-]+)/([A-Za-z0-9._-]+?)(\.git)?/?", repository)
    if not match:
        raise ValueError(f"{SETTING}: {repository!r} is not https://github.com/<owner>/<repository>")
    owner, repo = match.group(1).lower(), match.group(2)
    site = f"https://{owner}.github.io/"
    return site if repo.lower() == f"{owner}.github.io" else f"{site}{repo}/"


def requirement(root: Path = ROOT, extras: str = "[book]") -> str:
    """pip requirement of the pinned release, e.g. ``explr-book[book] @ git+https://github.com/o/r@v0.1.0``."""
    return f"{distribution(root)}{extras} @ git+{repository_url(root)}@{release_tag(root)}"


def cell_source(root: Path = ROOT) -> str:
    return (
        f"{MARKER} this chapter imports, pinned to the\n"
        "# book's release. Does nothing where explr is installed already (a clone after\n"
        "# `make install`).\n"
        "import importlib.util\n"
        "import subprocess\n"
        "import sys\n"
        "\n"
        'if "google.colab" in sys.modules or importlib.util.find_spec("explr") is None:\n'
        f'    requirement = "{requirement(root)}"\n'
        '    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", requirement],\n'
        "                   check=True)\n"
        "    importlib.invalidate_caches()"
    )


def percent_cell(root: Path = ROOT) -> str:
    return f'# %% tags=["{TAG}"]\n{cell_source(root)}\n'


# ----------------------------------------------------------------------------- the text files' derived lines
def project_urls(root: Path = ROOT) -> str:
    repo = repository_url(root)
    return (f'[project.urls]\nHomepage = "{book_url(repo)}"\nRepository = "{repo}"\n'
            f'Changelog = "{repo}/blob/main/CHANGELOG.md"\nIssues = "{repo}/issues"\n')


def online_line(root: Path = ROOT) -> str:
    if is_placeholder(root):
        return (f"{ONLINE} not published yet (a fork publishes it at `https://<owner>.github.io/<repository>/`: "
                "[below](#validate-and-publish-a-fork)). Locally:")
    return f"{ONLINE} <{book_url(repository_url(root))}>. Or locally:"


def derived_texts(root: Path = ROOT) -> dict[str, list[tuple[str, str]]]:
    """{file: [(regular expression of a derived piece, its current text)]}: each piece occurs at least once."""
    repo = repository_url(root)
    return {
        "pyproject.toml": [(r"(?m)^\[project\.urls\]\n(?:[A-Za-z]+ = .*\n)+", project_urls(root))],
        "CITATION.cff": [(r"(?m)^repository-code: .*$", f'repository-code: "{repo}"'),
                         (r"(?m)^url: .*$", f'url: "{book_url(repo)}"'),
                         (r"(?m)^version: .*$", f"version: {version(root)}")],
        "README.md": [(rf"(?m)^{re.escape(ONLINE)} .*$", online_line(root)),
                      (r'pip install "[^"\s]+ @ git\+[^"\s]+"', f'pip install "{requirement(root, "")}"'),
                      (r"git tag v\S+ && git push origin v\S+`", f"git tag {release_tag(root)} && git push origin "
                                                                 f"{release_tag(root)}`")],
    }


def text_problems(root: Path = ROOT) -> list[str]:
    out = []
    for name, pieces in derived_texts(root).items():
        text = (root / name).read_text()
        for pattern, current in pieces:
            found = re.findall(pattern, text)
            if not found:
                out.append(f"{name}: nothing matches {pattern!r}, where a piece derived from {SETTING} belongs")
            out += [f"{name}: {piece.strip()!r} is not derived from {SETTING} (python .ci/colab_cell.py --fix)"
                    for piece in dict.fromkeys(found) if piece != current]
    return out


def fix_texts(root: Path = ROOT) -> list[str]:
    done = []
    for name, pieces in derived_texts(root).items():
        path = root / name
        text = new = path.read_text()
        for pattern, current in pieces:
            new = re.sub(pattern, lambda _: current, new)
        if new != text:
            path.write_text(new)
            done.append(f"{name}: updated")
    return done


# ----------------------------------------------------------------------------- the chapters' install cells
def toc_chapters() -> list[Path]:
    """Every notebook listed in _toc.yml (chapters, sections, parts), in order."""
    paths = [ROOT / f"{name}.ipynb" for name in toc_docnames()]
    return [p for p in paths if p.exists()]


def install_cells(nb) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.startswith(MARKER)]


def problems(path: Path, root: Path = ROOT) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    found = install_cells(nb)
    if not found:
        return [f"{path.name}: no install cell (python .ci/colab_cell.py --fix, then make execute)"]
    out = []
    if len(found) > 1:
        out.append(f"{path.name}: {len(found)} install cells, expected one")
    i = found[0]
    cell = nb.cells[i]
    if cell.source != cell_source(root):
        out.append(f"{path.name}: install cell differs from the current one (python .ci/colab_cell.py --fix)")
    if TAG not in cell.metadata.get("tags", []):
        out.append(f"{path.name}: install cell is not tagged {TAG!r}")
    first_code = next(j for j, c in enumerate(nb.cells) if c.cell_type == "code")
    if i != first_code:
        out.append(f"{path.name}: the install cell must be the first code cell")
    if cell.get("outputs"):
        out.append(f"{path.name}: the install cell printed something in the committed notebook")
    return out


def fix(path: Path, root: Path = ROOT) -> str:
    nb = nbformat.read(path, as_version=4)
    found = install_cells(nb)
    if found:
        cell = nb.cells[found[0]]
        if cell.source == cell_source(root) and TAG in cell.metadata.get("tags", []):
            return "up to date"
        cell.source = cell_source(root)
        cell.metadata["tags"] = sorted(set(cell.metadata.get("tags", [])) | {TAG})
        msg = "updated"
    else:
        first_code = next((j for j, c in enumerate(nb.cells) if c.cell_type == "code"), len(nb.cells))
        cell = nbformat.v4.new_code_cell(cell_source(root), metadata={"tags": [TAG]})
        if nb.get("nbformat_minor", 0) < 5:  # cell ids exist from nbformat 4.5 on
            cell.pop("id", None)
        nb.cells.insert(first_code, cell)
        msg = "inserted: re-execute this chapter (make execute N=...)"
    nbformat.write(nb, path)
    return msg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="check every derived copy (the chapters in _toc.yml)")
    ap.add_argument("--fix", action="store_true", help="rewrite every derived copy")
    ap.add_argument("--published", action="store_true", help=f"fail while {SETTING} is the placeholder")
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this script's)")
    ap.add_argument("notebooks", nargs="*", type=Path, help="default: every chapter in _toc.yml")
    args = ap.parse_args()
    root = args.root.resolve()
    paths = [p.resolve() for p in args.notebooks] or [root / p.relative_to(ROOT) for p in toc_chapters()]
    if args.published:
        if is_placeholder(root):
            print(f"{SETTING} is still the placeholder {PLACEHOLDER}: set it to this repository's GitHub URL "
                  "and run python .ci/colab_cell.py --fix (README: Validate and publish a fork)", file=sys.stderr)
            return 1
        return 0
    if args.fix:
        for line in fix_texts(root):
            print(line)
        for p in paths:
            print(f"{p.name}: {fix(p, root)}")
        return 0
    if args.check:
        issues = text_problems(root) + [m for p in paths for m in problems(p, root)]
        print("\n".join(issues) or f"derived from {SETTING}: up to date in {len(paths)} chapters and "
              f"{len(derived_texts(root))} files")
        return 1 if issues else 0
    print(percent_cell(root), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
