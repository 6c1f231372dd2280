"""explr.book.report: grouping runs, Welch statistics, Holm's adjustment and the plan's verdicts."""
import dataclasses
import json

import numpy as np
import pytest
from scipy import stats

from explr.book.report import PLAN_PATH, Claim, holm, judge, load_plan, summarise, welch

PLAN = load_plan()
SCHEDULES = {"step", "texp", "texp--", "cosine", "cosine-texp", "texp-none"}


def run(schedule, seed, acc):
    return {"schedule": schedule, "seed": seed, "metrics": {"test_acc": np.asarray(acc, dtype=float)}}


def summaries(**finals):
    """Summaries of schedules with the given final accuracies (one per seed)."""
    return summarise([run(s.replace("_", "-"), i, [0.1, v]) for s, values in finals.items()
                      for i, v in enumerate(values)])


def plan_with(*claims, **changes):
    return dataclasses.replace(PLAN, claims=tuple(Claim(f"X{i}", a, b, h, "test") for i, (a, b, h) in
                                                  enumerate(claims)), **changes)


BASE = np.full(5, 0.82)
NOISE = np.array([0.001, -0.002, 0.0015, -0.0005, 0.0])  # seed-to-seed spread 0.14 points, below the margin


def test_summarise_takes_the_final_epoch_of_each_seed():
    s = summarise([run("step", 1, [0.1, 0.6]), run("step", 0, [0.1, 0.5]), run("texp", 0, [0.2, 0.7])])
    assert s["step"].seeds == (0, 1) and list(s["step"].final) == [0.5, 0.6]
    assert s["step"].mean == pytest.approx(0.55) and s["step"].std == pytest.approx(np.std([0.5, 0.6], ddof=1))
    assert s["texp"].std == 0.0 and s["texp"].epochs == 2


def test_summarise_refuses_mixed_lengths():
    with pytest.raises(ValueError, match="different numbers of epochs"):
        summarise([run("step", 0, [0.1, 0.5]), run("step", 1, [0.1])])


def test_the_committed_plan_is_complete_and_names_known_schedules():
    raw = json.loads(PLAN_PATH.read_text())
    assert PLAN.min_seeds >= 5 and PLAN.alpha == 0.05 and 0 < PLAN.margin <= 0.01
    for reason in ("margin_criterion", "min_seeds_reason", "test_reason", "multiplicity_family", "scope"):
        assert len(raw[reason]) > 40, reason
    assert {c.a for c in PLAN.claims} | {c.b for c in PLAN.claims} <= SCHEDULES
    assert len({c.id for c in PLAN.claims}) == len(PLAN.claims)
    assert ("cosine", "step") in {(c.a, c.b) for c in PLAN.claims}  # the hybrid's claim, tested directly


def test_a_plan_with_a_bad_field_is_refused(tmp_path):
    raw = json.loads(PLAN_PATH.read_text())
    for key, value, match in [("min_seeds", 1, "min_seeds"), ("alpha", 0, "alpha"), ("test", "paired", "welch")]:
        (tmp_path / "p.json").write_text(json.dumps({**raw, key: value}))
        with pytest.raises(ValueError, match=match):
            load_plan(tmp_path / "p.json")
    broken = {**raw, "claims": [{**raw["claims"][0], "hypothesis": "a worse"}]}
    (tmp_path / "p.json").write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="hypothesis"):
        load_plan(tmp_path / "p.json")


def test_welch_matches_scipy_and_tost_is_the_90_percent_interval_inside_the_margin():
    rng = np.random.default_rng(0)
    for _ in range(60):
        m, n = rng.integers(2, 9, size=2)
        a = rng.normal(rng.uniform(-0.01, 0.01), rng.uniform(0.001, 0.006), size=m)
        b = rng.normal(0.0, rng.uniform(0.001, 0.006), size=n)
        w = welch(a, b, 0.005)
        assert w.p_difference == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-9)
        assert w.ci95[0] < w.difference < w.ci95[1]
        half90 = stats.t.ppf(0.95, w.dof) * w.stderr
        inside = -0.005 < w.difference - half90 and w.difference + half90 < 0.005
        assert (w.p_equivalence < 0.05) == inside


def test_holm_adjustment():
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    p = np.random.default_rng(1).uniform(0, 0.2, size=9)
    adjusted = holm(p)
    assert (adjusted >= p).all() and (adjusted <= np.minimum(1, 9 * p) + 1e-15).all()
    assert holm([0.5]).tolist() == [0.5]


@pytest.mark.parametrize("shift, verdict, bearing", [
    (0.0, "equivalent", "supports"),      # the twins agree
    (0.03, "different", "contradicts"),   # twins that differ contradict the claim
    (-0.03, "different", "contradicts"),
])
def test_equivalence_claims_are_confirmed_and_refuted_by_the_same_rule(shift, verdict, bearing):
    s = summaries(texp=BASE + shift + NOISE, step=BASE + NOISE[::-1])
    [v] = judge(plan_with(("texp", "step", "equivalent")), s)
    assert (v.verdict, v.bearing) == (verdict, bearing)
    assert f"{100 * v.stats.difference:+.2f}" in v.sentence and "Holm-adjusted" in v.sentence


@pytest.mark.parametrize("shift, bearing", [(0.03, "supports"), (-0.03, "contradicts")])
def test_a_directional_claim_uses_the_two_sided_test_both_ways(shift, bearing):
    s = summaries(cosine=BASE + shift + NOISE, step=BASE)
    [v] = judge(plan_with(("cosine", "step", "a better")), s)
    assert v.verdict == "different" and v.bearing == bearing
    assert ("better" if shift > 0 else "worse") in v.sentence


def test_below_the_minimum_seeds_a_claim_is_not_tested_and_shows_its_interval():
    s = summaries(cosine=BASE[:4] + 0.05, step=BASE)  # a large effect, but 4 < 5 seeds
    [v] = judge(plan_with(("cosine", "step", "a better")), s)
    assert v.verdict == "not tested" and not v.tested and v.p_difference is None
    assert v.sentence.startswith("not tested (n = 4 < 5)") and "95 % CI" in v.sentence
    assert v.stats.ci95[0] > 0  # the interval is there, the verdict is withheld


def test_holm_makes_a_larger_family_more_conservative():
    """A difference that one test alone calls significant (raw p ≈ 0.02) is not, once adjusted among six tests."""
    s = summaries(texp=BASE + 0.0024 + NOISE, step=BASE + NOISE[::-1], cosine=BASE + NOISE,
                  cosine_texp=BASE + NOISE[::-1])
    alone = judge(plan_with(("texp", "step", "none")), s)[0]
    crowded = judge(plan_with(("texp", "step", "none"), ("cosine", "step", "none"),
                              ("cosine-texp", "cosine", "none")), s)[0]
    assert alone.stats.p_difference == crowded.stats.p_difference < 0.05
    assert alone.p_difference < 0.05 < crowded.p_difference


def test_claims_whose_schedules_are_absent_are_left_out():
    s = summaries(texp=BASE, step=BASE)
    assert [v.claim.id for v in judge(PLAN, s)] == ["C1"]
