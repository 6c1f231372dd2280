"""Helpers of the browser check (see conftest.py): the pages of _toc.yml, the no-execution build,
Chromium with an offline MathJax, and the local-link checker."""
from __future__ import annotations

import importlib.util
import mimetypes
import os
import re
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import yaml

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "_build" / "browser"
HTML = BUILD / "_build" / "html"
ARTIFACTS = ROOT / "test-artifacts"
SCREENSHOTS = ARTIFACTS / "screenshots"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
# Sphinx's default mathjax_path is https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js
MATHJAX_CDN = re.compile(r"^https://cdn\.jsdelivr\.net/npm/mathjax@3[^/]*/(.+)$")


def toc_docnames() -> list[str]:
    """Every page of _toc.yml in reading order: the root, then its chapters/parts/sections."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    names = [toc["root"]]

    def walk(entries):
        for e in entries or []:
            if "file" in e:
                names.append(e["file"])
            for key in ("chapters", "sections", "parts"):
                walk(e.get(key))

    walk((toc.get("chapters") or []) + (toc.get("parts") or []))
    return [str(Path(n).with_suffix("")) for n in names]


def config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def build_book() -> tuple[int, str, float]:
    """Build the HTML book from the committed notebooks (execution off), -W -n, into _build/browser.

    The configuration is _config.yml with only ``execute.execute_notebooks`` set to ``off``.
    Returns (exit code, log, seconds)."""
    cfg = config()
    cfg.setdefault("execute", {})["execute_notebooks"] = "off"
    BUILD.mkdir(parents=True, exist_ok=True)
    (BUILD / "_config.yml").write_text(yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb), "build", str(ROOT), "--config", str(BUILD / "_config.yml"), "--path-output", str(BUILD),
           "--all", "--warningiserror", "--nitpick", "--keep-going"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - start


def mathjax_dir() -> Path | None:
    """The MathJax 3.2.2 files of django-static-mathjax (requirements.txt), served in place of the CDN."""
    spec = importlib.util.find_spec("mathjax")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "static" / "mathjax"


class Browser:
    """One Chromium context (fresh profile) for the session; ``open(url)`` gives a page and its log.

    Requests: file:// pass, MathJax's CDN is answered from the local copy, everything else outside
    is refused (and listed in ``blocked``): the check runs offline and sees what a reader sees."""

    def __init__(self, context, mathjax: Path):
        self.context = context
        self.blocked: list[str] = []

        def route(r):
            url = r.request.url
            if url.startswith(("file:", "data:", "blob:", "about:")):
                return r.continue_()
            m = MATHJAX_CDN.match(url)
            if m:
                local = mathjax / unquote(m.group(1)).split("?")[0]
                if local.is_file():
                    ctype = mimetypes.guess_type(local.name)[0] or "application/octet-stream"
                    return r.fulfill(status=200, body=local.read_bytes(), content_type=ctype,
                                     headers={"Access-Control-Allow-Origin": "*"})
                return r.fulfill(status=404, body="not in the local MathJax copy")
            self.blocked.append(url)
            return r.abort()

        context.route("**/*", route)

    def open(self, url: str):
        page = self.context.new_page()
        page.set_default_timeout(30_000)
        log = {"pageerrors": [], "failed": []}
        page.on("pageerror", lambda e: log["pageerrors"].append(str(e)))
        page.on("requestfailed",
                lambda r: log["failed"].append(f"{r.url} ({r.failure})") if r.url.startswith("file:") else None)
        page.goto(url, wait_until="load")
        return page, log


class _Ids(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k in ("id", "name") and v:
                self.ids.add(v)


_IDS: dict[Path, set[str]] = {}


def anchors(path: Path) -> set[str]:
    """The ids (and names) of the elements of an HTML file: the valid #fragments of links to it."""
    if path not in _IDS:
        parser = _Ids()
        parser.feed(path.read_text(encoding="utf-8", errors="replace"))
        _IDS[path] = parser.ids
    return _IDS[path]


def broken_local_link(href: str, root: Path) -> str | None:
    """Why a file:// link of the built book is broken (outside the book, missing file, missing
    #anchor), or None if it is fine or not local."""
    parts = urlsplit(href)
    if parts.scheme != "file":
        return None
    target = Path(unquote(parts.path))
    try:
        target.resolve().relative_to(root.resolve())
    except ValueError:
        return f"{href}: points outside the built book"
    if target.is_dir():
        target = target / "index.html"
    if not target.exists():
        return f"{href}: no such file"
    fragment = unquote(parts.fragment)
    if fragment and target.suffix == ".html" and fragment not in anchors(target):
        return f"{href}: no element with id {fragment!r}"
    return None
