"""Every chapter: well-formed, and executed end to end by papermill with small parameters, as a reader reruns it.

* ``SMOKE``: the small parameters that every run of a chapter starts from;
* ``RERUN``: a perturbed set on top of SMOKE (other seed, lr/wd/momentum, sizes), as a reader would;
* every ``make chapter N=NN ARGS="..."`` command in a chapter's markdown ("Try this") runs on the small,
  perturbed base SMOKE + RERUN, updated by its ``-p``/``-y`` parameters; the README's example runs exactly
  as written.  Every parameter of RERUN keeps its perturbed value in at least one of a chapter's commands
  (:func:`test_every_perturbed_parameter_is_run`), so a run at SMOKE + RERUN alone would add nothing but a
  kernel's start and a chapter's time; it is made only for a chapter of :data:`OWN_RERUN`.  (A run at
  SMOKE alone is not made either: each run already is one, plus a change);
* ``INVALID``: an out-of-range value per chapter, which must stop the chapter at its check cell (the first
  cell after the parameters) with a one-line error naming it.  These runs execute the chapter's cells in
  the test's own process, up to that cell, with the parameter cell papermill injects: a kernel's start and
  imports would cost more than the one cell they evaluate.

nbval (``pytest book --nbval-lax``, part of ``make test``) separately re-runs the committed
notebooks with their default parameters and compares the cells tagged ``nbval-check-output``.
"""
import json
import os
import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
CHAPTERS = sorted(p.stem for p in BOOK.glob("[0-9][0-9]_*.ipynb"))

# Small parameters every papermill run of a chapter starts from (seconds, not minutes);
# "{tmp}" in a string value becomes the test's temporary directory.
SMOKE = {
    "01_scale_invariance": {"steps": 20},
    "02_wd_exp_lr": {"steps": 200, "record_every": 5},
    "03_multi_phase": {"epochs": 40, "milestones": [20, 30]},
    "04_bn_wd_counterexample": {"steps": 200, "seeds": 4, "burn_in": 100, "batch_sizes": [4, 16], "sweep_seeds": 4, "sweep_steps": 200, "sweep_burn_in": 100,
                                "population_steps": 1500, "exit_radii": [10, 1000], "exit_seeds": 4},
    "05_continuous_time": {"hidden": 6, "n_train": 128, "horizon": 0.5, "lrs": [0.1, 0.05, 0.025], "rtol": 1e-9,
                           "ray_scales": [0.5, 1.0, 2.0], "wd_horizon": 0.5, "sgd_steps": 20, "trans_steps": 3,
                           "edge_time": 0.1},  # the edge-of-stability run too short to settle: its claims skip
    "06_cifar10": {"train": True, "data": "synthetic", "synthetic_images": 128, "epochs": 2, "depth": 8,
                   "seeds": [0, 1], "out": "{tmp}/cifar10-live"},
    "07_using_explr": {"epochs": 8, "milestones": [4, 6], "extreme_steps": 200, "engine": False},
}


# A perturbed parameter set per chapter, applied on top of SMOKE: what a reader would change (seconds, too).
RERUN = {
    "01_scale_invariance": {"seed": 2, "batch_size": 64, "lr": 2.0, "steps": 15},
    "02_wd_exp_lr": {"seed": 1, "batch_size": 64, "lr": 0.05, "wd": 1e-3, "momentum": 0.5, "init_scale": 2.5,
                     "steps": 150, "record_every": 3},
    "03_multi_phase": {"seed": 1, "lr": 0.05, "wd": 1e-3, "momentum": 0.5, "epochs": 36, "milestones": [12, 30],
                       "record_every": 5},
    "04_bn_wd_counterexample": {"seed": 5, "lr": 0.2, "wd": 0.02, "dim": 4, "batch_size": 16, "eps_frac": 0.5,
                                "exit_radii": [20, 500], "batch_sizes": [8, 32, 128]},
    "05_continuous_time": {"seed": 1, "hidden": 6, "n_train": 200, "lrs": [0.08, 0.04], "wd": 0.2, "wd_lr": 0.1,
                           "sgd_lr": 0.3, "sgd_wd": 0.02, "momentum": 0.5, "batch_size": 64, "trans_lr": 0.1},
    "06_cifar10": {"seeds": [2, 5], "epochs": 3, "precision": "fp32", "synthetic_images": 160},  # every experiment
    "07_using_explr": {"seed": 1, "lr": 0.05, "wd": 1e-3, "momentum": 0.5, "epochs": 12,
                       "milestones": [5, 9], "extreme_steps": 300},  # the engine's demo: nbval runs it
}

