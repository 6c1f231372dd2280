"""explr.book.stats: chapter 6's statistics outside the judging path -- Welch's interval, the power analysis that
sizes plans v2-v4 (v1/v2's Welch/TOST/Holm rule, v3's paired rule), the pilot's spread, the grid's progress and
cost.  The plans: test_registration.py; the decision rule: test_verdicts.py; runs to verdicts: test_judging.py."""
import dataclasses
import json

import numpy as np
import pytest
from scipy import integrate, stats

import explr.book.verdicts as rule
from explr.book.judging import summarise
from explr.book.registration import Claim
from explr.book.stats import TRAIN_IMAGES, complete_seeds, count_by_arm, grid_cost, pooled_sd, power, throughput, welch
from test_judging import PILOT, PLAN, PLAN2, PLAN3, PLAN4, grid_run, run


def summaries(**finals):
    """Summaries of arms with the given final accuracies (one per seed)."""
    return summarise([run(s.replace("_", "-"), i, [0.1, v]) for s, values in finals.items()
                      for i, v in enumerate(values)])


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


# ----------------------------------------------------------------------------- the power analysis
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
    powered = [all(v >= spec["target"] for k, v in row.items() if k != "n") for row in spec["table"]]
    first = [row["n"] for row in spec["table"]].index(n)  # the first n from which on every row is powered
    assert not powered[first - 1] and all(powered[first:]) and n == len(PLAN3.seeds)
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


def test_v4_keeps_v3s_power_and_adds_the_joint_power_at_the_pilots_own_estimates():
    """v4's table and v3's rows are v3's (the same rule); its new rows are power at the pilot's mean differences
    (C1, C2) and at its pooled s.d. as well as at the 90 % limit, and reproduce; a true C1 difference of +0.12
    points costs joint power against Δ = 0, and the pilot's smaller spread gives it back."""
    spec, old = PLAN4.power, PLAN3.power
    assert spec["table"] == old["table"] and spec["sensitivity"][:len(old["sensitivity"])] == old["sensitivity"]
    pilot = summarise(pilot_runs()["main"] + pilot_runs()["ablation-none"])
    est = spec["pilot_estimates"]
    assert est == {"C1_difference": round(pilot["texp"].mean - pilot["step"].mean, 5),
                   "C2_difference": round(pilot["texp-none"].mean - pilot["texp"].mean, 5),
                   "sd": round(pooled_sd(pilot).sd, 5)}
    rows = sorted((r for r in spec["sensitivity"] if r["C1_difference"] == est["C1_difference"] != 0),
                  key=lambda r: r["sd"])
    assert [r["sd"] for r in rows] == [est["sd"], spec["sd"]]
    for row in rows:
        means = {**spec["means"], "texp": row["C1_difference"], "texp-none": row["C1_difference"]
                 + row["C2_difference"]}
        got = power(PLAN4, spec["n"], sd=row["sd"], means=means, draws=spec["draws"], seed=spec["seed"], rho=0.0)
        assert all(abs(got[k] - row[k]) <= 1e-3 for k in got), row["case"]
    at_zero = next(r for r in old["table"] if r["n"] == spec["n"])["joint"]
    assert rows[1]["joint"] < at_zero < rows[0]["joint"]


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
    """The same inputs with Holm left out (a deliberately wrong rule) or with C1 alone give C1 more power."""
    kw = dict(sd=PLAN2.power["sd"], means=PLAN2.power["means"], draws=4_000, seed=0)
    n, noise = 14, 3 * np.sqrt(0.25 / 4_000)
    family = power(PLAN2, n, **kw)["C1"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rule, "holm", lambda p: np.asarray(p))
        unadjusted = power(PLAN2, n, **kw)["C1"]
    alone = power(dataclasses.replace(PLAN2, claims=PLAN2.claims[:1]), n, **kw)["C1"]
    assert unadjusted > family + noise and alone > family + noise, (family, unadjusted, alone)


def test_power_is_deterministic_and_checks_its_inputs():
    kw = dict(sd=0.004, means=PLAN2.power["means"], draws=500)
    assert power(PLAN2, 6, **kw) == power(PLAN2, 6, **kw) != power(PLAN2, 6, **kw, seed=1)
    for bad, match in [(dict(n=1), "n must be an integer >= 2"), (dict(n=True), "n must be"),
                       (dict(sd=0), "sd must be > 0"), (dict(means={"step": 0.0}), "missing")]:
        with pytest.raises(ValueError, match=match):
            power(PLAN2, **{"n": 6, **kw, **bad})


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


# ----------------------------------------------------------------------------- the grid's progress and cost
def test_complete_seeds_counts_only_finished_runs_of_the_plans_recipe():
    """The --resume rule: another lr, another number of epochs, other data, a CPU run or an unfinished run is not
    done."""
    judged = [grid_run(arm, k) for arm in PLAN4.arms for k in PLAN4.seeds[:2]]
    assert complete_seeds(PLAN4, judged) == list(PLAN4.seeds[:2])
    assert complete_seeds(PLAN4, judged[1:]) == [PLAN4.seeds[1]]  # step's first seed missing
    for other in (dict(lr=0.05), dict(epochs=3), dict(status="running"), dict(status="diverged"),
                  dict(resolved={"device": "cpu", "precision": "bf16"})):
        swapped = [grid_run("step", PLAN4.seeds[0], **other)] + judged[1:]
        assert complete_seeds(PLAN4, swapped) == [PLAN4.seeds[1]], other
    foreign = [dict(r, manifest={**r["manifest"], "data": {"n_train": 10_000, "n_test": 10_000}}) for r in judged]
    assert complete_seeds(PLAN4, foreign) == []
    assert count_by_arm(judged) == dict.fromkeys(sorted(PLAN4.arms), 2)



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
