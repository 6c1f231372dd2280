"""Chapter 6's statistics under a registered analysis plan (:mod:`explr.book.registration`): the verdicts, the power
analysis that sizes the grid, which runs a plan judges, and the grid's cost.

*v3* (:func:`decide`): each claim is decided by its own paired test, Holm over a fixed family of the primary claims
(the rule is :mod:`explr.book.verdicts`, registered with the plan).

*v1, v2* (superseded, they judge no run; :func:`judge`): for a claim "a vs b" with final accuracies a₁..a_m and
b₁..b_n (Welch 1947; Schuirmann 1987 for TOST):

* Δ = ā − b̄ and its 95 % Welch interval Δ ± t_{0.975,ν} s, with s² = s_a²/m + s_b²/n and the
  Welch–Satterthwaite degrees of freedom ν = s⁴ / ((s_a²/m)²/(m−1) + (s_b²/n)²/(n−1));
* the two-sided Welch t-test of Δ = 0 (what ``scipy.stats.ttest_ind(equal_var=False)`` computes);
* TOST, the equivalence test against ±δ: p = max(P(T ≥ (Δ+δ)/s), P(T ≤ (Δ−δ)/s)) with T ~ t_ν,
  which is below α exactly when the 90 % interval lies inside (−δ, δ).

Every claim gets both tests, equivalence checked first; Holm's (1979) step-down adjusts the p-values of the family
(v1: every claim; v2: the primary claims) among the claims that reach the minimum seeds.  An exploratory claim
(v2) is judged on its unadjusted p-values.  Below the minimum a claim is "not tested".  Each verdict is a sentence
built from these numbers (:attr:`Verdict.sentence`, :attr:`Decision.sentence`).

**Power.** :func:`power` simulates the whole family under the plan's rule (numpy draws, the same tests and Holm):
the probability that each primary claim is supported (v3: and all of them at once, with same-seed correlation),
with n seeds per arm, arm means and one sd per run; :func:`power_table` and :func:`seeds_needed` choose n;
:func:`pooled_sd` gives the pilot's spread and its upper confidence limit.

**Runs.** :func:`split_runs` sorts runs into those the plan judges (started after the registration second, and
trained as the plan says) and the rest; :func:`count_by_arm`, :func:`complete_seeds` (the grid's ``--resume``),
:func:`open_runs` (whether the grid is closed).  **Cost.** :func:`throughput` of committed runs from their
manifests, :func:`grid_cost` of a plan's grid.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from explr.params import is_int, is_real

from . import verdicts as _rule
from .registration import AnalysisPlan, Claim, arm_of, parse_utc

__all__ = [
    "TRAIN_IMAGES", "ScheduleSummary", "Welch", "Verdict", "PooledSD", "Decision",
    "summarise", "welch", "judge", "decide", "pooled_sd", "power", "power_table", "seeds_needed",
    "split_runs", "count_by_arm", "complete_seeds", "open_runs", "throughput", "grid_cost",
]

#: CIFAR-10's training images: an image-epoch is one of them seen once.
TRAIN_IMAGES = 50_000


# ----------------------------------------------------------------------------- the runs: summaries and their tests
@dataclass(frozen=True)
class ScheduleSummary:
    """Final-epoch metric of every seed of one arm."""

    schedule: str  # the arm (:func:`arm_of`)
    seeds: tuple
    final: np.ndarray  # one value per seed, in ``seeds`` order
    epochs: int

    @property
    def mean(self) -> float:
        return float(self.final.mean())

    @property
    def std(self) -> float:
        """Sample standard deviation over seeds (0 for a single seed)."""
        return float(self.final.std(ddof=1)) if len(self.final) > 1 else 0.0


def summarise(runs, metric: str = "test_acc") -> dict[str, ScheduleSummary]:
    """Group runs (``explr`` run dicts with ``schedule``, ``seed``, ``metrics``, optionally ``manifest``) by arm
    (:func:`arm_of`), the final epoch of each.

    Raises ``ValueError`` if the runs of one arm have different lengths (a mix of finished and
    interrupted runs would compare different epochs).
    """
    by_arm: dict[str, list] = {}
    for run in runs:
        values = run["metrics"].get(metric)
        if values is None or len(values) == 0:
            continue
        by_arm.setdefault(arm_of(run), []).append((run["seed"], values))
    out = {}
    for arm, items in by_arm.items():
        lengths = {len(v) for _, v in items}
        if len(lengths) != 1:
            raise ValueError(f"arm {arm!r}: runs have different numbers of epochs {sorted(lengths)}; "
                             "finish or remove the incomplete ones")
        items.sort(key=lambda item: item[0])
        out[arm] = ScheduleSummary(arm, tuple(s for s, _ in items), np.array([float(v[-1]) for _, v in items]),
                                   lengths.pop())
    return out


@dataclass(frozen=True)
class Welch:
    """Welch statistics of a − b (module docstring): Δ, its standard error, ν, the 95 % interval, two p-values.
    Floats from :func:`welch`; arrays over draws inside :func:`power` (there without ``ci95``)."""

    difference: float
    stderr: float
    dof: float
    ci95: tuple
    p_difference: float  # two-sided, H0: Δ = 0
    p_equivalence: float  # TOST, H0: |Δ| >= margin


def _welch(a: np.ndarray, b: np.ndarray, margin: float) -> Welch:
    """:class:`Welch` of the last axes of ``a`` (..., m) and ``b`` (..., n), m, n >= 2 (module docstring), without
    its interval (:func:`_floats` adds it to one claim's)."""
    from scipy.special import stdtr  # the t distribution's cdf

    m, n = a.shape[-1], b.shape[-1]
    va, vb = a.var(axis=-1, ddof=1) / m, b.var(axis=-1, ddof=1) / n
    d = a.mean(axis=-1) - b.mean(axis=-1)
    se = np.sqrt(va + vb)
    flat = se <= 1e-15  # no spread in either arm: every test is decided exactly
    with np.errstate(divide="ignore", invalid="ignore"):
        dof = np.where(flat, np.inf, (va + vb) ** 2 / (va ** 2 / (m - 1) + vb ** 2 / (n - 1)))
        p_diff = np.where(flat, (d == 0).astype(float), 2 * stdtr(dof, -np.abs(d) / se))
        p_equiv = np.where(flat, (np.abs(d) >= margin).astype(float),
                           np.maximum(stdtr(dof, -(d + margin) / se), stdtr(dof, (d - margin) / se)))
    return Welch(d, se, dof, None, p_diff, p_equiv)


def welch(a, b, margin: float) -> Welch:
    """Welch's interval, two-sided test and TOST for the means of ``a`` and ``b`` (each >= 2 values)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.ndim != 1 or b.ndim != 1 or len(a) < 2 or len(b) < 2:
        raise ValueError(f"welch needs 1-d arrays of >= 2 values per arm; got shapes {a.shape} and {b.shape}")
    return _floats(_welch(a, b, margin))


def _floats(w: Welch) -> Welch:
    """One claim's :class:`Welch` of :func:`_welch` as floats, with its 95 % interval."""
    from scipy.special import stdtrit  # the t distribution's quantile

    d, se = float(w.difference), float(w.stderr)
    half = float(stdtrit(w.dof, 0.975)) * se if se > 0 else 0.0
    return Welch(d, se, float(w.dof), (d - half, d + half), float(w.p_difference), float(w.p_equivalence))


def _bearing(hypothesis: str, verdict, difference):
    """What a verdict says of a hypothesis: "supports", "contradicts" or "open" (scalars or arrays)."""
    verdict = np.asarray(verdict)
    equivalent, different = verdict == "equivalent", verdict == "different"
    if hypothesis == "equivalent":
        return np.select([equivalent, different], ["supports", "contradicts"], "open")
    if hypothesis == "a better":
        return np.select([equivalent, different & (np.asarray(difference) > 0), different],
                         ["contradicts", "supports", "contradicts"], "open")
    return np.full(verdict.shape, "open")


def _verdicts(plan: AnalysisPlan, claims, finals: dict) -> list[tuple]:
    """The plan's rule on ``finals`` (arm → final accuracies, shape (..., seeds)): per claim (Welch or None,
    p-values (Holm-adjusted over the tested primary claims, raw for exploratory ones) or None, verdict)."""
    rows = []
    for c in claims:
        n = min(finals[c.a].shape[-1], finals[c.b].shape[-1])
        w = _welch(finals[c.a], finals[c.b], plan.margin) if n >= 2 else None
        rows.append((c, w, n >= plan.min_seeds))
    p = {c.id: (w.p_difference, w.p_equivalence) for c, w, tested in rows if tested}
    family = [c.id for c, _, tested in rows if tested and c.role == "primary"]
    if family:
        adjusted = _rule.holm(np.stack([x for cid in family for x in p[cid]], axis=-1))
        p.update({cid: (adjusted[..., 2 * i], adjusted[..., 2 * i + 1]) for i, cid in enumerate(family)})
    out = []
    for c, w, tested in rows:
        if not tested:
            out.append((c, w, None, "not tested"))
            continue
        p_diff, p_equiv = p[c.id]
        verdict = np.where(p_equiv < plan.alpha, "equivalent", np.where(p_diff < plan.alpha, "different", "undecided"))
        out.append((c, w, (p_diff, p_equiv), verdict))
    return out


@dataclass(frozen=True)
class Verdict:
    """A claim of the plan judged on the data (:func:`judge`)."""

    claim: Claim
    n_a: int
    n_b: int
    stats: Welch | None  # None when an arm has fewer than 2 seeds
    p_difference: float | None  # Holm-adjusted (primary) or raw (exploratory); None when not tested
    p_equivalence: float | None
    verdict: str  # "equivalent", "different", "undecided", "not tested"
    margin: float
    alpha: float
    min_seeds: int

    @property
    def tested(self) -> bool:
        return self.verdict != "not tested"

    @property
    def bearing(self) -> str:
        """What the verdict says of the claim's hypothesis: "supports", "contradicts" or "open"."""
        return str(_bearing(self.claim.hypothesis, self.verdict, self.stats.difference if self.stats else 0.0))

    @property
    def sentence(self) -> str:
        """The verdict in words, with the numbers it rests on (accuracies in percentage points)."""
        pts = lambda v: f"{100 * v:+.2f}"  # noqa: E731
        a, b = self.claim.a, self.claim.b
        if self.stats is None:
            return f"not tested (n = {min(self.n_a, self.n_b)} < {self.min_seeds}); no interval with one seed"
        w = self.stats
        numbers = (f"Δ = {pts(w.difference)} points, 95 % CI [{pts(w.ci95[0])}, {pts(w.ci95[1])}], "
                   f"n = {self.n_a} vs {self.n_b}")
        if not self.tested:
            return f"not tested (n = {min(self.n_a, self.n_b)} < {self.min_seeds}); {numbers}"
        kind = "Holm-adjusted" if self.claim.role == "primary" else "exploratory, unadjusted"
        tests = f"{kind} p: difference {self.p_difference:.3g}, equivalence ±{100 * self.margin:.1f} " \
                f"points {self.p_equivalence:.3g}"
        if self.verdict == "equivalent":
            head = f"equivalent within ±{100 * self.margin:.1f} points"
        elif self.verdict == "different":
            head = f"different: {a} is {'better' if w.difference > 0 else 'worse'} than {b}"
        else:
            head = f"undecided at α = {self.alpha}: neither a difference nor equivalence is shown"
        return f"{head}; {numbers}; {tests}"


def judge(plan: AnalysisPlan, summaries: dict) -> list[Verdict]:
    """Apply ``plan`` to ``summaries`` (arm → :class:`ScheduleSummary`): one :class:`Verdict` per claim whose arms
    are both present, in the plan's order.  Holm's family: the primary claims with >= ``min_seeds`` per arm."""
    present = [c for c in plan.claims if c.a in summaries and c.b in summaries]
    finals = {s: summaries[s].final for c in present for s in (c.a, c.b)}
    out = []
    for c, w, p, verdict in _verdicts(plan, present, finals):
        w = _floats(w) if w is not None else None
        p_diff, p_equiv = (float(x) for x in p) if p is not None else (None, None)
        out.append(Verdict(c, len(finals[c.a]), len(finals[c.b]), w, p_diff, p_equiv, str(verdict), plan.margin,
                           plan.alpha, plan.min_seeds))
    return out


@dataclass(frozen=True)
class Decision:
    """A claim of a version-3 plan decided on the data (:func:`decide`, the rule of :mod:`explr.book.verdicts`)."""

    claim: Claim
    seeds: tuple  # the complete pairs: seeds both arms finished
    difference: float | None  # mean paired difference a − b; None with fewer than 2 pairs
    ci95: tuple | None  # its 95 % paired-t interval
    p: float | None  # the claim's own test, raw; None when not tested
    p_compared: float  # Holm-adjusted (primary) or raw (exploratory); 1 when not tested
    supported: bool
    margin: float
    alpha: float

    @property
    def tested(self) -> bool:
        return self.p is not None

    @property
    def sentence(self) -> str:
        """The decision in words, with the numbers it rests on (accuracies in percentage points)."""
        pts = lambda v: f"{100 * v:+.2f}"  # noqa: E731
        if not self.tested:
            return (f"not tested ({len(self.seeds)} complete pairs < {_rule.MIN_PAIRS}); in the family it counts "
                    "as not rejected")
        c = self.claim
        kind = "Holm-adjusted" if c.role == "primary" else "exploratory, unadjusted"
        test = (f"TOST ±{100 * self.margin:.2f} points" if c.hypothesis == "equivalent"
                else "one-sided paired t")
        numbers = (f"Δ = {pts(self.difference)} points, 95 % CI [{pts(self.ci95[0])}, {pts(self.ci95[1])}], "
                   f"{len(self.seeds)} pairs; {test}, {kind} p = {self.p_compared:.3g}")
        claim = (f"{c.a} within ±{100 * self.margin:.2f} points of {c.b}" if c.hypothesis == "equivalent"
                 else f"{c.a} better than {c.b}")
        head = "supported" if self.supported else "not shown"
        return f"{head} at α = {self.alpha}: {claim}; {numbers}"


def decide(plan: AnalysisPlan, summaries: dict) -> list[Decision]:
    """Apply a version-3 ``plan`` to ``summaries`` (arm → :class:`ScheduleSummary` of finished judged runs): one
    :class:`Decision` per claim, in the plan's order, by :func:`explr.book.verdicts.decide`.  A claim whose arms
    share fewer than 2 seeds is not tested, and stays in Holm's family with p = 1."""
    from scipy.special import stdtrit  # the t distribution's quantile

    if plan.version < 3:
        raise ValueError(f"decide applies a version-3 plan; {plan.path.name} is version {plan.version} (judge)")
    by_seed = {arm: dict(zip(s.seeds, s.final.tolist(), strict=True)) for arm, s in summaries.items()}
    pairs = [_rule.complete_pairs(by_seed.get(c.a, {}), by_seed.get(c.b, {})) for c in plan.claims]
    differences = [a - b if len(seeds) >= _rule.MIN_PAIRS else None for seeds, a, b in pairs]
    rows = _rule.decide([(c.hypothesis, c.role == "primary") for c in plan.claims], differences,
                        alpha=plan.alpha, margin=plan.margin)
    out = []
    for c, (seeds, _, _), d, (p, compared, supported) in zip(plan.claims, pairs, differences, rows, strict=True):
        mean = ci = None
        if d is not None:
            mean = float(d.mean())
            half = float(stdtrit(len(d) - 1, 0.975) * d.std(ddof=1) / math.sqrt(len(d)))
            ci = (mean - half, mean + half)
        out.append(Decision(c, seeds, mean, ci, None if p is None else float(p), float(compared), bool(supported),
                            plan.margin, plan.alpha))
    return out


# ----------------------------------------------------------------------------- the power analysis
@dataclass(frozen=True)
class PooledSD:
    """The pooled within-arm sd of a pilot, its degrees of freedom and its one-sided upper confidence limit."""

    sd: float
    dof: int
    upper: float
    confidence: float


def pooled_sd(summaries: dict, confidence: float = 0.8) -> PooledSD:
    """s_p = sqrt(Σ (n_i − 1) s_i² / ν), ν = Σ (n_i − 1), over the arms with >= 2 seeds, and its upper limit
    s_p sqrt(ν / χ²_{1−confidence, ν}): planning with that limit keeps the design's power in about ``confidence``
    of pilots, where the pilot's own s_p would leave it short half the time (Browne 1995, Stat. Med. 14:1933)."""
    from scipy.stats import chi2

    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1); got {confidence!r}")
    parts = [(len(s.final) - 1, s.std ** 2) for s in summaries.values() if len(s.final) >= 2]
    dof = sum(k for k, _ in parts)
    if dof == 0:
        raise ValueError("pooled_sd needs an arm with >= 2 seeds")
    sd = math.sqrt(sum(k * v for k, v in parts) / dof)
    return PooledSD(sd, dof, sd * math.sqrt(dof / chi2.ppf(1 - confidence, dof)), confidence)


