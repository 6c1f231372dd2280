"""The named experiment plans of the CIFAR-10 engine: which runs an experiment trains, declared once.

A plan is ``{experiment name: [TrainConfig, ...]}``; each experiment trains into its own folder
``<out>/<name>/`` (:func:`explr.cifar10.sweep.run_plan`, or :func:`~explr.cifar10.sweep.run_many` per folder).

* ``main`` (:func:`main_runs`) -- the five schedules of Li & Arora's Section 5 at the usual recipe (lr 0.1,
  momentum 0.9, wd 5e-4, decays at 50 % and 75 % of training), over seeds;
* ``ablation-none`` (:func:`ablation_runs`) -- TEXP without its momentum corrections (``corrections="none"``),
  paired by seed with main's TEXP;
* ``paper-scale`` (:func:`paper_scale_runs`) -- Step Decay + WD and TEXP at λ = 5e-3 (:data:`PAPER_SCALE`), with
  the decays at 2/3 and 5/6 of training (:func:`paper_scale_milestones`): a long phase 0 in which TEXP's lr
  grows by tens of e-folds and is rescaled whenever it passes 1.

:func:`experiment_plan` puts them together as chapter 6 and ``experiments/full_cifar10_gpu.py`` use them;
:func:`~explr.cifar10.config.config_to_argv` gives the command line of any of its runs.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from fractions import Fraction

from .config import SCHEDULES, TrainConfig, milestones_at

__all__ = [
    "PAPER_SCALE",
    "paper_scale_milestones",
    "main_runs",
    "ablation_runs",
    "paper_scale_runs",
    "experiment_plan",
]

#: the settings of the paper-scale pair: ten times the weight decay, rescaled whenever the lr passes 1.
PAPER_SCALE = {"wd": 5e-3, "rescale_above": 1.0}
#: where the paper-scale pair decays: at 2/3 and 5/6 of training.
PAPER_SCALE_DECAY_AT = (Fraction(2, 3), Fraction(5, 6))


def paper_scale_milestones(epochs: int) -> list[int]:
    """Decays at :data:`PAPER_SCALE_DECAY_AT`, 2/3 and 5/6 of training (8 and 10 of 12): a long phase 0 for the
    exponential growth."""
    return milestones_at(epochs, PAPER_SCALE_DECAY_AT)


def _seeds_of(seeds, schedule: str) -> list[int]:
    """``seeds`` for ``schedule``: one list for every schedule, or a mapping schedule → seeds."""
    return list(seeds.get(schedule, ()) if isinstance(seeds, Mapping) else seeds)


def main_runs(epochs: int, seeds: Iterable[int] | Mapping[str, Iterable[int]], schedules=SCHEDULES,
              **common) -> list[TrainConfig]:
    """Every schedule × its seeds at the usual recipe; ``common``: any other :class:`TrainConfig` field."""
    return [TrainConfig(schedule=s, seed=k, epochs=epochs, **common) for s in schedules for k in _seeds_of(seeds, s)]


def ablation_runs(epochs: int, seeds: Iterable[int], **common) -> list[TrainConfig]:
    """TEXP without momentum corrections, one run per seed (pair it with main's TEXP of the same seed)."""
    return [TrainConfig(schedule="texp", seed=k, epochs=epochs, corrections="none", **common) for k in seeds]


def paper_scale_runs(epochs: int, seeds: Iterable[int], **common) -> list[TrainConfig]:
    """Step Decay + WD and TEXP at :data:`PAPER_SCALE`, decays at :func:`paper_scale_milestones` (per seed)."""
    decays = tuple(paper_scale_milestones(epochs))
    return [TrainConfig(schedule=s, seed=k, epochs=epochs, decay_epochs=decays, **{**common, **PAPER_SCALE})
            for k in seeds for s in ("step", "texp")]


def experiment_plan(epochs: int, seeds: Iterable[int] | Mapping[str, Iterable[int]], *, schedules=SCHEDULES,
                    ablation: bool = True, paper_scale: bool = True, ablation_seeds: Iterable[int] | None = None,
                    paper_seeds: Iterable[int] | None = None, paper_epochs: int | None = None,
                    **common) -> dict[str, list[TrainConfig]]:
    """Chapter 6's plan: ``main`` always; ``ablation-none`` if ``ablation`` and TEXP is among ``schedules``
    (seeds: ``ablation_seeds``, default main's TEXP seeds); ``paper-scale`` if ``paper_scale`` (seeds:
    ``paper_seeds``, default the first of main's; ``paper_epochs``, default ``epochs``).  ``common``: any other
    :class:`TrainConfig` field, for every run (device, precision, data, depth, ...)."""
    plan = {"main": main_runs(epochs, seeds, schedules, **common)}
    texp_seeds = _seeds_of(seeds, "texp")
    if ablation and "texp" in schedules:
        plan["ablation-none"] = ablation_runs(epochs, texp_seeds if ablation_seeds is None else ablation_seeds,
                                              **common)
    if paper_scale:
        first = [c.seed for c in plan["main"]][:1]
        plan["paper-scale"] = paper_scale_runs(epochs if paper_epochs is None else paper_epochs,
                                               first if paper_seeds is None else paper_seeds, **common)
    return plan
