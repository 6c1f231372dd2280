"""explr.book.fits, registration, stats and verdicts: time-series fits; chapter 6's plans (v1, v2 superseded; v3), their
registration (plan, decision code, git), the Welch/TOST/Holm rule of v1/v2 and the paired rule of v3, the power
analysis that sizes v3, which runs a plan judges, and the grid's cost."""
import dataclasses
import datetime as dt
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate, stats

import explr.book.registration as reg
import explr.book.verdicts as rule
from explr.book.fits import first_time_above, loglog_slope, longest_stretch_at_or_below, returning_level
from explr.book.registration import (DECISION_CODE_PATH, PLAN_PATH, PLAN_V2_PATH, PLAN_V3_PATH, REGISTRATIONS_PATH,
                                     Claim, PlanError, load_plan, parse_utc)
from explr.book.stats import (TRAIN_IMAGES, complete_seeds, count_by_arm, decide, grid_cost, judge, open_runs,
                              pooled_sd, power, power_table, seeds_needed, split_runs, summarise, throughput, welch)
from explr.book.verdicts import holm
from explr.cifar10.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
PILOT = ROOT / "results" / "cifar10-full"
PLAN = load_plan(PLAN_PATH)
PLAN2 = load_plan(PLAN_V2_PATH)
PLAN3 = load_plan()
SCHEDULES = {"step", "texp", "texp--", "cosine", "cosine-texp", "texp-none"}


# ----------------------------------------------------------------------------- time series
def test_loglog_slope_recovers_a_power_law_and_rejects_non_positive_data():
    x = np.array([1.0, 4.0, 16.0, 64.0])
    assert abs(loglog_slope(x, 3 * x**-0.5) + 0.5) < 1e-12
    assert abs(loglog_slope([1e-3, 1e-2], [2e-6, 2e-4]) - 2) < 1e-12
    with pytest.raises(ValueError, match="positive"):
        loglog_slope(x, -x)
    with pytest.raises(ValueError, match="at least 2 points"):
        loglog_slope([1.0], [1.0])


def test_returning_level_and_longest_stretch():
    error = np.array([[0.5, 0.1], [0.1, 0.1], [0.1, 0.2], [0.4, 0.1], [0.1, 0.1]])
    np.testing.assert_allclose(returning_level(error, 3), [0.4, 0.2])
    np.testing.assert_allclose(returning_level(error, 1), [0.1, 0.1])
    np.testing.assert_allclose(returning_level(error, 5), error.max(axis=0))
    np.testing.assert_array_equal(longest_stretch_at_or_below(error, 0.1), [2, 2])
    np.testing.assert_array_equal(longest_stretch_at_or_below(error, [0.0, 0.2]), [0, 5])
    for bad in (0, 6, 2.5, True):
        with pytest.raises(ValueError, match="window must be an integer in"):
            returning_level(error, bad)
    with pytest.raises(ValueError, match=r"shape \(time, seeds\)"):
        returning_level(error[:, 0], 2)


def test_first_time_above():
    values = np.array([[0.0, 0.5, 0.0], [0.2, 0.5, 0.0], [0.3, 0.1, 0.0]])
    np.testing.assert_array_equal(first_time_above(values, 0.1), [1, 0, -1])
    np.testing.assert_array_equal(first_time_above(values, [0.25, 0.6, -1.0]), [2, -1, 0])
    with pytest.raises(ValueError, match="shape"):
        first_time_above(values[0], 0.1)


# ----------------------------------------------------------------------------- verdicts (both plans' rule)
def run(schedule, seed, acc, **manifest):
    out = {"schedule": schedule, "seed": seed, "metrics": {"test_acc": np.asarray(acc, dtype=float)}}
    return {**out, "manifest": manifest} if manifest else out


def summaries(**finals):
    """Summaries of arms with the given final accuracies (one per seed)."""
    return summarise([run(s.replace("_", "-"), i, [0.1, v]) for s, values in finals.items()
                      for i, v in enumerate(values)])


def plan_with(*claims, plan=PLAN, **changes):
    return dataclasses.replace(plan, claims=tuple(Claim(f"X{i}", a, b, h, "test", *role) for i, (a, b, h, *role) in
                                                  enumerate(claims)), **changes)


BASE = np.full(5, 0.82)
NOISE = np.array([0.001, -0.002, 0.0015, -0.0005, 0.0])  # seed-to-seed spread 0.14 points, below the margin


def test_summarise_takes_the_final_epoch_of_each_seed_and_names_arms_by_their_corrections():
    s = summarise([run("step", 1, [0.1, 0.6]), run("step", 0, [0.1, 0.5]), run("texp", 0, [0.2, 0.7])])
    assert s["step"].seeds == (0, 1) and list(s["step"].final) == [0.5, 0.6]
    assert s["step"].mean == pytest.approx(0.55) and s["step"].std == pytest.approx(np.std([0.5, 0.6], ddof=1))
    assert s["texp"].std == 0.0 and s["texp"].epochs == 2
    ablation = run("texp", 0, [0.3], config={"schedule": "texp", "corrections": "none"})
    assert list(summarise([ablation, run("texp", 0, [0.4])])) == ["texp-none", "texp"]


def test_summarise_refuses_mixed_lengths():
    with pytest.raises(ValueError, match="different numbers of epochs"):
        summarise([run("step", 0, [0.1, 0.5]), run("step", 1, [0.1])])


def test_the_v1_plan_is_complete_and_names_known_schedules():
    raw = json.loads(PLAN_PATH.read_text())
    assert PLAN.min_seeds >= 5 and PLAN.alpha == 0.05 and 0 < PLAN.margin <= 0.01 and PLAN.version == 1
    for reason in ("margin_criterion", "min_seeds_reason", "test_reason", "multiplicity_family", "scope"):
        assert len(raw[reason]) > 40, reason
    assert {c.a for c in PLAN.claims} | {c.b for c in PLAN.claims} <= SCHEDULES
    assert len({c.id for c in PLAN.claims}) == len(PLAN.claims) and PLAN.family == PLAN.claims
    assert PLAN.registration is None  # superseded: it judges no run


