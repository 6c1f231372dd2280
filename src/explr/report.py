"""Statistical verdicts for the CIFAR-10 schedule comparison (chapter 6), computed with ``scipy.stats``.

A claim of the paper compares two schedules by their final test accuracy. Runs of the same seed share
the initial weights, the batch order and the augmentations, so the comparison is **paired by seed**:
with d_i = a_i − b_i over the n seeds both schedules have,

* the mean difference d̄ and its 95 % confidence interval d̄ ± t_{0.975, n−1} s_d/√n;
* the paired t-test of d̄ = 0 (``scipy.stats.ttest_rel``), and, as a check that does not rely on the
  pairing, Welch's unequal-variance t-test on all seeds of each schedule (``ttest_ind(equal_var=False)``);
* "a ≈ b" claims: an equivalence test, TOST (two one-sided paired t-tests against ±δ), with the margin
  δ = :data:`EQUIVALENCE_MARGIN` fixed here for every claim; equivalence is shown when both one-sided
  tests reject at level α, i.e. when the 90 % interval lies inside (−δ, δ);
* "a at least as good as b" claims: a one-sided paired test of superiority (d̄ > 0) and one of
  non-inferiority (d̄ > −δ).

Every verdict is a sentence built from these numbers (:attr:`Comparison.sentence`), so a rerun on other
results cannot leave a stale conclusion behind.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "ALPHA",
    "EQUIVALENCE_MARGIN",
    "ScheduleSummary",
    "Comparison",
    "summarise",
    "compare",
]

#: Significance level of every test in the chapter.
ALPHA = 0.05
#: Equivalence margin δ for "≈" claims, in accuracy units: one percentage point of test accuracy.
EQUIVALENCE_MARGIN = 0.01


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

    def by_seed(self) -> dict:
        return dict(zip(self.seeds, self.final.tolist()))


@dataclass(frozen=True)
class Comparison:
    """The outcome of :func:`compare` (module docstring): paired statistics, Welch, the verdict."""

    a: str
    b: str
    kind: str  # "same" or "at-least"
    seeds: tuple  # the paired seeds
    differences: np.ndarray  # a − b per paired seed
    ci95: tuple  # 95 % confidence interval of the mean paired difference
    p_paired: float  # two-sided paired t-test
    p_welch: float  # two-sided Welch t-test on all seeds of each schedule
    p_equivalence: float  # TOST against ±margin (paired)
    p_superiority: float  # one-sided paired test of a > b
    p_noninferiority: float  # one-sided paired test of a > b − margin
    margin: float
    verdict: str  # "equivalent", "different", "better", "non-inferior", "worse", "undecided"

    @property
    def mean_difference(self) -> float:
        return float(self.differences.mean())

    @property
    def n(self) -> int:
        return len(self.seeds)

    @property
    def decided(self) -> bool:
        return self.verdict != "undecided"

    @property
    def sentence(self) -> str:
        """The verdict in words, with the numbers it rests on (accuracies in percentage points)."""
        pts = lambda v: f"{100 * v:+.2f}"  # noqa: E731
        lo, hi = self.ci95
        stats = (f"Δ = {pts(self.mean_difference)} points over {self.n} paired seeds, 95 % CI [{pts(lo)}, {pts(hi)}], "
                 f"paired p = {self.p_paired:.3g}, Welch p = {self.p_welch:.3g}")
        margin = f"±{100 * self.margin:.1f} points"
        if self.verdict == "equivalent":
            return f"equivalent within {margin} (TOST p = {self.p_equivalence:.3g}); {stats}"
        if self.verdict == "different":
            side = "better" if self.mean_difference > 0 else "worse"
            return (f"not equivalent: {self.a} is {side} (paired p = {self.p_paired:.3g} < {ALPHA}); "
                    f"{stats}; TOST p = {self.p_equivalence:.3g}")
        if self.verdict == "better":
            return f"{self.a} is better (one-sided paired p = {self.p_superiority:.3g}); {stats}"
        if self.verdict == "non-inferior":
            return (f"{self.a} is at least as good within {margin} (non-inferiority p = {self.p_noninferiority:.3g}) "
                    f"but not shown better (one-sided p = {self.p_superiority:.3g}); {stats}")
        if self.verdict == "worse":
            return f"contradicted: {self.a} is worse (paired p = {self.p_paired:.3g}); {stats}"
        what = (f"equivalence within {margin} (TOST p = {self.p_equivalence:.3g})" if self.kind == "same"
                else f"superiority (p = {self.p_superiority:.3g}) or non-inferiority within {margin} "
                     f"(p = {self.p_noninferiority:.3g})")
        return f"undecided at α = {ALPHA}: neither {what} nor a difference can be shown; {stats}"


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


def _t_p(d: np.ndarray, popmean: float, alternative: str) -> float:
    """p-value of a one-sample t-test of the paired differences (a constant sample is decided exactly)."""
    from scipy import stats

    if np.ptp(d) <= 1e-12:  # no spread (to rounding): the test statistic is ±inf or undefined
        delta = float(d[0]) - popmean
        if alternative == "greater":
            return 0.0 if delta > 0 else 1.0
        if alternative == "less":
            return 0.0 if delta < 0 else 1.0
        return 1.0 if delta == 0 else 0.0
    return float(stats.ttest_1samp(d, popmean, alternative=alternative).pvalue)


def compare(a: ScheduleSummary, b: ScheduleSummary, kind: str, margin: float = EQUIVALENCE_MARGIN,
            alpha: float = ALPHA) -> Comparison:
    """Test "a ≈ b" (``kind="same"``) or "a at least as good as b" (``kind="at-least"``), paired by seed.

    Verdicts, at level ``alpha``: ``same`` → "equivalent" (TOST rejects both one-sided nulls), else
    "different" (paired two-sided test rejects Δ = 0), else "undecided". ``at-least`` → "better"
    (one-sided superiority), else "non-inferior" (one-sided against −margin), else "worse" (two-sided
    rejects and Δ < 0), else "undecided". Needs at least two seeds that both schedules have.
    """
    from scipy import stats

    if kind not in ("same", "at-least"):
        raise ValueError(f"kind must be 'same' or 'at-least'; got {kind!r}")
    if not (0 < margin < 1) or not (0 < alpha < 1):
        raise ValueError(f"margin and alpha must be in (0, 1); got margin={margin!r}, alpha={alpha!r}")
    av, bv = a.by_seed(), b.by_seed()
    seeds = tuple(sorted(set(av) & set(bv)))
    if len(seeds) < 2 or len(a.final) < 2 or len(b.final) < 2:
        raise ValueError(f"compare needs >= 2 seeds that both {a.schedule!r} {a.seeds} and {b.schedule!r} {b.seeds} "
                         "have (paired by seed)")
    d = np.array([av[s] - bv[s] for s in seeds])
    n = len(d)
    half = stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / np.sqrt(n)
    ci = (float(d.mean() - half), float(d.mean() + half))
    p_paired = _t_p(d, 0.0, "two-sided")
    if np.ptp(a.final) <= 1e-12 and np.ptp(b.final) <= 1e-12:
        p_welch = 1.0 if a.mean == b.mean else 0.0
    else:
        p_welch = float(stats.ttest_ind(a.final, b.final, equal_var=False).pvalue)
    p_equiv = max(_t_p(d, -margin, "greater"), _t_p(d, margin, "less"))
    p_sup = _t_p(d, 0.0, "greater")
    p_noninf = _t_p(d, -margin, "greater")
    if kind == "same":
        verdict = "equivalent" if p_equiv < alpha else "different" if p_paired < alpha else "undecided"
    elif p_sup < alpha:
        verdict = "better"
    elif p_noninf < alpha:
        verdict = "non-inferior"
    elif p_paired < alpha and d.mean() < 0:
        verdict = "worse"
    else:
        verdict = "undecided"
    return Comparison(a.schedule, b.schedule, kind, seeds, d, ci, p_paired, p_welch, p_equiv, p_sup, p_noninf,
                      margin, verdict)
