"""experiments/exact_twins.py under bad input (issue 41, item 10): every bad flag exits 2 with one line on stderr
before any data is read; a dirty checkout is refused without --allow-dirty; SIGINT leaves the results whole.

The data is a tiny generated .npz (no test may need CIFAR-10); a PreResNet-8 on it trains two float64 units in
a few seconds."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cifar10_helpers import write_npz

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("exact_twins", ROOT / "experiments" / "exact_twins.py")
twins_cli = importlib.util.module_from_spec(spec)
spec.loader.exec_module(twins_cli)

pytestmark = pytest.mark.usefixtures("one_thread")
#: a run small enough for a test: 4 epochs of 2 steps, batch 4, PreResNet-8, float64 only.
SMALL = ["--depth", "8", "--epochs", "4", "--steps-per-epoch", "2", "--batch-size", "4", "--probe-size", "4",
         "--precisions", "float64", "--pairs", "step", "--allow-dirty"]


@pytest.fixture()
def npz(tmp_path):
    rng = np.random.default_rng(0)
    return write_npz(tmp_path / "tiny.npz", {
        "x_train": rng.integers(0, 256, (64, 32, 32, 3), dtype=np.uint8), "y_train": rng.integers(0, 10, 64),
        "x_test": rng.integers(0, 256, (16, 32, 32, 3), dtype=np.uint8), "y_test": rng.integers(0, 10, 16)})


def refuse_data(monkeypatch):
    """Fail the test if the script reads any data."""
    def refuse(path):
        raise AssertionError(f"data was read: {path}")
    monkeypatch.setattr(twins_cli, "load_npz", refuse)


def one_line_exit_2(argv, capsys, needle):
    with pytest.raises(SystemExit) as info:
        twins_cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1, err
    assert needle in err[-1], err[-1]
    assert "Traceback" not in err[-1]
    return err[-1]


@pytest.mark.parametrize("flags, needle", [
    (["--seed", "-1"], "--seed"),
    (["--depth", "7"], "--depth"),
    (["--lr", "nan"], "--lr"),
    (["--lr", "inf"], "--lr"),
    (["--record-every", "0"], "--record-every"),
    (["--record-every", "3"], "record_every must divide"),
    (["--epochs", "0"], "--epochs"),
    (["--threads", "0"], "--threads"),
    (["--probe-size", "1"], "--probe-size"),
    (["--wd", "0.5"], "lr*wd"),
    (["--momentum", "1"], "--momentum"),
    (["--rescale-at", "1"], "--rescale-at"),
    (["--near", "0"], "--near"),
    (["--near", "1e300"], "lr*wd"),
    (["--runs", "near"], "--runs near needs --near"),
])
def test_a_bad_flag_exits_2_with_one_line_before_any_data_is_read(flags, needle, npz, tmp_path, capsys, monkeypatch):
    refuse_data(monkeypatch)
    one_line_exit_2([*SMALL, "--data", str(npz), "--out", str(tmp_path / "m.json"), *flags], capsys, needle)


def test_a_bad_out_exits_2_before_the_compute(npz, tmp_path, capsys, monkeypatch):
    refuse_data(monkeypatch)
    one_line_exit_2([*SMALL, "--data", str(npz), "--out", str(tmp_path)], capsys, "is a folder")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    one_line_exit_2([*SMALL, "--data", str(npz), "--out", str(a_file / "sub" / "m.json")], capsys, "is not a folder")


def test_a_missing_or_bad_data_file_exits_2_with_one_line(tmp_path, capsys):
    one_line_exit_2([*SMALL, "--data", str(tmp_path / "none.npz"), "--out", str(tmp_path / "m.json")], capsys,
                    "no such file")
    one_line_exit_2([*SMALL, "--data", str(tmp_path), "--out", str(tmp_path / "m.json")], capsys, "is a folder")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    one_line_exit_2([*SMALL, "--data", str(bad), "--out", str(tmp_path / "m.json")], capsys, "--data")
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("content", ["{not json", "[1, 2, 3]", '{"settings": [], "data": {}, "units": {}}', "\xff"])
def test_a_malformed_resume_file_exits_2_with_one_line_before_any_data_is_read(content, npz, tmp_path, capsys,
                                                                               monkeypatch):
    refuse_data(monkeypatch)
    out = tmp_path / "m.json"
    out.write_bytes(content.encode("latin-1"))
    one_line_exit_2([*SMALL, "--data", str(npz), "--out", str(out), "--resume"], capsys, "--resume")
    assert out.read_bytes() == content.encode("latin-1")


def test_a_dirty_checkout_is_refused_without_allow_dirty(npz, tmp_path, capsys, monkeypatch):
    refuse_data(monkeypatch)
    monkeypatch.setattr(twins_cli, "source_state", lambda: {"commit": "0" * 40, "dirty": True})
    argv = [a for a in SMALL if a != "--allow-dirty"]
    one_line_exit_2([*argv, "--data", str(npz), "--out", str(tmp_path / "m.json")], capsys, "--allow-dirty")
    monkeypatch.setattr(twins_cli, "source_state", lambda: {"commit": None, "dirty": None})
    one_line_exit_2([*argv, "--data", str(npz), "--out", str(tmp_path / "m.json")], capsys, "uncommitted")


@pytest.mark.slow
def test_a_run_records_its_commit_and_resumes(npz, tmp_path, capsys, monkeypatch):
    """Two units written with the source state; a rerun with --resume trains nothing; other settings are refused."""
    monkeypatch.setattr(twins_cli, "source_state", lambda: {"commit": "f" * 40, "dirty": False})
    out = tmp_path / "m.json"
    argv = [a for a in SMALL if a != "--allow-dirty"] + ["--data", str(npz), "--out", str(out), "--rescale-at",
                                                          "1.01", "--near", "0.1", "--runs", "exact", "control", "near"]
    assert twins_cli.main(argv) == 0
    written = json.loads(out.read_text())
    assert written["machine"]["git"] == {"commit": "f" * 40, "dirty": False}
    unit = written["units"]["step/float64"]
    assert set(unit["deviation"]) == {"exact", "control", "near"} and unit["rescalings"]["exact"] >= 1
    assert written["summary"]["step"]["rescalings"] == unit["rescalings"]["exact"]
    capsys.readouterr()
    monkeypatch.setattr(twins_cli, "run_unit", lambda *a, **k: pytest.fail("a finished unit was trained again"))
    assert twins_cli.main([*argv, "--resume"]) == 0
    assert "done before, skipped" in capsys.readouterr().err
    one_line_exit_2([*argv, "--resume", "--seed", "1"], capsys, "another experiment")


#: the experiment as a subprocess whose second unit receives a real SIGINT from its own process as it starts (a
#: signal sent from outside lands wherever the machine's scheduling puts it), SIGINT ignored as a background job
#: inherits it: the experiment must handle it all the same
SIGINT_AT_SECOND_UNIT = """
import os, runpy, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
import explr.book.twins as twins
real, units = twins.run_unit, []
def run_unit(*args, **kwargs):
    units.append(args[5])
    if len(units) == 2:
        os.kill(os.getpid(), signal.SIGINT)
    return real(*args, **kwargs)
twins.run_unit = run_unit
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_sigint_prints_one_line_and_leaves_the_results_whole(npz, tmp_path):
    """SIGINT as the second unit starts (after the first is written), also where the process inherited it ignored:
    exit 130, one line naming it, no traceback, the file a whole JSON object holding the first unit."""
    out = tmp_path / "m.json"
    cmd = [sys.executable, "-c", SIGINT_AT_SECOND_UNIT, str(ROOT / "experiments" / "exact_twins.py"), *SMALL,
           "--pairs", "step", "cosine", "--data", str(npz), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    err = proc.stderr
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert [line for line in err.splitlines() if not line.startswith("[")] == [err.splitlines()[-1]]
    assert "interrupted by SIGINT" in err.splitlines()[-1]
    assert set(json.loads(out.read_text())["units"]) == {"step/float64"}