def test_a_plan_with_a_bad_field_is_refused(tmp_path):
    for source in (PLAN_PATH, PLAN_V2_PATH):
        raw = json.loads(source.read_text())
        for key, value, match in [("min_seeds", 1, "min_seeds"), ("alpha", 0, "alpha"), ("test", "paired", "welch")]:
            (tmp_path / "p.json").write_text(json.dumps({**raw, key: value}))
            with pytest.raises(ValueError, match=match):
                load_plan(tmp_path / "p.json")
        broken = {**raw, "claims": [{**raw["claims"][0], "hypothesis": "a worse"}]}
        (tmp_path / "p.json").write_text(json.dumps(broken))
        with pytest.raises(ValueError, match="hypothesis"):
            load_plan(tmp_path / "p.json")
    raw = json.loads(PLAN_V2_PATH.read_text())
    for changes, match in [({"seeds": raw["seeds"][:2]}, "seeds must be at least"), ({"config": {}}, "epochs"),
                           ({"arms": {**raw["arms"], "texp-none": {"schedule": "texp", "corrections": "all"}}},
                            "must be named 'texp'"),
                           ({"claims": [{**raw["claims"][0], "role": "secondary"}]}, "role"),
                           ({"claims": [{**raw["claims"][0], "a": "sgd"}]}, "not in 'arms'")]:
        (tmp_path / "p.json").write_text(json.dumps({**raw, **changes}))
        with pytest.raises(ValueError, match=match):
            load_plan(tmp_path / "p.json")
    (tmp_path / "p.json").write_text(json.dumps({k: v for k, v in raw.items() if k != "power"}))
    with pytest.raises(ValueError, match="no 'power'"):
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
    flat = welch([0.8, 0.8], [0.8, 0.8], 0.005)
    assert (flat.p_difference, flat.p_equivalence, flat.ci95) == (1.0, 0.0, (0.0, 0.0))
    with pytest.raises(ValueError, match=">= 2 values per arm"):
        welch([0.8], [0.8, 0.7], 0.005)


def test_holm_adjustment_over_the_last_axis():
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    p = np.random.default_rng(1).uniform(0, 0.2, size=(3, 9))
    adjusted = holm(p)
    assert (adjusted >= p).all() and (adjusted <= np.minimum(1, 9 * p) + 1e-15).all()
    np.testing.assert_array_equal(adjusted[1], holm(p[1]))  # rows adjusted one by one
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


def test_holm_makes_a_larger_family_more_conservative_and_exploratory_claims_stay_outside_it():
    """A difference that one test alone calls significant (raw p ≈ 0.02) is not, once adjusted among six tests;
    the same two claims marked exploratory leave it alone."""
    s = summaries(texp=BASE + 0.0024 + NOISE, step=BASE + NOISE[::-1], cosine=BASE + NOISE,
                  cosine_texp=BASE + NOISE[::-1])
    alone = judge(plan_with(("texp", "step", "none")), s)[0]
    crowded = judge(plan_with(("texp", "step", "none"), ("cosine", "step", "none"),
                              ("cosine-texp", "cosine", "none")), s)[0]
    assert alone.stats.p_difference == crowded.stats.p_difference < 0.05
    assert alone.p_difference < 0.05 < crowded.p_difference
    aside = judge(plan_with(("texp", "step", "none"), ("cosine", "step", "none", "exploratory"),
                            ("cosine-texp", "cosine", "none", "exploratory")), s)
    assert aside[0].p_difference == alone.p_difference
    assert aside[1].p_difference == aside[1].stats.p_difference and "exploratory, unadjusted" in aside[1].sentence


def test_claims_whose_schedules_are_absent_are_left_out():
    s = summaries(texp=BASE, step=BASE)
    assert [v.claim.id for v in judge(PLAN, s)] == ["C1"]


# ----------------------------------------------------------------------------- plans v2 (superseded) and v3
def pilot_runs():
    from explr.cifar10 import load_runs

    return {name: load_runs(PILOT / name) for name in ("main", "ablation-none", "paper-scale")}


def test_the_v2_plan_is_kept_and_superseded_so_it_judges_nothing():
    assert PLAN2.version == 2 and PLAN2.margin == 0.005 and PLAN2.registration is None
    assert [c.id for c in PLAN2.family] == ["C1", "C3", "C4", "C5"] and len(PLAN2.seeds) == 17
    record = json.loads(REGISTRATIONS_PATH.read_text())["plans"][PLAN_V2_PATH.name]
    assert record["superseded_by"] == PLAN_V3_PATH.name and record["commit"].startswith("4652fb3")


SEED_SENTENCES = {  # Li & Arora's own words, as /work/shared/seeds gives them
    "C1": "previously we have only verified our equivalence theorem in Step Decay LR schedules",
    "C2": "We empirically find on CIFAR10 that ignoring the correction term does not change performance much.",
    "C4": "Our experiments show this hybrid schedule with Cosine LR performs better on CIFAR10 than Step Decay",
    "C3": "it’s not sure how would the Exponential LR schedule behave on more rapid time-varying LR schedules",
}


