"""The browser check: build the book, open every page in headless Chromium, look at it as a reader.

The book is built *without executing the notebooks* (their committed outputs are what nbval checks
in the same `make test`), with the configuration of _config.yml otherwise and with ``-W -n``, into
``_build/browser``. Pages are opened from disk (``file://``) and every outside request is refused:
the book carries its own MathJax (the pinned copy of django-static-mathjax, which sphinxext/localmathjax.py
puts into its ``_static/mathjax``), so the check runs offline and sees what a reader offline sees.

Chromium is Debian's (``apt-get install chromium``; ``.ci/run`` installs it), driven by Playwright,
never a browser that Playwright downloads: the one on PATH, or ``CHROMIUM=/path/to/chromium``.
Without one the tests that need it skip, saying so, except under CI (``CI=true``), where they fail.
Screenshots and the build log go to test-artifacts/ (git-ignored).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import bookcheck  # noqa: E402

TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="session")
def book_html() -> Path:
    code, log, seconds = bookcheck.build_book()
    TIMINGS["book build, no execution (-W -n)"] = seconds
    bookcheck.ARTIFACTS.mkdir(exist_ok=True)
    (bookcheck.ARTIFACTS / "browser-build.log").write_text(log)
    if code != 0:
        lines = [ln for ln in log.splitlines() if "WARNING" in ln or "ERROR" in ln or "rror:" in ln]
        pytest.fail("the book does not build warning-free (full log: test-artifacts/browser-build.log):\n"
                    + "\n".join((lines or log.splitlines())[-30:]), pytrace=False)
    return bookcheck.HTML


@pytest.fixture(scope="session")
def browser(tmp_path_factory, missing):
    if not (bookcheck.CHROMIUM and Path(bookcheck.CHROMIUM).is_file()):
        where = f"none at CHROMIUM={bookcheck.CHROMIUM}" if os.environ.get("CHROMIUM") else "none on PATH"
        missing(f"Chromium for the browser check ({where})",
                "`apt-get install chromium chromium-driver` as root (.ci/run does it), or CHROMIUM=/path/to/chromium")
    from playwright.sync_api import sync_playwright

    start = time.perf_counter()
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),  # a fresh --user-data-dir
            executable_path=bookcheck.CHROMIUM, headless=True, args=bookcheck.CHROMIUM_FLAGS,
            viewport={"width": 1280, "height": 900}, device_scale_factor=1,
        )
        try:
            yield bookcheck.Browser(context)
        finally:
            context.close()
            TIMINGS["Chromium, all pages"] = time.perf_counter() - start


@pytest.fixture(scope="session")
def screenshots() -> Path:
    bookcheck.SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for old in bookcheck.SCREENSHOTS.glob("*.png"):
        old.unlink()
    return bookcheck.SCREENSHOTS


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        terminalreporter.write_sep("-", "browser check")
        for what, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{what}: {seconds:.1f} s")
        shots = sorted(bookcheck.SCREENSHOTS.glob("*.png")) if bookcheck.SCREENSHOTS.exists() else []
        if shots:
            terminalreporter.write_line(f"{len(shots)} screenshots in {bookcheck.SCREENSHOTS.relative_to(bookcheck.ROOT)}/")
