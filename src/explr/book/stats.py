"""The book's statistics: fits and levels of recorded time series (chapters 4, 5) and chapter 6's verdicts under a
registered analysis plan, with the power analysis that sizes it and the cost of its grid.

**Time series.** Plain arrays shaped (time, seeds), per-seed results: :func:`loglog_slope` (orders of convergence,
chapter 5), :func:`returning_level`, :func:`longest_stretch_at_or_below`, :func:`first_time_above` (chapter 4).

**Verdicts.** A plan (``analysis_plan.json`` = v1, :data:`PLAN_PATH`; ``analysis_plan_v2.json`` = v2,
:data:`PLAN_V2_PATH`; ``analysis_plan_v3.json`` = v3, :data:`PLAN_V3_PATH`; read by :func:`load_plan`) fixes before
its data the claims and their hypotheses, the level α, the margin δ, the test and the multiplicity control.

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

**Registration.** A registered plan is never edited: ``registrations.json`` (:data:`REGISTRATIONS_PATH`, written
in the commit after the plan's own) holds each registered plan's sha256, its commit and the committer time (v1,
superseded without a valid registration: its sha256 and no commit; v2: superseded by v3; v3: also the sha256 of
:data:`DECISION_CODE_PATH`), and :func:`load_plan` refuses a plan or decision code whose bytes differ, and a
record that git contradicts where a repository holds the plan.  Every malformed file is one :class:`PlanError`
(a ``ValueError``) naming it.  :func:`split_runs` sorts runs into those the plan judges (started after the
registration second, and trained as the plan says) and the rest; :func:`count_by_arm`, :func:`complete_seeds`
(the grid's ``--resume``), :func:`open_runs` (whether the grid is closed).

**Cost.** :func:`throughput` of committed runs from their manifests, :func:`grid_cost` of a plan's grid.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import math
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from explr.params import is_int, is_real

from . import verdicts as _rule
from .verdicts import holm

__all__ = [
    "loglog_slope", "returning_level", "longest_stretch_at_or_below", "first_time_above",
    "PLAN_PATH", "PLAN_V2_PATH", "REGISTRATIONS_PATH", "TRAIN_IMAGES",
    "Claim", "Registration", "AnalysisPlan", "ScheduleSummary", "Welch", "Verdict", "PooledSD",
    "PLAN_V3_PATH", "DECISION_CODE_PATH", "PlanError", "Decision", "decide", "open_runs",
    "load_plan", "arm_of", "summarise", "welch", "holm", "judge",
    "pooled_sd", "power", "power_table", "seeds_needed",
    "split_runs", "count_by_arm", "complete_seeds", "throughput", "grid_cost",
]

#: chapter 6's first plan (v1): committed after the runs it judged and edited after its commit, so it judges none.
PLAN_PATH = Path(__file__).with_name("analysis_plan.json")
#: chapter 6's second plan (v2), powered by the pilot and registered before its runs.
PLAN_V2_PATH = Path(__file__).with_name("analysis_plan_v2.json")
#: chapter 6's third plan (v3): each claim its own test, a fixed family, joint power; registered before its runs.
PLAN_V3_PATH = Path(__file__).with_name("analysis_plan_v3.json")
#: the decision code registered with v3 (:mod:`explr.book.verdicts`): load_plan refuses the plan if it changed.
DECISION_CODE_PATH = Path(_rule.__file__)
#: the registration record: plan file name → sha256, commit, committer time (v3: and the decision code's sha256).
REGISTRATIONS_PATH = Path(__file__).with_name("registrations.json")
#: CIFAR-10's training images: an image-epoch is one of them seen once.
TRAIN_IMAGES = 50_000
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
class PlanError(ValueError):
    """A plan or registration file that cannot be used: malformed, edited after its registration, or contradicted by
    git.  The message names the file."""


@dataclass(frozen=True)
class Claim:
    """One comparison of a plan: arm ``a`` against ``b``, the hypothesis, where it comes from, and its role."""

    id: str
    a: str
    b: str
    hypothesis: str  # "equivalent", "a better" or (v1, v2) "none": reported both ways
    source: str
    role: str = "primary"  # "primary": in the Holm family; "exploratory": judged alone, unadjusted, and said so
    question: str = ""  # v3: the empirical question the claim answers, in its scope


@dataclass(frozen=True)
class Registration:
    """A registered plan: its file's sha256, the commit that added it and that commit's committer time (UTC), and
    (v3 on) the sha256 of the decision code (:mod:`explr.book.verdicts`) it was registered with."""

    sha256: str
    commit: str
    committed: _dt.datetime
    decision_code: str | None = None
    checked: str = field(default="", compare=False)  # what load_plan checked the record against (git, or not)


@dataclass(frozen=True)
class AnalysisPlan:
    """The plan's numbers and claims (the JSON file holds the reasons for each); v2 on: the grid it judges."""

    path: Path
    registered: str
    alpha: float
    margin: float
    min_seeds: int  # v1, v2: seeds per arm below which a claim is not tested; v3: verdicts.MIN_PAIRS
    claims: tuple
    version: int = 1
    arms: dict = field(default_factory=dict)  # arm → {"schedule": ..., "corrections": ...}
    seeds: tuple = ()
    config: dict = field(default_factory=dict)  # the TrainConfig fields every run of the grid shares
    data: dict = field(default_factory=dict)  # what the manifests' "data" must say (n_train, n_test)
    power: dict | None = None  # the power analysis' inputs and result
    registration: Registration | None = None  # None: the plan judges no run
    missing_runs: str = ""  # v3: the registered rule for runs that fail

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


