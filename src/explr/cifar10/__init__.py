"""The CIFAR-10 engine: Li & Arora's (ICLR 2020, Sec. 5) schedules on a scale-invariant PreResNet, resumable runs.

Modules, each one concern:

* :mod:`~explr.cifar10.config` -- :class:`TrainConfig`, every setting declared once (CLI, ``config_to_argv``,
  validation and resume checks come from it), and the five schedules (:func:`~explr.cifar10.config.played_schedule`
  builds and checks one, an :class:`~explr.schedules.EquivalentSchedule` or a :class:`~explr.schedules.PlainSchedule`;
  :func:`schedule_arrays` its per-step lr and wd);
* :mod:`~explr.cifar10.plans` -- the named experiment plans (main, ablation, paper-scale, the 200-epoch grid);
* :mod:`~explr.cifar10.arrays` -- :class:`CifarArrays`, :class:`DataError`, ``.npz`` and the decode cache;
  :mod:`~explr.cifar10.sources` -- :func:`load_cifar10` (download, python batches), :func:`make_synthetic`;
  :mod:`~explr.cifar10.image_folder` -- image-folder trees and their archives;
* :mod:`~explr.cifar10.data` -- the device-resident augmenting sampler (and every loading name, re-exported);
* :mod:`~explr.cifar10.engine` -- the hot loop (:class:`Trainer`: epochs as ``EpochState``, its
  ``epoch_metrics()`` and ``describe()``) and divergence;
* :mod:`~explr.cifar10.runfolder` -- one run folder on disk: manifest, metrics, checkpoint (with its sha256),
  the checks before anything is written; :mod:`~explr.cifar10.lock` -- its lock, signals and errors;
* :mod:`~explr.cifar10.runs` -- training one run into its folder: resume, epochs, progress; ``RunSummary``;
* :mod:`~explr.cifar10.preflight` -- every run of a sweep checked before anything starts;
* :mod:`~explr.cifar10.sweep` -- many runs: trained here or in worker processes (one pool, a deadline);
  :mod:`~explr.cifar10.cluster` -- as submitit jobs, on SLURM;
* :mod:`~explr.cifar10.hardware` -- device, precision, the CPUs really available, one GPU per worker;
* :mod:`~explr.cifar10.files` -- atomic writes; :mod:`~explr.cifar10.results` -- the committed results;
* ``python -m explr.cifar10`` (:mod:`~explr.cifar10.__main__`) -- the command line.

The maths modules below (``explr.schedules``, ``lr_scheduler``, ``invariance``, ``models``, ...) import
nothing from here.
"""
from .config import SCHEDULES, TrainConfig, default_decay_epochs, schedule_arrays
from .data import CifarArrays, DataError, load_cifar10, make_synthetic
from .engine import Trainer, TrainingDiverged
from .results import committed_results
from .plans import experiment_plan
from .runs import METRIC_KEYS, RunError, RunResult, load_runs, read_metrics, run_dir, train_run
from .sweep import run_many, run_plan, submit

__all__ = [
    "SCHEDULES",
    "METRIC_KEYS",
    "CifarArrays",
    "DataError",
    "RunError",
    "RunResult",
    "TrainConfig",
    "Trainer",
    "TrainingDiverged",
    "committed_results",
    "default_decay_epochs",
    "experiment_plan",
    "load_cifar10",
    "load_runs",
    "make_synthetic",
    "read_metrics",
    "run_dir",
    "run_many",
    "run_plan",
    "schedule_arrays",
    "submit",
    "train_run",
]
