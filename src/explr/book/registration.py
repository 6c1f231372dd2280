"""Chapter 6's analysis plans and their registration: what a plan fixes before its data, and the proof that it did.

A plan (v1: :data:`PLAN_PATH`, v2: :data:`PLAN_V2_PATH`, v3: :data:`PLAN_V3_PATH`, v4: :data:`PLAN_V4_PATH`;
read by :func:`load_plan`) fixes the claims and their hypotheses, the level α, the margin δ, the test and the
multiplicity control, and (v2 on) the grid it judges; v4 also what its runs must resolve to (``resolved``:
precision bf16 on a CUDA device).

A registered plan is never edited: ``registrations.json`` (:data:`REGISTRATIONS_PATH`, written in the commit after
the plan's own) holds each plan's sha256, its commit and the committer time, and the sha256 of the code that turns
runs into verdicts (v3: ``verdicts.py``; v4: :data:`JUDGING_CODE`, the whole path: ``verdicts.py``,
``judging.py`` and this file).  :func:`load_plan` refuses a plan or code file whose bytes differ (read from
:data:`CODE_DIR`), and a record that git contradicts where a repository holds the plan; a superseded plan
judges nothing.  Every malformed file is one :class:`PlanError` (a ``ValueError``) naming it.  A caller that
trains the plan's runs passes ``config_fields`` (:class:`explr.cifar10.TrainConfig`'s fields): an unknown config
key is refused.
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
    "PLAN_PATH", "PLAN_V2_PATH", "PLAN_V3_PATH", "PLAN_V4_PATH", "CODE_DIR", "JUDGING_CODE", "REGISTRATIONS_PATH",
    "ROLES",
    "PlanError", "Claim", "Registration", "AnalysisPlan", "load_plan", "arm_of", "parse_utc",
]

#: chapter 6's first plan (v1): committed after the runs it judged and edited after its commit, so it judges none.
PLAN_PATH = Path(__file__).with_name("analysis_plan.json")
#: chapter 6's second plan (v2), powered by the pilot and registered before its runs.
PLAN_V2_PATH = Path(__file__).with_name("analysis_plan_v2.json")
#: chapter 6's third plan (v3): each claim its own test, a fixed family, joint power; registered before its runs.
PLAN_V3_PATH = Path(__file__).with_name("analysis_plan_v3.json")
#: chapter 6's fourth plan (v4): v3's claims, with the whole judging path and the resolved recipe registered.
PLAN_V4_PATH = Path(__file__).with_name("analysis_plan_v4.json")
#: where load_plan reads the registered code files (a test points it at an edited copy).
CODE_DIR = Path(__file__).parent
#: the files on the path from run folders to verdicts, each hashed in v4's record.
JUDGING_CODE = ("verdicts.py", "judging.py", "registration.py")
#: the registration record: plan file name → sha256, commit, committer time, and its code files' sha256.
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
    (v3 on) ``code``: (file name, sha256) of each code file it was registered with (v3: verdicts.py)."""

    sha256: str
    commit: str
    committed: _dt.datetime
    code: tuple = ()
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
    missing_runs: str = ""  # v3 on: the registered rule for runs that fail
    resolved: dict = field(default_factory=dict)  # v4: what a run must resolve: precision, device type

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
    "version": (lambda v: v in (1, 2, 3, 4) and is_int(v), "1, 2, 3 or 4"),
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


