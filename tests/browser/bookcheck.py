"""Helpers of the browser check (see conftest.py): the pages of _toc.yml, the no-execution build,
Chromium with every outside request refused, and the local-link checker."""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
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
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


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
    # paths of local extensions are relative to the configuration file, which moves to BUILD
    local = cfg.get("sphinx", {}).get("local_extensions") or {}
    for name, path in local.items():
        local[name] = str((ROOT / path).resolve())
    BUILD.mkdir(parents=True, exist_ok=True)
    (BUILD / "_config.yml").write_text(yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb), "build", str(ROOT), "--config", str(BUILD / "_config.yml"), "--path-output", str(BUILD),
           "--all", "--warningiserror", "--nitpick", "--keep-going"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - start


@functools.cache
def localmathjax():
    """sphinxext/localmathjax.py, the Sphinx extension that copies the pinned MathJax into the built book."""
    spec = importlib.util.spec_from_file_location("localmathjax", ROOT / "sphinxext" / "localmathjax.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LOCAL = ("file:", "data:", "blob:", "about:")


class Browser:
    """One Chromium context (fresh profile) for the session; ``open(url)`` gives a page and its log.

    Requests: file:// (and data:, blob:, about:) pass, every other one is refused, and a page's log
    lists those it made in ``outside``: the check runs offline and sees what a reader offline sees."""

    def __init__(self, context):
        self.context = context
        context.route("**/*", lambda r: r.continue_() if r.request.url.startswith(LOCAL) else r.abort())

    def open(self, url: str):
        page = self.context.new_page()
        page.set_default_timeout(30_000)
        log = {"pageerrors": [], "failed": [], "outside": []}
        page.on("pageerror", lambda e: log["pageerrors"].append(str(e)))
        page.on("request", lambda r: None if r.url.startswith(LOCAL) else log["outside"].append(r.url))
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


# ----------------------------------------------------------------------------- layout: what fits the column
MIN_SVG_TEXT_PX = 9.0   # smallest text in a figure, as displayed
# super- and subscripts (the exponent of a 10^7 tick label) are typeset at 70 % of their text:
# they need 70 % of the 9 px, as in print
MIN_SVG_SCRIPT_PX = 0.7 * MIN_SVG_TEXT_PX
MIN_LEGEND_PX = 10.0    # a legend's text, as displayed: it names the curves, and is read beside them
RASTER_OVERSAMPLING = 2.0  # a raster figure needs naturalWidth >= this x its displayed width

# Measured in the page at 1280 px (after MathJax): display equations and tables wider than their
# column, `pre` blocks (code cells, text outputs; collapsed ones opened for the measurement) that
# scroll sideways, and every image of the article with its natural and displayed width.
LAYOUT = r"""
() => {
  const article = document.querySelector('article.bd-article') || document.body;
  const closed = [...article.querySelectorAll('details:not([open])')];
  closed.forEach(d => d.open = true);
  const cs = getComputedStyle(article);
  const column = article.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
  const tex = new Map();
  try {
    for (const item of MathJax.startup.document.math) {
      if (item.typesetRoot) tex.set(item.typesetRoot, item.math);
    }
  } catch (e) {}
  const wideMath = [...article.querySelectorAll('mjx-container[display="true"]')].map(c => {
    const inner = c.querySelector('mjx-math') || c;
    const box = c.closest('div.math') || c.parentElement;
    const eqno = box.querySelector('span.eqno');
    const avail = Math.min(box.clientWidth || column, column) - (eqno ? eqno.getBoundingClientRect().width : 0);
    return {width: Math.round(inner.getBoundingClientRect().width), avail: Math.round(avail),
            scrolls: c.scrollWidth > c.clientWidth + 1,
            tex: (tex.get(c) || c.textContent).replace(/\s+/g, ' ').trim().slice(0, 70)};
  }).filter(m => m.width > m.avail + 1 || m.scrolls);
  const widePre = [...article.querySelectorAll('pre')]
    .filter(p => p.clientWidth > 0 && p.scrollWidth > p.clientWidth + 1)
    .map(p => {
      const longest = p.textContent.split('\n').reduce((a, b) => b.length > a.length ? b : a, '');
      return {over: p.scrollWidth - p.clientWidth, chars: longest.length, line: longest.trim().slice(0, 60),
              output: !!p.closest('.cell_output, .output')};
    });
  // a table wider than the column (the theme then scrolls it in a container, cutting its header)
  const wideTables = [...article.querySelectorAll('table')].map(t => {
    const width = t.getBoundingClientRect().width;
    const holder = t.closest('.pst-scrollable-table-container, .cell_output, div.table-wrapper') || t.parentElement;
    return {width: Math.round(width), avail: Math.round(Math.min(column, holder.clientWidth || column)),
            columns: t.rows.length ? t.rows[0].cells.length : 0,
            head: (t.rows.length ? t.rows[0].textContent : '').replace(/\s+/g, ' ').trim().slice(0, 60)};
  }).filter(t => t.width > 0 && t.width > t.avail + 1);
  const images = [...article.querySelectorAll('img')].map(i => ({
    src: i.currentSrc || i.src, natural: i.naturalWidth, shown: i.getBoundingClientRect().width}));
  closed.forEach(d => d.open = false);
  return {column: Math.round(column), wideMath, widePre, wideTables, images};
}
"""


def _is_svg(src: str) -> bool:
    return bool(re.search(r"\.svg([?#]|$)", src)) or src.startswith("data:image/svg")


def _length(value: str | None) -> float | None:
    m = re.match(r"\s*([0-9.]+)", value or "")
    return float(m.group(1)) if m else None


_SCALE = re.compile(r"scale\(\s*([-0-9.eE]+)(?:[ ,]+([-0-9.eE]+))?\s*\)")
_MATRIX = re.compile(r"matrix\(\s*([-0-9.eE]+)[ ,]+([-0-9.eE]+)[ ,]+([-0-9.eE]+)[ ,]+([-0-9.eE]+)")
_FONT_PX = re.compile(r"font(?:-size)?\s*:[^;]*?([0-9.]+)px")


def _transform_scale(transform: str | None) -> float:
    s = 1.0
    for m in _SCALE.finditer(transform or ""):
        sx = abs(float(m.group(1)))
        sy = abs(float(m.group(2))) if m.group(2) else sx
        s *= (sx * sy) ** 0.5
    for m in _MATRIX.finditer(transform or ""):
        a, b, c, d = (float(g) for g in m.groups())
        s *= abs(a * d - b * c) ** 0.5
    return s


def svg_text_sizes(svg_text: str) -> tuple[float | None, list[tuple[float, bool, bool]]]:
    """(the SVG's width in user units, [(font size in user units, is a script, is in a legend)] of every piece
    of text; matplotlib writes a legend as ``<g id="legend_1">``).

    matplotlib writes figures with ``svg.fonttype: none`` as ``<text style="font: 10px 'DejaVu Sans'">``
    inside ``<svg width="540pt" viewBox="0 0 540 237.6">``: user units are the viewBox's; scales of
    ``transform`` attributes apply. Mathtext (``$10^{7}$``) is a ``<text>`` of ``<tspan>`` pieces; a
    piece smaller than the largest of its ``<text>`` is a super- or subscript."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(svg_text)
    view = (root.get("viewBox") or "").replace(",", " ").split()
    width = float(view[2]) if len(view) == 4 else _length(root.get("width"))
    sizes: list[tuple[float, bool, bool]] = []

    def own_size(el, inherited):
        m = _FONT_PX.search(el.get("style") or "")
        if m:
            return float(m.group(1))
        return _length(el.get("font-size")) or inherited

    def walk(el, scale, inherited, legend=False):
        scale *= _transform_scale(el.get("transform"))
        size = own_size(el, inherited)
        legend = legend or (el.get("id") or "").startswith("legend")
        if el.tag.rsplit("}", 1)[-1] == "text":
            pieces = [(size * scale, (el.text or "").strip())] if (el.text or "").strip() else []
            for span in el.iter():
                if span is not el and span.tag.rsplit("}", 1)[-1] == "tspan" and (span.text or "").strip():
                    span_size = own_size(span, size)
                    pieces.append((span_size * scale * _transform_scale(span.get("transform")), span.text))
            if pieces and all(p[0] for p in pieces):
                largest = max(p[0] for p in pieces)
                sizes.extend((p[0], p[0] < 0.95 * largest, legend) for p in pieces)
            return
        for child in el:
            walk(child, scale, size, legend)

    walk(root, 1.0, None)
    return width, sizes


def layout_problems(layout: dict) -> dict[str, list[str]]:
    """The layout faults of one page, by check: 'wide equation', 'wide code or output', 'wide table',
    'low-resolution raster', 'small SVG text'."""
    out: dict[str, list[str]] = {}
    for m in layout["wideMath"]:
        out.setdefault("wide equation", []).append(
            f"display equation {m['width']} px wide in a {m['avail']} px column: {m['tex']!r}")
    for p in layout["widePre"]:
        what = "text output" if p["output"] else "code"
        out.setdefault("wide code or output", []).append(
            f"{what} scrolls sideways by {p['over']} px (longest line {p['chars']} characters: {p['line']!r})")
    for t in layout["wideTables"]:
        out.setdefault("wide table", []).append(
            f"table of {t['columns']} columns {t['width']} px wide in a {t['avail']} px column: {t['head']!r}")
    for img in layout["images"]:
        src, shown = img["src"], img["shown"]
        if shown <= 0:
            continue
        name = unquote(urlsplit(src).path).rsplit("/", 1)[-1] if not src.startswith("data:") else "inline image"
        if not _is_svg(src):
            if img["natural"] < RASTER_OVERSAMPLING * shown:
                out.setdefault("low-resolution raster", []).append(
                    f"{name}: a raster {img['natural']} px wide shown at {shown:.0f} px (needs SVG, or "
                    f">= {RASTER_OVERSAMPLING:g}x: {RASTER_OVERSAMPLING * shown:.0f} px)")
            continue
        if not src.startswith("file:"):
            continue
        try:
            width, sizes = svg_text_sizes(Path(unquote(urlsplit(src).path)).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:  # ParseError is a ValueError... and SyntaxError
            out.setdefault("small SVG text", []).append(f"{name}: unreadable SVG ({err})")
            continue
        except SyntaxError as err:
            out.setdefault("small SVG text", []).append(f"{name}: unreadable SVG ({err})")
            continue
        if not width or not sizes:
            continue
        for kind, least, what in (("text", MIN_SVG_TEXT_PX, "text"), ("script", MIN_SVG_SCRIPT_PX, "super/subscript"),
                                  ("legend", MIN_LEGEND_PX, "legend text")):
            chosen = [size for size, script, legend in sizes if kind == ("script" if script else "text")
                      or (kind == "legend" and legend and not script)]
            if chosen and min(chosen) * shown / width < least:
                out.setdefault("small SVG text", []).append(
                    f"{name}: smallest {what} {min(chosen) * shown / width:.1f} px as displayed ({min(chosen):g} of "
                    f"{width:g} user units shown {shown:.0f} px wide; needs >= {least:g} px)")
    return out