def test_the_v3_plan_follows_the_paper_and_needs_only_its_arms():
    raw = json.loads(PLAN_V3_PATH.read_text())
    assert PLAN3.version == 3 and PLAN3.alpha == 0.05 and PLAN3.registration is not None
    assert [c.id for c in PLAN3.family] == ["C1", "C2", "C4"]
    assert {c.id: c.hypothesis for c in PLAN3.family} == {"C1": "equivalent", "C2": "equivalent", "C4": "a better"}
    assert [c.id for c in PLAN3.claims if c.role == "exploratory"] == ["C3", "C5"]
    for c in PLAN3.claims:
        assert "16 epochs" in c.question, c.id  # the scope in the claim's own words
        if c.id in SEED_SENTENCES:
            assert SEED_SENTENCES[c.id].replace("’", "'") in c.source.replace("’", "'"), c.id
    assert all("bf16" in c.question for c in PLAN3.claims if c.id in ("C1", "C3"))
    assert "not a claim of the paper" in next(c.source for c in PLAN3.claims if c.id == "C5")
    assert set(PLAN3.arms) == {c.a for c in PLAN3.claims} | {c.b for c in PLAN3.claims}  # no arm without a claim
    assert PLAN3.seeds == tuple(range(100, 100 + raw["power"]["n"]))  # none of the pilot's seeds 0-4
    for reason in ("supersedes", "scope", "arms_reason", "config_reason", "seeds_reason", "margin_criterion",
                   "test_reason", "tests_reason", "multiplicity_family", "missing_runs"):
        assert len(raw[reason]) > 150, reason
    assert PLAN3.missing_runs == raw["missing_runs"] and "3 attempts" in PLAN3.missing_runs


def test_the_v3_margin_is_the_test_sets_resolution_at_the_recipes_accuracy_and_below_the_effect():
    """δ = sqrt(p (1 − p) / 10,000) at p = 0.82 (v1/v2's 0.5 points is the same formula at p = 0.5), and smaller
    than the superiority effect the power analysis assumes."""
    assert PLAN3.margin == round(np.sqrt(0.82 * 0.18 / PLAN3.data["n_test"]), 5) == 0.00384
    assert PLAN2.margin == round(np.sqrt(0.5 * 0.5 / PLAN3.data["n_test"]), 5) != PLAN3.margin
    effect = PLAN3.power["means"]["cosine-texp"] - PLAN3.power["means"]["step"]
    assert PLAN3.margin < effect and f"{100 * PLAN3.margin / effect:.0f} %" in json.loads(
        PLAN_V3_PATH.read_text())["margin_criterion"]


def test_the_v3_power_analysis_recomputes_from_the_pilot():
    """sd: the pilot's pooled sd at its 90 % upper limit; effect: half the smaller cosine gain; the table, n (joint
    power >= 0.8 from n on) and the sensitivity rows are what power gives with the recorded inputs."""
    spec = PLAN3.power
    pilot = summarise(pilot_runs()["main"] + pilot_runs()["ablation-none"])
    limits = {c: round(pooled_sd(pilot, confidence=c).upper, 5) for c in (0.8, 0.9, 0.95)}
    assert spec["sd"] == limits[0.9] and spec["confidence"] == 0.9 and spec["rho"] == 0.0
    effect = round((min(pilot["cosine-texp"].mean, pilot["cosine"].mean) - pilot["step"].mean) / 2, 5)
    assert spec["means"] == {"step": 0.0, "texp": 0.0, "texp-none": 0.0, "cosine-texp": effect, "cosine": effect}
    kw = dict(sd=spec["sd"], means=spec["means"], draws=spec["draws"], seed=spec["seed"])
    n = spec["n"]
    rows = {row["n"]: row for row in spec["table"]}
    def close(got, row):  # seeded draws: only a p-value at α itself could move an entry (by 1/draws)
        return all(abs(got[k] - row[k]) <= 1e-3 for k in got) and got.keys() <= row.keys()

    for m in (n - 1, n, n + 1):
        assert close(power(PLAN3, m, **kw), rows[m]), m
    assert seeds_needed(spec["table"], spec["target"]) == n == len(PLAN3.seeds)
    assert rows[n]["joint"] >= 0.8 > rows[n - 1]["joint"]
    assert all(rows[n][c.id] >= rows[n]["joint"] for c in PLAN3.family)  # joint power is the binding one
    sensitivity = {row["case"]: row for row in spec["sensitivity"]}
    assert {row["sd"] for row in spec["sensitivity"]} == set(limits.values())
    for row in spec["sensitivity"]:
        means = {**spec["means"], "texp": row["C1_difference"], "texp-none": row["C1_difference"]
                 + row["C2_difference"]}
        got = power(PLAN3, n, **{**kw, "sd": row["sd"], "means": means, "rho": row["rho"]})
        assert close(got, row), row["case"]
    spread = [sensitivity[k]["joint"] for k in ("spread at its 80 % upper limit",
                                                "the plan: 90 % upper limit of the spread",
                                                "spread at its 95 % upper limit")]
    assert spread == sorted(spread, reverse=True)  # a larger spread, less power


def test_the_paired_tests_match_scipy_and_a_two_sided_rule_would_not():
    rng = np.random.default_rng(0)
    two_sided_differs = False
    for _ in range(60):
        n = int(rng.integers(2, 12))
        b = rng.normal(0.82, 0.004, n)
        a = b + rng.normal(rng.uniform(-0.005, 0.005), 0.003, n)
        p = rule.paired_p(a - b, "a better", 0.00384)
        assert p == pytest.approx(stats.ttest_rel(a, b, alternative="greater").pvalue, rel=1e-9, abs=1e-15)
        two_sided_differs |= abs(p - stats.ttest_rel(a, b).pvalue) > 1e-3
        d = a - b
        half90 = stats.t.ppf(0.95, n - 1) * d.std(ddof=1) / np.sqrt(n)
        inside = -0.00384 < d.mean() - half90 and d.mean() + half90 < 0.00384
        assert (rule.paired_p(d, "equivalent", 0.00384) < 0.05) == inside
    assert two_sided_differs
    flat = [float(rule.paired_p(np.full(3, x), h, 0.004)) for x, h in
            [(0.0, "a better"), (0.001, "a better"), (0.001, "equivalent"), (0.005, "equivalent")]]
    assert flat == [1.0, 0.0, 0.0, 1.0]
    for bad in [dict(differences=[0.1]), dict(hypothesis="none")]:
        with pytest.raises(ValueError, match="needs >= 2 pairs"):
            rule.paired_p(**{"differences": [0.1, 0.2], "hypothesis": "a better", "margin": 0.004, **bad})


