"""The book's statistics: fits and levels of recorded time series (chapters 4, 5) and chapter 6's verdicts under a
registered analysis plan, with the power analysis that sizes it and the cost of its grid.

**Time series.** Plain arrays shaped (time, seeds), per-seed results: :func:`loglog_slope` (orders of convergence,
chapter 5), :func:`returning_level`, :func:`longest_stretch_at_or_below`, :func:`first_time_above` (chapter 4).

**Verdicts.** A plan (``analysis_plan.json`` = v1, :data:`PLAN_PATH`; ``analysis_plan_v2.json`` = v2,
:data:`PLAN_V2_PATH`; read by :func:`load_plan`) fixes before its data the claims and their hypotheses, the level
α, the margin δ, the minimum seeds per arm, the test and the multiplicity control.  :func:`judge` applies it.
For a claim "a vs b" with final accuracies a₁..a_m and b₁..b_n (Welch 1947; Schuirmann 1987 for TOST):

* Δ = ā − b̄ and its 95 % Welch interval Δ ± t_{0.975,ν} s, with s² = s_a²/m + s_b²/n and the
  Welch–Satterthwaite degrees of freedom ν = s⁴ / ((s_a²/m)²/(m−1) + (s_b²/n)²/(n−1));
* the two-sided Welch t-test of Δ = 0 (what ``scipy.stats.ttest_ind(equal_var=False)`` computes);
* TOST, the equivalence test against ±δ: p = max(P(T ≥ (Δ+δ)/s), P(T ≤ (Δ−δ)/s)) with T ~ t_ν,
  which is below α exactly when the 90 % interval lies inside (−δ, δ).

Every claim gets both tests, so a claim of equivalence and one of difference are confirmed and refuted by the
same rule.  Holm's (1979) step-down procedure adjusts the p-values of the plan's family (v1: every claim; v2: the
primary claims) among the claims that reach the minimum seeds.  An exploratory claim (v2) is judged on its
unadjusted p-values and says so.  Below the minimum a claim is "not tested" and only its interval is shown.  Each
verdict is a sentence built from these numbers (:attr:`Verdict.sentence`).

**Power.** :func:`power` simulates the whole family under the plan's rule (numpy draws, the same tests and Holm
as :func:`judge`): the probability that each primary claim's verdict supports its hypothesis, with n seeds per
arm, arm means and one sd per run; :func:`power_table` and :func:`seeds_needed` choose n; :func:`pooled_sd` gives
the pilot's spread and its upper confidence limit.

**Registration.** A registered plan is never edited: ``registrations.json`` (:data:`REGISTRATIONS_PATH`, written
in the commit after the plan's own) holds each registered plan's sha256, its commit and the committer time (v1,
superseded without a valid registration: its sha256 and no commit), and :func:`load_plan` refuses a plan whose
bytes differ.  :func:`split_runs` sorts runs into those the plan judges
(started after that time, to the second, and trained as the plan says) and the rest; :func:`count_by_arm`.

**Cost.** :func:`throughput` of committed runs from their manifests, :func:`grid_cost` of a plan's grid.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

__all__ = [
    "loglog_slope", "returning_level", "longest_stretch_at_or_below", "first_time_above",
    "PLAN_PATH", "PLAN_V2_PATH", "REGISTRATIONS_PATH", "TRAIN_IMAGES",
    "Claim", "Registration", "AnalysisPlan", "ScheduleSummary", "Welch", "Verdict", "PooledSD",
    "load_plan", "arm_of", "summarise", "welch", "holm", "judge",
    "pooled_sd", "power", "power_table", "seeds_needed",
    "split_runs", "count_by_arm", "complete_seeds", "throughput", "grid_cost",
]

#: chapter 6's first plan (v1): committed after the runs it judged and edited after its commit, so it judges none.
PLAN_PATH = Path(__file__).with_name("analysis_plan.json")
#: chapter 6's second plan (v2), powered by the pilot and registered before its runs.
PLAN_V2_PATH = Path(__file__).with_name("analysis_plan_v2.json")
#: the registration record: plan file name → sha256, commit, committer time.
REGISTRATIONS_PATH = Path(__file__).with_name("registrations.json")
#: CIFAR-10's training images: an image-epoch is one of them seen once.
TRAIN_IMAGES = 50_000
HYPOTHESES = ("equivalent", "a better", "none")
ROLES = ("primary", "exploratory")


def _time_series(name, values):
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[0] == 0:
        raise ValueError(f"{name} must be an array of shape (time, seeds); got shape {values.shape}")
    return values


def loglog_slope(x, y) -> float:
    """Least-squares slope p of ln y = p ln x + c: the exponent of a power law y ∝ x^p.

    ``x`` and ``y``: positive arrays of one shape with at least 2 points.  An order-p method's global
    error against the step size, for instance, has slope p.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.size < 2 or not (x > 0).all() or not (y > 0).all():
        raise ValueError("x and y must be positive arrays of the same shape with at least 2 points")
    return float(np.polyfit(np.log(x.ravel()), np.log(y.ravel()), 1)[0])


