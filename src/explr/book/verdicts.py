"""Chapter 6's decision rule from analysis plan v3 on: which runs a plan judges, and how their final accuracies
become verdicts.  ``registrations.json`` records this file's sha256 beside the plan's, and
:func:`explr.book.stats.load_plan` refuses a registered plan if either file has changed.

**Which runs.** A run is judged when its manifest's ``started`` is at or after the end of the registration second
(:func:`after_registration`: git records the commit to the second, so a run started at hh:mm:ss.5 of that second
may predate the commit and is not judged), its arm and seed are the plan's, and its recipe is the plan's
(:func:`same_recipe`, also the rule by which a finished run counts as done when a grid resumes).

**Each claim, its own test** (the paired t-test, Student 1908; TOST, Schuirmann 1987).  The arms share their seeds
(initial weights, batch order, augmentations), so a claim "a vs b" is tested on the seeds that both arms finished,
through the differences d_i = a_i − b_i: mean d̄, sd s_d, se = s_d/√n, ν = n − 1, T ~ t_ν:

* "a better" (superiority): one-sided, H0: Δ <= 0, p = P(T >= d̄/se);
* "equivalent" (TOST against ±δ): H0: |Δ| >= δ, p = max(P(T >= (d̄ + δ)/se), P(T <= (d̄ − δ)/se)),
  below α exactly when the 90 % interval d̄ ± t_{0.95,ν} se lies inside (−δ, δ).

No claim is decided, or vetoed, by a test of the other kind.  With no spread (se = 0) each test is decided
exactly: superiority iff d̄ > 0, equivalence iff |d̄| < δ.

**The family.** Holm's (1979) step-down over one p-value per primary claim: its size is the plan's number of
primary claims whatever the data, since a claim with fewer than :data:`MIN_PAIRS` complete pairs is not tested
and enters with p = 1 (not rejected).  A primary claim is supported when its adjusted p < α; an exploratory claim
is judged alone on its raw p and confirms nothing.
"""
from __future__ import annotations

import datetime as _dt

import numpy as np

#: the hypotheses a claim can state, each with its own test
HYPOTHESES = ("equivalent", "a better")
#: the fewest complete pairs (seeds both arms finished) on which a claim is tested
MIN_PAIRS = 2
_ABSENT = object()


def after_registration(started: _dt.datetime, committed: _dt.datetime) -> bool:
    """Whether a run started at ``started`` is after the registration: ``started >= committed + 1 s`` (both aware)."""
    return started >= committed + _dt.timedelta(seconds=1)


def same_recipe(config: dict, data: dict, manifest) -> bool:
    """Whether a run's ``manifest`` says it was trained with every field of the plan's ``config`` and ``data``
    (a field absent from the manifest differs; lists and tuples compare by their items)."""
    if not isinstance(manifest, dict):
        return False
    got_config, got_data = manifest.get("config"), manifest.get("data")
    if not (isinstance(got_config, dict) and isinstance(got_data, dict)):
        return False
    return (all(_same(got_config.get(k, _ABSENT), v) for k, v in config.items())
            and all(_same(got_data.get(k, _ABSENT), v) for k, v in data.items()))


def _same(got, want) -> bool:
    if isinstance(want, (list, tuple)):
        return (isinstance(got, (list, tuple)) and len(got) == len(want)
                and all(_same(g, w) for g, w in zip(got, want, strict=True)))
    if isinstance(want, (bool, str)) or isinstance(got, bool):  # True is not 1, "16" is not 16
        return type(got) is type(want) and got == want
    return got == want


def finished(manifest) -> bool:
    """Whether a run's manifest says it finished (every epoch trained and evaluated)."""
    return isinstance(manifest, dict) and manifest.get("status") == "finished"


def complete_pairs(a: dict, b: dict) -> tuple:
    """The seeds both arms finished, sorted, and the two arrays of their final accuracies (``a``, ``b``: seed →
    final accuracy)."""
    seeds = sorted(set(a) & set(b))
    return tuple(seeds), np.array([a[k] for k in seeds], dtype=float), np.array([b[k] for k in seeds], dtype=float)


def paired_p(differences, hypothesis: str, margin: float) -> np.ndarray:
    """The p-value of the test of ``hypothesis`` (module docstring) on the paired differences of the last axis of
    ``differences`` (..., n), n >= :data:`MIN_PAIRS`."""
    from scipy.special import stdtr  # the t distribution's cdf

    d = np.asarray(differences, dtype=float)
    n = d.shape[-1]
    if n < MIN_PAIRS or hypothesis not in HYPOTHESES:
        raise ValueError(f"paired_p needs >= {MIN_PAIRS} pairs and a hypothesis in {HYPOTHESES}; "
                         f"got {n} and {hypothesis!r}")
    mean, se = d.mean(axis=-1), d.std(axis=-1, ddof=1) / np.sqrt(n)
    flat = se <= 1e-15
    with np.errstate(divide="ignore", invalid="ignore"):
        if hypothesis == "a better":
            return np.where(flat, (mean <= 0).astype(float), stdtr(n - 1, -mean / se))
        return np.where(flat, (np.abs(mean) >= margin).astype(float),
                        np.maximum(stdtr(n - 1, -(mean + margin) / se), stdtr(n - 1, (mean - margin) / se)))


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


def decide(claims, differences, *, alpha: float, margin: float) -> list[tuple]:
    """The rule (module docstring) on one grid or on many at once.  ``claims``: (hypothesis, primary) per claim;
    ``differences``: per claim, its paired differences (..., n) or None when it has fewer than :data:`MIN_PAIRS`
    pairs (not tested).  Returns per claim (raw p or None, the p compared with ``alpha``: Holm-adjusted over the
    primary claims for a primary one, raw for an exploratory one, 1 when not tested; supported)."""
    raw = [None if d is None or np.shape(d)[-1] < MIN_PAIRS else paired_p(d, h, margin)
           for (h, _), d in zip(claims, differences, strict=True)]
    family = [i for i, (_, primary) in enumerate(claims) if primary]
    compared = [np.float64(1.0) if p is None else p for p in raw]
    if family:
        adjusted = holm(np.stack(np.broadcast_arrays(*(compared[i] for i in family)), axis=-1))
        for j, i in enumerate(family):
            compared[i] = adjusted[..., j]
    return [(p, c, c < alpha) for p, c in zip(raw, compared, strict=True)]