def power(plan: AnalysisPlan, n: int, *, sd: float, means: dict, draws: int = 20_000, seed: int = 0,
          rho: float | None = None) -> dict:
    """Claim id → the probability that its verdict supports its hypothesis, for each primary claim with one, when
    every arm has ``n`` seeds with final accuracies ~ N(``means[arm]``, ``sd``²), all drawn at once and judged
    by the plan's rule (v1, v2: :func:`judge`'s tests and Holm's family; v3: :func:`explr.book.verdicts.decide`),
    and for v3 also ``"joint"``: the probability that every primary claim is supported at once.  v3 pairs the
    seeds: the runs of one seed correlate by ``rho`` (default 0), each value sd (√rho Z_seed + √(1 − rho) Z_run).
    Monte Carlo over ``draws`` grids, seeded by (``seed``, n): the same numbers on every run, and a standard error
    <= 0.5/sqrt(draws)."""
    if not (is_int(n) and n >= 2):
        raise ValueError(f"n must be an integer >= 2 (seeds per arm); got {n!r}")
    if not (is_real(sd) and sd > 0 and is_int(draws) and draws >= 1):
        raise ValueError(f"sd must be > 0 and draws an integer >= 1; got sd={sd!r}, draws={draws!r}")
    if rho is not None and (plan.version < 3 or not (is_real(rho) and 0 <= rho < 1)):
        raise ValueError(f"rho must be in [0, 1), for a version-3 plan (paired seeds); got {rho!r}")
    claims = [c for c in plan.family if c.hypothesis != "none"]
    arms = sorted({c.a for c in claims} | {c.b for c in claims})
    missing = [a for a in arms if a not in means]
    if missing:
        raise ValueError(f"means must give every arm of the primary claims; missing {missing}")
    rng = np.random.default_rng([seed, n])
    if plan.version < 3:
        finals = {arm: rng.normal(means[arm], sd, size=(draws, n)) for arm in arms}
        rows = _verdicts(replace(plan, min_seeds=2), claims, finals)
        return {c.id: float(np.mean(_bearing(c.hypothesis, verdict, w.difference) == "supports"))
                for c, w, _, verdict in rows}
    rho = 0.0 if rho is None else float(rho)
    shared = rng.standard_normal((draws, n))
    finals = {arm: means[arm] + sd * (math.sqrt(rho) * shared + math.sqrt(1 - rho) * rng.standard_normal((draws, n)))
              for arm in arms}
    rows = _rule.decide([(c.hypothesis, True) for c in claims], [finals[c.a] - finals[c.b] for c in claims],
                        alpha=plan.alpha, margin=plan.margin)
    supported = np.stack([ok for _, _, ok in rows])
    return {**{c.id: float(ok.mean()) for c, ok in zip(claims, supported, strict=True)},
            "joint": float(supported.all(axis=0).mean())}


