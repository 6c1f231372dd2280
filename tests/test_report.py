"""explr.report: grouping runs by schedule and the scipy-based paired verdicts."""
import numpy as np
import pytest
from scipy import stats

from explr.report import EQUIVALENCE_MARGIN, compare, summarise


def run(schedule, seed, acc):
    return {"schedule": schedule, "seed": seed, "metrics": {"test_acc": np.asarray(acc, dtype=float)}}


def pair(a, b):
    """Summaries of two schedules with final accuracies a[i], b[i] for seeds i."""
    s = summarise([run("a", i, [0.1, v]) for i, v in enumerate(a)] + [run("b", i, [0.1, v]) for i, v in enumerate(b)])
    return s["a"], s["b"]


def test_summarise_takes_the_final_epoch_of_each_seed():
    s = summarise([run("step", 1, [0.1, 0.6]), run("step", 0, [0.1, 0.5]), run("texp", 0, [0.2, 0.7])])
    assert s["step"].seeds == (0, 1) and list(s["step"].final) == [0.5, 0.6]
    assert s["step"].mean == pytest.approx(0.55) and s["step"].std == pytest.approx(np.std([0.5, 0.6], ddof=1))
    assert s["texp"].std == 0.0 and s["texp"].epochs == 2


def test_summarise_refuses_mixed_lengths():
    with pytest.raises(ValueError, match="different numbers of epochs"):
        summarise([run("step", 0, [0.1, 0.5]), run("step", 1, [0.1])])


BASE = np.array([0.80, 0.82, 0.79, 0.81, 0.83])
NOISE = np.array([0.001, -0.002, 0.0015, -0.0005, 0.0])


@pytest.mark.parametrize("shift, kind, verdict", [
    (0.0, "same", "equivalent"),
    (-0.03, "same", "different"),
    (0.02, "at-least", "better"),
    (-0.002, "at-least", "non-inferior"),
    (-0.03, "at-least", "worse"),
])
def test_verdicts_follow_the_paired_tests(shift, kind, verdict):
    a, b = pair(BASE + shift + NOISE, BASE)
    c = compare(a, b, kind)
    assert c.verdict == verdict and c.decided
    assert c.mean_difference == pytest.approx(shift + NOISE.mean())
    assert c.p_paired == pytest.approx(stats.ttest_rel(a.final, b.final).pvalue)
    assert c.p_welch == pytest.approx(stats.ttest_ind(a.final, b.final, equal_var=False).pvalue)
    assert f"{100 * c.mean_difference:+.2f}" in c.sentence


def test_pairing_is_what_makes_small_shifts_decidable():
    """Seeds differ by ±2 points from each other; the paired shift of 0.5 point is still detected, Welch is not."""
    a, b = pair(BASE + 0.005 + NOISE / 5, BASE)
    c = compare(a, b, "at-least")
    assert c.verdict == "better" and c.p_welch > 0.5


def test_equivalence_is_the_90_percent_interval_inside_the_margin():
    rng = np.random.default_rng(0)
    for _ in range(50):
        d = rng.normal(rng.uniform(-0.015, 0.015), rng.uniform(0.001, 0.01), size=4)
        a, b = pair(BASE[:4] + d, BASE[:4])
        c = compare(a, b, "same")
        half = stats.t.ppf(0.95, 3) * d.std(ddof=1) / 2
        inside = (d.mean() - half > -EQUIVALENCE_MARGIN) and (d.mean() + half < EQUIVALENCE_MARGIN)
        assert (c.p_equivalence < 0.05) == inside


def test_few_noisy_seeds_leave_the_claim_undecided():
    a, b = pair([0.80, 0.84], [0.82, 0.81])
    c = compare(a, b, "same")
    assert c.verdict == "undecided" and not c.decided and "undecided" in c.sentence
    assert c.ci95[0] < 0 < c.ci95[1]


def test_only_shared_seeds_are_paired():
    s = summarise([run("a", i, [v]) for i, v in [(0, 0.8), (1, 0.81), (2, 0.82)]]
                  + [run("b", i, [v]) for i, v in [(1, 0.80), (2, 0.81), (7, 0.5)]])
    c = compare(s["a"], s["b"], "same")
    assert c.seeds == (1, 2) and np.allclose(c.differences, [0.01, 0.01])


def test_bad_input_is_refused():
    a, b = pair(BASE, BASE)
    with pytest.raises(ValueError, match="kind"):
        compare(a, b, "better")
    with pytest.raises(ValueError, match="margin"):
        compare(a, b, "same", margin=0)
    one = summarise([run("d", 0, [0.5])])["d"]
    with pytest.raises(ValueError, match=">= 2 seeds"):
        compare(one, a, "same")
