"""Statistical verdicts for the CIFAR-10 schedule comparison (chapter 6), under a pre-registered plan.

The plan (:data:`PLAN_PATH`, ``analysis_plan.json`` beside this module, read by :func:`load_plan`) fixes
before the data: the claims and their hypotheses, the level α, the equivalence margin δ and its
criterion, the minimum number of seeds per arm, the test and why, and the multiplicity control.
:func:`judge` applies it. For a claim "a vs b" with final accuracies a₁..a_m and b₁..b_n:

* Δ = ā − b̄ and its 95 % Welch interval Δ ± t_{0.975,ν} s, with s² = s_a²/m + s_b²/n and the
  Welch–Satterthwaite degrees of freedom ν = s⁴ / ((s_a²/m)²/(m−1) + (s_b²/n)²/(n−1));
* the two-sided Welch t-test of Δ = 0 (``scipy.stats.ttest_ind(equal_var=False)``);
* TOST, the equivalence test against ±δ: p = max(P(T ≥ (Δ+δ)/s), P(T ≤ (Δ−δ)/s)) with T ~ t_ν,
  which is below α exactly when the 90 % interval lies inside (−δ, δ).

Every claim gets both tests, so a claim of equivalence and one of difference are confirmed and refuted
by the same rule. Holm's step-down procedure adjusts all the p-values of the claims that reach the
minimum number of seeds, as one family. Below that number a claim is "not tested" and only its
interval is shown. Each verdict is a sentence built from these numbers (:attr:`Verdict.sentence`), so
a rerun on other results cannot leave a stale conclusion behind.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "PLAN_PATH",
    "Claim",
    "AnalysisPlan",
    "ScheduleSummary",
    "Welch",
    "Verdict",
    "load_plan",
    "summarise",
    "welch",
    "holm",
    "judge",
]

#: The pre-registered analysis plan of chapter 6.
PLAN_PATH = Path(__file__).with_name("analysis_plan.json")
HYPOTHESES = ("equivalent", "a better", "none")


@dataclass(frozen=True)
class Claim:
    """One comparison of the plan: schedule ``a`` against ``b``, the hypothesis, and where it comes from."""

    id: str
    a: str
    b: str
    hypothesis: str  # "equivalent", "a better" or "none" (reported both ways)
    source: str


@dataclass(frozen=True)
class AnalysisPlan:
    """The plan's numbers and claims (the JSON file holds the reasons for each)."""

    path: Path
    registered: str
    alpha: float
    margin: float
    min_seeds: int
    claims: tuple


def load_plan(path=PLAN_PATH) -> AnalysisPlan:
    """Read and check an analysis plan (``ValueError`` naming the field if one is missing or out of range)."""
    path = Path(path)
    raw = json.loads(path.read_text())
    for key in ("registered", "alpha", "margin", "min_seeds", "test", "multiplicity", "claims"):
        if key not in raw:
            raise ValueError(f"{path}: the plan has no {key!r}")
    if raw["test"] != "welch" or raw["multiplicity"] != "holm":
        raise ValueError(f"{path}: only test 'welch' with multiplicity 'holm' is implemented; got "
                         f"{raw['test']!r}, {raw['multiplicity']!r}")
    if not (0 < raw["alpha"] < 1 and 0 < raw["margin"] < 1):
        raise ValueError(f"{path}: alpha and margin must be in (0, 1); got {raw['alpha']!r}, {raw['margin']!r}")
    if not (isinstance(raw["min_seeds"], int) and raw["min_seeds"] >= 2):
        raise ValueError(f"{path}: min_seeds must be an integer >= 2; got {raw['min_seeds']!r}")
    claims = tuple(Claim(c["id"], c["a"], c["b"], c["hypothesis"], c["source"]) for c in raw["claims"])
    for c in claims:
        if c.hypothesis not in HYPOTHESES:
            raise ValueError(f"{path}: claim {c.id}: hypothesis must be one of {HYPOTHESES}; got {c.hypothesis!r}")
    return AnalysisPlan(path, raw["registered"], float(raw["alpha"]), float(raw["margin"]), raw["min_seeds"], claims)


@dataclass(frozen=True)
class ScheduleSummary:
    """Final-epoch metric of every seed of one schedule."""

    schedule: str
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
    """Group runs (``explr`` run dicts with ``schedule``, ``seed``, ``metrics``) by schedule, final epoch of each.

    Raises ``ValueError`` if the runs of one schedule have different lengths (a mix of finished and
    interrupted runs would compare different epochs).
    """
    by_schedule: dict[str, list] = {}
    for run in runs:
        values = run["metrics"].get(metric)
        if values is None or len(values) == 0:
            continue
        by_schedule.setdefault(run["schedule"], []).append((run["seed"], values))
    out = {}
    for schedule, items in by_schedule.items():
        lengths = {len(v) for _, v in items}
        if len(lengths) != 1:
            raise ValueError(f"schedule {schedule!r}: runs have different numbers of epochs {sorted(lengths)}; "
                             "finish or remove the incomplete ones")
        items.sort(key=lambda item: item[0])
        out[schedule] = ScheduleSummary(schedule, tuple(s for s, _ in items),
                                        np.array([float(v[-1]) for _, v in items]), lengths.pop())
    return out