def _check_against_git(path: Path, record: dict, code: tuple, registry: Path) -> str:
    """Check a registration record against the git repository that tracks ``path``, if any: the commit exists, adds
    the plan file alone, at the recorded committer time, with the recorded sha256, and each code file of ``code``
    ((name, sha256), v3 on) has its recorded sha256 at that commit.  Returns what was checked ("git", or why not); :class:`PlanError` if git
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
    in_repo = CODE_DIR.resolve().is_relative_to(root)
    for name, sha256 in code if in_repo else ():  # the code was committed before the plan
        blob = _git(root, "show", f"{commit}:{(CODE_DIR.resolve() / name).relative_to(root).as_posix()}")
        if blob.returncode != 0 or hashlib.sha256(blob.stdout).hexdigest() != sha256:
            problems.append(f"{name} at that commit has another sha256")
    problems = [p for p in problems if p]
    if problems:
        raise PlanError(f"{registry}: git contradicts {path.name}'s registration (commit {commit[:10]}): "
                        + "; ".join(problems))
    return ("git: the commit adds the plan alone, at the recorded time, with the recorded bytes"
            + (", and holds the recorded code" if code and in_repo else ""))


def _registration(path: Path, data: bytes, registrations, check_git: bool) -> Registration | None:
    """The registration of the plan file ``path`` (bytes ``data``) in ``registrations``: None if it has none, or a
    record without a commit (v1) or superseded (v2); :class:`PlanError` if the plan's sha256, a code file's sha256
    (:func:`_code`) or git (where the plan lies in a repository) contradicts the record."""
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
    code = _code(record, registry, what, path.name)
    checked = _check_against_git(path, record, code, registry) if check_git else "git not asked"
    if _field(record, "superseded_by", "text", registry, what, default=None) is not None:
        return None  # registered, then replaced before any run it judges: kept byte for byte, judges nothing
    return Registration(recorded, commit, committed, code, checked)


def _code(record: dict, registry: Path, what: str, plan: str) -> tuple:
    """(name, sha256) of each code file a record registers (v3: ``decision_code``, one object; v4:
    ``judging_code``, a list of them), each checked against the file in :data:`CODE_DIR`."""
    entries = _field(record, "judging_code", "list", registry, what, default=None)
    key = "judging_code"
    if entries is None:
        one = _field(record, "decision_code", "object", registry, what, default=None)
        entries, key = ([] if one is None else [one]), "decision_code"
    code = tuple((_field(e, "file", "text", registry, f"{what}'s {key}"),
                  _field(e, "sha256", "text", registry, f"{what}'s {key}")) for e in entries)
    for name, sha256 in code:
        try:
            running = hashlib.sha256((CODE_DIR / name).read_bytes()).hexdigest()
        except OSError as err:
            raise PlanError(f"{CODE_DIR / name}: cannot read the code registered with {plan}: "
                            f"{err.strerror or err}") from None
        if running != sha256:
            raise PlanError(f"{CODE_DIR / name}: sha256 {running[:16]}... is not the {sha256[:16]}... registered "
                            f"with {plan}; registered code is never edited: write a new plan version")
    return code


def _claims(raw, path: Path, arms, version: int) -> tuple:
    """The plan's claims, checked: known hypothesis and role, distinct ids, two different arms of the plan."""
    items = _field(raw, "claims", "list", path)
    claims = []
    for i, c in enumerate(items):
        what = f"claim {i + 1}"
        claim = Claim(*(_field(c, k, "text", path, what) for k in ("id", "a", "b", "hypothesis", "source")),
                      _field(c, "role", "text", path, what, default="primary"),
                      _field(c, "question", "text", path, what) if version >= 3 else "")
        hypotheses = _rule.HYPOTHESES if version >= 3 else _rule.HYPOTHESES + ("none",)
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
    """Read and check an analysis plan (default: v4) and its registration in ``registrations``: one
    :class:`PlanError` (a ``ValueError``) naming the file for a missing, malformed or out-of-range field, a plan
    or code file whose sha256 is not the registered one, a v4 record that does not register every file of
    :data:`JUDGING_CODE`, or (``check_git``, where the plan lies in a git repository) a registration that git
    contradicts; with ``config_fields``, a config key that is none of them."""
    path = Path(PLAN_V4_PATH if path is None else path)
    data, raw = _read_json(path, "analysis plan")
    version = _field(raw, "version", "version", path, default=1)
    for key in ("registered", "test", "multiplicity"):
        _field(raw, key, "text", path)
    test = "paired" if version >= 3 else "welch"
    if raw["test"] != test or raw["multiplicity"] != "holm":
        raise PlanError(f"{path}: a version-{version} plan implements test {test!r} with multiplicity 'holm'; got "
                        f"{raw['test']!r}, {raw['multiplicity']!r}")
    alpha, margin = _field(raw, "alpha", "level", path), _field(raw, "margin", "level", path)
    min_seeds = _rule.MIN_PAIRS if version >= 3 else _field(raw, "min_seeds", "count", path)
    grid = _grid(raw, path, min_seeds, config_fields) if version != 1 else {}
    plan = AnalysisPlan(path, raw["registered"], float(alpha), float(margin), min_seeds,
                        _claims(raw, path, grid.get("arms"), version), version, **grid,
                        registration=_registration(path, data, registrations, check_git))
    if version == 4:
        plan = replace(plan, resolved=_resolved(raw, path, plan))
    if version >= 3:
        plan = replace(plan, missing_runs=_field(raw, "missing_runs", "text", path))
        for key, kind in (("sd", "level"), ("confidence", "level"), ("target", "level"), ("rho", "share"),
                          ("n", "count"), ("draws", "count"), ("seed", "index"), ("means", "numbers"),
                          ("table", "list"), ("sensitivity", "list")):
            _field(plan.power, key, kind, path, "the plan's power")
        if not plan.family:
            raise PlanError(f"{path}: a version-{version} plan needs at least one primary claim")
    return plan


def _resolved(raw, path: Path, plan: AnalysisPlan) -> dict:
    """A v4 plan's ``resolved``, checked: a precision (not "auto") that its config states too, and a device type;
    with the plan's registration, which must hash every file of :data:`JUDGING_CODE`."""
    resolved = _field(raw, "resolved", "object", path)
    precision = _field(resolved, "precision", "text", path, "'resolved'")
    _field(resolved, "device", "text", path, "'resolved'")
    if precision == "auto" or plan.config.get("precision") != precision or set(resolved) != {"precision", "device"}:
        raise PlanError(f"{path}: 'resolved' must give the precision (not 'auto', as config states it) and the "
                        f"device type, nothing else; got {resolved}, config precision {plan.config.get('precision')!r}")
    registered = {name for name, _ in plan.registration.code} if plan.registration else set(JUDGING_CODE)
    if registered != set(JUDGING_CODE):
        raise PlanError(f"{path}: its registration hashes {sorted(registered)}, not the judging path "
                        f"{list(JUDGING_CODE)}")
    return dict(resolved)