def grid_summaries(shift=None, noise=0.0002, arms=None, seeds=range(100, 106), shared=0.003):
    """Summaries of v3's arms at 82 % plus ``shift[arm]``, seed-to-seed noise (sd ``shared``) common to every arm of
    a seed plus a per-run part (sd ``noise``)."""
    shift = shift or {}
    rng = np.random.default_rng(1)
    common = rng.normal(0, shared, len(seeds))
    runs = [run(arm, k, [0.1, 0.82 + shift.get(arm, 0.0) + common[i] + rng.normal(0, noise)])
            for arm in (arms or PLAN3.arms) for i, k in enumerate(seeds)]
    for r in runs:
        r["manifest"] = {"config": {"schedule": PLAN3.arms[r["schedule"]]["schedule"],
                                    "corrections": PLAN3.arms[r["schedule"]]["corrections"]}}
    return summarise(runs)


def test_v3_decides_each_claim_by_its_own_test_without_cross_vetoes():
    """A gain of 0.2 points, far inside the margin and shown with tight pairs: v3 supports the superiority claim
    (v2 called it 'equivalent' and so contradicted it); two equal arms support equivalence."""
    out = {d.claim.id: d for d in decide(PLAN3, grid_summaries({"cosine-texp": 0.002, "cosine": 0.002}))}
    assert out["C4"].supported and out["C1"].supported and out["C2"].supported and out["C3"].supported
    assert abs(out["C4"].difference - 0.002) < 3e-4 and out["C4"].difference < PLAN3.margin
    assert out["C4"].sentence.startswith("supported at α = 0.05: cosine-texp better than step")
    assert "Holm-adjusted" in out["C1"].sentence and "exploratory, unadjusted" in out["C3"].sentence
    tight = grid_summaries({"cosine-texp": 0.002, "cosine": 0.002}, arms=["step", "cosine-texp", "cosine", "texp"],
                           shared=0.0)
    v2 = {v.claim.id: v for v in judge(dataclasses.replace(PLAN2, min_seeds=2), tight)}
    assert v2["C4"].verdict == "equivalent" and v2["C4"].bearing == "contradicts"  # v2's veto, which v3 removed
    assert next(d for d in decide(PLAN3, tight) if d.claim.id == "C4").supported
    worse = {d.claim.id: d for d in decide(PLAN3, grid_summaries({"cosine-texp": -0.01}))}
    assert not worse["C4"].supported and worse["C4"].p > 0.5
    assert not worse["C3"].supported and worse["C1"].supported


def test_the_family_is_fixed_an_untested_claim_counts_as_not_rejected():
    """With texp-none missing, C2 is not tested and enters Holm with p = 1: C1's adjusted p is the one of a family
    of three, not two."""
    full = {d.claim.id: d for d in decide(PLAN3, grid_summaries(noise=0.001))}
    short = {d.claim.id: d for d in decide(PLAN3, grid_summaries(noise=0.001, arms=["step", "texp", "cosine-texp",
                                                                                       "cosine"]))}
    c2 = short["C2"]
    assert not c2.tested and not c2.supported and c2.p is None and c2.p_compared == 1.0 and "not tested" in c2.sentence
    expected = holm([short["C1"].p, 1.0, short["C4"].p])
    assert short["C1"].p_compared == pytest.approx(expected[0]) and short["C4"].p_compared == pytest.approx(expected[2])
    assert short["C1"].p_compared > holm([short["C1"].p, short["C4"].p])[0]  # a family of two would be laxer
    assert short["C1"].p == full["C1"].p
    with pytest.raises(ValueError, match="decide applies a version-3 plan"):
        decide(PLAN2, grid_summaries())


def test_v3_power_does_not_fall_as_n_grows_and_v2_did():
    """P(support) of C4 at true gains +0.3 and 0 points, and of C1 at true differences 0 and δ, over n: v3's is
    non-decreasing (within Monte-Carlo noise) and stays <= α at the null's edge; v2's C4 at +0.3 falls."""
    sd, draws = PLAN3.power["sd"], 4000
    tol = 3 * np.sqrt(0.25 / draws)

    def p(claim, n, **means):
        return power(PLAN3, n, sd=sd, means={**PLAN3.power["means"], **means}, draws=draws)[claim]

    ns = (5, 20, 80)
    gain = [p("C4", n, **{"cosine-texp": 0.003}) for n in ns]
    null = [p("C4", n, **{"cosine-texp": 0.0}) for n in ns]
    equal = [p("C1", n) for n in ns]
    edge = [p("C1", n, texp=PLAN3.margin, **{"texp-none": PLAN3.margin}) for n in ns]
    assert all(later >= earlier - tol for row in (gain, equal) for earlier, later in zip(row, row[1:]))
    assert gain[-1] > 0.95 and equal[-1] > 0.95 and max(null + edge) <= PLAN3.alpha + tol
    v2 = [power(PLAN2, n, sd=PLAN2.power["sd"], means={**PLAN2.power["means"], "cosine-texp": 0.003,
                                                       "cosine": 0.003}, draws=2000)["C4"] for n in (17, 100)]
    assert v2[1] < v2[0] / 2, v2


def _equivalence_plan(alpha=0.05, margin=0.005):
    return dataclasses.replace(PLAN2, alpha=alpha, margin=margin,
                               claims=(Claim("E", "texp", "step", "equivalent", "test"),))


