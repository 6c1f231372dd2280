"""tests/conftest.py's rule for a tool the machine lacks (Chromium, a SLURM cluster): skip with one line
naming it and how to install it, counted in the run's summary; under CI (``CI`` set, not to 0/false), fail."""
from pathlib import Path
from types import SimpleNamespace

import pytest

PIECE, HOW = "a SLURM cluster (no sbatch on PATH)", "as root, .ci/slurm-up starts one"


@pytest.mark.parametrize("value", ["", "0", "false", "False"])
def test_outside_ci_a_missing_piece_skips_naming_it_and_how_to_install_it(missing, monkeypatch, value):
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.skip.Exception, match=r"^a SLURM cluster \(no sbatch on PATH\) is missing: as root"):
        missing(PIECE, HOW)


@pytest.mark.parametrize("value", ["true", "1", "yes"])
def test_under_ci_a_missing_piece_fails(missing, monkeypatch, value):
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match=rf"is missing, and CI={value} requires it: as root"):
        missing(PIECE, HOW)


@pytest.fixture()
def conftest(request):
    """tests/conftest.py as pytest loaded it (every conftest.py outside a package is a module "conftest")."""
    return request.config.pluginmanager.get_plugin(str(Path(__file__).resolve().parents[1] / "conftest.py"))


def test_the_summary_counts_the_skips_of_each_missing_piece(monkeypatch, missing, conftest):
    monkeypatch.setattr(conftest, "SKIPPED_FOR", type(conftest.SKIPPED_FOR)())
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as skip:
        missing(PIECE, HOW)
    reason = f"Skipped: {skip.value.msg}"
    for longrepr in [("tests/test_slurm.py", 120, reason)] * 2 + [("tests/test_x.py", 3, "Skipped: other reason")]:
        conftest.pytest_runtest_logreport(SimpleNamespace(skipped=True, longrepr=longrepr))
    lines = []
    conftest.pytest_terminal_summary(SimpleNamespace(write_sep=lambda *a: None, write_line=lines.append))
    assert lines == [f"{PIECE}: 2 tests skipped; {HOW}"]
