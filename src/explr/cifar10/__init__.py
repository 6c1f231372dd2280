"""The CIFAR-10 engine: Li & Arora's (ICLR 2020, Sec. 5) schedules on a scale-invariant PreResNet, resumable runs.

Modules, each one concern, from the settings up (docs/cifar10-engine.md tells how they work together):

* :mod:`~explr.cifar10.config` -- :class:`TrainConfig`, every setting declared once, its command line, the schedule
  it plays (:func:`played_schedule`), the device, precision and threads it resolves to, the experiment plans;
* :mod:`~explr.cifar10.data` -- every source of ``--data`` (:func:`load_cifar10`) into :class:`CifarArrays`;
* :mod:`~explr.cifar10.files` -- atomic writes, a run folder's lock, the signals that end a run, :class:`Status`;
* :mod:`~explr.cifar10.runfolder` -- a run folder's files (checkpoint, metrics, manifest), its checks,
  :func:`load_runs`;
* :mod:`~explr.cifar10.runs` -- one run: the hot loop (:class:`Trainer`), the on-device sampler, the run trained
  into its folder (:func:`train_run`, :class:`RunResult`);
* :mod:`~explr.cifar10.sweep` -- many runs: checked first, then trained here, in worker processes or as submitit
  jobs (:func:`run_many`, :func:`run_plan`, :func:`submit`);
* :mod:`~explr.cifar10.results` -- the committed results (:func:`committed_results`, :func:`experiment_runs`);
* ``python -m explr.cifar10`` (:mod:`~explr.cifar10.__main__`) -- the command line.
"""
from .config import SCHEDULES, TrainConfig, default_decay_epochs, experiment_plan, played_schedule
from .data import CifarArrays, DataError, load_cifar10, make_synthetic
from .files import RunError, Status
from .results import committed_results, experiment_runs
from .runfolder import load_runs, read_metrics, run_dir
from .runs import PreparedRun, RunResult, Trainer, TrainingDiverged, prepare_run, train_prepared, train_run
from .sweep import run_many, run_plan, submit

__all__ = [
    "SCHEDULES", "CifarArrays", "DataError", "PreparedRun", "RunError", "RunResult", "Status", "TrainConfig",
    "Trainer", "TrainingDiverged", "committed_results", "default_decay_epochs", "experiment_plan",
    "experiment_runs", "load_cifar10", "load_runs", "make_synthetic", "played_schedule", "prepare_run",
    "read_metrics", "run_dir", "run_many", "run_plan", "submit", "train_prepared", "train_run",
]
