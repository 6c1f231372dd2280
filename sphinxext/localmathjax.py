"""Sphinx extension of the book: the HTML carries its own MathJax, the pinned copy, not a CDN's.

Sphinx loads MathJax from ``mathjax_path``; its default is jsDelivr's moving ``mathjax@3`` tag, which a
reader offline never gets and which is not the MathJax the browser check (tests/browser) runs.
_config.yml sets ``mathjax_path`` to a path under ``_static/`` (``mathjax/tex-mml-chtml.js``), and after
an HTML build this copies there, from the pinned django-static-mathjax of requirements.txt, that
combined component and the ES5 folders it loads from on demand (TeX extensions, fonts, menu,
accessibility): 11 MB. The browser check opens
the pages it built this way, with every outside request refused.
"""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path, PurePosixPath

from sphinx.errors import ExtensionError

#: MathJax's combined components (input, output and loader in one file), at the top of es5/
COMBINED = r"(tex|mml)-.*\.js$|node-main\.js$|latest\.js$"


def es5_dir() -> Path:
    """The ES5 components of the installed django-static-mathjax (``mathjax/static/mathjax/es5``)."""
    spec = importlib.util.find_spec("mathjax")
    if spec is None or not spec.submodule_search_locations:
        raise ExtensionError("no local MathJax: django-static-mathjax (requirements.txt) is not installed; "
                             "`make install`")
    return Path(list(spec.submodule_search_locations)[0]) / "static" / "mathjax" / "es5"


def version() -> str:
    """MathJax's version of that copy, from its package.json."""
    return json.loads((es5_dir().parent / "package.json").read_text())["version"]


def _local_path(path: str) -> PurePosixPath:
    """``mathjax_path`` as a path relative to ``_static``: a folder (the copy's place) and a component."""
    rel = PurePosixPath(path)
    if "://" in path or path.startswith("//") or rel.is_absolute() or ".." in rel.parts or len(rel.parts) < 2:
        raise ExtensionError(f"mathjax_path must be a path under _static such as mathjax/tex-mml-chtml.js, "
                             f"so that the book carries its MathJax; got {path!r}")
    if not (es5_dir() / rel.name).is_file():
        raise ExtensionError(f"mathjax_path {path!r}: MathJax {version()} has no component {rel.name!r} "
                             f"in {es5_dir()}")
    return rel


def _check(app, config) -> None:
    _local_path(config.mathjax_path)


def _copy(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    rel = _local_path(app.config.mathjax_path)
    src = es5_dir()

    def other_components(folder, names):
        """The combined components other than the one the book loads (tex-svg.js, mml-chtml.js, ...): 13 MB
        that no page requests. The folders it loads from on demand (TeX extensions, fonts, menu,
        accessibility) are copied whole."""
        if Path(folder) != src:
            return []
        return [n for n in names if n != rel.name and (src / n).is_file() and re.match(COMBINED, n)]

    shutil.copytree(src, Path(app.outdir) / "_static" / rel.parent, ignore=other_components, dirs_exist_ok=True)


def setup(app):
    app.setup_extension("sphinx.ext.mathjax")
    app.connect("config-inited", _check)
    app.connect("build-finished", _copy)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
