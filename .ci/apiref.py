"""The API reference's two helpers (book/api.md), registered by _config.yml (``sphinx.local_extensions``).

**The CLI's options.** A directive that writes a command line's options from its argparse parser, so the
page cannot drift from ``--help`` (it is generated from the same parser when the book is built):

    ```{eval-rst}
    .. cli-options:: explr.cifar10.__main__:build_parser
    ```

It writes the parser's description, then per argument group a rubric and one ``std:option`` entry per
option (``:option:`` links and the index find them) whose text is exactly ``--help``'s, defaults included
(``--help``'s usage line is left out: its longest option does not fit the book's column).

**Names in a docstring's scope.** A docstring names objects as its code does: the engine's ``runfolder``
writes :class:`RunError` for the ``RunError`` it imports from ``lock``. Sphinx's Python domain looks a name
up only among the objects documented in the docstring's own module and class; a reference it cannot
resolve is looked up again as Python would, in that module's namespace, and resolved to the object's own
module and name, where autodoc documented it; a constant (it has no ``__module__``) to the one documented
object of its name, as Sphinx resolves ``.NAME``. A name Python does not find there, or an object the
page does not document (or, for a constant, documents twice), stays unresolved and fails the ``-n`` build.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

WIDTH = 80  # --help as an 80-column terminal shows it (the help texts are joined into one line each)


def load_parser(spec: str) -> argparse.ArgumentParser:
    """``module:function`` -> the parser that function returns."""
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module), function)()


def formatter(parser: argparse.ArgumentParser) -> argparse.HelpFormatter:
    return parser.formatter_class(prog=parser.prog, width=WIDTH)


def option_entries(parser: argparse.ArgumentParser) -> list[tuple[str, list[tuple[str, str]]]]:
    """[(group title, [(invocation as --help writes it, help text as --help writes it)])], in --help's order;
    ``-h/--help`` and positional arguments aside."""
    fmt = formatter(parser)
    groups = []
    for group in parser._action_groups:
        entries = []
        for action in group._group_actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            if action.help == argparse.SUPPRESS:
                continue
            invocation = fmt._format_action_invocation(action)
            helptext = " ".join(fmt._expand_help(action).split()) if action.help else ""
            entries.append((invocation, helptext))
        if entries:
            groups.append((group.title or "options", entries))
    return groups


class CliOptions(SphinxDirective):
    required_arguments = 1
    has_content = False

    def run(self):
        parser = load_parser(self.arguments[0])
        self.env.note_dependency(importlib.import_module(self.arguments[0].partition(":")[0]).__file__)
        out: list[nodes.Node] = []
        # no usage block: argparse cannot wrap `[--schedule {step,...} [{step,...} ...]]` (125 characters)
        if parser.description:
            out.append(nodes.paragraph(text=parser.description))
        # the option directives need the program's name for their targets (cmdoption-<program>-<option>)
        rst = StringList()
        rst.append(f".. program:: {parser.prog}", "<cli-options>")
        rst.append("", "<cli-options>")
        groups = option_entries(parser)
        for title, entries in groups:
            rst.append(f".. rubric:: {title[:1].upper() + title[1:]}", "<cli-options>")
            rst.append("", "<cli-options>")
            for invocation, _ in entries:
                rst.append(f".. option:: {invocation}", "<cli-options>")
                rst.append("", "<cli-options>")
        container = nodes.container()
        nested_parse_with_titles(self.state, rst, container)
        # the help texts go in as text nodes, never parsed: a `*` or a backquote in a help string stays as typed
        helps = [h for _, entries in groups for _, h in entries]
        contents = [d for d in container.findall(nodes.Element) if d.tagname == "desc_content"]
        if len(contents) != len(helps):
            raise self.error(f"cli-options: {len(helps)} options, {len(contents)} option entries written")
        for content, helptext in zip(contents, helps):
            content += nodes.paragraph(text=helptext)
        out.extend(container.children)
        return out


def _canonical(scope: str, cls: str | None, target: str) -> str | None:
    """Where Python finds ``target`` from the docstring's module ``scope`` (and class ``cls``): the defining
    module and qualified name of that object, or None."""
    candidates = []
    if "." in target:  # a dotted name: its longest importable module prefix, then attributes
        parts = target.split(".")
        for i in range(len(parts) - 1, 0, -1):
            try:
                candidates.append((importlib.import_module(".".join(parts[:i])), parts[i:]))
                break
            except ImportError:
                continue
    module = sys.modules.get(scope)
    if module is not None:
        if cls:
            candidates.append((module, cls.split(".") + target.split(".")))
        candidates.append((module, target.split(".")))
    for obj, path in candidates:
        try:
            for name in path:
                obj = getattr(obj, name)
        except AttributeError:
            continue
        owner = getattr(obj, "__module__", None)
        qualname = getattr(obj, "__qualname__", None)
        if owner and qualname:
            return f"{owner}.{qualname}"
        if len(path) == 1 and module is not None:  # a constant: documented in the module that holds it
            return None
    return None


def resolve_by_scope(app, env, node, contnode):
    """``missing-reference``: an unresolved ``py`` reference in an ``explr`` docstring, looked up as Python
    would from that docstring's module and class, by the object's own module and name (a re-export such as
    ``explr.cifar10.runs.RunError`` is ``explr.cifar10.lock.RunError``). An object of another project
    (torch's ``get_last_lr``, inherited) gets its full name, which ``nitpick_ignore_regex`` then matches."""
    if node.get("refdomain") != "py" or not (node.get("py:module") or "").startswith("explr"):
        return None
    target = _canonical(node["py:module"], node.get("py:class"), node.get("reftarget", ""))
    if target == node["reftarget"]:
        return None
    if target is not None and not target.startswith("explr"):
        node["reftarget"] = target
        return None
    retry = node.deepcopy()
    if target is None:  # a constant (no __module__ to follow): the one documented object of that name
        target = node["reftarget"]
        retry["refspecific"] = True
    else:
        retry["reftarget"] = target
        retry["py:class"] = None
    return env.get_domain("py").resolve_xref(env, node["refdoc"], app.builder, node["reftype"], target, retry,
                                             contnode)


def public_where_defined(app, what, name, obj, skip, options):
    """``autodoc-skip-member``: with ``ignore-module-all`` autodoc documents a module's own members only (no
    re-exports, so every object once, where it is defined); of those, skip what its module's ``__all__``
    leaves out. Data (constants) has no ``__module__`` and stays if it has a ``#:`` comment."""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    if what == "module" and module is not None and module.__name__.startswith("explr"):
        public = getattr(module, "__all__", None)
        if public is not None and name not in public:
            return True
    return None


def setup(app):
    app.add_directive("cli-options", CliOptions)
    app.connect("missing-reference", resolve_by_scope)
    app.connect("autodoc-skip-member", public_where_defined)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