# Out-of-range values per chapter, one run each: the chapter must stop at once with a ValueError naming the
# parameter (the first of each list is the plain case; the rest got past the checks once and failed later).
# Sizes past what the machine holds (10**12 steps, 10**400 epochs) and huge ints for float parameters (10**400,
# beyond float64) are among the latter.
INVALID = {
    "01_scale_invariance": [{"batch_size": 1}, {"lr": 1e300}, {"seed": 2**64}, {"lr": 10**400},
                            {"seed": 2**64 - 1}],  # seed + 1 draws the warm-up batches
    "02_wd_exp_lr": [{"wd": 0.1}, {"init_scale": 10**400}, {"steps": 10**12}],
    "03_multi_phase": [{"momentum": 1.0}, {"epochs": 10**400}],
    "04_bn_wd_counterexample": [{"eps_frac": 1.5}, {"batch_size": 1000000000}, {"delta": 10**400},
                                {"steps": 10**12}, {"norm0": 1e30},  # float32 runs: ‖θ‖² overflows
                                {"lr": 1e-6}],  # the exit runs' window: 3.6e8 steps
    "05_continuous_time": [{"momentum": 1.0}, {"hidden": 10**400}, {"edge_time": 1e300},
                           {"lrs": [1e-300, 0.1]}],  # 1e300 steps
    "06_cifar10": [{"epochs": 1}, {"results": "../results/nope"}, {"device": "cuda:abc"},
                   {"schedules": ["step"]},  # ablation=True needs "texp" (its error names ablation)
                   {"synthetic_images": 10**12}, {"seeds": [2**64]}],
    "07_using_explr": [{"momentum": 1.0}, {"results": "/nonexistent"}, {"extreme_steps": 10**12},
                       {"epochs": 10**12}, {"lr": 1e30}],  # PerStepLR refused rescale_above 1e3 < lr
}
NAMED = {("06_cifar10", "schedules"): "ablation", ("04_bn_wd_counterexample", "lr"): "exit_seeds"}  # the parameter the error must name, where not the one set

COMMAND = re.compile(r'make chapter N=(\d\d) ARGS="([^"]*)"')


def parse_args(args: str) -> dict:
    """papermill's command-line parameters: ``-p name value`` (typed as papermill types them) and ``-y yaml``."""
    from papermill.cli import _resolve_type

    words, params = shlex.split(args), {}
    while words:
        flag = words.pop(0)
        if flag in ("-p", "--parameters"):
            name, value = words.pop(0), words.pop(0)
            params[name] = _resolve_type(value)
        elif flag in ("-y", "--parameters_yaml"):
            params.update(yaml.safe_load(words.pop(0)) or {})
        else:
            raise ValueError(f"unsupported papermill argument {flag!r} in {args!r}")
    return params


def try_this_commands(chapter) -> list[dict]:
    """The parameters of every ``make chapter`` command in the chapter's markdown cells."""
    number = chapter[:2]
    found = []
    for c in cells(chapter):
        if c["cell_type"] == "markdown":
            for n, args in COMMAND.findall("".join(c["source"])):
                assert n == number, f"{chapter}: a command for chapter {n}"
                found.append(parse_args(args))
    return found


def readme_commands() -> list[tuple[str, dict]]:
    text = (ROOT / "README.md").read_text()
    return [(next(ch for ch in CHAPTERS if ch.startswith(n)), parse_args(args)) for n, args in COMMAND.findall(text)]


def with_tmp(parameters: dict, tmp_path) -> dict:
    """``parameters`` with "{tmp}" in a string value replaced by the test's temporary directory."""
    return {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in parameters.items()}


