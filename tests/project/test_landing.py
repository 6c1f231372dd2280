"""The landing page's results table (.ci/results_table.py): generated from the executed chapters, and the
committed file is what they give now, so it cannot go stale."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("results_table", ROOT / ".ci" / "results_table.py")
results_table = importlib.util.module_from_spec(spec)
sys.modules["results_table"] = results_table  # its dataclasses look their module up
spec.loader.exec_module(results_table)


def test_committed_results_table_is_what_the_chapters_print():
    committed = results_table.OUTPUT.read_text(encoding="utf-8")
    assert committed == results_table.table(), (
        "book/_generated/results_table.md is stale (a chapter's checks changed): "
        "run `python .ci/results_table.py` and commit the file")


def test_the_landing_page_includes_the_table():
    index = json.loads((ROOT / "book" / "index.ipynb").read_text(encoding="utf-8"))
    text = "".join("".join(c["source"]) for c in index["cells"] if c["cell_type"] == "markdown")
    assert "```{include} _generated/results_table.md" in text


def test_every_paper_result_has_a_row_and_a_book_number():
    text = results_table.table()
    for name, _keys, number, fallback, _pattern in results_table.RESULTS:
        assert f"| {name}" in text or f", {name}" in text, name
        if fallback:
            assert f"{{prf:ref}}`{fallback}`" in text or "{prf:ref}" in text, name


@pytest.mark.parametrize("line, expected", [
    ("✓ TEXP ≡ Step Decay: measured 3.6e-14, tolerance 1e-09", ("✓", "TEXP ≡ Step Decay", "3.6e-14", "1e-09")),
    ("✓ runs that left the cone: measured 128", ("✓", "runs that left the cone", "128", "")),
    ("✓ float32 without rescaling stops", ("✓", "float32 without rescaling stops", "", "")),
    ("SKIPPED (not asserted): C3 (exact twins); needs 5 seeds", ("skipped", "C3 (exact twins)", "", "needs 5 seeds")),
    ("identity 3  Hessian theta = -grad : True", ("✓", "identity 3  Hessian theta = -grad", "holds", "")),
    ("3000 steps = 300 epochs × 10 steps", None),
])
def test_check_lines_are_read_in_every_dialect(line, expected):
    check = results_table.parse_check(line)
    assert (None if check is None else (check.status, check.claim, check.measured, check.tolerance)) == expected


def test_paper_numbers_are_read_from_theorem_titles():
    keys = results_table.paper_keys
    assert keys("Constant LR with WD equals exponential LR (Li & Arora, Thms 2.1 and 2.5)") == {
        ("thm", "2.1"), ("thm", "2.5")}
    assert keys("Norm growth with momentum (Li & Arora, Lemma B.1)") == {("lemma", "B.1")}
    assert keys("The toy problem (Li & Arora, Section 3)") == {("sec", "3")}
    assert keys("Step decay") == set()


def test_a_table_cell_cannot_break_the_markdown():
    assert results_table.escape("a | b $x$ *c* <d>") == r"a \| b \$x\$ \*c\* \<d\>"