def power_table(plan: AnalysisPlan, ns, **kwargs) -> list[dict]:
    """One row per n of ``ns``: ``{"n": n, claim id: power, ...}`` (:func:`power`, same ``kwargs``)."""
    return [{"n": n, **power(plan, n, **kwargs)} for n in ns]


def seeds_needed(table: list[dict], target: float = 0.8) -> int:
    """The smallest n of ``table`` (:func:`power_table`, rows by increasing n) from which on every claim has power
    >= ``target`` in every row (so that Monte-Carlo noise cannot pick an n whose next row falls short)."""
    if not 0 < target < 1:
        raise ValueError(f"target must be in (0, 1); got {target!r}")
    enough = [all(v >= target for k, v in row.items() if k != "n") for row in table]
    if not enough or not enough[-1]:
        raise ValueError(f"no n in the table gives every claim power >= {target}; extend the table's n")
    last_short = max((i for i, ok in enumerate(enough) if not ok), default=-1)
    return table[last_short + 1]["n"]


# ----------------------------------------------------------------------------- which runs a plan judges, and its cost
def split_runs(plan: AnalysisPlan, runs) -> tuple[list, list]:
    """``(judged, not_judged)``: the runs (``explr`` run dicts with a manifest) that ``plan`` judges, and the rest
    (the pilot, runs applied post hoc, runs of another recipe).  A run is judged when the plan is registered, the
    run's ``started`` (manifest, ISO time) is after the registration second (:func:`explr.book.verdicts.
    after_registration`: a run started in that second is not), its arm and seed are the plan's, and its recipe is
    the plan's (:func:`explr.book.verdicts.same_recipe`).  An unregistered or superseded plan judges none."""
    judged, rest = [], []
    for run in runs:
        manifest = run["manifest"]
        ok = (plan.registration is not None and _in_grid(plan, run)
              and _rule.after_registration(parse_utc(manifest.get("started"), f"{run.get('dir', 'a run')}: started"),
                                           plan.registration.committed))
        (judged if ok else rest).append(run)
    return judged, rest