def _analytic_equivalence_power(n, sd, alpha, margin):
    """One equivalence claim, its two tests under Holm (family of 2), true Δ = 0, equal n and sd, ν = 2n − 2:
    supports ⇔ adjusted TOST p < α ⇔ p_tost < α/2, or p_diff < α/2 and p_tost < α, i.e. with D ~ N(0, σ_D²),
    σ_D = sd sqrt(2/n), S² = σ_D² χ²_ν/ν:  |D| < δ − t_{1−α/2} S  or  t_{1−α/4} S < |D| < δ − t_{1−α} S."""
    nu, sigma = 2 * n - 2, sd * np.sqrt(2 / n)
    t = {q: stats.t.ppf(1 - q, nu) for q in (alpha / 2, alpha / 4, alpha)}
    inside = lambda x: 2 * stats.norm.cdf(np.maximum(x, 0) / sigma) - 1  # noqa: E731  P(|D| < x)

    def given(chi):
        s = sigma * np.sqrt(chi / nu)
        first = margin - t[alpha / 2] * s  # the union of [0, first) and (max(first, low), high)
        band = np.maximum(inside(margin - t[alpha] * s) - inside(max(first, t[alpha / 4] * s)), 0)
        return (inside(first) + band) * stats.chi2.pdf(chi, nu)

    return integrate.quad(given, 0, np.inf, limit=200)[0]


def test_power_of_one_tost_matches_its_analytic_value_and_a_wrong_rule_does_not():
    n, sd = 30, 0.0065
    simulated = power(_equivalence_plan(), n, sd=sd, means={"texp": 0.0, "step": 0.0}, draws=20_000, seed=3)["E"]
    exact = _analytic_equivalence_power(n, sd, 0.05, 0.005)
    # Monte-Carlo sd <= 0.0036; Welch's ν below 2n − 2 lowers the simulated power by < 0.005 at n = 30
    assert abs(simulated - exact) < 0.015, (simulated, exact)
    one_test = 2 * stats.norm.cdf(0.005 / (sd * np.sqrt(2 / n)) - stats.norm.ppf(0.95)) - 1  # TOST alone, no Holm
    assert abs(one_test - exact) > 0.05, (one_test, exact)


def test_a_difference_claim_at_no_effect_supports_its_hypothesis_at_most_half_alpha():
    plan = dataclasses.replace(PLAN2, claims=(Claim("D", "cosine", "step", "a better", "test"),))
    p = power(plan, 8, sd=0.01, means={"cosine": 0.0, "step": 0.0}, draws=20_000)["D"]
    # at sd 0.01 (se ≈ δ) the TOST never passes, so Holm doubles the difference's p: P(p < α/2, right sign) = α/4;
    # a sign-blind rule or one without Holm gives α/2 = 0.025 (Monte-Carlo sd 0.0008)
    assert 0.009 < p < 0.016, p


def test_the_power_analysis_depends_on_holm_and_on_the_family():
    """The same inputs with Holm left out (a deliberately wrong rule) or with C1 alone choose a smaller n."""
    kw = dict(sd=PLAN2.power["sd"], means=PLAN2.power["means"], draws=2_000, seed=0)
    ns = range(6, 31, 2)
    n = seeds_needed(power_table(PLAN2, ns, **kw))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rule, "holm", lambda p: np.asarray(p))
        unadjusted = seeds_needed(power_table(PLAN2, ns, **kw))
    alone = seeds_needed(power_table(dataclasses.replace(PLAN2, claims=PLAN2.claims[:1]), ns, **kw))
    assert unadjusted < n and alone < n, (n, unadjusted, alone)


def test_power_is_deterministic_and_checks_its_inputs():
    kw = dict(sd=0.004, means=PLAN2.power["means"], draws=500)
    assert power(PLAN2, 6, **kw) == power(PLAN2, 6, **kw) != power(PLAN2, 6, **kw, seed=1)
    for bad, match in [(dict(n=1), "n must be an integer >= 2"), (dict(n=True), "n must be"),
                       (dict(sd=0), "sd must be > 0"), (dict(means={"step": 0.0}), "missing")]:
        with pytest.raises(ValueError, match=match):
            power(PLAN2, **{"n": 6, **kw, **bad})


def test_seeds_needed_takes_the_n_from_which_on_every_row_is_powered():
    table = [{"n": 4, "A": 0.5, "B": 0.9}, {"n": 5, "A": 0.81, "B": 0.9}, {"n": 6, "A": 0.79, "B": 0.95},
             {"n": 7, "A": 0.85, "B": 0.97}]
    assert seeds_needed(table) == 7 and seeds_needed(table, 0.78) == 5
    with pytest.raises(ValueError, match="extend the table"):
        seeds_needed(table, 0.9)
    with pytest.raises(ValueError, match="target must be in"):
        seeds_needed(table, 1.0)


def test_pooled_sd_and_its_upper_confidence_limit():
    s = summaries(step=[0.80, 0.82, 0.84], texp=[0.81, 0.81], cosine=[0.9])  # the single seed adds nothing
    p = pooled_sd(s, confidence=0.8)
    assert p.dof == 3 and p.sd == pytest.approx(np.sqrt((2 * 0.02**2 + 0) / 3))
    assert p.upper == pytest.approx(p.sd * np.sqrt(3 / stats.chi2.ppf(0.2, 3)))
    assert p.upper > p.sd and pooled_sd(s, confidence=0.5).upper < p.upper
    with pytest.raises(ValueError, match="confidence must be in"):
        pooled_sd(s, confidence=1)
    with pytest.raises(ValueError, match=">= 2 seeds"):
        pooled_sd(summaries(step=[0.8]))


# ----------------------------------------------------------------------------- registration
def test_an_edited_plan_is_refused_and_an_unchanged_copy_loads(tmp_path):
    for source in (PLAN_V3_PATH, PLAN_V2_PATH, PLAN_PATH):
        copy = tmp_path / source.name
        shutil.copyfile(source, copy)
        assert load_plan(copy, registrations=REGISTRATIONS_PATH).registration == load_plan(source).registration
        copy.write_bytes(source.read_bytes().replace(b'"alpha": 0.05', b'"alpha": 0.049'))
        with pytest.raises(PlanError, match="never edited"):
            load_plan(copy, registrations=REGISTRATIONS_PATH)
    assert load_plan(copy, registrations=tmp_path / "none.json").registration is None  # unregistered: judges none


