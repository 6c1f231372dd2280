"""explr.book.stats: time-series fits; chapter 6's plans (v1, v2), their registration, Welch/TOST/Holm verdicts, the
power analysis that sizes v2, which runs a plan judges, and the grid's cost."""
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

import explr.book.stats as st
from explr.book.stats import (PLAN_PATH, PLAN_V2_PATH, REGISTRATIONS_PATH, TRAIN_IMAGES, Claim, complete_seeds,
                              count_by_arm, first_time_above, grid_cost, holm, judge, load_plan, loglog_slope,
                              longest_stretch_at_or_below, pooled_sd, power, power_table, returning_level,
                              seeds_needed, split_runs, summarise, throughput, welch)

ROOT = Path(__file__).resolve().parents[1]
PILOT = ROOT / "results" / "cifar10-full"
PLAN = load_plan()
PLAN2 = load_plan(PLAN_V2_PATH)
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


# ----------------------------------------------------------------------------- plan v2
def pilot_runs():
    from explr.cifar10 import load_runs

    return {name: load_runs(PILOT / name) for name in ("main", "ablation-none", "paper-scale")}


def test_the_v2_plan_has_a_small_primary_family_and_its_grid():
    raw = json.loads(PLAN_V2_PATH.read_text())
    assert PLAN2.version == 2 and PLAN2.alpha == 0.05 and PLAN2.margin == 0.005
    assert [c.id for c in PLAN2.family] == ["C1", "C3", "C4", "C5"]
    assert {c.id: c.role for c in PLAN2.claims if c.role == "exploratory"} == dict.fromkeys(["C2", "C6", "C7"],
                                                                                            "exploratory")
    assert set(PLAN2.arms) == SCHEDULES | {"cosine-texp-none"}
    assert PLAN2.arms["cosine-texp-none"] == {"schedule": "cosine-texp", "corrections": "none"}
    assert len(PLAN2.seeds) == PLAN2.min_seeds == raw["power"]["n"] and min(PLAN2.seeds) > 4  # none of the pilot's
    c2 = next(c for c in PLAN2.claims if c.id == "C2").source
    assert "We empirically find on CIFAR10 that ignoring the correction term does not change performance much." in c2
    for reason in ("margin_criterion", "min_seeds_reason", "test_reason", "multiplicity_family", "family_reason",
                   "scope", "supersedes", "config_reason", "seeds_reason", "arms_reason"):
        assert len(raw[reason]) > 80, reason
    assert "from the pilot" in raw["power"]["sd_source"] and "from the pilot" in raw["power"]["means_source"]


def test_the_recorded_power_analysis_recomputes_from_the_pilot():
    """The plan's sd and effects are the pilot's (pooled sd's 80 % upper limit; half the smaller of C4's and C5's
    differences), and its table and n are what power_table and seeds_needed give with the recorded inputs."""
    recorded = PLAN2.power
    runs = pilot_runs()
    pilot = summarise(runs["main"] + runs["ablation-none"])
    assert recorded["sd"] == round(pooled_sd(pilot, confidence=0.8).upper, 5)
    effect = min(pilot["cosine-texp"].mean, pilot["cosine"].mean) - pilot["step"].mean
    assert recorded["means"] == {"step": 0.0, "texp": 0.0, "cosine": round(effect / 2, 5),
                                 "cosine-texp": round(effect / 2, 5)}
    table = power_table(PLAN2, recorded["ns"], sd=recorded["sd"], means=recorded["means"], draws=recorded["draws"],
                        seed=recorded["seed"])
    for got, row in zip(table, recorded["table"], strict=True):
        assert got.keys() == row.keys() and all(abs(got[k] - row[k]) <= 1e-4 for k in row), (got, row)
    assert seeds_needed(table, recorded["target"]) == recorded["n"] == PLAN2.min_seeds
    at_n = next(row for row in table if row["n"] == recorded["n"])
    before = next(row for row in table if row["n"] == recorded["n"] - 1)
    assert min(v for k, v in at_n.items() if k != "n") >= 0.8 > min(v for k, v in before.items() if k != "n")


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
        patch.setattr(st, "holm", lambda p: np.asarray(p))
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
    for source in (PLAN_V2_PATH, PLAN_PATH):
        copy = tmp_path / source.name
        shutil.copyfile(source, copy)
        assert load_plan(copy, registrations=REGISTRATIONS_PATH).registration == load_plan(source).registration
        copy.write_bytes(source.read_bytes().replace(b'"alpha": 0.05', b'"alpha": 0.049'))
        with pytest.raises(ValueError, match="never edited"):
            load_plan(copy, registrations=REGISTRATIONS_PATH)
    assert load_plan(copy, registrations=tmp_path / "none.json").registration is None  # unregistered: judges none


def test_the_registration_record_matches_the_plan_files():
    record = json.loads(REGISTRATIONS_PATH.read_text())["plans"]
    assert record.keys() == {PLAN_PATH.name, PLAN_V2_PATH.name}
    for path in (PLAN_PATH, PLAN_V2_PATH):
        assert record[path.name]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record[PLAN_PATH.name]["commit"] is None and PLAN.registration is None
    assert PLAN2.registration.commit == record[PLAN_V2_PATH.name]["commit"]


