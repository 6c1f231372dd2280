"""The CIFAR-10 engine: Li & Arora's (ICLR 2020, Sec. 5) schedules on a scale-invariant PreResNet, resumable runs.
Modules: ``config`` (the settings), ``data``, ``runfolder`` (a run's files, lock and signals), ``runs`` (one run),
``sweep`` (many), ``results`` (the committed ones), ``__main__`` (the command line); docs/cifar10-engine.md."""
from .config import SCHEDULES, TrainConfig, default_decay_epochs, experiment_plan, played_schedule
from .data import CifarArrays, DataError, load_cifar10, make_synthetic
from .results import committed_results, experiment_runs
from .runfolder import RunError, Status, load_runs, read_metrics, run_dir
from .runs import PreparedRun, RunResult, Trainer, TrainingDiverged, prepare_run, train_prepared, train_run
from .sweep import run_many, run_plan, submit

__all__ = [
    "SCHEDULES", "CifarArrays", "DataError", "PreparedRun", "RunError", "RunResult", "Status", "TrainConfig",
    "Trainer", "TrainingDiverged", "committed_results", "default_decay_epochs", "experiment_plan",
    "experiment_runs", "load_cifar10", "load_runs", "make_synthetic", "played_schedule", "prepare_run",
    "read_metrics", "run_dir", "run_many", "run_plan", "submit", "train_prepared", "train_run",
]
