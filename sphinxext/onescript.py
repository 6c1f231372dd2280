"""Sphinx extension of the book: each script once per page.

sphinx-thebe 0.3.1 adds its settings (``const THEBE_JS_URL = ...``) as an inline script,
``app.add_js_file(None, body=...)``, once the builder exists.  Sphinx 7.4 keeps it twice: as added (file name
``None``) and as its registry hands it to the builder (``filename or ''``, i.e. ``''``); the two do not compare
equal, both are written, and the second ``const`` throws "Identifier 'THEBE_JS_URL' has already been declared"
on every page.  Before a page is written, this drops a script equal to an earlier one but for ``None`` vs ``''``.
"""
from __future__ import annotations


def _once(app, _pagename, _templatename, context, _doctree) -> None:
    scripts = context.get("script_files")
    if scripts is None:
        return
    seen, kept = set(), []
    for script in scripts:
        key = (script.filename or "", script.priority, tuple(sorted(script.attributes.items())))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    scripts[:] = kept  # the builder's own list: it restores it, duplicates included, before the next page


def setup(app):
    app.connect("html-page-context", _once, priority=900)  # after every extension added its scripts
    return {"parallel_read_safe": True, "parallel_write_safe": True}
