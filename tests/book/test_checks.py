"""explr.book.checks: one line per claim, the closing table, the round-off rule of what is shown, and the bounds of
a chapter's parameters (the memory a count holds, the seeds torch takes)."""
import pytest

from explr.book.checks import EXACTNESS, MEMORY, Checks, bound, count, held, most, seed_rule, shown
from explr.params import check_parameters


def test_checks_print_one_line_per_claim_raise_on_a_failure_and_tabulate(capsys):
    checks = Checks()
    checks.claim("TEXP ≡ Step Decay", 3.6e-14 < 1e-9, measured=3.6e-14, tolerance=1e-9)
    checks.claim("ratio near 1", True, measured=1.0096, tolerance=0.01)
    checks.skip("drift past 1e-2", "needs >= 2000 steps")
    assert capsys.readouterr().out.splitlines() == [
        "✓ TEXP ≡ Step Decay: measured < 1e-10, tolerance 1e-09",
        "✓ ratio near 1: measured 1.01, tolerance 0.01",
        "SKIPPED (not asserted): drift past 1e-2; needs >= 2000 steps"]
    # a failure shows every digit: it is an error to read, not an output to commit
    with pytest.raises(AssertionError, match=r"^✗ twins agree: measured 0.2034567, tolerance 0.024$"):
        checks.claim("twins agree", False, measured=0.2034567, tolerance=0.024)
    assert checks.skipped == ["drift past 1e-2"]
    checks.claim("TEXP grows", True)
    checks.claim("the invariance breaks", 0.0104 > 2.22e-10, measured=0.0104, tolerance=2.22e-10)
    # the closing table: the claims by kind of tolerance (the failed claim is not counted), not the ✓ lines again
    table = checks.markdown().splitlines()
    assert table[0] == "| kind of claim | claims | why this tolerance |" and len(table) == 6, table
    assert [row.split(" | ")[:2] for row in table[2:]] == [
        ["| exact up to round-off", "1"], ["| a value against its threshold", "2"], ["| holds or not", "1"],
        ["| skipped", "drift past 1e-2 (needs >= 2000 steps)"]]
    assert not any("TEXP ≡ Step Decay" in row for row in table)


@pytest.mark.parametrize("tolerance, expected", [
    (1e-9, 1e-10), (1e-12, 1e-13), (8.8e-12, 1e-13), (1e-7, 1e-8), (1e-6, 1e-7), (2e-6, 0.0), (0.05, 0.0),
    (0, 0.0)])
def test_the_bound_is_a_power_of_ten_a_tenth_of_an_exactness_tolerance_or_below(tolerance, expected):
    assert bound(tolerance) == pytest.approx(expected, rel=1e-12)
    assert bound(tolerance) <= tolerance / 10
    assert (bound(tolerance) > 0) == (0 < tolerance <= EXACTNESS)


def test_values_at_round_off_read_the_same_whatever_their_last_digits():
    # the digits that moved between two CPUs (issue: 5.2e-17 / 1.13e-16, 0 / 2.22e-16, 3.95e-15 / 7.49e-15)
    for a, b, tolerance in [(5.2e-17, 1.13e-16, 1e-9), (0.0, 2.22e-16, 1e-13), (3.95e-15, 7.49e-15, 1e-10)]:
        assert shown(a, tolerance) == shown(b, tolerance) == f"< {bound(tolerance):.0e}"
    # ... while a quantity of its own keeps its digits, and without a tolerance nothing is bounded
    assert shown(0.0031, 0.05) == "0.0031" and shown(0.0, 0.01) == "0"  # a fraction of failed windows is exact
    assert shown(2.3e-14, 1e-12) == "< 1e-13"
    assert shown(3e-13, 1e-12) == "3e-13"  # above the bound: shown, so a too-loose tolerance is visible
    assert shown(1.13e-16) == "1.13e-16"
    assert shown(-1e-17, 1e-9) == "-1e-17"  # a signed quantity is not a deviation
    assert shown(14, 1) == "14" and shown(True, 1) == "True" and shown("1 ± 0.01") == "1 ± 0.01"


def test_a_count_is_bounded_by_the_memory_its_units_hold_and_says_so():
    rule = count(30, "an epoch's batches", bytes_each=2**20)  # 1 MiB an epoch
    assert most(2**20) == MEMORY // 2**20 and rule.maximum == most(2**20)
    assert rule.ok(30) and rule.ok(most(2**20)) and not rule.ok(most(2**20) + 1) and not rule.ok(10**400)
    assert not rule.ok(29)
    with pytest.raises(ValueError) as err:
        check_parameters({"epochs": 10**12}, {"epochs": rule})
    assert str(err.value) == (f"epochs = 1000000000000: must be an integer in [30, {MEMORY // 2**20}] "
                              f"(an epoch's batches: 1 MiB each, at most 4 GiB in all)")
    # a share of the memory, and words on the range before the reason
    shared = count(1, "a step", bytes_each=1000, share=5, note="one at least")
    assert shared.maximum == MEMORY // 5000
    assert shared.rule().endswith("(one at least; a step: 1000 B each, at most 819 MiB in all, 1/5 of 4 GiB)")
    assert held("a state", bytes_each=3 * 2**30) == " (a state: 3 GiB each, at most 4 GiB in all)"
    assert most(MEMORY + 1) == 0  # a unit larger than the memory: no count fits
    with pytest.raises(ValueError, match=r"^bytes_each = 0: must be a number > 0$"):
        most(0)


def test_a_seed_is_what_torch_manual_seed_takes():
    torch = pytest.importorskip("torch")
    rule, three = seed_rule(), seed_rule(used=3)
    torch.manual_seed(rule.maximum)  # the largest seed is taken ...
    with pytest.raises((RuntimeError, ValueError)):  # ValueError in torch 2.14, RuntimeError in older ones
        torch.manual_seed(rule.maximum + 1)  # ... and the next refused, by torch itself
    assert rule.ok(0) and rule.ok(2**64 - 1) and not rule.ok(2**64) and not rule.ok(-1) and not rule.ok(1.0)
    assert three.ok(2**64 - 3) and not three.ok(2**64 - 2)  # seed + 2 must be taken too
    assert three.rule() == f"an integer in [0, {2**64 - 3}] (what torch.manual_seed takes, up to seed + 2)"