def run_chapter(chapter, parameters, tmp_path):
    """Execute ``chapter`` with ``parameters`` (its arithmetic perturbed, roundoff_guard.py).  Its figures are
    drawn but not rendered (matplotlib's Agg backend): rendering them is a fifth of a smoke run's time, and the
    committed chapters' figures are rendered by nbval and looked at by the browser check."""
    import papermill as pm

    backend = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "Agg"  # for the kernel papermill starts
    try:
        pm.execute_notebook(
            str(BOOK / f"{chapter}.ipynb"),
            str(tmp_path / f"{chapter}.ipynb"),
            parameters=with_tmp(parameters, tmp_path),
            cwd=str(BOOK),
            kernel_name="python3",
            progress_bar=False,
            # the outputs are complete when the last cell returns: stop the kernel at once, not waiting for it
            # to exit
            shutdown_kernel="immediate",
        )
    finally:
        if backend is None:
            os.environ.pop("MPLBACKEND")
        else:
            os.environ["MPLBACKEND"] = backend


def run_to_the_check_cell(chapter, parameters, tmp_path):
    """Execute ``chapter``'s code cells in this process, in a fresh namespace, from the first through the
    one after papermill's injected ``parameters`` (the check cell); returns the injected cell's source.

    The notebook is parameterised by papermill itself (:func:`papermill.parameterize.parameterize_notebook`),
    so the injected cell is the one ``make chapter`` runs.  The chapters use no IPython magics
    (:func:`test_chapter_is_well_formed`), so their code is plain Python."""
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    nb = parameterize_notebook(load_notebook_node(str(BOOK / f"{chapter}.ipynb")),
                               with_tmp(parameters, tmp_path), kernel_name="python3", language="python")
    code = [c for c in nb.cells if c.cell_type == "code"]
    injected = next(i for i, c in enumerate(code) if "injected-parameters" in tags(c))
    namespace = {"__name__": "__main__"}
    cwd = os.getcwd()
    os.chdir(BOOK)  # as papermill's --cwd book
    try:
        for i, cell in enumerate(code[: injected + 2]):
            exec(compile(cell.source, f"<{chapter} code cell {i}>", "exec"), namespace)
    finally:
        os.chdir(cwd)
    return code[injected].source


def cells(chapter):
    return json.loads((BOOK / f"{chapter}.ipynb").read_text())["cells"]


def tags(cell):
    return cell.get("metadata", {}).get("tags", [])


def test_every_chapter_is_in_the_table_of_contents_and_vice_versa():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    entries = toc.get("chapters") or [c for part in toc["parts"] for c in part["chapters"]]
    files = [Path(c["file"]).name for c in entries if re.match(r"\d\d_", Path(c["file"]).name)]
    assert sorted(files) == CHAPTERS
    assert files == sorted(files), "chapters are listed in order"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_is_well_formed(chapter):
    cs = cells(chapter)
    code = [c for c in cs if c["cell_type"] == "code"]
    params = [c for c in code if "parameters" in tags(c)]
    assert len(params) == 1, "exactly one cell tagged 'parameters'"
    names = set(re.findall(r"^(\w+)\s*=", "".join(params[0]["source"]), flags=re.M))
    assert set(SMOKE.get(chapter, {})) <= names, "smoke parameters must exist in the parameters cell"
    from papermill.translators import PythonTranslator

    parsed = {p.name for p in PythonTranslator.inspect({"source": "".join(params[0]["source"])})}
    assert parsed == names, f"papermill cannot parse {sorted(names - parsed)} ('Unable to parse line' on make chapter)"
    assert any("nbval-check-output" in tags(c) for c in code), "some result cells are checked by nbval"
    assert any(re.search(r"^\s*assert ", "".join(c["source"]), flags=re.M) for c in code), "claims are asserted"
    assert cs[0]["cell_type"] == "markdown" and "".join(cs[0]["source"]).lstrip().startswith(("(", "#"))
    for c in code:
        for out in c.get("outputs", []):
            assert out.get("output_type") != "error", "committed notebook holds an error output"
            assert out.get("name") != "stderr" or "Warning" not in "".join(out.get("text", "")), "warnings in outputs"
    assert all(c.get("execution_count") for c in code), "commit the notebook executed, in order"