def returning_level(values, window: int) -> np.ndarray:
    """The largest level that ``values`` exceeds (or reaches) in *every* ``window`` consecutive steps, per seed:

        min over t of max(values[t : t + window]),      ``values`` (time, seeds) → (seeds,).

    A series that converges has a returning level that falls to its limit as the run goes on; one that
    keeps fluctuating (Li & Arora's Thm 3.1 for BN + WD) keeps a returning level bounded away from 0.
    """
    values = _time_series("values", values)
    if isinstance(window, bool) or not float(window).is_integer() or not 1 <= window <= values.shape[0]:
        raise ValueError(f"window must be an integer in [1, {values.shape[0]}] (the recorded steps); got {window!r}")
    view = np.lib.stride_tricks.sliding_window_view(values, int(window), axis=0)
    return view.max(axis=-1).min(axis=0)


def longest_stretch_at_or_below(values, level) -> np.ndarray:
    """The longest run of consecutive steps with ``values`` <= ``level``, per seed (int array of shape (seeds,)).

    ``values`` (time, seeds); ``level`` a number or an array that broadcasts against (seeds,).
    """
    below = _time_series("values", values) <= level
    best = np.zeros(below.shape[1], dtype=int)
    run = np.zeros(below.shape[1], dtype=int)
    for row in below:  # a loop over time on (seeds,) vectors: cheap
        run = np.where(row, run + 1, 0)
        best = np.maximum(best, run)
    return best


def first_time_above(values, level) -> np.ndarray:
    """The first index t with ``values[t]`` > ``level``, per seed; −1 where the series never exceeds it.

    ``values`` (time, seeds); ``level`` a number or an array that broadcasts against (seeds,).  With
    ``values`` an error and ``level`` = ε/π this is the first exit time from the ε-cone of Li & Arora's
    Thm 3.1.
    """
    above = _time_series("values", values) > level
    return np.where(above.any(axis=0), above.argmax(axis=0), -1)


# ----------------------------------------------------------------------------- the plan and its registration
@dataclass(frozen=True)
class Claim:
    """One comparison of a plan: arm ``a`` against ``b``, the hypothesis, where it comes from, and its role."""

    id: str
    a: str
    b: str
    hypothesis: str  # "equivalent", "a better" or "none" (reported both ways)
    source: str
    role: str = "primary"  # "primary": in the Holm family; "exploratory": judged alone, unadjusted, and said so


@dataclass(frozen=True)
class Registration:
    """A registered plan: its file's sha256, the commit that added it and that commit's committer time (UTC)."""

    sha256: str
    commit: str
    committed: _dt.datetime


@dataclass(frozen=True)
class AnalysisPlan:
    """The plan's numbers and claims (the JSON file holds the reasons for each); v2 adds the grid it judges."""

    path: Path
    registered: str
    alpha: float
    margin: float
    min_seeds: int
    claims: tuple
    version: int = 1
    arms: dict = field(default_factory=dict)  # arm → {"schedule": ..., "corrections": ...}
    seeds: tuple = ()
    config: dict = field(default_factory=dict)  # the TrainConfig fields every run of the grid shares
    data: dict = field(default_factory=dict)  # what the manifests' "data" must say (n_train, n_test)
    power: dict | None = None  # the power analysis' inputs and result
    registration: Registration | None = None  # None: the plan judges no run

    @property
    def family(self) -> tuple:
        """The claims of Holm's family: the primary ones (v1: every claim)."""
        return tuple(c for c in self.claims if c.role == "primary")


def _arm_name(schedule: str, corrections: str) -> str:
    return schedule if corrections == "all" else f"{schedule}-{corrections}"


