"""explr.book.stats: chapter 6's statistics -- the summaries of runs, the Welch/TOST/Holm rule of plans v1/v2 and the
decisions of v3, the power analysis that sizes v3, which runs a plan judges, and the grid's cost.  The plans
themselves: test_registration.py; v3's decision rule: test_verdicts.py; the time-series fits: test_fits.py."""
import dataclasses
import datetime as dt
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate, stats

import explr.book.verdicts as rule
from explr.book.registration import PLAN_PATH, PLAN_V2_PATH, Claim, load_plan
from explr.book.stats import (TRAIN_IMAGES, complete_seeds, count_by_arm, decide, grid_cost, judge, open_runs,
                              pooled_sd, power, power_table, seeds_needed, split_runs, summarise, throughput, welch)
from explr.book.verdicts import holm

ROOT = Path(__file__).resolve().parents[2]
PILOT = ROOT / "results" / "cifar10-full"
PLAN = load_plan(PLAN_PATH)
PLAN2 = load_plan(PLAN_V2_PATH)
PLAN3 = load_plan()


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


# ----------------------------------------------------------------------------- plan v3: decisions and power
def pilot_runs():
    from explr.cifar10 import load_runs

    return {name: load_runs(PILOT / name) for name in ("main", "ablation-none", "paper-scale")}


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
