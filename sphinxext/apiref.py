"""The API reference's helpers (book/api.md), registered by _config.yml (``sphinx.local_extensions``).

**The CLI's options.** A directive that writes a command line's options from its argparse parser, so the
page cannot drift from ``--help`` (it is generated from the same parser when the book is built):

    ```{eval-rst}
    .. cli-options:: explr.cifar10.__main__:build_parser
    ```

It writes the parser's description, then per argument group a rubric and one ``std:option`` entry per
option (``:option:`` links and the index find them) whose text is exactly ``--help``'s, defaults included
(``--help``'s usage line is left out: its longest option does not fit the book's column).

**A package's public names.** ``.. public-names:: explr.cifar10`` documents each name of the package's ``__all__``
as the user imports it (``explr.cifar10.TrainConfig``), without members, whichever module defines it: the
engine's modules are internal and may be renamed without touching the page.

**Names in a docstring's scope.** A docstring names objects as its code does: the engine's ``runfolder``
writes :class:`RunError` for the ``RunError`` it imports from ``lock``. Sphinx's Python domain looks a name
up only among the objects documented in the docstring's own module and class; a reference it cannot
resolve is looked up again as Python would, in the namespace of the module that defines the docstring's object,
and resolved to the object's own module and name where autodoc documented it, or to the package name that
documents it (:func:`public_alias`); a constant (it has no ``__module__``) to the one documented object of its
name, as Sphinx resolves ``.NAME``. An engine internal that Python finds stays plain text; any other name Python
does not find, or an object the page does not document, stays unresolved and fails the ``-n`` build.

**LR curves.** Under each public scheduler and schedule builder (:func:`lr_curves` names them) the page shows its
learning rate per step, as torch's documentation does: drawn when the book is built, as an SVG in the build folder
(``api_figures/``), and appended to the docstring as a numbered figure.  A name of :func:`lr_curves` that the page
never documents is a build warning (so -W fails).
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import os
import re
import sys
import warnings
from functools import cache
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

WIDTH = 80  # --help as an 80-column terminal shows it (the help texts are joined into one line each)
ENGINE = "explr.cifar10"  # the package whose public names alone the page documents


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


class PublicNames(SphinxDirective):
    """``.. public-names:: package``: each name of the package's ``__all__`` documented as ``package.name`` (autodoc,
    without members), a constant with the ``#:`` comment of the module that defines it.  The page so documents
    what a user imports, whichever module holds it."""
    required_arguments = 1
    has_content = False

    def run(self):
        package = importlib.import_module(self.arguments[0])
        rst = StringList()
        for name in package.__all__:
            obj, full = getattr(package, name), f"{package.__name__}.{name}"  # documented by the user's name
            if inspect.isclass(obj) or inspect.isfunction(obj):
                kind = "exception" if inspect.isclass(obj) and issubclass(obj, BaseException) else \
                    "class" if inspect.isclass(obj) else "function"
                rst.append(f".. auto{kind}:: {full}", "<public-names>")
                rst.append("", "<public-names>")
                continue
            module, comment = constant_comment(package.__name__, name, obj)
            for line in (f".. py:data:: {name}", f"   :module: {package.__name__}", f"   :value: {obj!r}", ""):
                rst.append(line, "<public-names>")
            for line in comment:
                rst.append(f"   {line}", f"{module}:{name}")
            rst.append("", "<public-names>")
        container = nodes.container()
        nested_parse_with_titles(self.state, rst, container)
        return container.children


def constant_comment(package: str, name: str, obj) -> tuple[str, list[str]]:
    """(module, the ``#:`` comment of ``name`` there): the module of ``package`` that defines the constant (the first
    that holds ``obj`` under that name and comments it); (package, []) if none does."""
    from sphinx.pycode import ModuleAnalyzer

    for module in sorted(m for m in sys.modules if m.startswith(f"{package}.")):
        if getattr(sys.modules[module], name, None) is obj:
            comment = ModuleAnalyzer.for_module(module).find_attr_docs().get(("", name))
            if comment:
                return module, [line for line in comment if line]
    return package, []


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


def public_alias(target: str) -> str | None:
    """The name under which a package documents ``target`` through its ``__all__``: for
    ``explr.cifar10.runs.RunResult.status``, ``explr.cifar10.RunResult.status`` if ``explr.cifar10`` hands on
    ``RunResult``; None if no package above the defining module does."""
    parts = target.split(".")
    i = next((i for i in range(len(parts) - 1, 0, -1) if ".".join(parts[:i]) in sys.modules), None)
    if i is None:
        return None
    obj = getattr(sys.modules[".".join(parts[:i])], parts[i], None)
    for j in range(i - 1, 0, -1):
        package = sys.modules.get(".".join(parts[:j]))
        if parts[i] in getattr(package, "__all__", ()) and getattr(package, parts[i], None) is obj:
            return ".".join(parts[:j] + parts[i:])
    return None


def resolve_by_scope(app, env, node, contnode):
    """``missing-reference``: an unresolved ``py`` reference in an ``explr`` docstring, looked up as Python
    would from the docstring's own module (:func:`docstring_module`) and class, by the object's own module and
    name or by the package name that documents it (:func:`public_alias`: ``explr.cifar10.runs.RunResult`` is
    ``explr.cifar10.RunResult``).  An engine internal stays plain text: the page documents the engine's
    ``__all__`` only.  An object of another project (torch's ``get_last_lr``, inherited) gets its full name,
    which ``nitpick_ignore_regex`` then matches."""
    if node.get("refdomain") != "py" or not (node.get("py:module") or "").startswith("explr"):
        return None
    reftarget, cls = node.get("reftarget", ""), node.get("py:class")
    scope = docstring_module(node) or node["py:module"]
    if node.get("reftype") == "mod" and reftarget.startswith(f"{ENGINE}.") and reftarget in sys.modules:
        return contnode
    target = _canonical(scope, cls, reftarget)
    if target is not None and not target.startswith("explr"):
        node["reftarget"] = target
        return None
    domain = env.get_domain("py")
    retry = node.deepcopy()
    if target is None:  # a constant (no __module__ to follow): the one documented object of that name
        retry["refspecific"] = True
        candidates = [reftarget]
    else:
        retry["py:class"] = None
        candidates = [c for c in dict.fromkeys([target, public_alias(target)]) if c is not None]
    for candidate in candidates:
        retry["reftarget"] = candidate
        found = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], candidate, retry, contnode)
        if found is not None:
            return found
    internal = target.startswith(f"{ENGINE}.") if target else scope.startswith(ENGINE) and _found(scope, cls, reftarget)
    return contnode if internal else None


def docstring_module(node) -> str | None:
    """The module that defines the object whose docstring holds ``node`` (autodoc's source, ``...:docstring of
    explr.cifar10.runs.train_run``): the scope its names are written in, whichever name the page documents it by."""
    match = re.search(r"docstring of ([\w.]+)", node.source or "")
    parts = match.group(1).split(".") if match else []
    return next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in sys.modules), None)


def _found(scope: str, cls: str | None, target: str) -> bool:
    """Whether Python finds ``target`` from module ``scope`` (and class ``cls``), or as an absolute dotted name."""
    parts = target.split(".")
    starts = [(sys.modules.get(scope), [*cls.split("."), *parts]) if cls else None, (sys.modules.get(scope), parts),
              *((sys.modules[".".join(parts[:i])], parts[i:]) for i in range(1, len(parts))
                if ".".join(parts[:i]) in sys.modules)]
    for obj, path in filter(None, starts):
        try:
            for name in path:
                obj = getattr(obj, name)
            return True
        except AttributeError:
            continue
    return False


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


# the CIFAR-10 recipe the curves are drawn for: lr 0.1, 200 epochs of 391 steps, step decay at 100 and 150
RECIPE = dict(lr=0.1, epochs=200, steps_per_epoch=391)
MILESTONES = [100, 150]
WD, MOMENTUM = 5e-4, 0.9
RESCALE_ABOVE = 1.0
EVERY = 20  # the curves are drawn at every 20th step (3,910 points of 78,200)
#: the names whose figure this build appended (reset when a build starts; checked when the documents are read)
SHOWN: set[str] = set()


@cache
def lr_curves() -> dict[str, tuple[str, dict[str, object]]]:
    """{documented name: (caption, {label: lr per step})}: the recipe's schedule as each builder makes it (with the
    ordinary schedule it starts from), and for ``PerStepLR`` the lr it writes into the optimizer with
    ``rescale_above``, under the schedule's own.  Names in ``LOG_SCALE`` are drawn on a log axis."""
    import numpy as np
    import torch

    from explr.lr_scheduler import PerStepLR
    from explr.schedules import cosine, exp_lr, step_decay, texp, texp_minus_minus, texp_plus_plus

    step = step_decay(**RECIPE, milestones=MILESTONES)
    per_step = cosine(**RECIPE, per="step")
    steps = len(step)
    equivalent = texp(step, WD, MOMENTUM)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=RECIPE["lr"], momentum=MOMENTUM)
    sched = PerStepLR.from_schedule(opt, equivalent, rescale_above=RESCALE_ABOVE)
    played = np.empty(steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # no optimizer.step(): only the lr is drawn
        for k in range(steps):
            played[k] = opt.param_groups[0]["lr"]
            if k + 1 < steps:
                sched.step()
    recipe = f"lr 0.1, {RECIPE['epochs']} epochs of {RECIPE['steps_per_epoch']} steps"
    decay = f"step decay ({recipe}, ÷10 at epochs 100 and 150)"
    with_wd = f"weight decay {WD:g}, momentum {MOMENTUM:g}"
    return {
        "explr.schedules.step_decay": (f"The {decay}.", {"step_decay": step}),
        "explr.schedules.cosine": (f"Cosine ({recipe}), constant inside each epoch (per='epoch').",
                                   {"cosine": cosine(**RECIPE)}),
        "explr.schedules.exp_lr": (f"exp_lr: constant lr 0.1 with {with_wd}, as an exponential lr.",
                                   {"exp_lr": exp_lr(RECIPE["lr"], WD, MOMENTUM, steps).lr}),
        "explr.schedules.texp": (f"texp of the {decay} with {with_wd}.", {"step decay": step, "texp": equivalent.lr}),
        "explr.schedules.texp_plus_plus": (f"texp_plus_plus of the per-step cosine with {with_wd}.",
                                           {"cosine per step": per_step,
                                            "texp++": texp_plus_plus(per_step, WD, MOMENTUM).lr}),
        "explr.schedules.texp_minus_minus": (f"texp_minus_minus of the {decay} with {with_wd}.",
                                             {"step decay": step, "texp--": texp_minus_minus(step, WD, MOMENTUM).lr}),
        "explr.lr_scheduler.PerStepLR": (f"PerStepLR playing texp's schedule (above) with rescale_above="
                                         f"{RESCALE_ABOVE:g}: the lr written into the optimizer stays below it.",
                                         {"texp's lr": equivalent.lr, "played": played}),
    }


#: the exponential schedules, drawn on a log axis
LOG_SCALE = ("explr.schedules.exp_lr", "explr.schedules.texp", "explr.schedules.texp_plus_plus",
             "explr.schedules.texp_minus_minus", "explr.lr_scheduler.PerStepLR")


def draw(name: str, path: Path) -> None:
    """The curves of ``name`` as an SVG at ``path`` (the book's figure style), with PerStepLR's ``rescale_above``
    as a dotted line."""
    import numpy as np
    from matplotlib.figure import Figure

    from explr.book.plotting import COLORS, FIGURE_WIDTH, setup

    setup()
    _, curves = lr_curves()[name]
    fig = Figure(figsize=(FIGURE_WIDTH, 2.8), layout="constrained")
    ax = fig.add_subplot()
    colours = {"step decay": COLORS["step"], "step_decay": COLORS["step"], "texp": COLORS["texp"],
               "texp's lr": COLORS["texp"], "texp++": COLORS["texp++"], "texp--": COLORS["texp--"],
               "exp_lr": COLORS["texp"], "played": COLORS["theory"], "cosine": COLORS["cosine"],
               "cosine per step": COLORS["cosine"]}
    for label, lr in curves.items():
        k = np.unique(np.r_[np.arange(0, len(lr), EVERY), len(lr) - 1])  # every EVERY-th step: a small SVG
        ax.plot(k, np.asarray(lr)[k], label=label, color=colours.get(label), lw=1.4)
    if name in LOG_SCALE:
        ax.set_yscale("log")
    if name == "explr.lr_scheduler.PerStepLR":
        ax.axhline(RESCALE_ABOVE, color=COLORS["theory"], lw=0.8, ls=":", label=f"rescale_above = {RESCALE_ABOVE:g}")
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    if len(curves) > 1:
        ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg")


def append_lr_curve(app, what, name, obj, options, lines):
    """``autodoc-process-docstring``: a figure of :func:`lr_curves` under the docstring of each name it has."""
    if name not in lr_curves():
        return
    path = Path(app.doctreedir).parent / "api_figures" / f"{name}.svg"
    draw(name, path)
    app.env.note_dependency(__file__)
    SHOWN.add(name)
    relative = os.path.relpath(path, Path(app.srcdir) / Path(app.env.docname).parent)
    caption, _ = lr_curves()[name]
    lines += ["", f".. figure:: {relative}", f"   :alt: the learning rate per step of {name.rsplit('.', 1)[1]}",
              "", f"   {caption}", ""]


def check_every_curve_shown(app, env):
    """``env-updated``: once the API page was read in this build (some figure appended), every name of
    :func:`lr_curves` got its figure; a warning otherwise (-W fails)."""
    missing = sorted(set(lr_curves()) - SHOWN)
    if SHOWN and missing:
        from sphinx.util import logging
        logging.getLogger(__name__).warning(f"apiref: no LR curve shown for {missing}: the page does not document them")
    return []


def setup(app):
    app.add_directive("cli-options", CliOptions)
    app.add_directive("public-names", PublicNames)
    app.connect("missing-reference", resolve_by_scope)
    app.connect("autodoc-skip-member", public_where_defined)
    app.connect("autodoc-process-docstring", append_lr_curve)
    app.connect("builder-inited", lambda app: SHOWN.clear())
    app.connect("env-updated", check_every_curve_shown)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