def _in_grid(plan: AnalysisPlan, run) -> bool:
    """An arm and a seed of the plan, trained with its recipe."""
    return (arm_of(run) in plan.arms and run["seed"] in plan.seeds
            and _rule.same_recipe(plan.config, plan.data, run.get("manifest")))


def count_by_arm(runs) -> dict[str, int]:
    """Arm (:func:`arm_of`) → number of runs, arms in sorted order."""
    counts: dict[str, int] = {}
    for run in runs:
        counts[arm_of(run)] = counts.get(arm_of(run), 0) + 1
    return dict(sorted(counts.items()))


def complete_seeds(plan: AnalysisPlan, runs) -> list[int]:
    """The plan's seeds for which every arm of the plan has a finished run among ``runs`` trained with the plan's
    recipe (:func:`explr.book.verdicts.same_recipe`, the rule of :func:`split_runs`): a balanced grid."""
    done = {(arm_of(r), r["seed"]) for r in runs if _rule.finished(r.get("manifest")) and _in_grid(plan, r)}
    return [k for k in plan.seeds if all((arm, k) in done for arm in plan.arms)]


def open_runs(plan: AnalysisPlan, judged, missing=()) -> list[tuple]:
    """The (arm, seed) pairs of the plan's grid that have no finished judged run and are not declared ``missing``
    (pairs (arm, seed) that failed every attempt the plan allows): the grid is closed, and decided, when none is
    left."""
    done = {(arm_of(r), r["seed"]) for r in judged if _rule.finished(r.get("manifest"))} | set(map(tuple, missing))
    return [(arm, k) for k in plan.seeds for arm in plan.arms if (arm, k) not in done]