#: chapters whose "Try this" commands run on SMOKE alone, with a run of their own at SMOKE + RERUN:
#: chapter 6's commands analyse the committed results, which have none of RERUN's seeds
OWN_RERUN = {"06_cifar10"}


def try_this_base(chapter) -> dict:
    """The parameters a chapter's "Try this" commands update: SMOKE + RERUN, or SMOKE (:data:`OWN_RERUN`)."""
    return dict(SMOKE[chapter]) if chapter in OWN_RERUN else {**SMOKE[chapter], **RERUN[chapter]}


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_perturbed_parameter_is_run(chapter):
    assert chapter in SMOKE, f"add smoke parameters for {chapter} to SMOKE in {__file__}"
    assert RERUN.get(chapter), f"add a perturbed parameter set for {chapter} to RERUN in {__file__}"
    if chapter in OWN_RERUN:
        return  # test_chapter_runs_small_with_a_readers_parameters runs it
    commands = try_this_commands(chapter)
    assert commands, f"{chapter} has no 'Try this' command: add it to OWN_RERUN"
    overridden = [name for name in RERUN[chapter] if all(name in c for c in commands)]
    assert not overridden, f"{chapter}: every command overrides {overridden}; add it to OWN_RERUN"


@pytest.mark.chapters
@pytest.mark.parametrize("chapter", sorted(OWN_RERUN))
def test_chapter_runs_small_with_a_readers_parameters(chapter, tmp_path):
    run_chapter(chapter, {**SMOKE[chapter], **RERUN[chapter]}, tmp_path)


@pytest.mark.chapters
@pytest.mark.parametrize("chapter, index", [(ch, i) for ch in CHAPTERS for i in range(len(try_this_commands(ch)))])
def test_try_this_commands_run(chapter, index, tmp_path):
    run_chapter(chapter, {**try_this_base(chapter), **try_this_commands(chapter)[index]}, tmp_path)


@pytest.mark.chapters
@pytest.mark.parametrize("chapter, params", readme_commands())
def test_readme_example_runs_as_written(chapter, params, tmp_path):
    run_chapter(chapter, params, tmp_path)


def test_readme_shows_a_rerun_example():
    assert readme_commands(), "README shows how to rerun a chapter with other parameters"


@pytest.mark.chapters
@pytest.mark.parametrize("chapter, params", [(ch, p) for ch in CHAPTERS for p in INVALID.get(ch, [{}])],
                         ids=lambda v: "-".join(f"{k}={short_id(v[k])}" for k in v) if isinstance(v, dict) else v)
def test_out_of_range_parameters_stop_with_one_clear_line(chapter, params, tmp_path):
    assert params, f"add an out-of-range parameter for {chapter} to INVALID in {__file__}"
    (name, value), = params.items()
    with pytest.raises(ValueError) as err:
        injected = run_to_the_check_cell(chapter, {**SMOKE[chapter], name: value}, tmp_path)
        pytest.fail(f"{chapter} ran its check cell with {name} = {value!r} (injected:\n{injected})")
    named = NAMED.get((chapter, name), name)
    message = str(err.value)
    assert message.startswith(f"{named} = "), message
    assert len(message.splitlines()) == 1, message
    cell = next(e for e in reversed(err.traceback) if e.frame.code.raw.co_filename.startswith(f"<{chapter}"))
    assert cell.frame.code.raw.co_filename.endswith(f"code cell {cell_after_parameters(chapter)}>"), \
        f"{chapter} stopped in {cell.frame.code.raw.co_filename}, not in its check cell"


