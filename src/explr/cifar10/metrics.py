"""A run's ``metrics.jsonl``: one JSON object (:class:`MetricsRow`) per finished epoch, written atomically, read
back (:func:`read_metrics`) and checked (:func:`check_rows`, :func:`check_metrics_file`).

A row reports the schedule's lr (``lr``; ``null`` beyond float64, where only ``log_lr`` = ln lr says it), the
optimizer's actual lr (``lr_opt``), the accumulated rescaling factor R = lr_opt/lr = 2^``log2_rescale``
(``rescale``), ‖θ‖ in the schedule's units (``weight_norm`` = ‖θ_opt‖/√R) and the effective lr,
lr/‖θ‖² = lr_opt/‖θ_opt‖² (Li & Arora 2020, Lemma 1.3), then the wall-clock timings (:data:`TIMING_KEYS`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, TypedDict

from ..params import Float, is_int, is_real_type
from .checkpoint import CHECKPOINT, refuse, shown
from .files import read_run_file, write_file
from .lock import RunError

__all__ = ["FINAL_KEYS", "METRICS", "SHOWN", "TIMING_KEYS", "EpochMetrics", "MetricsRow", "Timings",
           "check_metrics_file", "check_rows", "read_metrics", "write_metrics"]

#: the metrics' name in a run folder
METRICS = "metrics.jsonl"
#: larger than the metrics of 100000 epochs (~60 MiB).
MAX_METRICS_BYTES = 1 << 28
_REMEDY = f"delete the file and rerun with --resume: it is rewritten from {CHECKPOINT}"


#: the numbers of a finished epoch (:meth:`~explr.cifar10.engine.Trainer.epoch_metrics`)
EpochMetrics = TypedDict("EpochMetrics", {
    "epoch": int, "step": int, "train_loss": float, "train_acc": float, "test_loss": float, "test_acc": float,
    "lr": Optional[float], "log_lr": float, "lr_opt": float, "rescale": float, "log2_rescale": int,
    "rescale_count": int, "weight_norm": Optional[float], "weight_norm_opt": float, "effective_lr": float,
})
#: the wall-clock seconds of an epoch (all, training, evaluation) and its training images per second
Timings = TypedDict("Timings", {"seconds": float, "train_seconds": float, "eval_seconds": float,
                                "images_per_s": float})


class MetricsRow(EpochMetrics, Timings):
    """One line of metrics.jsonl: the epoch's numbers, then its timings."""


#: metrics that depend on wall-clock time (everything else is reproducible bit for bit on a CPU).
TIMING_KEYS = tuple(Timings.__annotations__)
#: the numbers of a row that a resume shows and reports (the progress bar, the manifest's "final"), and their rules
SHOWN = {"train_loss": Float(0, lo_open=False), "train_acc": Float(0, 1, lo_open=False, hi_open=False),
         "test_loss": Float(0, lo_open=False), "test_acc": Float(0, 1, lo_open=False, hi_open=False)}
#: the manifest's ``final``: the last row's epoch and :data:`SHOWN` numbers
FINAL_KEYS = ("epoch", *SHOWN)


def check_rows(rows: list, path) -> None:
    """The rows of the checkpoint at ``path``: JSON objects of epochs 1, 2, ... in order, holding only numbers or
    null, with :data:`SHOWN` numbers that keep their rules; a :class:`RunError` naming ``path`` otherwise."""
    wrong = _row_error(rows)
    if wrong:
        raise refuse(Path(path), wrong)


def _row_error(rows: list) -> str | None:
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            return f"holds a metrics row {number} = {shown(row)}, not a JSON object"
        bad = next((k for k, v in row.items() if not isinstance(k, str) or not (v is None or is_real_type(type(v)))),
                   None)
        if bad is not None:
            return f"holds a metrics row {number} whose {shown(bad)} = {shown(row[bad])} is not a number or null"
        if not is_int(row.get("epoch")) or row.get("epoch") != number:
            return f"holds a metrics row {number} of epoch {shown(row.get('epoch'))}, not of epoch {number}"
        for key, rule in SHOWN.items():
            if not rule.ok(row.get(key)):
                return f"holds a metrics row {number} whose {key} = {shown(row.get(key))} is not {rule.rule()}"
    return None


def write_metrics(path, rows) -> None:
    """Write ``rows`` as ``path`` (one JSON object a line), atomically."""
    write_file(path, lambda f: f.write("".join(json.dumps(r) + "\n" for r in rows).encode()))


def read_metrics(path, *, drop_partial_last: bool = False) -> list[dict]:
    """The per-epoch rows of a run (``path``: its directory or its metrics.jsonl).

    A line that is not a JSON object is a :class:`RunError` naming the file and the line, and so is a file that
    is not a regular UTF-8 file of at most :data:`MAX_METRICS_BYTES`; a missing file is ``FileNotFoundError``.
    ``drop_partial_last``: an unparsable last line is dropped instead (the partial write of a killed epoch).
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS
    try:
        lines = read_run_file(path, MAX_METRICS_BYTES).decode().splitlines()
    except FileNotFoundError:
        raise
    except (ValueError, OSError) as err:
        raise RunError(f"{path} is unreadable ({err}); {_REMEDY}") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            if drop_partial_last and number == len(lines):
                break
            row = None
        if not isinstance(row, dict):
            raise RunError(f"{path} line {number} is not a JSON object (truncated or hand-edited?); {_REMEDY}")
        rows.append(row)
    return rows


def check_metrics_file(rows: list, saved_rows: list, path, checkpoint) -> None:
    """The rows of a finished run's metrics file at ``path`` must be those of its ``checkpoint`` (``saved_rows``), or
    the first of them (a process killed between the last checkpoint and its metrics:
    :func:`~explr.cifar10.runs.train_run` rewrites them from the checkpoint); other rows (a duplicated or edited
    line) are a :class:`RunError` naming both files."""
    rows, expected = [json.dumps(r) for r in rows], [json.dumps(r) for r in saved_rows]  # as written (NaN = NaN)
    if rows != expected[:len(rows)]:
        first = next((i for i, (a, b) in enumerate(zip(rows, expected)) if a != b), len(expected))
        raise RunError(f"{path} is not the {len(expected)} metrics rows of {checkpoint} (its row {first + 1} of "
                       f"{len(rows)} differs: hand-edited?); delete it and rerun with --resume: it is rewritten from "
                       "the checkpoint")
