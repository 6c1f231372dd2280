"""The CIFAR-10 engine: Li & Arora's (ICLR 2020, Sec. 5) schedules on a scale-invariant PreResNet, resumable runs.

Modules, each one concern, from the settings up to the command line:

* :mod:`~explr.cifar10.config` -- :class:`TrainConfig`, every setting declared once (CLI, ``config_to_argv``,
  validation and resume checks come from it);
* :mod:`~explr.cifar10.played` -- the five schedules a config plays (:func:`played_schedule`: an
  :class:`~explr.schedules.EquivalentSchedule` or a :class:`~explr.schedules.PlainSchedule`, with ``.lr`` and
  ``.wd`` per step), built and checked once;
* :mod:`~explr.cifar10.plans` -- the named experiment plans (main, ablation, paper-scale);
* :mod:`~explr.cifar10.hardware` -- device, precision, the CPUs and memory really available, one GPU per worker;
* :mod:`~explr.cifar10.files` -- atomic writes, leftover temporary files, whether a writer lives, the guarded reads
  and writes of a run's files (a full disk: :class:`~explr.cifar10.files.DiskFull`);
* :mod:`~explr.cifar10.arrays` -- :class:`CifarArrays`, :class:`DataError`, ``.npz`` and the decode cache;
  :mod:`~explr.cifar10.image_folder` -- image-folder trees and their archives
  (``explr.cifar10.archives``: tar archives streamed once, hashed as read, in bounded memory);
  :mod:`~explr.cifar10.sources` -- :func:`load_cifar10` (every source of ``--data``), :func:`make_synthetic`;
* :mod:`~explr.cifar10.data` -- the device-resident augmenting sampler;
* :mod:`~explr.cifar10.status` -- :class:`Status`, how a run stands or ended, with its exit code;
  :mod:`~explr.cifar10.lock` -- a run folder's lock, the signals that end a run, and its errors;
* a run folder's files, each with its schema: :mod:`~explr.cifar10.checkpoint` (written, read and checked before a
  resume), :mod:`~explr.cifar10.metrics` (the per-epoch rows, :func:`read_metrics`) and
  :mod:`~explr.cifar10.manifest` (the run's record, with the checkpoint's sha256);
* :mod:`~explr.cifar10.engine` -- the hot loop (:class:`Trainer`: epochs as ``EpochState``, its
  ``epoch_metrics()`` and ``describe()``) and divergence;
* :mod:`~explr.cifar10.runfolder` -- one run folder on disk: where it lives, the checks before anything is written,
  :func:`load_runs`;
* :mod:`~explr.cifar10.prepared` -- one run made ready once (:func:`prepare_run`: a :class:`PreparedRun` holding
  its schedule, resolved settings, data identity and what its folder holds), taken by all that trains it;
* :mod:`~explr.cifar10.runs` -- training one run into its folder (:func:`train_run`, :func:`train_prepared`:
  resume, epochs, progress) and :class:`RunResult`, what became of a run;
* :mod:`~explr.cifar10.preflight` -- every run of a sweep checked before anything starts;
* :mod:`~explr.cifar10.sweep` -- many runs: trained here or in worker processes (one pool, a deadline);
  :mod:`~explr.cifar10.cluster` -- as submitit jobs, on SLURM;
* :mod:`~explr.cifar10.results` -- the committed results (:func:`committed_results`) and the runs of one
  experiment in them (:func:`experiment_runs`);
* ``python -m explr.cifar10`` (:mod:`~explr.cifar10.__main__`) -- the command line.

Every other name is imported from the module that defines it.  The maths modules below (``explr.schedules``,
``lr_scheduler``, ``invariance``, ``models``, ...) import nothing from here.
"""
from .arrays import CifarArrays, DataError
from .cluster import submit
from .config import SCHEDULES, TrainConfig, default_decay_epochs
from .engine import Trainer, TrainingDiverged
from .lock import RunError
from .plans import experiment_plan
from .results import committed_results, experiment_runs
from .metrics import read_metrics
from .runfolder import load_runs, run_dir
from .prepared import PreparedRun, prepare_run
from .runs import RunResult, train_prepared, train_run
from .played import played_schedule
from .sources import load_cifar10, make_synthetic
from .status import Status
from .sweep import run_many, run_plan

__all__ = [
    "SCHEDULES",
    "CifarArrays",
    "DataError",
    "PreparedRun",
    "RunError",
    "RunResult",
    "Status",
    "TrainConfig",
    "Trainer",
    "TrainingDiverged",
    "committed_results",
    "default_decay_epochs",
    "experiment_plan",
    "experiment_runs",
    "load_cifar10",
    "load_runs",
    "make_synthetic",
    "played_schedule",
    "prepare_run",
    "read_metrics",
    "run_dir",
    "run_many",
    "run_plan",
    "submit",
    "train_prepared",
    "train_run",
]
