"""Rerun one chapter with other parameters: what ``make chapter N=02 ARGS="-p steps 3000"`` runs.

    python .ci/chapter.py 02 -p steps 3000 -y "lrs: [0.1, 0.05]"   # into _build/chapters/02_*.ipynb

Before a kernel starts, every name is looked up in the chapter's ``parameters`` cell: an unknown one stops
the rerun with the nearest known name (difflib).  The chapter's first cell after its parameters checks
their values (:func:`explr.params.check_parameters`); a value out of range or of the wrong type stops it
there, and this script prints that one line and the parameters cell's line for the name, not the traceback.
The kernel's transport is encrypted (``KernelManager.transport_encryption = "auto"``, jupyter_client 8.10;
the kernelspec declares CurveZMQ), so ipykernel does not warn "running over TCP without encryption".

The notebook is written atomically: papermill writes into ``.<name>.partial.ipynb``; a finished run replaces
``<name>.ipynb`` (``os.replace``) and removes an earlier ``<name>.failed.ipynb``; a failed one becomes that file,
beside the last good one.
Exit status 0, 1 (the chapter failed) or 2 (a parameter refused).
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
OUT = ROOT / "_build" / "chapters"
#: the kernel manager's setting that turns off ipykernel's "running over TCP without encryption" warning
KERNEL_CONFIG = {"KernelManager": {"transport_encryption": "auto"}}


class Refused(Exception):
    """A rerun refused before or at the chapter's parameter check (exit status 2)."""


class Failed(Exception):
    """A chapter that failed after its parameter check (exit status 1)."""


def chapter(number: str) -> Path:
    """``book/<number>_*.ipynb``."""
    found = sorted(BOOK.glob(f"{number}_*.ipynb"))
    if not number or not found:
        known = ", ".join(p.name[:2] for p in sorted(BOOK.glob("[0-9][0-9]_*.ipynb")))
        raise Refused(f"N = {number!r}: no chapter book/{number}_*.ipynb; N is one of {known}")
    return found[0]


def parameters_cell(notebook: Path) -> dict[str, str]:
    """The chapter's parameters, name → its line in the ``parameters`` cell (default and stated range)."""
    from papermill.translators import PythonTranslator

    cell = next(c for c in json.loads(notebook.read_text())["cells"]
                if "parameters" in c.get("metadata", {}).get("tags", []))
    return {p.name: f"{p.name} = {p.default}  # {p.help}".rstrip(" #")
            for p in PythonTranslator.inspect({"source": "".join(cell["source"])})}


def parse(words: list[str]) -> dict:
    """papermill's parameter options: ``-p name value`` (typed as papermill types it: int, float, True,
    False, None, else a string), ``-r name value`` (a string) and ``-y yaml``."""
    from papermill.cli import _resolve_type

    words, params = list(words), {}
    while words:
        flag = words.pop(0)
        need = 2 if flag in ("-p", "--parameters", "-r", "--parameters_raw") else 1
        if flag not in ("-p", "--parameters", "-r", "--parameters_raw", "-y", "--parameters_yaml"):
            raise Refused(f"ARGS: {flag!r} is not a parameter option; use -p name value, -r name text or -y yaml")
        if len(words) < need:
            raise Refused(f"ARGS: {flag} needs {'a name and a value' if need == 2 else 'a YAML mapping'}")
        if need == 1:
            try:
                given = yaml.safe_load(words.pop(0))
            except yaml.YAMLError as err:
                raise Refused(f"ARGS: -y is not YAML ({str(err).splitlines()[0]})") from None
            if not isinstance(given, dict):
                raise Refused(f"ARGS: -y {given!r} is not a mapping of names to values")
            params.update(given)
        else:
            name, value = words.pop(0), words.pop(0)
            params[name] = _resolve_type(value) if flag in ("-p", "--parameters") else value
    return params


def check_names(params: dict, known: dict[str, str]) -> None:
    """Refuse a name the parameters cell does not define, suggesting the nearest known one."""
    for name in params:
        if name not in known:
            near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"did you mean {near[0]}? " if near else ""
            raise Refused(f"{name}: no such parameter; {hint}known: {', '.join(known)}")


def execute(notebook: Path, partial: Path, params: dict) -> None:
    """papermill, in ``book/``, with an encrypted kernel transport (:data:`KERNEL_CONFIG`)."""
    import papermill as pm
    from traitlets.config import Config

    # the notebook is complete when its last cell returns (or one fails): stop the kernel at once, not asking it to
    # shut down, which it may answer on stderr ("KeyboardInterrupt caught in kernel")
    pm.execute_notebook(str(notebook), str(partial), parameters=params, cwd=str(BOOK), kernel_name="python3",
                        progress_bar=sys.stderr.isatty(), config=Config(KERNEL_CONFIG), shutdown_kernel="immediate")


def rerun(notebook: Path, params: dict, out: Path = OUT, run=execute) -> Path:
    """Run ``notebook`` with ``params`` into ``out/<name>``, atomically (the module docstring); returns the
    notebook written.  A failure in the cell after the parameters (the check cell) is :class:`Refused`."""
    known = parameters_cell(notebook)
    check_names(params, known)
    out.mkdir(parents=True, exist_ok=True)
    final, partial = out / notebook.name, out / f".{notebook.stem}.partial.ipynb"
    failed = out / f"{notebook.stem}.failed.ipynb"
    try:
        run(notebook, partial, params)
    except BaseException as err:
        written = partial.exists()  # papermill writes the notebook before its first cell
        if written:
            os.replace(partial, failed)
        from papermill.exceptions import PapermillExecutionError

        if not isinstance(err, PapermillExecutionError):
            raise
        kept = (f"the failed run is in {_shown(failed)}" if written else "no notebook was written") + (
            f"; {_shown(final)} is unchanged" if final.exists() else "")
        line = err.evalue.splitlines()[0] if err.evalue else err.ename
        if err.ename == "ValueError" and written and _is_check_cell(failed, err.cell_index):
            name = line.split(" ", 1)[0].rstrip(":")
            stated = f"\nthe parameters cell: {known[name]}" if name in known else ""
            raise Refused(f"{line}{stated}\n{kept}") from None
        raise Failed(f"{notebook.name} failed in cell {err.cell_index}: {err.ename}: {line}\n{kept}") from None
    os.replace(partial, final)
    failed.unlink(missing_ok=True)  # an earlier failure is no longer the latest run
    return final


def _is_check_cell(notebook: Path, index: int) -> bool:
    """Whether cell ``index`` of the executed ``notebook`` (papermill's error banners left out, as in its
    ``cell_index``) is the first code cell after the injected one."""
    cells = [c for c in json.loads(notebook.read_text())["cells"]
             if "papermill-error-cell-tag" not in c.get("metadata", {}).get("tags", [])]
    code = [i for i, c in enumerate(cells) if c["cell_type"] == "code"]
    injected = next(i for i in code if "injected-parameters" in cells[i].get("metadata", {}).get("tags", []))
    return index == next((i for i in code if i > injected), None)


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=True)
    ap.add_argument("number", help="the chapter's two digits, e.g. 02")
    ap.add_argument("--out", type=Path, default=OUT, help="the folder of the rerun notebooks (_build/chapters)")
    args, rest = ap.parse_known_args(argv)
    try:
        notebook = chapter(args.number)
        written = rerun(notebook, parse(rest), args.out)
    except Refused as err:
        print(f"make chapter N={args.number}: {err}", file=sys.stderr)
        return 2
    except Failed as err:
        print(f"make chapter N={args.number}: {err}", file=sys.stderr)
        return 1
    print(f"wrote {_shown(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
