"""Summaries and honest verdicts for the CIFAR-10 schedule comparison (chapter 6).

A claim of the paper compares two schedules by their final test accuracy.  With a handful of seeds
per schedule the comparison is a two-sample one: the difference of the seed means, Δ = ā − b̄, against
its standard error SE = √(s_a²/n_a + s_b²/n_b) (sample standard deviations, ddof = 1).  The verdicts
use the usual two-standard-error band; with two seeds per schedule SE itself is a rough estimate,
which the chapter says next to every verdict.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["ScheduleSummary", "Comparison", "summarise", "compare"]


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


@dataclass(frozen=True)
class Comparison:
    """The outcome of :func:`compare`: Δ = mean(a) − mean(b), its standard error and the verdict."""

    claim: str
    difference: float
    standard_error: float
    verdict: str
    decided: bool


def summarise(runs, metric: str = "test_acc") -> dict[str, ScheduleSummary]:
    """Group :func:`explr.train.load_runs` output by schedule; keep finished runs only.

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
        items.sort()
        out[schedule] = ScheduleSummary(schedule, tuple(s for s, _ in items),
                                        np.array([float(v[-1]) for _, v in items]), lengths.pop())
    return out


def compare(a: ScheduleSummary, b: ScheduleSummary, kind: str) -> Comparison:
    """Verdict on "a ≈ b" (``kind="same"``) or "a at least as good as b" (``kind="at-least"``).

    With Δ = ā − b̄ and SE as in the module docstring:

    * ``same``: |Δ| ≤ 2 SE → consistent; otherwise the schedules differ at this scale.
    * ``at-least``: Δ > 2 SE → a is better; |Δ| ≤ 2 SE → no detectable difference (this scale
      cannot decide); Δ < −2 SE → contradicted at this scale.

    Needs at least two seeds per schedule (otherwise there is no spread to compare against).
    """
    if kind not in ("same", "at-least"):
        raise ValueError(f"kind must be 'same' or 'at-least'; got {kind!r}")
    if len(a.final) < 2 or len(b.final) < 2:
        raise ValueError(f"compare needs >= 2 seeds per schedule; got {len(a.final)} ({a.schedule}) and "
                         f"{len(b.final)} ({b.schedule})")
    diff = a.mean - b.mean
    se = math.sqrt(a.std**2 / len(a.final) + b.std**2 / len(b.final))
    within = abs(diff) <= 2 * se
    if kind == "same":
        claim = f"{a.schedule} ≈ {b.schedule}"
        verdict = "consistent (within 2 SE)" if within else "differs by more than 2 SE"
        return Comparison(claim, diff, se, verdict, decided=True)
    claim = f"{a.schedule} ≥ {b.schedule}"
    if within:
        return Comparison(claim, diff, se, "no detectable difference: this scale cannot decide", decided=False)
    verdict = f"{a.schedule} better by more than 2 SE" if diff > 0 else "contradicted: worse by more than 2 SE"
    return Comparison(claim, diff, se, verdict, decided=True)