def arm_of(run) -> str:
    """A run's arm: its schedule, with ``-<corrections>`` appended when its momentum corrections are not "all"
    (``texp-none``, ``cosine-texp-none``); read from the manifest's config where the run has one."""
    config = run.get("manifest", {}).get("config", {})
    return _arm_name(config.get("schedule", run["schedule"]), config.get("corrections", "all"))


def _utc(text, what: str) -> _dt.datetime:
    try:
        when = _dt.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        when = None
    if when is None or when.tzinfo is None:
        raise ValueError(f"{what} must be an ISO time with its UTC offset; got {text!r}")
    return when.astimezone(_dt.timezone.utc)


def _registration(path: Path, data: bytes, registrations) -> Registration | None:
    """The registration of the plan file ``path`` (bytes ``data``) in ``registrations``: None if it has none, or
    a record without a commit (a superseded plan, kept unchanged); ``ValueError`` if its sha256 is not the recorded
    one."""
    registry = Path(registrations)
    record = json.loads(registry.read_text())["plans"].get(path.name) if registry.exists() else None
    if record is None:
        return None
    digest = hashlib.sha256(data).hexdigest()
    if digest != record["sha256"]:
        raise ValueError(f"{path}: sha256 {digest[:16]}... is not the {record['sha256'][:16]}... recorded for it "
                         f"(commit {str(record['commit'])[:10]}); a registered plan is never edited: write a new version")
    if record["commit"] is None:  # superseded without a valid registration (v1): kept byte for byte, judges nothing
        return None
    return Registration(record["sha256"], record["commit"], _utc(record["committed"], f"{registry}: committed"))