def _read_json(path: Path, what: str):
    """The bytes of ``path`` and their JSON; :class:`PlanError` naming the file if either cannot be had."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise PlanError(f"{path}: cannot read the {what}: {err.strerror or err}") from None
    try:
        return data, json.loads(data)
    except (ValueError, RecursionError) as err:  # bad JSON, bad UTF-8, nesting too deep
        raise PlanError(f"{path}: the {what} is not valid JSON: {str(err)[:120]}") from None


_REQUIRED = object()
_KINDS = {  # name → (test, what the error says a value must be)
    "text": (lambda v: isinstance(v, str), "a string"),
    "object": (lambda v: isinstance(v, dict), "a JSON object"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "level": (lambda v: is_real(v) and 0 < v < 1, "a number in (0, 1)"),
    "count": (lambda v: is_int(v) and v >= 2, "an integer >= 2"),
    "version": (lambda v: v in (1, 2, 3) and is_int(v), "1, 2 or 3"),
    "time": (lambda v: _is_time(v), "an ISO time with its UTC offset"),
    "share": (lambda v: is_real(v) and 0 <= v < 1, "a number in [0, 1)"),
    "index": (lambda v: is_int(v) and v >= 0, "an integer >= 0"),
    "numbers": (lambda v: isinstance(v, dict) and all(is_real(x) for x in v.values()), "an object of numbers"),
    "commit": (lambda v: v is None or (isinstance(v, str) and len(v) == 40), "null or a 40-digit commit hash"),
}


def _is_time(text) -> bool:
    try:
        _utc(text, "")
    except ValueError:
        return False
    return True


def _field(raw, key: str, kind: str, where, what: str = "the plan", default=_REQUIRED):
    """``raw[key]``, checked to be of ``kind`` (:data:`_KINDS`); ``default`` (when given) for an absent key."""
    if not isinstance(raw, dict):
        raise PlanError(f"{where}: {what} must be a JSON object; got {type(raw).__name__}")
    if key not in raw:
        if default is not _REQUIRED:
            return default
        raise PlanError(f"{where}: {what} has no {key!r}")
    ok, must = _KINDS[kind]
    if not ok(raw[key]):
        raise PlanError(f"{where}: {what}'s {key!r} must be {must}; got {str(raw[key])[:60]!r}")
    return raw[key]


def _git(cwd: Path, *args) -> subprocess.CompletedProcess | None:
    """``git args`` in ``cwd`` (bytes out), or None where git cannot run there."""
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None


def _check_against_git(path: Path, record: dict, code_sha256: str | None, registry: Path) -> str:
    """Check a registration record against the git repository that tracks ``path``, if any: the commit exists, adds
    the plan file alone, at the recorded committer time, with the recorded sha256, and (v3) the decision code at
    that commit has the recorded sha256.  Returns what was checked ("git", or why not); :class:`PlanError` if git
    contradicts the record."""
    top = _git(path.parent, "rev-parse", "--show-toplevel")
    if top is None or top.returncode != 0:
        return "no git repository: the record and the sha256 of the files are trusted"
    root = Path(top.stdout.decode().strip()).resolve()
    try:
        rel = path.resolve().relative_to(root).as_posix()
    except ValueError:
        return "no git repository: the record and the sha256 of the files are trusted"
    tracked = _git(root, "ls-files", "--error-unmatch", "--", rel)
    if tracked is None or tracked.returncode != 0:  # e.g. an installed copy inside someone else's repository
        return "the plan is not tracked by the repository around it: the record and the sha256 are trusted"
    commit = record["commit"]
    shown = _git(root, "show", "-s", "--format=%cI", f"{commit}^{{commit}}")
    if shown is None or shown.returncode != 0:
        shallow = _git(root, "rev-parse", "--is-shallow-repository")
        if shallow is not None and shallow.stdout.strip() == b"true":
            return "a shallow clone without the registration commit: the record is trusted"
        raise PlanError(f"{registry}: {path.name}'s commit {commit[:10]} is not in the repository {root}")
    when = _utc(shown.stdout.decode().strip(), f"git: {commit[:10]}")
    files = _git(root, "show", "--format=", "--name-only", "--no-renames", commit).stdout.decode().split()
    blob = _git(root, "show", f"{commit}:{rel}")
    problems = [f"its files are {files}, not [{rel!r}] alone" if files != [rel] else "",
                f"its committer time is {when.isoformat()}, not {record['committed']}"
                if when != _utc(record["committed"], f"{registry}: committed") else "",
                "the plan it adds has another sha256" if blob.returncode != 0
                or hashlib.sha256(blob.stdout).hexdigest() != record["sha256"] else ""]
    code = DECISION_CODE_PATH.resolve()
    if code_sha256 is not None and code.is_relative_to(root):  # the rule was committed before the plan
        blob = _git(root, "show", f"{commit}:{code.relative_to(root).as_posix()}")
        if blob.returncode != 0 or hashlib.sha256(blob.stdout).hexdigest() != code_sha256:
            problems.append("the decision code at that commit has another sha256")
    problems = [p for p in problems if p]
    if problems:
        raise PlanError(f"{registry}: git contradicts {path.name}'s registration (commit {commit[:10]}): "
                        + "; ".join(problems))
    return ("git: the commit adds the plan alone, at the recorded time, with the recorded bytes"
            + (", and holds the recorded decision code" if code_sha256 is not None and code.is_relative_to(root) else ""))


def _registration(path: Path, data: bytes, registrations, check_git: bool) -> Registration | None:
    """The registration of the plan file ``path`` (bytes ``data``) in ``registrations``: None if it has none, or a
    record without a commit (v1) or superseded (v2); :class:`PlanError` if the plan's sha256, the decision code's
    sha256 or git (where the plan lies in a repository) contradicts the record."""
    registry = Path(registrations)
    if not registry.exists():
        return None
    plans = _field(_read_json(registry, "registration record")[1], "plans", "object", registry, "the record")
    record = plans.get(path.name)
    if record is None:
        return None
    what = f"the record of {path.name}"
    recorded = _field(record, "sha256", "text", registry, what)
    commit = _field(record, "commit", "commit", registry, what)
    digest = hashlib.sha256(data).hexdigest()
    if digest != recorded:
        raise PlanError(f"{path}: sha256 {digest[:16]}... is not the {recorded[:16]}... recorded for it "
                        f"(commit {str(commit)[:10]}); a registered plan is never edited: write a new version")
    if commit is None:  # superseded without a valid registration (v1): kept byte for byte, judges nothing
        return None
    committed = _utc(_field(record, "committed", "time", registry, what), f"{registry}: {path.name}: committed")
    code = _field(record, "decision_code", "object", registry, what, default=None)
    code_sha256 = None
    if code is not None:
        code_sha256 = _field(code, "sha256", "text", registry, f"{what}'s decision_code")
        try:
            running = hashlib.sha256(DECISION_CODE_PATH.read_bytes()).hexdigest()
        except OSError as err:
            raise PlanError(f"{DECISION_CODE_PATH}: cannot read the decision code registered with {path.name}: "
                            f"{err.strerror or err}") from None
        if _field(code, "file", "text", registry, f"{what}'s decision_code") != DECISION_CODE_PATH.name \
                or running != code_sha256:
            raise PlanError(f"{DECISION_CODE_PATH}: sha256 {running[:16]}... is not the decision code "
                            f"{code_sha256[:16]}... registered with {path.name}; a registered rule is never edited: "
                            "write a new plan version")
    checked = _check_against_git(path, record, code_sha256, registry) if check_git else "git not asked"
    if _field(record, "superseded_by", "text", registry, what, default=None) is not None:
        return None  # registered, then replaced before any run it judges: kept byte for byte, judges nothing
    return Registration(recorded, commit, committed, code_sha256, checked)


def _claims(raw, path: Path, arms, version: int) -> tuple:
    """The plan's claims, checked: known hypothesis and role, distinct ids, two different arms of the plan."""
    items = _field(raw, "claims", "list", path)
    claims = []
    for i, c in enumerate(items):
        what = f"claim {i + 1}"
        claim = Claim(*(_field(c, k, "text", path, what) for k in ("id", "a", "b", "hypothesis", "source")),
                      _field(c, "role", "text", path, what, default="primary"),
                      _field(c, "question", "text", path, what) if version == 3 else "")
        hypotheses = _rule.HYPOTHESES if version == 3 else _rule.HYPOTHESES + ("none",)
        if claim.hypothesis not in hypotheses:
            raise PlanError(f"{path}: claim {claim.id}: hypothesis must be one of {hypotheses}; "
                            f"got {claim.hypothesis!r}")
        if claim.role not in ROLES:
            raise PlanError(f"{path}: claim {claim.id}: role must be one of {ROLES}; got {claim.role!r}")
        if claim.a == claim.b:
            raise PlanError(f"{path}: claim {claim.id} compares arm {claim.a!r} with itself")
        if arms is not None and not {claim.a, claim.b} <= set(arms):
            raise PlanError(f"{path}: claim {claim.id} names arms that are not in 'arms': "
                            f"{sorted({claim.a, claim.b} - set(arms))}")
        claims.append(claim)
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids):
        raise PlanError(f"{path}: claim ids must be distinct; got {ids}")
    return tuple(claims)