@dataclass(frozen=True)
class Welch:
    """Welch statistics of a − b (module docstring): Δ, its standard error, ν, the 95 % interval, two p-values."""

    difference: float
    stderr: float
    dof: float
    ci95: tuple
    p_difference: float  # two-sided, H0: Δ = 0
    p_equivalence: float  # TOST, H0: |Δ| >= margin


def welch(a: np.ndarray, b: np.ndarray, margin: float) -> Welch:
    """Welch's interval, two-sided test and TOST for the means of ``a`` and ``b`` (each >= 2 values)."""
    from scipy import stats

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"welch needs >= 2 values per arm; got {len(a)} and {len(b)}")
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    d = float(a.mean() - b.mean())
    se = math.sqrt(va + vb)
    if se <= 1e-15:  # no spread in either arm: every test is decided exactly
        inside = abs(d) < margin
        return Welch(d, 0.0, math.inf, (d, d), 1.0 if d == 0 else 0.0, 0.0 if inside else 1.0)
    dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = stats.t.ppf(0.975, dof) * se
    p_diff = float(2 * stats.t.sf(abs(d) / se, dof))
    p_equiv = float(max(stats.t.sf((d + margin) / se, dof), stats.t.cdf((d - margin) / se, dof)))
    return Welch(d, se, dof, (d - half, d + half), p_diff, p_equiv)


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values: p̃_(i) = max_{j<=i} min(1, (k − j + 1) p_(j)) for sorted p_(1) <= ... <= p_(k)."""
    p = np.asarray(pvalues, dtype=float)
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (len(p) - np.arange(len(p))) * p[order])
    adjusted = np.empty_like(p)
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted


@dataclass(frozen=True)
class Verdict:
    """A claim of the plan judged on the data (:func:`judge`)."""

    claim: Claim
    n_a: int
    n_b: int
    stats: Welch | None  # None when an arm has fewer than 2 seeds
    p_difference: float | None  # Holm-adjusted; None when not tested
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
        h, v = self.claim.hypothesis, self.verdict
        if v == "equivalent":
            return "supports" if h == "equivalent" else "contradicts" if h == "a better" else "open"
        if v == "different":
            if h == "equivalent":
                return "contradicts"
            if h == "a better":
                return "supports" if self.stats.difference > 0 else "contradicts"
        return "open"

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
        tests = f"Holm-adjusted p: difference {self.p_difference:.3g}, equivalence ±{100 * self.margin:.1f} " \
                f"points {self.p_equivalence:.3g}"
        if self.verdict == "equivalent":
            head = f"equivalent within ±{100 * self.margin:.1f} points"
        elif self.verdict == "different":
            head = f"different: {a} is {'better' if w.difference > 0 else 'worse'} than {b}"
        else:
            head = f"undecided at α = {self.alpha}: neither a difference nor equivalence is shown"
        return f"{head}; {numbers}; {tests}"


def judge(plan: AnalysisPlan, summaries: dict) -> list[Verdict]:
    """Apply ``plan`` to ``summaries`` (schedule → :class:`ScheduleSummary`): one :class:`Verdict` per claim whose
    schedules are both present, in the plan's order. Holm's family is every claim with >= ``min_seeds`` per arm."""
    present = [c for c in plan.claims if c.a in summaries and c.b in summaries]
    rows = []
    for c in present:
        a, b = summaries[c.a].final, summaries[c.b].final
        w = welch(a, b, plan.margin) if min(len(a), len(b)) >= 2 else None
        rows.append((c, len(a), len(b), w, min(len(a), len(b)) >= plan.min_seeds))
    family = [(w.p_difference, w.p_equivalence) for _, _, _, w, tested in rows if tested]
    adjusted = iter(holm(np.ravel(family)).reshape(-1, 2)) if family else iter(())
    out = []
    for c, na, nb, w, tested in rows:
        if not tested:
            out.append(Verdict(c, na, nb, w, None, None, "not tested", plan.margin, plan.alpha, plan.min_seeds))
            continue
        p_diff, p_equiv = next(adjusted)
        verdict = ("equivalent" if p_equiv < plan.alpha else "different" if p_diff < plan.alpha else "undecided")
        out.append(Verdict(c, na, nb, w, float(p_diff), float(p_equiv), verdict, plan.margin, plan.alpha,
                           plan.min_seeds))
    return out
