"""Every page of the book, opened in headless Chromium as a reader would meet it.

Per page of _toc.yml (so chapters added to _toc.yml are covered without touching this file):
MathJax typeset every formula (no raw ``$$``/``\\(`` left, no MathJax error for an unknown macro), with
the MathJax the book carries (its ``_static/mathjax``, the pinned copy) while every request outside the
book is refused;
every image loaded; no error output, no stderr warning, no docutils error in the page; every
local link resolves, to a file and, for ``#anchor`` links, to an element with that id; no
JavaScript exception and no missing local resource. A page that fails leaves two full-page
screenshots in test-artifacts/screenshots/, at 1280 and at 800 px; ``BOOKCHECK_SCREENSHOTS=all``
(``make browser-check`` sets it) takes them of every page. (They cost about half the
check's time, so ``make test`` takes them only where they explain a failure.)

Chapter pages also: theorems/lemmas/definitions and figures carry the chapter's number
(``Lemma 1.2``, ``Fig. 1.3``) in one running sequence, every plot is a numbered figure with a
caption, plumbing code is collapsed, long outputs scroll (tables and ``full-output`` cells are
shown whole, never clipped), the install cell is not shown, and the Colab and Binder buttons point
at this chapter's notebook.

Layout, per page at 1280 px (bookcheck.layout_problems): no display equation and no table wider than
the text column, no code cell or text output that scrolls sideways, every figure an SVG or a raster of at
least twice its displayed width, and SVG text at least 9 px as displayed (super- and subscripts
6.3 px, legends 10 px).  A section shows at most one collapsed-code bar (_static/foldcode.js); every page has
a favicon and declares sphinx-thebe's THEBE_JS_URL once.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from bookcheck import LAYOUT, ROOT, broken_local_link, config, layout_problems, localmathjax, toc_docnames

PAGES = toc_docnames()
# the chapters are the numbered notebooks; other pages (the notation page) are checked as pages
CHAPTERS = [d for d in PAGES[1:] if (ROOT / f"{d}.ipynb").exists()]

PROOF_KINDS = ("Theorem|Lemma|Definition|Remark|Corollary|Proposition|Example|Assumption|Axiom|"
               "Conjecture|Criterion|Property|Observation|Notation|Algorithm")

INSPECT = r"""
() => {
  // shown to a reader: not inside a closed <details> (collapsed cells) and rendered
  const visible = el => !el.closest('details:not([open])') &&
      (el.checkVisibility ? el.checkVisibility() : !!(el.offsetWidth || el.offsetHeight));
  const article = document.querySelector('article.bd-article') || document.body;
  // prose text: the article without code, rendered math and scripts
  const clone = article.cloneNode(true);
  clone.querySelectorAll('pre, code, .highlight, mjx-container, script, style, .cell_input')
       .forEach(e => e.remove());
  const prose = clone.textContent;
  const math = [...article.querySelectorAll('span.math, div.math')];
  return {
    title: document.title,
    h1: (article.querySelector('h1') || {}).textContent || '',
    mathCount: math.length,
    mathjax: window.MathJax && MathJax.version ? MathJax.version : null,
    mathjaxScripts: [...document.scripts].map(s => s.src).filter(s => /mathjax/i.test(s)),
    mathUnrendered: math.filter(m => !m.querySelector('mjx-container')).map(m => m.textContent.slice(0, 80)),
    mathErrors: [...article.querySelectorAll('mjx-merror')].map(e => e.getAttribute('data-mjx-error') || e.textContent),
    rawTex: (prose.match(/\$\$|\\\(|\\\)|\\\[|\\\]|\\begin\{|\$\\[A-Za-z]+/g) || []),
    images: [...document.images].map(i => ({src: i.currentSrc || i.src, w: i.naturalWidth, complete: i.complete})),
    tracebacks: article.querySelectorAll('.cell_output .traceback, .cell_output .output.error').length,
    // a markdown table printed as text ("| a | b |" then "|---|"): an output that was not rendered
    rawTables: [...article.querySelectorAll('p, .cell_output .output.text_markdown, .cell_output div')]
        .filter(e => !e.querySelector('table, pre') && /\|\s*:?-{3,}:?\s*\|/.test(e.textContent))
        .map(e => e.textContent.trim().slice(0, 80)),
    stderr: [...article.querySelectorAll('.cell_output .output.stderr')].map(e => e.textContent.slice(0, 200)),
    docutilsErrors: [...article.querySelectorAll('.system-message, .problematic')].map(e => e.textContent.slice(0, 120)),
    links: [...document.querySelectorAll('a[href], link[rel~=icon]')].map(a => a.href),
    favicon: !!document.querySelector('link[rel~=icon]'),
    thebeSettings: [...document.scripts].filter(s => /\bTHEBE_JS_URL\s*=/.test(s.textContent)).length,
    proofs: [...article.querySelectorAll('div.proof .caption-number')].map(e => e.textContent.trim()),
    // caption text as displayed: its weight (the theme's 300 is hard to read) and colour
    captionStyles: [...article.querySelectorAll('figcaption .caption-text')].map(e => {
        const st = getComputedStyle(e); return {weight: +st.fontWeight, color: st.color}; }),
    bodyColor: getComputedStyle(article.querySelector('p') || article).color,
    figures: [...article.querySelectorAll('figure')].map(f => ({
        number: ((f.querySelector('figcaption .caption-number') || {}).textContent || '').trim(),
        caption: ((f.querySelector('figcaption .caption-text') || {}).textContent || '').trim(),
        id: f.id})),
    outputImagesOutsideFigures: [...article.querySelectorAll('.cell_output img')].filter(i => !i.closest('figure')).length,
    equations: [...article.querySelectorAll('span.eqno')].map(e => e.firstChild.textContent.trim()),
    hiddenInputsVisible: [...article.querySelectorAll('.cell.tag_hide-input .cell_input pre')].filter(visible).length,
    hiddenInputs: article.querySelectorAll('.cell.tag_hide-input').length,
    // the collapsed-code bars a section shows (_static/foldcode.js folds them into one)
    barsPerSection: Math.max(0, ...[...article.querySelectorAll('section')].map(s =>
        [...s.querySelectorAll('details.hide > summary')]
          .filter(x => x.closest('section') === s && x.getClientRects().length > 0).length)),
    // long outputs scroll, except the ones shown whole on purpose: tables, and full-output cells
    outputsNotScrolling: [...article.querySelectorAll('.cell_output')].filter(o => {
        if (o.querySelector('table') || o.closest('.cell.tag_full-output')) return false;
        const s = getComputedStyle(o); return s.maxHeight === 'none' || !['auto', 'scroll'].includes(s.overflowY);
    }).length,
    tablesClipped: [...article.querySelectorAll('.cell_output')].filter(o =>
        (o.querySelector('table') || o.closest('.cell.tag_full-output')) && o.scrollHeight > o.clientHeight + 1).length,
    installCellShown: article.textContent.includes('google.colab'),
    launch: [...document.querySelectorAll('a[href]')].map(a => a.href)
              .filter(h => /colab\.research\.google\.com|mybinder\.org/.test(h)),
  };
}
"""


def _ready(page, log: dict | None = None) -> None:
    """Wait until MathJax has typeset the page and every image (lazy ones too) has loaded."""
    if page.evaluate("() => !!document.querySelector('span.math, div.math')"):
        try:
            page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
        except PlaywrightTimeout:
            refused = log["outside"] if log else "not recorded"
            raise AssertionError(f"MathJax did not start within 30 s (requests outside the book, refused: {refused}); "
                                 "the book must load its own copy (mathjax_path in _config.yml)") from None
        page.evaluate("() => MathJax.startup.promise.then(() => true)")
    page.evaluate("() => document.querySelectorAll('img[loading=lazy]').forEach(i => i.loading = 'eager')")
    page.wait_for_function("() => [...document.images].every(i => i.complete)")


def _url(html: Path, docname: str) -> str:
    return (html / f"{docname}.html").as_uri()


def _problems(report: dict, html: Path, log: dict) -> list[str]:
    out = []
    if log["outside"]:
        out.append(f"requests outside the book (refused: the book must work offline): {log['outside'][:5]}")
    if report["mathCount"]:
        own = (html / "_static" / "mathjax").as_uri() + "/"
        foreign = [s for s in report["mathjaxScripts"] if not s.startswith(own)]
        if foreign or not report["mathjaxScripts"]:
            out.append(f"MathJax not loaded from the book's own {own}: {report['mathjaxScripts']} "
                       "(mathjax_path in _config.yml, sphinxext/localmathjax.py)")
        elif report["mathjax"] != localmathjax().version():
            out.append(f"MathJax {report['mathjax']} ran, not the pinned {localmathjax().version()}")
    if report["mathUnrendered"]:
        out.append(f"MathJax did not typeset {len(report['mathUnrendered'])} of {report['mathCount']} formulas, "
                   f"e.g. {report['mathUnrendered'][:3]}")
    if report["mathErrors"]:
        out.append(f"MathJax errors (unknown macro?): {report['mathErrors'][:5]}")
    if report["rawTex"]:
        out.append(f"raw TeX left in the text: {sorted(set(report['rawTex']))}")
    bad_images = [i["src"] for i in report["images"] if not (i["complete"] and i["w"] > 0)]
    if bad_images:
        out.append(f"images that did not load: {bad_images}")
    if report["tracebacks"]:
        out.append(f"{report['tracebacks']} error output(s)")
    if report["rawTables"]:
        out.append(f"markdown tables shown as text, not rendered: {report['rawTables'][:3]}")
    warnings = [s for s in report["stderr"] if re.search(r"Warning|Error|Traceback", s)]
    if warnings:
        out.append(f"warnings/errors on stderr: {warnings}")
    if report["docutilsErrors"]:
        out.append(f"docutils errors in the page: {report['docutilsErrors']}")
    broken = sorted({b for b in (broken_local_link(h, html) for h in report["links"]) if b})
    if broken:
        out.append("broken internal links:\n    " + "\n    ".join(broken))
    if log["pageerrors"]:
        out.append(f"JavaScript errors: {log['pageerrors']}")
    # sphinx-thebe's settings, once (sphinxext/onescript.py): a second `const THEBE_JS_URL` throws
    if report["thebeSettings"] > 1:
        out.append(f"THEBE_JS_URL declared {report['thebeSettings']} times")
    if not report["favicon"]:
        out.append("no favicon (html.favicon in _config.yml)")
    if log["failed"]:
        out.append(f"local resources that failed to load: {log['failed']}")
    return out


def _chapter_problems(report: dict, docname: str) -> list[str]:
    out = []
    m = re.match(r"\s*(\d+)\.", report["h1"])
    if not m:
        return [f"chapter title {report['h1']!r} is not numbered (numbered: in _toc.yml)"]
    n = m.group(1)
    # theorems, lemmas, definitions, ...: one running counter per chapter, prefixed by the chapter
    numbers = []
    for label in report["proofs"]:
        pm = re.fullmatch(rf"({PROOF_KINDS}) (\d+)\.(\d+)", label)
        if not pm or pm.group(2) != n:
            out.append(f"proof directive numbered {label!r}, expected '<Kind> {n}.<k>'")
        else:
            numbers.append(int(pm.group(3)))
    if numbers != list(range(1, len(numbers) + 1)):
        out.append(f"theorem-like numbers are not one running sequence: {report['proofs']}")
    figures = [f["number"] for f in report["figures"]]
    expected = [f"Fig. {n}.{k}" for k in range(1, len(figures) + 1)]
    if figures != expected:
        out.append(f"figure numbers {figures}, expected {expected}")
    if not figures and not report["outputImagesOutsideFigures"]:
        out.append("no plot at all: was the notebook committed without its outputs?")
    if any(not f["caption"] for f in report["figures"]):
        out.append("a figure without caption")
    faint = [c for c in report["captionStyles"] if c["weight"] < 400 or c["color"] != report["bodyColor"]]
    if faint:
        out.append(f"{len(faint)} captions lighter than the text (weight {faint[0]['weight']}, {faint[0]['color']}; "
                   f"the text {report['bodyColor']}): _static/book.css")
    if report["outputImagesOutsideFigures"]:
        out.append(f"{report['outputImagesOutsideFigures']} plot(s) not in a numbered figure: give the cell "
                   "metadata mystnb.figure.caption/name (CONTRIBUTING.md)")
    if any(not re.fullmatch(rf"\({n}\.\d+\)", e) for e in report["equations"]):
        out.append(f"equation numbers {report['equations']}, expected '({n}.<k>)'")
    if report["hiddenInputsVisible"]:
        out.append(f"{report['hiddenInputsVisible']} hide-input cells show their code expanded")
    if report["barsPerSection"] > 1:
        out.append(f"a section shows {report['barsPerSection']} collapsed-code bars, not one (_static/foldcode.js)")
    if report["outputsNotScrolling"]:
        out.append(f"{report['outputsNotScrolling']} outputs do not scroll (nb_scroll_outputs)")
    if report["tablesClipped"]:
        out.append(f"{report['tablesClipped']} table or full-output outputs are clipped by a scroll box")
    if report["installCellShown"]:
        out.append("the Colab install cell is shown (tag it remove-cell)")
    repo = config().get("repository", {})
    org_repo = repo.get("url", "").rstrip("/").split("github.com/")[-1]
    branch = repo.get("branch", "main")
    want = {
        "Colab": f"https://colab.research.google.com/github/{org_repo}/blob/{branch}/{docname}.ipynb",
        "Binder": f"https://mybinder.org/v2/gh/{org_repo}/{branch}?urlpath=lab/tree/{docname}.ipynb",
    }
    for name, link in want.items():
        if link not in report["launch"]:
            out.append(f"no {name} launch button for this notebook ({link}); found {report['launch']}")
    return out


#: whether every page gets its screenshots, or only a page that fails
ALL_SCREENSHOTS = os.environ.get("BOOKCHECK_SCREENSHOTS") == "all"
CITES_JS = "ss => ss.map(s => [s.textContent, [...s.querySelectorAll('a')].map(a => a.href)])"
#: docname → its citations, [text, [hrefs]], read while test_page has the page open
CITES: dict[str, list] = {}


@pytest.mark.parametrize("docname", PAGES)
def test_page(docname, book_html, browser, screenshots):
    html = book_html
    assert (html / f"{docname}.html").exists(), f"{docname} of _toc.yml was not built"
    page, log = browser.open(_url(html, docname))
    name = docname.replace("/", "__")
    try:
        _ready(page, log)
        report = page.evaluate(INSPECT)
        layout = page.evaluate(LAYOUT)
        CITES[docname] = page.eval_on_selector_all("article span.bibtex-citation", CITES_JS)
        problems = _problems(report, html, log)
        if docname in CHAPTERS:
            problems += _chapter_problems(report, docname)
        for check, found in layout_problems(layout).items():
            problems += [f"{check}: {f}" for f in found]
        if problems or ALL_SCREENSHOTS:
            page.screenshot(path=str(screenshots / f"{name}.png"), full_page=True)
            page.set_viewport_size({"width": 800, "height": 900})
            page.wait_for_timeout(300)
            page.screenshot(path=str(screenshots / f"{name}@800px.png"), full_page=True)
    finally:
        page.close()
    assert not problems, f"{docname} (screenshots: test-artifacts/screenshots/{name}*.png):\n  " + \
        "\n  ".join(problems)


LANDING = r"""
() => {
  const fig = document.querySelector('article figure#fig-landing');
  const img = fig && fig.querySelector('img');
  const table = [...document.querySelectorAll('article table')]
      .find(t => /Paper/.test((t.querySelector('thead') || {}).textContent || ''));
  const toc = document.querySelector('article .toctree-wrapper');
  const rows = table ? [...table.querySelectorAll('tbody tr')].map(r => [...r.cells].map(c => c.textContent.trim())) : null;
  return {figure: !!fig, figureLoaded: !!(img && img.complete && img.naturalWidth > 0),
          figureSrc: img ? img.currentSrc || img.src : '',
          caption: fig ? ((fig.querySelector('figcaption') || {}).textContent || '').trim() : '',
          rows,
          refs: table ? [...table.querySelectorAll('a.reference.internal')].map(a => a.textContent.trim()) : [],
          // the list of chapters comes before the long results table
          tocFirst: !!(toc && table && (toc.compareDocumentPosition(table) & Node.DOCUMENT_POSITION_FOLLOWING))};
}
"""


def _results_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("results_table", ROOT / ".ci" / "results_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["results_table"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_landing_page(book_html, browser):
    """The root page: its figure, its results table (every paper result with a resolved book number and
    a check), the bibliography is there and cited, every chapter is linked in order, before the table."""
    page, log = browser.open(_url(book_html, PAGES[0]))
    try:
        _ready(page, log)
        entries = page.locator("div.citation, .bibliography .citation, dl.citation > dt").count()
        toc_links = page.eval_on_selector_all(
            "article .toctree-wrapper a.reference.internal", "as => as.map(a => a.getAttribute('href'))")
        landing = page.evaluate(LANDING)
    finally:
        page.close()
    assert landing["figure"] and landing["figureLoaded"], "the landing page has no figure fig-landing that loads"
    assert landing["caption"], "the landing figure has no caption"
    assert landing["tocFirst"], "the landing page lists the chapters after the results table"
    assert landing["figureSrc"].endswith(".svg"), f"the landing figure is not an SVG: {landing['figureSrc']}"
    rows = landing["rows"]
    assert rows, "the landing page has no results table (a table whose header names 'Paper')"
    papers = {name for name, *_ in _results_module().RESULTS}
    missing = [n for n in papers if not any(re.search(rf"(^|, ){re.escape(n)}(,|$)", r[0]) for r in rows)]
    assert not missing, f"results table lacks {missing}"
    unresolved = [r for r in landing["refs"] if not re.match(rf"({PROOF_KINDS}|Chapter) ?\d|\d+$", r)]
    assert not unresolved, f"results table: book numbers that did not resolve: {unresolved}"
    no_check = [r[0] for r in rows if "no check line" in " ".join(r)]
    assert not no_check, f"results table: no check line for {no_check} (was a chapter committed unexecuted?)"
    assert all(r[4].startswith(("✓", "skipped")) for r in rows if r[4]), "results without ✓ or skipped"
    assert entries >= 1, "no bibliography entries on the landing page"
    linked = [re.sub(r"\.html(#.*)?$", "", h).split("/")[-1] for h in toc_links]
    wanted = [Path(c).name for c in CHAPTERS]
    assert [x for x in linked if x in wanted] == wanted, f"landing page lists {linked}, _toc.yml has {wanted}"


BIB_LABELS = r"""
() => Object.fromEntries([...document.querySelectorAll('[id]')].map(e => {
  const entry = e.closest('div.citation, dl.citation > dt') || e.querySelector('div.citation');
  const label = entry && (entry.querySelector('span.label') || entry);
  return [e.id, label ? label.textContent.replace(/^\[|\]$/g, '').trim() : null];
}).filter(([, v]) => v))
"""


def test_citations_resolve_to_the_bibliography(book_html, browser):
    """Every {cite} in a chapter links to an entry of the bibliography (not a '?' or a dead anchor)."""
    missing, cited, all_cites = [], 0, []
    for docname in CHAPTERS:
        if docname not in CITES:  # test_page did not run on it (pytest -k)
            page, _ = browser.open(_url(book_html, docname))
            try:
                CITES[docname] = page.eval_on_selector_all("article span.bibtex-citation", CITES_JS)
            finally:
                page.close()
        cites = CITES[docname]
        cited += len(cites)
        for text, hrefs in cites:
            if not hrefs or "?" in text:
                missing.append(f"{docname}: unresolved citation {text!r}")
            missing += [f"{docname}: {b}" for b in (broken_local_link(h, book_html) for h in hrefs) if b]
            all_cites.append((docname, text, hrefs))
    assert cited, "no chapter cites anything"
    assert not missing, "\n".join(missing)
    # the citation reads as the bibliography's label: "[Li and Arora, 2020]" / "Li and Arora [2020]"
    # in the text, "[Li and Arora, 2020]" in the list (not "[LA20]")
    labels = {}
    for page_url in sorted({h.split("#")[0] for *_, hrefs in all_cites for h in hrefs}):
        page, _ = browser.open(page_url)
        try:
            labels.update({f"{page_url}#{k}": v for k, v in page.evaluate(BIB_LABELS).items()})
        finally:
            page.close()
    disagree = []
    for docname, text, hrefs in all_cites:
        wanted = {labels.get(h) for h in hrefs}
        m = re.fullmatch(r"\[(.*)\]", text.strip())
        shown = set(m.group(1).split("; ")) if m else {re.sub(r"\s*\[(.*)\]$", r", \1", text.strip())}
        if shown != wanted:
            disagree.append(f"{docname}: citation {text!r}, bibliography label(s) {sorted(map(str, wanted))}")
    assert not disagree, "citations and bibliography labels differ:\n" + "\n".join(disagree)


def test_generated_pages(book_html, browser):
    """The pages Sphinx adds (index of terms, proof index, search): they load and their links resolve."""
    toc_files = {(book_html / f"{d}.html").resolve() for d in PAGES}
    extra = [p for p in sorted(book_html.rglob("*.html"))
             if p.resolve() not in toc_files and "_static" not in p.parts and "_sources" not in p.parts]
    problems = []
    for path in extra:
        redirect = re.search(r'http-equiv="refresh" content="\d+;\s*url=([^"]+)"', path.read_text(), re.I)
        if redirect:  # the top-level index.html forwards to the root page
            target = (path.parent / redirect.group(1)).as_uri()
            problems += [f"{path.name}: redirect {b}" for b in [broken_local_link(target, book_html)] if b]
            continue
        page, log = browser.open(path.as_uri())
        try:
            links = page.eval_on_selector_all("a[href]", "as => as.map(a => a.href)")
        finally:
            page.close()
        problems += [f"{path.name}: {b}" for b in {broken_local_link(h, book_html) for h in links} if b]
        problems += [f"{path.name}: JavaScript error {e}" for e in log["pageerrors"]]
    assert not problems, "\n".join(problems)


def test_the_check_catches_a_broken_page(tmp_path, browser):
    """The checker itself: a page with each fault gets each complaint (its MathJax, from the CDN, is refused)."""
    (tmp_path / "page.html").write_text(
        '<html><head><script async src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js">'
        '</script></head><body><article class="bd-article"><h1>Broken</h1>'
        '<p>unrendered $$x^2$$ and <span class="math notranslate nohighlight">\\(x\\)</span></p>'
        '<img src="missing.png"><a href="other.html">gone</a> <a href="#nowhere">no anchor</a>'
        '<div class="cell_output"><div class="output traceback">ZeroDivisionError</div>'
        '<div class="output stderr">UserWarning: careful</div></div>'
        '<div class="cell_output"><p>| claim | result | |---|---| | a | ✓ |</p></div>'
        '<script>const THEBE_JS_URL = "a"</script><script>const THEBE_JS_URL = "a"</script>'
        '</article></body></html>')
    page, log = browser.open((tmp_path / "page.html").as_uri())
    try:
        page.wait_for_function("() => [...document.images].every(i => i.complete)")
        report = page.evaluate(INSPECT)
    finally:
        page.close()
    problems = "\n".join(_problems(report, tmp_path, log))
    for expected in ("MathJax did not typeset 1 of 1", "raw TeX left", "images that did not load",
                     "1 error output", "warnings/errors on stderr", "other.html: no such file",
                     "no element with id 'nowhere'", "local resources that failed to load",
                     "markdown tables shown as text", "requests outside the book (refused",
                     "MathJax not loaded from the book's own", "THEBE_JS_URL declared 2 times",
                     "JavaScript errors: [\"Identifier 'THEBE_JS_URL' has already been declared",
                     "no favicon"):
        assert expected in problems, f"{expected!r} not reported; got:\n{problems}"


def test_the_check_catches_clipped_tables_and_unscrolled_outputs(tmp_path, browser):
    """A table output clipped by a scroll box, a text output that does not scroll, and a caption lighter than
    the text are each reported; a table shown whole and a scrolling text output are not."""
    rows = "".join(f"<tr><td>claim {i}</td><td>✓</td></tr>" for i in range(30))
    box = 'style="max-height: 4em; overflow-y: auto"'
    (tmp_path / "page.html").write_text(
        '<html><body><article class="bd-article"><h1>1. A chapter</h1>'
        f'<div class="cell"><div class="cell_output" {box}><table>{rows}</table></div></div>'
        f'<div class="cell"><div class="cell_output"><table>{rows}</table></div></div>'
        '<div class="cell"><div class="cell_output"><pre>long text</pre></div></div>'
        f'<div class="cell"><div class="cell_output" {box}><pre>scrolls</pre></div></div>'
        '<p>text</p><figure><figcaption><span class="caption-text" style="font-weight: 300; color: grey">'
        'a faint caption</span></figcaption></figure>'
        '</article></body></html>')
    page, _ = browser.open((tmp_path / "page.html").as_uri())
    try:
        report = page.evaluate(INSPECT)
    finally:
        page.close()
    assert report["tablesClipped"] == 1 and report["outputsNotScrolling"] == 1, report
    problems = "\n".join(_chapter_problems(report, "book/01_scale_invariance"))
    assert "1 table or full-output outputs are clipped" in problems and "1 outputs do not scroll" in problems
    assert "1 captions lighter than the text (weight 300" in problems


FOLDED_SECTION = ('<section><h2>A section</h2>' + ''.join(
    f'<div class="cell tag_hide-input"><details class="admonition hide above-input"><summary>'
    f'<p class="collapsed admonition-title">Show code cell source</p>'
    f'<p class="expanded admonition-title">Hide code cell source</p></summary>'
    f'<div class="cell_input"><pre>code_{i} = {i}</pre></div></details>'
    f'<div class="cell_output"><pre>output {i}</pre></div></div>' for i in range(3)) + '</section>')


@pytest.mark.parametrize("fold", [False, True], ids=["without foldcode.js", "with foldcode.js"])
def test_a_sections_collapsed_code_folds_into_one_bar(tmp_path, browser, fold):
    """Three collapsed cells in a section: three bars without _static/foldcode.js (the check says so), one with
    it, which opens all three; their outputs show either way."""
    script = f'<script src="{(ROOT / "_static" / "foldcode.js").as_uri()}"></script>' if fold else ""
    css = f'<link rel="stylesheet" href="{(ROOT / "_static" / "book.css").as_uri()}">'
    (tmp_path / "page.html").write_text(f'<html><head>{css}{script}</head><body><article class="bd-article">'
                                        f'<h1>1. A chapter</h1>{FOLDED_SECTION}</article></body></html>')
    page, _ = browser.open((tmp_path / "page.html").as_uri())
    try:
        report = page.evaluate(INSPECT)
        outputs = page.locator(".cell_output pre").evaluate_all("ps => ps.filter(p => p.getClientRects().length).length")
        if fold:
            assert page.locator("summary").first.inner_text().startswith("Show the code of this section (3 cells)")
            page.locator("summary").first.click()
            page.wait_for_timeout(100)
            shown = page.locator(".cell_input pre").evaluate_all("ps => ps.filter(p => p.getClientRects().length).length")
    finally:
        page.close()
    assert outputs == 3
    problems = "\n".join(_chapter_problems(report, "book/01_scale_invariance"))
    if fold:
        assert report["barsPerSection"] == 1 and "collapsed-code bars" not in problems and shown == 3
    else:
        assert report["barsPerSection"] == 3 and "a section shows 3 collapsed-code bars" in problems


def test_the_layout_check_catches_a_broken_page(tmp_path, browser):
    """The layout checker itself: a page (in the book theme's structure, with the pinned MathJax)
    with an overwide display equation, an overwide code line, an overwide table, a low-resolution PNG and an SVG
    figure with 4 px text (or a 4 px exponent, or a 9.6 px legend) gets each complaint, and its well-made figures
    (a 2x PNG, 12 px SVG text with an 8.4 px exponent) none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    plt.imsave(tmp_path / "low.png", np.zeros((50, 100, 3)))    # 100 px wide, shown at 400
    plt.imsave(tmp_path / "sharp.png", np.zeros((200, 800, 3)))  # 800 px wide, shown at 400
    svg = ('<svg xmlns="http://www.w3.org/2000/svg" width="300pt" height="75pt" viewBox="0 0 300 75">'
           '<text x="10" y="30" style="font: {size}px \'DejaVu Sans\'">label</text></svg>')
    (tmp_path / "tiny.svg").write_text(svg.format(size=3))   # 3 user units shown at 400/300: 4 px
    (tmp_path / "fine.svg").write_text(svg.format(size=9).replace(  # 12 px, its exponent 8.4 px
        "label</text>", '<tspan style="font-size: 9px">10</tspan><tspan style="font-size: 6.3px">7</tspan></text>'))
    (tmp_path / "legend.svg").write_text(svg.format(size=9).replace(  # 12 px, its legend 9.6 px
        '<text x="10"', '<g id="legend_1"><text x="40" y="50" style="font: 7.2px \'DejaVu Sans\'">curve</text></g>'
        '<text x="10"'))
    (tmp_path / "script.svg").write_text(svg.format(size=9).replace(  # 12 px, its exponent 4 px
        "label</text>", '<tspan style="font-size: 9px">10</tspan><tspan style="font-size: 3px">7</tspan></text>'))
    # a table of 30 columns of "0.0015·(γ/α²)^(k−T)": wider than the 700 px column, it scrolls in its container
    wide_row = "<tr>" + "".join(f"<td>0.0015·(γ/α²)^(k−{k})</td>" for k in range(30)) + "</tr>"
    wide_tex = " + ".join(f"\\frac{{a_{{{k}}}}}{{b_{{{k}}} + c_{{{k}}}}}" for k in range(40))
    (tmp_path / "page.html").write_text(
        f'<html><head><script async src="{(localmathjax().es5_dir() / "tex-mml-chtml.js").as_uri()}">'
        '</script></head><body><article class="bd-article" style="width: 700px">'
        f'<div class="math notranslate nohighlight">\\[{wide_tex}\\]</div>'
        '<div class="math notranslate nohighlight">\\[x^2 + y^2\\]</div>'
        '<div class="cell_input"><div class="highlight"><pre style="overflow-x: auto">'
        'short = 1\n' + "x = " + " + ".join(["value"] * 40) + '</pre></div></div>'
        f'<div class="pst-scrollable-table-container"><table>{wide_row}</table></div>'
        '<table><tr><td>a narrow table</td><td>✓</td></tr></table>'
        '<img src="low.png" style="width: 400px"><img src="sharp.png" style="width: 400px">'
        '<img src="tiny.svg" style="width: 400px"><img src="fine.svg" style="width: 400px">'
        '<img src="script.svg" style="width: 400px"><img src="legend.svg" style="width: 400px">'
        '</article></body></html>')
    page, _ = browser.open((tmp_path / "page.html").as_uri())
    try:
        _ready(page)
        layout = page.evaluate(LAYOUT)
    finally:
        page.close()
    found = layout_problems(layout)
    report = "\n".join(f"{k}: {v}" for k, v in found.items())
    assert set(found) == {"wide equation", "wide code or output", "wide table", "low-resolution raster",
                          "small SVG text"}, report
    assert len(found["wide table"]) == 1 and "30 columns" in found["wide table"][0], report
    assert len(found["wide equation"]) == 1 and "frac" in found["wide equation"][0], report
    assert len(found["wide code or output"]) == 1 and "value + value" in found["wide code or output"][0], report
    assert len(found["low-resolution raster"]) == 1 and "low.png" in found["low-resolution raster"][0], report
    small = found["small SVG text"]
    assert len(small) == 3 and "tiny.svg: smallest text 4.0 px" in small[0], report
    assert "tiny.svg: smallest legend text" not in report and "fine.svg" not in report, report
    assert "script.svg: smallest super/subscript 4.0 px" in small[1], report
    assert "legend.svg: smallest legend text 9.6 px" in small[2], report


def test_api_page_lists_every_cli_option(book_html):
    """The API reference's CLI section (book/api.md, sphinxext/apiref.py) is the parser's: every option of
    ``python -m explr.cifar10 --help`` but ``--help`` has its entry, with --help's text, and no other."""
    from explr.cifar10.__main__ import build_parser

    sys.path.insert(0, str(ROOT / "sphinxext"))
    import apiref

    html = (book_html / "book" / "api.html").read_text()
    page = set(re.findall(r'id="cmdoption-python-m-explr\.cifar10(-[^"]+)"', html))
    parser = build_parser()
    wanted = {f"-{s.lstrip('-')}" for a in parser._actions if a.option_strings and a.dest != "help"
              for s in a.option_strings}
    assert page == wanted, f"only on the page: {sorted(page - wanted)}; only in --help: {sorted(wanted - page)}"
    import html as html_lib

    text = " ".join(html_lib.unescape(re.sub(r"<[^>]+>", " ", html)).split())
    missing = [h[:60] for _, entries in apiref.option_entries(parser) for _, h in entries if h not in text]
    assert not missing, f"help texts not on the page: {missing}"