def short_id(value) -> str:
    """A value as a test id shows it: 10**400 as "10000000...(401 chars)"."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:8]}...({len(text)} chars)"


def cell_after_parameters(chapter) -> int:
    """The index among the code cells, once papermill has injected its cell, of the check cell."""
    code = [c for c in cells(chapter) if c["cell_type"] == "code"]
    return next(i for i, c in enumerate(code) if "parameters" in tags(c)) + 2


def test_the_check_cell_runner_returns_when_the_parameters_are_valid(tmp_path):
    """A value inside its range passes chapter 1's check cell and the runner returns there, having run no
    further: so an out-of-range test above fails (``pytest.fail``) where a check is missing."""
    injected = run_to_the_check_cell("01_scale_invariance", {**SMOKE["01_scale_invariance"], "lr": 2.0}, tmp_path)
    assert "lr = 2.0" in injected


#: the cells a reader does not see expanded on the page: collapsed (hide-input, hide-cell) or removed
NOT_SHOWN = {"hide-input", "hide-cell", "remove-input", "remove-cell"}
#: the book's limit on a chapter's visible code (CONTRIBUTING.md): the code that teaches, not the plumbing
MAX_VISIBLE_CODE = 150


def visible_code_lines(chapter) -> int:
    """The lines (blank ones included, as the page shows them) of the code cells shown expanded."""
    return sum(len("".join(c["source"]).splitlines()) for c in cells(chapter)
               if c["cell_type"] == "code" and not NOT_SHOWN & set(tags(c)))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_visible_code_is_at_most_150_lines(chapter):
    assert visible_code_lines(chapter) <= MAX_VISIBLE_CODE, \
        f"{chapter} shows {visible_code_lines(chapter)} lines of code: collapse plumbing (tag hide-input)"


def test_the_visible_code_count_counts_what_the_page_shows():
    """Chapter 1 with its collapsed cells expanded shows more than the limit: the count reads the tags."""
    shown = sum(len("".join(c["source"]).splitlines()) for c in cells("01_scale_invariance")
                if c["cell_type"] == "code" and "remove-cell" not in tags(c))
    assert shown > MAX_VISIBLE_CODE >= visible_code_lines("01_scale_invariance")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_try_this_is_a_heading(chapter):
    """One style for a chapter's "Try this": a ``##`` heading, never bold text."""
    text = "\n".join("".join(c["source"]) for c in cells(chapter) if c["cell_type"] == "markdown")
    assert re.search(r"^## Try this\s*$", text, flags=re.M), f"{chapter}: no '## Try this' heading"
    assert "**Try this**" not in text


#: pseudo-TeX in a printed line or a table cell: ``θ_{k+1}``, ``η^2``, ``θ_k`` (a one-letter symbol and its index)
PSEUDO_TEX = re.compile(r"_\{|\^|(?<![\w\\])[A-Za-zα-ωΑ-Ω]\u0303?_[A-Za-z0-9]\b")
#: what a chapter may print with it: the library's own error messages, quoted as raised (Python notation)
QUOTED_ERRORS = re.compile(r"sqrt\(momentum\)\)\^2|x\^2 - \(1 \+ momentum|is 2\^[\d.]+, beyond")


def pseudo_tex(chapter) -> list[str]:
    """The lines of a chapter's outputs (printed text, markdown tables outside $…$) that write maths as TeX."""
    found = []
    for c in cells(chapter):
        for out in c.get("outputs", []):
            text = "".join(out.get("text", "")) + "\n" + re.sub(
                r"\$[^$]*\$", "", "".join(out.get("data", {}).get("text/markdown", "")))
            found += [ln.strip() for ln in text.splitlines() if PSEUDO_TEX.search(QUOTED_ERRORS.sub("", ln))]
    return found


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_outputs_write_maths_in_unicode_not_pseudo_tex(chapter):
    found = pseudo_tex(chapter)
    assert not found, f"{chapter} prints maths as TeX (θₖ₊₁, η², 1/√B instead): {found[:5]}"


def test_the_pseudo_tex_rule_tells_tex_from_names():
    assert all(PSEUDO_TEX.search(s) for s in ("‖θ_{k+1}‖", "∝ η^2", "θ_k", "W_2 = 41", "η̃_k"))
    assert not any(PSEUDO_TEX.search(s) for s in ("batch_size = 64", "θₖ₊₁", "η²", "exit_radii", "1/√B"))
