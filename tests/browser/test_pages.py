"""Every page of the book, opened in headless Chromium as a reader would meet it.

Per page of _toc.yml (so chapters added to _toc.yml are covered without touching this file):
MathJax typeset every formula (no raw ``$$``/``\\(`` left, no MathJax error for an unknown macro);
every image loaded; no error output, no stderr warning, no docutils error in the page; every
local link resolves, to a file and, for ``#anchor`` links, to an element with that id; no
JavaScript exception and no missing local resource; and one full-page screenshot in
test-artifacts/screenshots/. Chapter pages also: theorems/lemmas/definitions and figures carry
the chapter's number (``Lemma 1.2``, ``Fig. 1.3``) in one running sequence, every plot is a
numbered figure with a caption, plumbing code is collapsed, long outputs scroll, the install cell
is not shown, and the Colab and Binder buttons point at this chapter's notebook.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from bookcheck import broken_local_link, config, toc_docnames

PAGES = toc_docnames()
CHAPTERS = PAGES[1:]
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
    mathUnrendered: math.filter(m => !m.querySelector('mjx-container')).map(m => m.textContent.slice(0, 80)),
    mathErrors: [...article.querySelectorAll('mjx-merror')].map(e => e.getAttribute('data-mjx-error') || e.textContent),
    rawTex: (prose.match(/\$\$|\\\(|\\\)|\\\[|\\\]|\\begin\{|\$\\[A-Za-z]+/g) || []),
    images: [...document.images].map(i => ({src: i.currentSrc || i.src, w: i.naturalWidth, complete: i.complete})),
    tracebacks: article.querySelectorAll('.cell_output .traceback, .cell_output .output.error').length,
    stderr: [...article.querySelectorAll('.cell_output .output.stderr')].map(e => e.textContent.slice(0, 200)),
    docutilsErrors: [...article.querySelectorAll('.system-message, .problematic')].map(e => e.textContent.slice(0, 120)),
    links: [...document.querySelectorAll('a[href]')].map(a => a.href),
    proofs: [...article.querySelectorAll('div.proof .caption-number')].map(e => e.textContent.trim()),
    figures: [...article.querySelectorAll('figure')].map(f => ({
        number: ((f.querySelector('figcaption .caption-number') || {}).textContent || '').trim(),
        caption: ((f.querySelector('figcaption .caption-text') || {}).textContent || '').trim(),
        id: f.id})),
    outputImagesOutsideFigures: [...article.querySelectorAll('.cell_output img')].filter(i => !i.closest('figure')).length,
    equations: [...article.querySelectorAll('span.eqno')].map(e => e.firstChild.textContent.trim()),
    hiddenInputsVisible: [...article.querySelectorAll('.cell.tag_hide-input .cell_input pre')].filter(visible).length,
    hiddenInputs: article.querySelectorAll('.cell.tag_hide-input').length,
    outputsNotScrolling: [...article.querySelectorAll('.cell_output')].filter(o => {
        const s = getComputedStyle(o); return s.maxHeight === 'none' || !['auto', 'scroll'].includes(s.overflowY);
    }).length,
    installCellShown: article.textContent.includes('google.colab'),
    launch: [...document.querySelectorAll('a[href]')].map(a => a.href)
              .filter(h => /colab\.research\.google\.com|mybinder\.org/.test(h)),
  };
}
"""


# sphinx-thebe 0.3.1 under Sphinx 7.4 writes its inline config script twice into every page; the
# second copy re-declares `const THEBE_JS_URL` and throws, the first has defined everything (thebe
# is off in this book). Any other JavaScript error fails the check.
KNOWN_JS_ERRORS = ("Identifier 'THEBE_JS_URL' has already been declared",)


def _ready(page) -> None:
    """Wait until MathJax has typeset the page and every image (lazy ones too) has loaded."""
    if page.evaluate("() => !!document.querySelector('span.math, div.math')"):
        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
        page.evaluate("() => MathJax.startup.promise.then(() => true)")
    page.evaluate("() => document.querySelectorAll('img[loading=lazy]').forEach(i => i.loading = 'eager')")
    page.wait_for_function("() => [...document.images].every(i => i.complete)")


def _url(html: Path, docname: str) -> str:
    return (html / f"{docname}.html").as_uri()