def _grid(raw, path: Path, min_seeds: int) -> dict:
    """A v2/v3 plan's arms, seeds, config, data and power, checked (config keys are TrainConfig fields)."""
    from explr.cifar10.config import TrainConfig

    arms = _field(raw, "arms", "object", path)
    for name, arm in arms.items():
        schedule = _field(arm, "schedule", "text", path, f"arm {name!r}")
        corrections = _field(arm, "corrections", "text", path, f"arm {name!r}")
        if name != _arm_name(schedule, corrections):
            raise PlanError(f"{path}: arm {name!r} must be named {_arm_name(schedule, corrections)!r}")
    seeds = _field(raw, "seeds", "list", path)
    if not (all(is_int(k) and k >= 0 for k in seeds) and len(set(seeds)) == len(seeds) >= min_seeds):
        raise PlanError(f"{path}: seeds must be at least min_seeds = {min_seeds} distinct integers >= 0; "
                        f"got {str(seeds)[:80]}")
    config = _field(raw, "config", "object", path)
    fixable = {f.name for f in dataclasses.fields(TrainConfig)} - {"schedule", "corrections", "seed"}
    unknown = sorted(set(config) - fixable)
    if unknown:
        raise PlanError(f"{path}: config keys {unknown} are not TrainConfig fields a plan may fix (schedule, "
                        "corrections and seed come from the arms and seeds)")
    if not (is_int(config.get("epochs")) and config["epochs"] >= 2):
        raise PlanError(f"{path}: config must give the runs' epochs, an integer >= 2; got {config.get('epochs')!r}")
    return dict(arms=dict(arms), seeds=tuple(seeds), config=dict(config),
                data=dict(_field(raw, "data", "object", path)), power=_field(raw, "power", "object", path))


