"""Chapter 6's analysis plans and their registration: what a plan fixes before its data, and the proof that it did.

A plan (``analysis_plan.json`` = v1, :data:`PLAN_PATH`; ``analysis_plan_v2.json`` = v2, :data:`PLAN_V2_PATH`;
``analysis_plan_v3.json`` = v3, :data:`PLAN_V3_PATH`; read by :func:`load_plan`) fixes the claims and their
hypotheses, the level α, the margin δ, the test and the multiplicity control, and (v2 on) the grid it judges.

A registered plan is never edited: ``registrations.json`` (:data:`REGISTRATIONS_PATH`, written in the commit after
the plan's own) holds each registered plan's sha256, its commit and the committer time (v1, superseded without a
valid registration: its sha256 and no commit; v2: superseded by v3; v3: also the sha256 of
:data:`DECISION_CODE_PATH`), and :func:`load_plan` refuses a plan or decision code whose bytes differ, and a record
that git contradicts where a repository holds the plan.  Every malformed file is one :class:`PlanError` (a
``ValueError``) naming it.  This floor does not know the engine's settings: a caller that trains the plan's runs
passes ``config_fields`` (the names of :class:`explr.cifar10.TrainConfig`'s fields) and an unknown config key is
refused.  (:mod:`explr.book.verdicts`, frozen by its registration, names :func:`load_plan` by its former
home, ``explr.book.stats``.)
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from explr.params import is_int, is_real

from . import verdicts as _rule

__all__ = [
    "PLAN_PATH", "PLAN_V2_PATH", "PLAN_V3_PATH", "DECISION_CODE_PATH", "REGISTRATIONS_PATH", "ROLES",
    "PlanError", "Claim", "Registration", "AnalysisPlan", "load_plan", "arm_of", "parse_utc",
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
ROLES = ("primary", "exploratory")


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


def parse_utc(text, what: str) -> _dt.datetime:
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
        parse_utc(text, "")
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
    when = parse_utc(shown.stdout.decode().strip(), f"git: {commit[:10]}")
    files = _git(root, "show", "--format=", "--name-only", "--no-renames", commit).stdout.decode().split()
    blob = _git(root, "show", f"{commit}:{rel}")
    problems = [f"its files are {files}, not [{rel!r}] alone" if files != [rel] else "",
                f"its committer time is {when.isoformat()}, not {record['committed']}"
                if when != parse_utc(record["committed"], f"{registry}: committed") else "",
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
    committed = parse_utc(_field(record, "committed", "time", registry, what), f"{registry}: {path.name}: committed")
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


def _grid(raw, path: Path, min_seeds: int, config_fields) -> dict:
    """A v2/v3 plan's arms, seeds, config, data and power, checked (config keys among ``config_fields``, if given)."""

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
    fixable = set(config_fields or ()) - {"schedule", "corrections", "seed"}
    unknown = sorted(set(config) - fixable) if config_fields is not None else []
    if unknown:
        raise PlanError(f"{path}: config keys {unknown} are not TrainConfig fields a plan may fix (schedule, "
                        "corrections and seed come from the arms and seeds)")
    if not (is_int(config.get("epochs")) and config["epochs"] >= 2):
        raise PlanError(f"{path}: config must give the runs' epochs, an integer >= 2; got {config.get('epochs')!r}")
    return dict(arms=dict(arms), seeds=tuple(seeds), config=dict(config),
                data=dict(_field(raw, "data", "object", path)), power=_field(raw, "power", "object", path))


def load_plan(path=None, registrations=REGISTRATIONS_PATH, *, check_git: bool = True,
              config_fields: Iterable[str] | None = None) -> AnalysisPlan:
    """Read and check an analysis plan (default: v3) and its registration in ``registrations``: one
    :class:`PlanError` (a ``ValueError``) naming the file for a missing, malformed or out-of-range field, a plan
    or decision code whose sha256 is not the registered one, or (``check_git``, where the plan lies in a git
    repository) a registration that git contradicts; with ``config_fields``, a config key that is none of them."""
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
    grid = _grid(raw, path, min_seeds, config_fields) if version != 1 else {}
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