def _problems(report: dict, html: Path, log: dict) -> list[str]:
    out = []
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
    warnings = [s for s in report["stderr"] if re.search(r"Warning|Error|Traceback", s)]
    if warnings:
        out.append(f"warnings/errors on stderr: {warnings}")
    if report["docutilsErrors"]:
        out.append(f"docutils errors in the page: {report['docutilsErrors']}")
    broken = sorted({b for b in (broken_local_link(h, html) for h in report["links"]) if b})
    if broken:
        out.append("broken internal links:\n    " + "\n    ".join(broken))
    js_errors = [e for e in log["pageerrors"] if e not in KNOWN_JS_ERRORS]
    if js_errors:
        out.append(f"JavaScript errors: {js_errors}")
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
    if report["outputImagesOutsideFigures"]:
        out.append(f"{report['outputImagesOutsideFigures']} plot(s) not in a numbered figure: give the cell "
                   "metadata mystnb.figure.caption/name (CONTRIBUTING.md)")
    if any(not re.fullmatch(rf"\({n}\.\d+\)", e) for e in report["equations"]):
        out.append(f"equation numbers {report['equations']}, expected '({n}.<k>)'")
    if report["hiddenInputsVisible"]:
        out.append(f"{report['hiddenInputsVisible']} hide-input cells show their code expanded")
    if report["outputsNotScrolling"]:
        out.append(f"{report['outputsNotScrolling']} outputs do not scroll (nb_scroll_outputs)")
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


@pytest.mark.parametrize("docname", PAGES)
def test_page(docname, book_html, browser, screenshots):
    html = book_html
    assert (html / f"{docname}.html").exists(), f"{docname} of _toc.yml was not built"
    page, log = browser.open(_url(html, docname))
    try:
        _ready(page)
        report = page.evaluate(INSPECT)
        page.screenshot(path=str(screenshots / f"{docname.replace('/', '__')}.png"), full_page=True)
    finally:
        page.close()
    problems = _problems(report, html, log)
    if docname in CHAPTERS:
        problems += _chapter_problems(report, docname)
    assert not problems, f"{docname}:\n  " + "\n  ".join(problems)


def test_landing_page(book_html, browser):
    """The root page: the bibliography is there and cited, every chapter is linked in order."""
    page, log = browser.open(_url(book_html, PAGES[0]))
    try:
        _ready(page)
        entries = page.locator("div.citation, .bibliography .citation, dl.citation > dt").count()
        toc_links = page.eval_on_selector_all(
            "article .toctree-wrapper a.reference.internal", "as => as.map(a => a.getAttribute('href'))")
    finally:
        page.close()
    assert entries >= 1, "no bibliography entries on the landing page"
    linked = [re.sub(r"\.html(#.*)?$", "", h).split("/")[-1] for h in toc_links]
    wanted = [Path(c).name for c in CHAPTERS]
    assert [x for x in linked if x in wanted] == wanted, f"landing page lists {linked}, _toc.yml has {wanted}"


def test_citations_resolve_to_the_bibliography(book_html, browser):
    """Every {cite} in a chapter links to an entry of the bibliography (not a '?' or a dead anchor)."""
    missing, cited = [], 0
    for docname in CHAPTERS:
        page, _ = browser.open(_url(book_html, docname))
        try:
            cites = page.eval_on_selector_all("article span.bibtex-citation",
                                              "ss => ss.map(s => [s.textContent, [...s.querySelectorAll('a')].map(a => a.href)])")
        finally:
            page.close()
        cited += len(cites)
        for text, hrefs in cites:
            if not hrefs or "?" in text:
                missing.append(f"{docname}: unresolved citation {text!r}")
            missing += [f"{docname}: {b}" for b in (broken_local_link(h, book_html) for h in hrefs) if b]
    assert cited, "no chapter cites anything"
    assert not missing, "\n".join(missing)


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
        problems += [f"{path.name}: JavaScript error {e}" for e in log["pageerrors"] if e not in KNOWN_JS_ERRORS]
    assert not problems, "\n".join(problems)


def test_the_check_catches_a_broken_page(tmp_path, browser):
    """The checker itself: a page with each fault gets each complaint (no MathJax is loaded here)."""
    (tmp_path / "page.html").write_text(
        '<html><body><article class="bd-article"><h1>Broken</h1>'
        '<p>unrendered $$x^2$$ and <span class="math notranslate nohighlight">\\(x\\)</span></p>'
        '<img src="missing.png"><a href="other.html">gone</a> <a href="#nowhere">no anchor</a>'
        '<div class="cell_output"><div class="output traceback">ZeroDivisionError</div>'
        '<div class="output stderr">UserWarning: careful</div></div>'
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
                     "no element with id 'nowhere'", "local resources that failed to load"):
        assert expected in problems, f"{expected!r} not reported; got:\n{problems}"