def load_plan(path=None, registrations=REGISTRATIONS_PATH, *, check_git: bool = True) -> AnalysisPlan:
    """Read and check an analysis plan (default: v3) and its registration in ``registrations``: one
    :class:`PlanError` (a ``ValueError``) naming the file for a missing, malformed or out-of-range field, a plan
    or decision code whose sha256 is not the registered one, or (``check_git``, where the plan lies in a git
    repository) a registration that git contradicts."""
    path = Path(PLAN_V3_PATH if path is None else path)
    data, raw = _read_json(path, "analysis plan")
    version = _field(raw, "version", "version", path, default=1)
    for key in ("registered", "test", "multiplicity"):
        _field(raw, key, "text", path)
    test = "paired" if version == 3 else "welch"
    if raw["test"] != test or raw["multiplicity"] != "holm":
        raise PlanError(f"{path}: a version-{version} plan implements test {test!r} with multiplicity 'holm'; got "
                        f"{raw['test']!r}, {raw['multiplicity']!r}")
    alpha, margin = _field(raw, "alpha", "level", path), _field(raw, "margin", "level", path)
    min_seeds = _rule.MIN_PAIRS if version == 3 else _field(raw, "min_seeds", "count", path)
    grid = _grid(raw, path, min_seeds) if version != 1 else {}
    plan = AnalysisPlan(path, raw["registered"], float(alpha), float(margin), min_seeds,
                        _claims(raw, path, grid.get("arms"), version), version, **grid,
                        registration=_registration(path, data, registrations, check_git))
    if version == 3:
        plan = replace(plan, missing_runs=_field(raw, "missing_runs", "text", path))
        for key, kind in (("sd", "level"), ("confidence", "level"), ("target", "level"), ("rho", "share"),
                          ("n", "count"), ("draws", "count"), ("seed", "index"), ("means", "numbers"),
                          ("table", "list"), ("sensitivity", "list")):
            _field(plan.power, key, kind, path, "the plan's power")
        if not plan.family:
            raise PlanError(f"{path}: a version-3 plan needs at least one primary claim")
    return plan


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
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
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
              and _rule.after_registration(_utc(manifest.get("started"), f"{run.get('dir', 'a run')}: started"),
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