def test_a_changed_decision_rule_is_refused(tmp_path, monkeypatch):
    """The registration holds the sha256 of verdicts.py: one changed character of the rule (α's comparison made
    <=) and the plan no longer loads."""
    edited = tmp_path / DECISION_CODE_PATH.name
    code = DECISION_CODE_PATH.read_bytes()
    assert code.count(b"c < alpha") == 1
    edited.write_bytes(code.replace(b"c < alpha", b"c <= alpha"))
    monkeypatch.setattr(reg, "DECISION_CODE_PATH", edited)
    with pytest.raises(PlanError, match="decision code"):
        load_plan()
    monkeypatch.setattr(reg, "DECISION_CODE_PATH", tmp_path / "missing.py")
    with pytest.raises(PlanError, match="cannot read"):
        load_plan()
    assert load_plan(PLAN_V2_PATH).version == 2  # v2 registered no decision code


def test_the_registration_record_matches_the_plan_files():
    record = json.loads(REGISTRATIONS_PATH.read_text())["plans"]
    assert record.keys() == {PLAN_PATH.name, PLAN_V2_PATH.name, PLAN_V3_PATH.name}
    for path in (PLAN_PATH, PLAN_V2_PATH, PLAN_V3_PATH):
        assert record[path.name]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record[PLAN_PATH.name]["commit"] is None and PLAN.registration is None
    reg = PLAN3.registration
    assert reg.commit == record[PLAN_V3_PATH.name]["commit"]
    assert reg.decision_code == hashlib.sha256(DECISION_CODE_PATH.read_bytes()).hexdigest()
    assert record[PLAN_V3_PATH.name]["decision_code"] == {"file": "verdicts.py", "sha256": reg.decision_code}


def _git(*args, cwd=ROOT, **env):
    import os

    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          env={**os.environ, **env}).stdout.strip()


@pytest.mark.parametrize("path", [PLAN_V2_PATH, PLAN_V3_PATH])
def test_git_history_shows_each_plan_committed_once_by_its_recorded_commit_at_its_recorded_time(path):
    """The registration is the commit that added the plan: its only commit (an edit would add one), whose
    committer time is the recorded one to the second, and whose file has the recorded sha256; v3's decision code
    was committed, unchanged since, before it."""
    if not (ROOT / ".git").exists() or _git("rev-parse", "--is-shallow-repository") == "true":
        pytest.skip("needs a full git clone (a shallow one has no history): actions/checkout with fetch-depth: 0")
    rel = path.relative_to(ROOT).as_posix()
    log = _git("log", "--follow", "--format=%H %cI", "--", rel).splitlines()
    assert len(log) == 1, f"{rel} has {len(log)} commits; a registered plan is never edited: {log}"
    commit, when = log[0].split()
    record = json.loads(REGISTRATIONS_PATH.read_text())["plans"][path.name]
    assert commit == record["commit"] and parse_utc(when, "git") == parse_utc(record["committed"], "record")
    assert _git("show", "--format=", "--name-only", commit).splitlines() == [rel]  # the plan alone
    blob = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=ROOT, capture_output=True, check=True).stdout
    assert hashlib.sha256(blob).hexdigest() == record["sha256"]
    if path == PLAN_V3_PATH:
        code = DECISION_CODE_PATH.relative_to(ROOT).as_posix()
        blob = subprocess.run(["git", "show", f"{commit}:{code}"], cwd=ROOT, capture_output=True, check=True).stdout
        assert hashlib.sha256(blob).hexdigest() == PLAN3.registration.decision_code