def _git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def test_git_history_shows_the_v2_plan_committed_once_by_its_recorded_commit_at_its_recorded_time():
    """The registration is the commit that added the plan: its only commit (an edit would add one), whose
    committer time is the recorded one to the second, and whose file has the recorded sha256."""
    if not (ROOT / ".git").exists() or _git("rev-parse", "--is-shallow-repository") == "true":
        pytest.skip("needs a full git clone (a shallow one has no history): actions/checkout with fetch-depth: 0")
    rel = PLAN_V2_PATH.relative_to(ROOT).as_posix()
    log = _git("log", "--follow", "--format=%H %cI", "--", rel).splitlines()
    assert len(log) == 1, f"{rel} has {len(log)} commits; a registered plan is never edited: {log}"
    commit, when = log[0].split()
    reg = PLAN2.registration
    assert commit == reg.commit and st._utc(when, "git") == reg.committed
    assert _git("show", "--format=", "--name-only", commit).splitlines() == [rel]  # the plan alone
    blob = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=ROOT, capture_output=True, check=True).stdout
    assert hashlib.sha256(blob).hexdigest() == reg.sha256


# ----------------------------------------------------------------------------- which runs a plan judges
def grid_run(arm="step", seed=None, started=None, **config):
    schedule, corrections = PLAN2.arms[arm]["schedule"], PLAN2.arms[arm]["corrections"]
    when = started or (PLAN2.registration.committed + dt.timedelta(seconds=1)).isoformat()
    manifest = {"config": {**PLAN2.config, "schedule": schedule, "corrections": corrections, "seed": seed, **config},
                "data": {**PLAN2.data}, "started": when, "status": "finished"}
    return run(schedule, PLAN2.seeds[0] if seed is None else seed, [0.8], **manifest)


def test_split_runs_judges_only_the_grid_started_after_registration():
    at = PLAN2.registration.committed
    good = [grid_run(arm, k) for arm in PLAN2.arms for k in PLAN2.seeds[:2]]
    bad = [grid_run(started=at.isoformat()),  # in the registration's second: not after it
           grid_run(started=(at - dt.timedelta(days=1)).isoformat()), grid_run(epochs=200), grid_run(seed=0),
           grid_run(started=(at + dt.timedelta(hours=1)).astimezone(dt.timezone(dt.timedelta(hours=-5))).isoformat(),
                    wd=5e-3)]
    judged, rest = split_runs(PLAN2, good + bad)
    assert judged == good and rest == bad
    late_ok = grid_run(started=(at + dt.timedelta(seconds=1)).astimezone(dt.timezone(dt.timedelta(hours=9)))
                       .isoformat())
    assert split_runs(PLAN2, [late_ok])[0] == [late_ok]  # another UTC offset, one second later
    assert split_runs(PLAN, good) == ([], good)  # v1 judges nothing
    assert count_by_arm(judged) == dict.fromkeys(sorted(PLAN2.arms), 2)
    assert complete_seeds(PLAN2, judged) == list(PLAN2.seeds[:2])
    assert complete_seeds(PLAN2, judged[1:]) == [PLAN2.seeds[1]]  # step's first seed missing
    with pytest.raises(ValueError, match="started must be an ISO time"):
        split_runs(PLAN2, [grid_run(started="2026-12-02")])


def test_the_pilot_is_judged_by_no_plan():
    runs = [r for group in pilot_runs().values() for r in group]
    assert split_runs(PLAN2, runs) == ([], runs) and split_runs(PLAN, runs) == ([], runs)
    assert count_by_arm(runs) == {"cosine": 2, "cosine-texp": 2, "step": 6, "texp": 6, "texp--": 2, "texp-none": 5}


# ----------------------------------------------------------------------------- cost
def timed(start, stop, epochs):
    return {"manifest": {"started": f"2026-11-30T10:00:{start:02d}+00:00", "updated": f"2026-11-30T10:00:{stop:02d}"
                         "+00:00", "epochs_done": epochs}}


def test_throughput_counts_overlapping_runs_once_and_grid_cost_is_its_arithmetic():
    runs = [timed(0, 10, 2), timed(5, 20, 1), timed(6, 8, 1), timed(40, 50, 1)]  # busy 0-20 and 40-50: 30 s
    assert throughput(runs) == 5 * TRAIN_IMAGES / 30
    cost = grid_cost(PLAN2, 1000.0)
    n_image_epochs = len(PLAN2.arms) * len(PLAN2.seeds) * PLAN2.config["epochs"] * TRAIN_IMAGES
    assert cost["image_epochs"] == n_image_epochs and cost["seconds"] == n_image_epochs / 1000.0
    with pytest.raises(ValueError, match="arms"):
        grid_cost(PLAN, 1000.0)
    with pytest.raises(ValueError, match="images_per_s > 0"):
        grid_cost(PLAN2, 0.0)


def test_the_pilot_throughput_on_the_h200_is_between_one_process_and_sixteen():
    """From the manifests, evaluation included: below gpu_probe.json's 16-process training throughput, above one
    process's."""
    runs = [r for group in pilot_runs().values() for r in group]
    probe = {row["jobs"]: row["images_per_s"] for row in json.loads((PILOT / "gpu_probe.json").read_text())["rows"]}
    assert {d for r in runs for d in r["manifest"]["devices"]} == {"NVIDIA H200"}
    assert probe[1] < throughput(runs) < probe[16]
