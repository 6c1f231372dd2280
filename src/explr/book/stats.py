"""Chapter 6's statistics beside the registered judging (:mod:`explr.book.judging`): the power analysis that sizes a
plan's grid, the pilot's spread, the grid's progress and its cost.

The rule of v1, v2 plans (superseded, they judge no run; v3 on: :func:`explr.book.verdicts.decide`): per claim
"a vs b", Welch's (1947) test of Δ = ā − b̄, s² = s_a²/m + s_b²/n, ν = s⁴ / ((s_a²/m)²/(m−1) + (s_b²/n)²/(n−1)),
and TOST against ±δ (Schuirmann 1987), p = max(P(T ≥ (Δ+δ)/s), P(T ≤ (Δ−δ)/s)), T ~ t_ν; equivalence checked
first, Holm (1979) over the family.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from explr.params import is_int, is_real

from . import verdicts as _rule
from .judging import in_grid
from .registration import AnalysisPlan, arm_of, parse_utc

__all__ = ["TRAIN_IMAGES", "Welch", "PooledSD", "welch", "pooled_sd", "power", "count_by_arm", "complete_seeds",
           "throughput", "grid_cost"]

#: CIFAR-10's training images: an image-epoch is one of them seen once.
TRAIN_IMAGES = 50_000


@dataclass(frozen=True)
class Welch:
    """Welch statistics of a − b: Δ, its standard error, ν, the 95 % interval, two p-values (arrays over draws
    inside :func:`power`, there without ``ci95``)."""

    difference: float
    stderr: float
    dof: float
    ci95: tuple
    p_difference: float  # two-sided, H0: Δ = 0
    p_equivalence: float  # TOST, H0: |Δ| >= margin


def _welch(a: np.ndarray, b: np.ndarray, margin: float) -> Welch:
    """:class:`Welch` of the last axes of ``a`` (..., m) and ``b`` (..., n), m, n >= 2, without its interval."""
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
    from scipy.special import stdtrit  # the t distribution's quantile

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.ndim != 1 or b.ndim != 1 or len(a) < 2 or len(b) < 2:
        raise ValueError(f"welch needs 1-d arrays of >= 2 values per arm; got shapes {a.shape} and {b.shape}")
    w = _welch(a, b, margin)
    d, se = float(w.difference), float(w.stderr)
    half = float(stdtrit(w.dof, 0.975)) * se if se > 0 else 0.0
    return Welch(d, se, float(w.dof), (d - half, d + half), float(w.p_difference), float(w.p_equivalence))


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
    """Claim id → P(its verdict supports its hypothesis) under the plan's rule, for each primary claim with one, when
    every arm has ``n`` seeds with finals ~ N(``means[arm]``, ``sd``²); v3 on also ``"joint"`` (all at once), the
    runs of a seed correlated by ``rho``: sd (√rho Z_seed + √(1 − rho) Z_run).  Monte Carlo over ``draws`` grids
    seeded by (``seed``, n): standard error <= 0.5/sqrt(draws)."""
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
    if plan.version < 3:  # Welch and TOST per claim, Holm over the family, equivalence first (module docstring)
        finals = {arm: rng.normal(means[arm], sd, size=(draws, n)) for arm in arms}
        tests = [_welch(finals[c.a], finals[c.b], plan.margin) for c in claims]
        p = _rule.holm(np.stack([x for w in tests for x in (w.p_difference, w.p_equivalence)], axis=-1))
        out = {}
        for i, (c, w) in enumerate(zip(claims, tests)):
            equivalent = p[..., 2 * i + 1] < plan.alpha
            different = ~equivalent & (p[..., 2 * i] < plan.alpha)
            out[c.id] = float(np.mean(equivalent if c.hypothesis == "equivalent" else different & (w.difference > 0)))
        return out
    rho = 0.0 if rho is None else float(rho)
    shared = rng.standard_normal((draws, n))
    finals = {arm: means[arm] + sd * (math.sqrt(rho) * shared + math.sqrt(1 - rho) * rng.standard_normal((draws, n)))
              for arm in arms}
    rows = _rule.decide([(c.hypothesis, True) for c in claims], [finals[c.a] - finals[c.b] for c in claims],
                        alpha=plan.alpha, margin=plan.margin)
    supported = np.stack([ok for _, _, ok in rows])
    return {**{c.id: float(ok.mean()) for c, ok in zip(claims, supported, strict=True)},
            "joint": float(supported.all(axis=0).mean())}


def count_by_arm(runs) -> dict[str, int]:
    """Arm (:func:`arm_of`) → number of runs, arms in sorted order."""
    return dict(sorted(Counter(arm_of(run) for run in runs).items()))


def complete_seeds(plan: AnalysisPlan, runs) -> list[int]:
    """The plan's seeds for which every arm has a finished run in the plan's grid among ``runs``: a balanced grid."""
    done = {(arm_of(r), r["seed"]) for r in runs if _rule.finished(r.get("manifest")) and in_grid(plan, r)}
    return [k for k in plan.seeds if all((arm, k) in done for arm in plan.arms)]


def throughput(runs) -> float:
    """Image-epochs per second of runs that shared one machine: Σ ``epochs_done`` × :data:`TRAIN_IMAGES` over the
    union of their manifests' [``started``, ``updated``] intervals."""
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