def _repository(tmp_path, plan_bytes, *extra):
    """A git repository whose second commit adds plan.json alone (and ``extra`` files), committed at a fixed time;
    returns (plan path, registrations path, the record that git supports)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    when = "2026-12-01T10:00:00+00:00"
    env = dict(GIT_AUTHOR_DATE=when, GIT_COMMITTER_DATE=when, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    _git("init", "-q", cwd=repo)
    (repo / "README").write_text("x")
    _git("add", "README", cwd=repo)
    _git("commit", "-q", "-m", "first", cwd=repo, **env)
    plan = repo / "plan.json"
    plan.write_bytes(plan_bytes)
    for name in extra:
        (repo / name).write_text("y")
    _git("add", "plan.json", *extra, cwd=repo)
    _git("commit", "-q", "-m", "plan", cwd=repo, **env)
    record = {"sha256": hashlib.sha256(plan_bytes).hexdigest(), "commit": _git("rev-parse", "HEAD", cwd=repo),
              "committed": when}
    return plan, tmp_path / "registrations.json", record


def _register(registry, record):
    registry.write_text(json.dumps({"plans": {"plan.json": record}}))


def test_the_registration_is_checked_against_git_where_a_repository_holds_the_plan(tmp_path):
    """A record git supports loads; a plan edited together with its recorded sha256, a commit git does not have,
    another committer time or a commit with more files is refused; outside a repository the record is trusted."""
    raw = PLAN_V2_PATH.read_bytes()
    plan, registry, record = _repository(tmp_path, raw)
    _register(registry, record)
    assert load_plan(plan, registry).version == 2  # supported (v2: no decision code), judges none (unsuperseded)
    assert load_plan(plan, registry).registration.commit == record["commit"]
    edited = raw.replace(b'"alpha": 0.05', b'"alpha": 0.049')
    plan.write_bytes(edited)
    _register(registry, {**record, "sha256": hashlib.sha256(edited).hexdigest()})
    with pytest.raises(PlanError, match="another sha256"):
        load_plan(plan, registry)
    assert load_plan(plan, registry, check_git=False).alpha == 0.049  # what is trusted without git
    plan.write_bytes(raw)
    for change, match in [({"commit": "0" * 40}, "is not in the repository"),
                          ({"committed": "2026-12-01T10:00:01+00:00"}, "committer time"),
                          ({"committed": "2026-12-01T11:00:00+01:00"}, None)]:  # the same time, another offset
        _register(registry, {**record, **change})
        if match is None:
            assert load_plan(plan, registry).registration is not None
        else:
            with pytest.raises(PlanError, match=match):
                load_plan(plan, registry)
    crowded = tmp_path / "other"
    crowded.mkdir()
    plan, registry, record = _repository(crowded, raw, "notes.txt")
    _register(registry, record)
    with pytest.raises(PlanError, match="not \\['plan.json'\\] alone"):
        load_plan(plan, registry)
    untracked = plan.parent / "untracked.json"  # in a repository, but not its file (an installed copy, say)
    untracked.write_bytes(raw)
    registry.write_text(json.dumps({"plans": {"untracked.json": {**record, "commit": "2" * 40}}}))
    assert load_plan(untracked, registry).registration.checked.startswith("the plan is not tracked")
    outside = tmp_path / "copy.json"
    outside.write_bytes(raw)
    registry.write_text(json.dumps({"plans": {"copy.json": {**record, "commit": "1" * 40}}}))
    trusted = load_plan(outside, registry).registration
    assert trusted.commit == "1" * 40 and trusted.checked.startswith("no git repository")  # the record is trusted


def _malformed(tmp_path, content, name="p.json"):
    path = tmp_path / name
    path.write_text(content) if isinstance(content, str) else path.write_text(json.dumps(content))
    return path


V3 = json.loads(PLAN_V3_PATH.read_text())
#: what a caller that trains the plan passes (the book floor does not know the engine's settings).
CONFIG_FIELDS = [f.name for f in dataclasses.fields(TrainConfig)]


@pytest.mark.parametrize("content, match", [
    ("[1, 2]", "must be a JSON object; got list"),
    ("{", "not valid JSON"),
    ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
    ({**V3, "alpha": "0.05"}, "'alpha' must be a number in \\(0, 1\\)"),
    ({**V3, "alpha": True}, "'alpha' must be"),
    ({**V3, "claims": {"C1": 1}}, "'claims' must be a list"),
    ({**V3, "claims": ["C1"]}, "claim 1 must be a JSON object"),
    ({**V3, "claims": [{k: v for k, v in V3["claims"][0].items() if k != "source"}]}, "claim 1 has no 'source'"),
    ({**V3, "claims": [{**V3["claims"][0], "b": "texp"}]}, "compares arm 'texp' with itself"),
    ({**V3, "claims": [V3["claims"][0], V3["claims"][0]]}, "claim ids must be distinct"),
    ({**V3, "claims": [{**V3["claims"][0], "hypothesis": "none"}]}, "hypothesis must be one of"),
    ({**V3, "claims": [{**V3["claims"][3]}]}, "at least one primary claim"),
    ({**V3, "config": {**V3["config"], "learning_rate": 0.1}}, "config keys \\['learning_rate'\\] are not"),
    ({**V3, "config": {**V3["config"], "seed": 3}}, "config keys \\['seed'\\]"),
    ({**V3, "arms": []}, "'arms' must be a JSON object"),
    ({**V3, "arms": {"step": "step"}}, "arm 'step' must be a JSON object"),
    ({**V3, "seeds": "100"}, "'seeds' must be a list"),
    ({**V3, "seeds": [100, 100]}, "seeds must be at least"),
    ({**V3, "power": None}, "'power' must be a JSON object"),
    ({**V3, "version": 4}, "'version' must be 1, 2 or 3"),
    ({**V3, "test": "welch"}, "implements test 'paired'"),
    ({k: v for k, v in V3.items() if k != "missing_runs"}, "has no 'missing_runs'"),
    ({**V3, "power": {**V3["power"], "sd": "0.4"}}, "the plan's power's 'sd' must be a number"),
    ({**V3, "power": {**V3["power"], "means": {"step": None}}}, "'means' must be an object of numbers"),
    ({**V3, "power": {k: v for k, v in V3["power"].items() if k != "table"}}, "the plan's power has no 'table'"),
])
def test_a_malformed_plan_is_one_plan_error_naming_the_file(tmp_path, content, match):
    path = _malformed(tmp_path, content)
    with pytest.raises(PlanError, match=match) as err:
        load_plan(path, registrations=tmp_path / "none.json", config_fields=CONFIG_FIELDS)
    assert str(path) in str(err.value) and isinstance(err.value, ValueError) and "\n" not in str(err.value)


def test_a_missing_or_unreadable_plan_is_one_plan_error_naming_the_file(tmp_path):
    for path in (tmp_path / "absent.json", tmp_path):
        with pytest.raises(PlanError, match="cannot read the analysis plan") as err:
            load_plan(path)
        assert str(path) in str(err.value)


@pytest.mark.parametrize("record, match", [
    ("[]", "the record must be a JSON object"),
    ("{]", "not valid JSON"),
    ({"plans": []}, "'plans' must be a JSON object"),
    ({"plans": {PLAN_V3_PATH.name: "abc"}}, "must be a JSON object; got str"),
    ({"plans": {PLAN_V3_PATH.name: {"commit": None}}}, "has no 'sha256'"),
    ({"plans": {PLAN_V3_PATH.name: {"sha256": 5, "commit": None}}}, "'sha256' must be a string"),
    ({"plans": {PLAN_V3_PATH.name: {"sha256": "x", "commit": 12}}}, "'commit' must be null or a 40-digit"),
    ({"plans": {PLAN_V3_PATH.name: {**json.loads(REGISTRATIONS_PATH.read_text())["plans"][PLAN_V3_PATH.name],
                                    "committed": "2026-12-02 06:12"}}}, "'committed' must be an ISO time with"),
])
def test_a_malformed_registration_is_one_plan_error_naming_the_file(tmp_path, record, match):
    registry = _malformed(tmp_path, record, "registrations.json")
    with pytest.raises(PlanError, match=match) as err:
        load_plan(PLAN_V3_PATH, registrations=registry)
    assert str(registry) in str(err.value)
    good = json.loads(REGISTRATIONS_PATH.read_text())
    good["plans"][PLAN_V3_PATH.name]["decision_code"] = {"file": "verdicts.py"}
    registry.write_text(json.dumps(good))
    with pytest.raises(PlanError, match="decision_code has no 'sha256'"):
        load_plan(PLAN_V3_PATH, registrations=registry)


# ----------------------------------------------------------------------------- which runs a plan judges
def grid_run(arm="step", seed=None, started=None, status="finished", **config):
    schedule, corrections = PLAN3.arms[arm]["schedule"], PLAN3.arms[arm]["corrections"]
    when = started or (PLAN3.registration.committed + dt.timedelta(seconds=1)).isoformat()
    manifest = {"config": {**PLAN3.config, "schedule": schedule, "corrections": corrections, "seed": seed, **config},
                "data": {**PLAN3.data}, "started": when, "status": status}
    return run(schedule if corrections == "all" else arm, PLAN3.seeds[0] if seed is None else seed, [0.8],
               **manifest)


def test_split_runs_judges_only_the_grid_started_after_the_registration_second():
    at = PLAN3.registration.committed
    good = [grid_run(arm, k) for arm in PLAN3.arms for k in PLAN3.seeds[:2]]
    bad = [grid_run(started=at.isoformat()),  # in the registration's second: not after it
           grid_run(started=(at + dt.timedelta(seconds=0.5)).isoformat()),  # still inside it
           grid_run(started=(at - dt.timedelta(days=1)).isoformat()), grid_run(epochs=200), grid_run(seed=0),
           grid_run(augment=1),  # 1 is not True
           grid_run(started=(at + dt.timedelta(hours=1)).astimezone(dt.timezone(dt.timedelta(hours=-5))).isoformat(),
                    wd=5e-3)]
    judged, rest = split_runs(PLAN3, good + bad)
    assert judged == good and rest == bad
    late_ok = grid_run(started=(at + dt.timedelta(seconds=1)).astimezone(dt.timezone(dt.timedelta(hours=9)))
                       .isoformat())
    assert split_runs(PLAN3, [late_ok])[0] == [late_ok]  # another UTC offset, one second later
    assert split_runs(PLAN, good) == ([], good) and split_runs(PLAN2, good) == ([], good)  # v1, v2 judge nothing
    assert count_by_arm(judged) == dict.fromkeys(sorted(PLAN3.arms), 2)
    with pytest.raises(ValueError, match="started must be an ISO time"):
        split_runs(PLAN3, [grid_run(started="2026-12-02")])


def test_complete_seeds_counts_only_finished_runs_of_the_plans_recipe():
    """The --resume rule: another lr, another number of epochs, other data or an unfinished run is not done."""
    judged = [grid_run(arm, k) for arm in PLAN3.arms for k in PLAN3.seeds[:2]]
    assert complete_seeds(PLAN3, judged) == list(PLAN3.seeds[:2])
    assert complete_seeds(PLAN3, judged[1:]) == [PLAN3.seeds[1]]  # step's first seed missing
    for other in (dict(lr=0.05), dict(epochs=3), dict(status="running"), dict(status="diverged")):
        swapped = [grid_run("step", PLAN3.seeds[0], **other)] + judged[1:]
        assert complete_seeds(PLAN3, swapped) == [PLAN3.seeds[1]], other
    foreign = [dict(r, manifest={**r["manifest"], "data": {"n_train": 10_000, "n_test": 10_000}}) for r in judged]
    assert complete_seeds(PLAN3, foreign) == []
    assert open_runs(PLAN3, judged[1:], missing=[("step", PLAN3.seeds[0])])[:1] == [("step", PLAN3.seeds[2])]
    assert ("step", PLAN3.seeds[0]) in open_runs(PLAN3, judged[1:])
    assert len(open_runs(PLAN3, [])) == len(PLAN3.arms) * len(PLAN3.seeds)


def test_the_pilot_is_judged_by_no_plan():
    runs = [r for group in pilot_runs().values() for r in group]
    for plan in (PLAN, PLAN2, PLAN3):
        assert split_runs(plan, runs) == ([], runs)
    assert count_by_arm(runs) == {"cosine": 2, "cosine-texp": 2, "step": 6, "texp": 6, "texp--": 2, "texp-none": 5}


# ----------------------------------------------------------------------------- cost
def timed(start, stop, epochs):
    return {"manifest": {"started": f"2026-11-30T10:00:{start:02d}+00:00", "updated": f"2026-11-30T10:00:{stop:02d}"
                         "+00:00", "epochs_done": epochs}}


def test_throughput_counts_overlapping_runs_once_and_grid_cost_is_its_arithmetic():
    runs = [timed(0, 10, 2), timed(5, 20, 1), timed(6, 8, 1), timed(40, 50, 1)]  # busy 0-20 and 40-50: 30 s
    assert throughput(runs) == 5 * TRAIN_IMAGES / 30
    cost = grid_cost(PLAN3, 1000.0)
    n_image_epochs = len(PLAN3.arms) * len(PLAN3.seeds) * PLAN3.config["epochs"] * TRAIN_IMAGES
    assert cost["image_epochs"] == n_image_epochs and cost["seconds"] == n_image_epochs / 1000.0
    with pytest.raises(ValueError, match="arms"):
        grid_cost(PLAN, 1000.0)
    with pytest.raises(ValueError, match="images_per_s > 0"):
        grid_cost(PLAN3, 0.0)


def test_the_pilot_throughput_on_the_h200_is_between_one_process_and_sixteen():
    """From the manifests, evaluation included: below gpu_probe.json's 16-process training throughput, above one
    process's."""
    runs = [r for group in pilot_runs().values() for r in group]
    probe = {row["jobs"]: row["images_per_s"] for row in json.loads((PILOT / "gpu_probe.json").read_text())["rows"]}
    assert {d for r in runs for d in r["manifest"]["devices"]} == {"NVIDIA H200"}
    assert probe[1] < throughput(runs) < probe[16]