def throughput(runs) -> float:
    """Image-epochs per second of runs that shared one machine: Σ ``epochs_done`` × :data:`TRAIN_IMAGES` over the
    union of their [``started``, ``updated``] intervals (manifests; evaluation and start-up included)."""
    spans = sorted((parse_utc(r["manifest"]["started"], "started"), parse_utc(r["manifest"]["updated"], "updated"))
                   for r in runs)
    if not spans:
        raise ValueError("throughput needs at least one run")
    busy, end = 0.0, None
    for start, stop in spans:
        start = max(start, end) if end is not None else start
        if stop > start:
            busy += (stop - start).total_seconds()
            end = stop
    return sum(r["manifest"]["epochs_done"] for r in runs) * TRAIN_IMAGES / busy


def grid_cost(plan: AnalysisPlan, images_per_s: float) -> dict:
    """The plan's grid: arms × seeds × epochs × :data:`TRAIN_IMAGES` image-epochs, and the seconds they take at
    ``images_per_s`` (e.g. :func:`throughput` of the pilot)."""
    if not plan.arms or not images_per_s > 0:
        raise ValueError(f"grid_cost needs a plan with arms (v2) and images_per_s > 0; got {images_per_s!r}")
    image_epochs = len(plan.arms) * len(plan.seeds) * plan.config["epochs"] * TRAIN_IMAGES
    return {"arms": len(plan.arms), "seeds": len(plan.seeds), "epochs": plan.config["epochs"],
            "image_epochs": image_epochs, "seconds": image_epochs / images_per_s}
