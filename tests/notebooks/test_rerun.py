"""``make chapter`` (.ci/chapter.py): a refused rerun says why in a few lines, and never loses the last good notebook.

Two runs start a real kernel (a few seconds each: they stop at the chapter's check cell); the rest call the
runner's functions with a stand-in for papermill."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("chapter_runner", ROOT / ".ci" / "chapter.py")
runner = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runner)
CH01 = runner.chapter("01")


def make_chapter(tmp_path, *args) -> tuple[int, list[str]]:
    """The runner as ``make chapter`` calls it, in a process of its own: (exit status, its output's lines)."""
    proc = subprocess.run([sys.executable, str(ROOT / ".ci" / "chapter.py"), *args, "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT)
    return proc.returncode, (proc.stdout + proc.stderr).splitlines()


@pytest.mark.chapters
@pytest.mark.parametrize("args, named, shown", [
    (["04", "-p", "dim", "2"], "dim = 2: must be an integer in [3, ", "dim = 5  # m, the input dimension: integer in [3, 134217728]"),
    (["01", "-p", "lr", "abc"], "lr = 'abc': must be a finite number in (0, 1e+06]", "lr = 5.0  # its learning rate, in (0, 1e6]"),
], ids=["out-of-range", "wrong-type"])
def test_a_value_out_of_range_or_of_the_wrong_type_stops_in_three_lines(tmp_path, args, named, shown):
    """Out of range, wrong type: exit 2 at the check cell with the check's line and the parameters cell's (the
    same range), no kernel warning; the last good notebook stays as it was, the failed run beside it."""
    name = runner.chapter(args[0]).name
    (tmp_path / name).write_text("last good")
    code, lines = make_chapter(tmp_path, *args)
    assert code == 2 and len(lines) <= 3, lines
    assert named in lines[0] and lines[1].startswith(f"the parameters cell: {shown}"), lines
    assert not any("without encryption" in ln for ln in lines), lines
    assert (tmp_path / name).read_text() == "last good"
    failed = json.loads((tmp_path / name.replace(".ipynb", ".failed.ipynb")).read_text())
    assert any("injected-parameters" in c["metadata"].get("tags", []) for c in failed["cells"])
    assert not list(tmp_path.glob(".*partial*")), "the partial notebook was renamed, not left behind"


def test_a_misspelled_parameter_is_refused_with_the_nearest_name(tmp_path, capsys):
    """``-p stepz 300`` stops before any kernel starts (exit 2, one line), suggesting ``steps``; a name with
    no near neighbour lists the known ones."""
    assert runner.main(["01", "-p", "stepz", "300", "--out", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert out.err.splitlines() == [
        "make chapter N=01: stepz: no such parameter; did you mean steps? known: steps, lr, batch_size, seed"]
    with pytest.raises(runner.Refused, match=r"^zzz: no such parameter; known: steps, lr"):
        runner.rerun(CH01, {"zzz": 1}, tmp_path, run=pytest.fail)
    assert not list(tmp_path.iterdir()), "nothing is written for a refused name"


@pytest.mark.parametrize("words, message", [
    (["-p", "steps"], "-p needs a name and a value"),
    (["-x", "1"], "'-x' is not a parameter option"),
    (["-y", "[1, 2]"], "is not a mapping"),
    (["-y", "a: [1"], "-y is not YAML"),
])
def test_malformed_arguments_are_refused_in_one_line(words, message):
    with pytest.raises(runner.Refused, match=message.replace("[", r"\[")) as err:
        runner.parse(words)
    assert len(str(err.value).splitlines()) == 1


def test_arguments_are_typed_as_papermill_types_them():
    assert runner.parse(["-p", "steps", "300", "-p", "lr", "0.5", "-r", "seed", "7", "-y", "lrs: [0.1, 0.05]",
                         "-p", "flag", "False"]) == {"steps": 300, "lr": 0.5, "seed": "7", "lrs": [0.1, 0.05],
                                                     "flag": False}


def test_an_unknown_chapter_lists_the_chapters(tmp_path, capsys):
    assert runner.main(["99", "--out", str(tmp_path)]) == 2
    assert "N = '99': no chapter book/99_*.ipynb; N is one of 01, 02" in capsys.readouterr().err


def _writes_then(outcome):
    """A stand-in for papermill: writes a partial notebook, as papermill does after each cell, then ``outcome``."""
    def run(notebook, partial, params):
        partial.write_text(json.dumps({"params": params}))
        if isinstance(outcome, BaseException):
            raise outcome
    return run


def test_a_finished_rerun_replaces_the_notebook(tmp_path):
    """... and removes an earlier failed run: it is no longer the latest."""
    (tmp_path / CH01.name).write_text("last good")
    (tmp_path / CH01.name.replace(".ipynb", ".failed.ipynb")).write_text("an earlier failure")
    written = runner.rerun(CH01, {"steps": 20}, tmp_path, run=_writes_then(None))
    assert written == tmp_path / CH01.name and json.loads(written.read_text()) == {"params": {"steps": 20}}
    assert sorted(p.name for p in tmp_path.iterdir()) == [CH01.name]


@pytest.mark.parametrize("error", [KeyboardInterrupt(), OSError("disk full")])
def test_an_interrupted_rerun_keeps_the_last_good_notebook(tmp_path, error):
    """An interruption or an error outside the chapter: raised as it is, the partial run kept as .failed."""
    (tmp_path / CH01.name).write_text("last good")
    with pytest.raises(type(error)):
        runner.rerun(CH01, {"steps": 20}, tmp_path, run=_writes_then(error))
    assert (tmp_path / CH01.name).read_text() == "last good"
    assert json.loads((tmp_path / CH01.name.replace(".ipynb", ".failed.ipynb")).read_text())["params"]


def test_a_chapter_failing_after_its_check_exits_1_and_says_where(tmp_path):
    """An error in a later cell is not a parameter refusal: Failed, naming the cell and the error's first line."""
    from papermill.exceptions import PapermillExecutionError

    def run(notebook, partial, params):
        cells = json.loads(notebook.read_text())["cells"]
        cells.insert(0, {"cell_type": "code", "metadata": {"tags": ["injected-parameters"]}, "source": ""})
        partial.write_text(json.dumps({"cells": cells}))
        raise PapermillExecutionError(len(cells) - 1, 9, "boom", "ZeroDivisionError", "division by zero\nmore", [])

    with pytest.raises(runner.Failed) as err:
        runner.rerun(CH01, {}, tmp_path, run=run)
    lines = str(err.value).splitlines()
    assert lines[0].startswith(f"{CH01.name} failed in cell ") and "ZeroDivisionError: division by zero" in lines[0]
    assert len(lines) == 2 and "failed run is in" in lines[1]


def test_the_kernel_is_started_with_transport_encryption():
    """ipykernel warns "running over TCP without encryption" unless the manager provisions CurveZMQ keys: the
    runner's setting asks for them ("auto"), which takes effect only where pyzmq has Curve and the kernelspec
    declares it; both hold here, or this fails."""
    import zmq
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from traitlets.config import Config

    manager = KernelManager(kernel_name="python3", config=Config(runner.KERNEL_CONFIG))
    assert manager.transport_encryption == "auto" and zmq.has("curve")
    assert "curve" in KernelSpecManager().get_kernel_spec("python3").metadata.get("supported_encryption", [])
    assert KernelManager(kernel_name="python3").transport_encryption == "disabled", "the default, which warns"
