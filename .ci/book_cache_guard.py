"""Clear the book's execution cache when the library changed since the chapters in it were executed.

    .venv/bin/python .ci/book_cache_guard.py     # `make book` runs it before `jupyter-book build`

jupyter-cache (``_build/.jupyter_cache``, ``execute_notebooks: cache`` in _config.yml) keys a chapter by
its code cells only, so a change in ``src/explr``, which every chapter imports, would leave stale outputs.
This records a sha256 of every file of ``src/explr`` (paths and contents, ``__pycache__`` aside) beside
the cache, in ``_build/.jupyter_cache.explr-sha256``, and removes the cache when the digest differs or
was never recorded: the build then executes every chapter again.  An unchanged library keeps the cache.
"""
from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def library_digest(src: Path) -> str:
    """sha256 over the relative path and the bytes of every file under ``src`` (sorted; no ``__pycache__``)."""
    h = hashlib.sha256()
    for path in sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(path.relative_to(src).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def guard(root: Path = ROOT) -> str:
    """Clear ``root/_build/.jupyter_cache`` if ``root/src/explr`` changed; returns "kept", "cleared" or "none"."""
    cache = root / "_build" / ".jupyter_cache"
    record = cache.with_name(cache.name + ".explr-sha256")
    digest = library_digest(root / "src" / "explr")
    outcome = "none"
    if cache.exists():
        recorded = record.read_text().strip() if record.exists() else None
        outcome = "kept" if recorded == digest else "cleared"
        if outcome == "cleared":
            shutil.rmtree(cache)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(digest + "\n")
    return outcome


if __name__ == "__main__":
    if guard() == "cleared":
        print("src/explr changed since the chapters were executed: cleared _build/.jupyter_cache, every chapter "
              "runs again", file=sys.stderr)