def load_plan(path=PLAN_PATH, registrations=REGISTRATIONS_PATH) -> AnalysisPlan:
    """Read and check an analysis plan (``ValueError`` naming the field if one is missing or out of range), and its
    registration in ``registrations`` (refused if the file's sha256 is not the registered one)."""
    path = Path(path)
    data = path.read_bytes()
    raw = json.loads(data)
    version = raw.get("version", 1)
    required = ("registered", "alpha", "margin", "min_seeds", "test", "multiplicity", "claims")
    for key in required + (("arms", "seeds", "config", "data", "power") if version != 1 else ()):
        if key not in raw:
            raise ValueError(f"{path}: the plan has no {key!r}")
    if raw["test"] != "welch" or raw["multiplicity"] != "holm":
        raise ValueError(f"{path}: only test 'welch' with multiplicity 'holm' is implemented; got "
                         f"{raw['test']!r}, {raw['multiplicity']!r}")
    if not (0 < raw["alpha"] < 1 and 0 < raw["margin"] < 1):
        raise ValueError(f"{path}: alpha and margin must be in (0, 1); got {raw['alpha']!r}, {raw['margin']!r}")
    if not (isinstance(raw["min_seeds"], int) and raw["min_seeds"] >= 2):
        raise ValueError(f"{path}: min_seeds must be an integer >= 2; got {raw['min_seeds']!r}")
    claims = tuple(Claim(c["id"], c["a"], c["b"], c["hypothesis"], c["source"], c.get("role", "primary"))
                   for c in raw["claims"])
    for c in claims:
        if c.hypothesis not in HYPOTHESES:
            raise ValueError(f"{path}: claim {c.id}: hypothesis must be one of {HYPOTHESES}; got {c.hypothesis!r}")
        if c.role not in ROLES:
            raise ValueError(f"{path}: claim {c.id}: role must be one of {ROLES}; got {c.role!r}")
    plan = AnalysisPlan(path, raw["registered"], float(raw["alpha"]), float(raw["margin"]), raw["min_seeds"], claims,
                        version, registration=_registration(path, data, registrations))
    if version == 1:
        return plan
    arms, seeds = raw["arms"], raw["seeds"]
    for name, arm in arms.items():
        if name != _arm_name(arm["schedule"], arm["corrections"]):
            raise ValueError(f"{path}: arm {name!r} must be named {_arm_name(arm['schedule'], arm['corrections'])!r}")
    unknown = sorted(({c.a for c in claims} | {c.b for c in claims}) - set(arms))
    if unknown:
        raise ValueError(f"{path}: claims name arms that are not in 'arms': {unknown}")
    if not (all(type(k) is int and k >= 0 for k in seeds) and len(set(seeds)) == len(seeds) >= raw["min_seeds"]):
        raise ValueError(f"{path}: seeds must be at least min_seeds = {raw['min_seeds']} distinct integers >= 0; "
                         f"got {seeds!r}")
    if type(raw["config"].get("epochs")) is not int:
        raise ValueError(f"{path}: config must give the runs' epochs; got {raw['config']!r}")
    return replace(plan, arms=dict(arms), seeds=tuple(seeds), config=dict(raw["config"]), data=dict(raw["data"]),
                   power=raw["power"])


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


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values over the last axis: p̃_(i) = max_{j<=i} min(1, (k − j + 1) p_(j)) for
    sorted p_(1) <= ... <= p_(k) (Holm 1979)."""
    p = np.asarray(pvalues, dtype=float)
    k = p.shape[-1]
    order = np.argsort(p, axis=-1, kind="stable")
    scaled = np.minimum(1.0, (k - np.arange(k)) * np.take_along_axis(p, order, axis=-1))
    adjusted = np.empty_like(p)
    np.put_along_axis(adjusted, order, np.maximum.accumulate(scaled, axis=-1), axis=-1)
    return adjusted


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
        adjusted = holm(np.stack([x for cid in family for x in p[cid]], axis=-1))
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


def power(plan: AnalysisPlan, n: int, *, sd: float, means: dict, draws: int = 20_000, seed: int = 0) -> dict:
    """Claim id → the probability that its verdict supports its hypothesis, for each primary claim with one, when
    every arm has ``n`` seeds with final accuracies ~ N(``means[arm]``, ``sd``²), all drawn at once and judged
    by the plan's rule (:func:`judge`'s tests and Holm's family).  Monte Carlo over ``draws`` families, seeded by
    (``seed``, n): the same numbers on every run, and a standard error <= 0.5/sqrt(draws)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an integer >= 2 (seeds per arm); got {n!r}")
    if not (sd > 0 and isinstance(draws, int) and draws >= 1):
        raise ValueError(f"sd must be > 0 and draws an integer >= 1; got sd={sd!r}, draws={draws!r}")
    claims = [c for c in plan.family if c.hypothesis != "none"]
    arms = sorted({c.a for c in claims} | {c.b for c in claims})
    missing = [a for a in arms if a not in means]
    if missing:
        raise ValueError(f"means must give every arm of the primary claims; missing {missing}")
    rng = np.random.default_rng([seed, n])
    finals = {arm: rng.normal(means[arm], sd, size=(draws, n)) for arm in arms}
    rows = _verdicts(replace(plan, min_seeds=2), claims, finals)
    return {c.id: float(np.mean(_bearing(c.hypothesis, verdict, w.difference) == "supports"))
            for c, w, _, verdict in rows}


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
    run's ``started`` (manifest, ISO time) is after the registration commit's time, to the second (a run started
    in that second is not), its arm and seed are the plan's, and its manifest's config and data agree with every
    field of the plan's ``config`` and ``data``.  An unregistered plan (v1) judges none."""
    judged, rest = [], []
    for run in runs:
        manifest = run["manifest"]
        ok = (plan.registration is not None and arm_of(run) in plan.arms and run["seed"] in plan.seeds
              and _utc(manifest.get("started"), f"{run.get('dir', 'a run')}: started")
              > plan.registration.committed
              and all(manifest["config"].get(k) == v for k, v in plan.config.items())
              and all(manifest.get("data", {}).get(k) == v for k, v in plan.data.items()))
        (judged if ok else rest).append(run)
    return judged, rest


def count_by_arm(runs) -> dict[str, int]:
    """Arm (:func:`arm_of`) → number of runs, arms in sorted order."""
    counts: dict[str, int] = {}
    for run in runs:
        counts[arm_of(run)] = counts.get(arm_of(run), 0) + 1
    return dict(sorted(counts.items()))


def complete_seeds(plan: AnalysisPlan, runs) -> list[int]:
    """The plan's seeds for which every arm of the plan has a finished run among ``runs`` (a balanced grid)."""
    done = {(arm_of(r), r["seed"]) for r in runs if r["manifest"].get("status") == "finished"}
    return [k for k in plan.seeds if all((arm, k) in done for arm in plan.arms)]


def throughput(runs) -> float:
    """Image-epochs per second of runs that shared one machine: Σ ``epochs_done`` × :data:`TRAIN_IMAGES` over the
    union of their [``started``, ``updated``] intervals (manifests; evaluation and start-up included)."""
    spans = sorted((_utc(r["manifest"]["started"], "started"), _utc(r["manifest"]["updated"], "updated"))
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
