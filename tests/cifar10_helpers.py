"""Shared settings, data and helpers of the CIFAR-10 engine tests (tests/cifar10/, tests/experiments/, tests/slurm/):
PreResNet8 on 192 generated images, batch 32 (6 steps per epoch), seconds per run on a CPU.  A test module registers
the data as module fixtures::

    arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
    npz = pytest.fixture(tiny_npz, scope="module", name="npz")

Imported by name (``pythonpath`` in pyproject.toml holds tests/), like digits_helpers.
"""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
import torch

from explr.cifar10.__main__ import main
from explr.cifar10.config import TrainConfig, config_to_argv
from explr.cifar10.sources import make_synthetic
from explr.cifar10.arrays import write_npz
from explr.cifar10.metrics import TIMING_KEYS, read_metrics

TINY = dict(epochs=3, batch_size=32, depth=8, threads=1, eval_batch_size=64, log_every=2)
#: TINY on the command line (--epochs 3 --batch-size 32 ...), without progress bars
CLI_TINY = [*config_to_argv(TrainConfig(**TINY)), "--no-progress"]


def tiny_arrays():
    return make_synthetic(n_train=192, n_test=64, seed=2)


def tiny_npz(arrays, tmp_path_factory):
    """``arrays`` written as a .npz in a temporary folder (its path as a string)."""
    return str(write_npz(tmp_path_factory.mktemp("data") / "tiny.npz", arrays))


def reproducible(rows):
    """The metrics rows without their wall-clock timings (everything else is reproducible bit for bit)."""
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def alive(pid):
    """Whether process ``pid`` is running (a zombie, which has ended, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def edit_checkpoint(run, edit):
    """``edit(saved)`` on the run's checkpoint, recording its new sha256 in the manifest (a careful hand edit)."""
    saved = torch.load(run / "checkpoint.pt", weights_only=True)
    edit(saved)
    torch.save(saved, run / "checkpoint.pt")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest.update(checkpoint_sha256=hashlib.sha256((run / "checkpoint.pt").read_bytes()).hexdigest(),
                    checkpoint_sha256_writing=None)
    (run / "manifest.json").write_text(json.dumps(manifest))


@contextmanager
def deadline(seconds):
    """Fail (TimeoutError) instead of hanging if the block blocks for ``seconds``, as opening a FIFO does."""
    def expired(signum, frame):
        raise TimeoutError(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ----------------------------------------------------------------------------- the command line and the run folders
# (the run-file tests of test_lock, test_runfolder, test_manifest, test_metrics, test_preflight, test_main, ...)
def refused(argv, capsys, *words):
    """``main(argv)`` exits 2 with one line on stderr, no traceback, naming every one of ``words``."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


def fails_in_one_line(argv, capsys, match):
    """``main(argv)`` exits 2 with one line on stderr, no traceback, holding ``match``; returns that line."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert match in err, err
    return err


def one_line(argv, capsys, match, code=2):
    """``main(argv)`` ends with ``code`` and one line on stderr holding ``match``; returns that line."""
    with pytest.raises(SystemExit) as exc:
        rc = main(argv)
        raise SystemExit(rc)
    err = capsys.readouterr().err
    assert exc.value.code == code, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert match in err, err
    return err


def cli(out, npz, *extra):
    """The command line of a TINY step run of ``npz`` into ``out``, and ``extra``."""
    return ["--schedule", "step", "--data", npz, "--out", str(out), *CLI_TINY, *extra]


def snapshot(folder):
    """{relative path: bytes} of every file under ``folder``."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


#: :func:`snapshot`, by the name the hostile-input tests give it
files_of = snapshot


def tree_of(folder):
    """Every path under ``folder`` (links not followed)."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def deeply_nested(depth=200_000):
    """JSON nested deeper than Python's parser goes."""
    return "[" * depth + "]" * depth


def edit_manifest(run, **changes):
    """``changes`` written into the run's manifest.json (a hand edit)."""
    manifest = json.loads((run / "manifest.json").read_text())
    manifest.update(changes)
    (run / "manifest.json").write_text(json.dumps(manifest))


def replace_by(path, what):
    """``path`` replaced by a link to /dev/zero (``what`` = "/dev/zero") or by a FIFO."""
    path.unlink()
    if what == "/dev/zero":
        path.symlink_to("/dev/zero")
    else:
        os.mkfifo(path)


def _cli(tmp_path, npz, *extra):
    """The command line as a subprocess: texp for 40 epochs into ``tmp_path``, long enough to be interrupted."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "explr.cifar10", "--schedule", "texp", "--data", npz, "--out", str(tmp_path),
           *CLI_TINY, "--epochs", "40", "--wd", "5e-3", "--rescale-above", "0.102", *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_epochs(run, n, proc, timeout=120):
    """Until ``run`` has ``n`` rows of metrics (``proc`` still running), at most ``timeout`` seconds."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if (run / "metrics.jsonl").exists() and len(read_metrics(run)) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("no epoch finished in time")
