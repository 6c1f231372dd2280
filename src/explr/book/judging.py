"""Chapter 6's path from run folders to verdicts, registered with plan v4 (its sha256 is in ``registrations.json``
and :func:`explr.book.registration.load_plan` refuses the plan if this file changes).

**Which runs** (:func:`split_runs`): a run is judged when the plan is registered, its manifest's ``started`` is at
or after the end of the registration second (:func:`explr.book.verdicts.after_registration`), its arm and seed are
the plan's, and its recipe is the plan's (:func:`same_recipe`: every field of the plan's ``config`` and ``data``,
and from v4 the settings as the run resolved them, the manifest's ``resolved`` precision and device type).
**Failed runs** (the plan's ``missing_runs``): :func:`failure` says whether a run's record is a failed attempt,
:func:`declared_missing` which (arm, seed) failed :data:`ATTEMPTS` times, :func:`read_missing` reads the grid's
``missing.json`` and :func:`open_runs` what the grid still lacks: only a closed grid is decided.
**Verdicts**: :func:`summarise` takes each run's final accuracy, :func:`decide` applies
:func:`explr.book.verdicts.decide` (each claim its own paired test, Holm over the primary claims) to the seeds
both arms of a claim finished.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import verdicts as _rule
from .registration import AnalysisPlan, Claim, arm_of, parse_utc

__all__ = ["ATTEMPTS", "FAILURES", "ScheduleSummary", "Decision", "same_recipe", "in_grid", "split_runs",
           "failure", "declared_missing", "read_missing", "open_runs", "summarise", "decide"]

#: attempts a run gets before it is declared missing (the plan's ``missing_runs``: "up to 3 attempts in all").
ATTEMPTS = 3
#: the engine's statuses (the words ``explr.cifar10.Status`` writes; the book floor does not import the engine)
#: that make a run a failed attempt: a non-finite or exploding loss, a worker that failed.
FAILURES = ("diverged", "failed")


# ----------------------------------------------------------------------------- which runs a plan judges
def same_recipe(plan: AnalysisPlan, manifest) -> bool:
    """Whether a run's ``manifest`` records the plan's recipe: :func:`explr.book.verdicts.same_recipe` of its
    ``config`` and ``data`` and, for each setting of ``plan.resolved`` (v4: ``precision``, ``device``), the value
    the run resolved (``manifest["resolved"]``; a device compares by its type, ``cuda:1`` is ``cuda``)."""
    if not _rule.same_recipe(plan.config, plan.data, manifest):
        return False
    resolved = manifest.get("resolved")
    if plan.resolved and not isinstance(resolved, dict):
        return False
    got = {k: str(resolved.get(k)).split(":")[0] if k == "device" else resolved.get(k) for k in plan.resolved}
    return all(type(got[k]) is str and got[k] == v for k, v in plan.resolved.items())


def in_grid(plan: AnalysisPlan, run) -> bool:
    """An arm and a seed of the plan, trained with its recipe (:func:`same_recipe`)."""
    return arm_of(run) in plan.arms and run["seed"] in plan.seeds and same_recipe(plan, run.get("manifest"))


def split_runs(plan: AnalysisPlan, runs) -> tuple[list, list]:
    """``(judged, not_judged)``: the runs (``explr`` run dicts with a manifest) that ``plan`` judges (module
    docstring), and the rest (the pilot, runs of another recipe).  An unregistered or superseded plan judges none."""
    judged, rest = [], []
    for run in runs:
        manifest = run["manifest"]
        ok = (plan.registration is not None and in_grid(plan, run)
              and _rule.after_registration(parse_utc(manifest.get("started"), f"{run.get('dir', 'a run')}: started"),
                                           plan.registration.committed))
        (judged if ok else rest).append(run)
    return judged, rest


# ----------------------------------------------------------------------------- failed and missing runs
def failure(manifest: dict, status: str | None = None, message: str = "", locked: bool = False) -> dict | None:
    """``{"status", "message"}`` if a run is a failed attempt, else None.  ``status``, ``message``: what the grid's
    worker reported (None: the ``manifest`` alone tells).  A finished run is never one; otherwise a reported status
    in :data:`FAILURES`, a manifest that says "diverged", or one left "running" with no process holding its lock
    (``locked`` False: a crash, a lost machine, SIGKILL).  "interrupted" and "disk full" were stopped from outside."""
    if _rule.finished(manifest):
        return None
    if status is not None:
        return {"status": str(status), "message": message} if status in FAILURES else None
    if manifest.get("status") == "diverged":
        return {"status": "diverged", "message": manifest.get("message", "")}
    if manifest.get("status") == "running" and not locked:
        return {"status": "failed",
                "message": "its process ended without recording how (a crash, a lost machine or SIGKILL): its "
                           f"manifest still said 'running' after {manifest.get('epochs_done', 0)} epochs and no "
                           "process held its lock"}
    return None


def declared_missing(attempts: dict) -> list[dict]:
    """The entries of ``missing.json``: ``{"arm", "seed", "attempts"}`` for each (arm, seed) of ``attempts``
    ((arm, seed) → its failed attempts, in the grid's order) with at least :data:`ATTEMPTS` of them."""
    return [{"arm": arm, "seed": seed, "attempts": tried} for (arm, seed), tried in attempts.items()
            if len(tried) >= ATTEMPTS]


def read_missing(path) -> list[tuple]:
    """The (arm, seed) pairs a grid's ``missing.json`` declares missing (none where the file does not exist);
    ``ValueError`` naming the file if it is no such record."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        entries = json.loads(path.read_text())["missing"]
        pairs = [(m["arm"], m["seed"]) for m in entries]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
        raise ValueError(f"{path} is not a grid's record of missing runs ({err!r:.80}); restore it") from None
    if not all(type(arm) is str and type(seed) is int for arm, seed in pairs):
        raise ValueError(f"{path}: each missing run needs a string arm and an integer seed; restore it")
    return pairs


def open_runs(plan: AnalysisPlan, judged, missing=()) -> list[tuple]:
    """The (arm, seed) pairs of the plan's grid that have no finished judged run and are not declared ``missing``:
    the grid is closed, and decided, when none is left."""
    done = {(arm_of(r), r["seed"]) for r in judged if _rule.finished(r.get("manifest"))} | set(map(tuple, missing))
    return [(arm, k) for k in plan.seeds for arm in plan.arms if (arm, k) not in done]


# ----------------------------------------------------------------------------- the verdicts
@dataclass(frozen=True)
class ScheduleSummary:
    """Final-epoch metric of every seed of one arm."""

    schedule: str  # the arm (:func:`explr.book.registration.arm_of`)
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
    """Group runs (``explr`` run dicts with ``schedule``, ``seed``, ``metrics``, optionally ``manifest``) by arm,
    the final epoch of each.  ``ValueError`` if the runs of one arm have different lengths (finish or remove the
    incomplete ones: they would compare different epochs)."""
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
class Decision:
    """A claim of a version-3 or -4 plan decided on the data (:func:`decide`)."""

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
    """Apply a version-3 or -4 ``plan`` to ``summaries`` (arm → :class:`ScheduleSummary` of finished judged runs):
    one :class:`Decision` per claim, in the plan's order, by :func:`explr.book.verdicts.decide`.  A claim whose arms
    share fewer than 2 seeds is not tested, and stays in Holm's family with p = 1."""
    from scipy.special import stdtrit  # the t distribution's quantile

    if plan.version < 3:
        raise ValueError(f"decide applies a version-3 or -4 plan; {plan.path.name} is version {plan.version}")
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
