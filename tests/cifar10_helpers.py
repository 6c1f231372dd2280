"""Shared settings, data and helpers of the CIFAR-10 engine tests (tests/cifar10/, tests/experiments/, tests/slurm/):
PreResNet8 on 192 generated images, batch 32 (6 steps per epoch), seconds per run on a CPU.  A test module registers
the data as module fixtures::

    arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
    npz = pytest.fixture(tiny_npz, scope="module", name="npz")

Imported by name (``pythonpath`` in pyproject.toml holds tests/), like digits_helpers.
"""
import hashlib
import pickle
import tarfile
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import numpy as np
import torch

from explr.cifar10.__main__ import main
from explr.cifar10.config import TrainConfig, config_to_argv
from explr.cifar10.data import CLASSES, CifarArrays, NPZ_KEYS, file_hash, make_synthetic
from explr.cifar10.runfolder import TIMING_KEYS, read_metrics

#: the keys of a metrics.jsonl row before its TIMING_KEYS (Trainer.epoch_metrics), as docs/cifar10-engine.md lists them
EPOCH_KEYS = ("epoch", "step", "train_loss", "train_acc", "test_loss", "test_acc", "lr", "log_lr", "lr_opt", "rescale",
              "log2_rescale", "rescale_count", "weight_norm", "weight_norm_opt", "effective_lr")
TINY = dict(epochs=3, batch_size=32, depth=8, threads=1, eval_batch_size=64, log_every=2)
#: TINY on the command line (--epochs 3 --batch-size 32 ...), without progress bars
CLI_TINY = [*config_to_argv(TrainConfig(**TINY)), "--no-progress"]


def write_npz(path, arrays: CifarArrays | dict) -> Path:
    """Write the four arrays in the ``.npz`` schema ``load_npz`` reads (``savez_compressed``)."""
    get = arrays.get if isinstance(arrays, dict) else lambda k: getattr(arrays, k)
    path = Path(path)
    np.savez_compressed(path, **{k: np.asarray(get(k)) for k in NPZ_KEYS})
    return path


def write_image_folder(root, arrays: CifarArrays | dict, fmt: str = "png", archive: str | None = None) -> Path:
    """``arrays`` as ``train/<class>/NNNNN.<fmt>`` and ``test/...`` (``png`` or ``jpg``); with ``archive`` (``tar``,
    ``tar.gz``, ``tgz``) also packed into ``<root>.<archive>``, whose path is returned."""
    from PIL import Image

    get = arrays.get if isinstance(arrays, dict) else lambda k: getattr(arrays, k)
    root = Path(root)
    for split in ("train", "test"):
        x, y = np.asarray(get(f"x_{split}")), np.asarray(get(f"y_{split}"))
        for cls in sorted(set(int(v) for v in y)):
            (root / split / CLASSES[cls]).mkdir(parents=True, exist_ok=True)
        for i, (img, label) in enumerate(zip(x, y)):
            Image.fromarray(img, "RGB").save(root / split / CLASSES[int(label)] / f"{i:05d}.{fmt}")
    if archive is None:
        return root
    out = root.with_name(f"{root.name}.{archive}")
    with tarfile.open(out, "w:gz" if archive in ("tar.gz", "tgz") else "w") as tar:
        tar.add(root, arcname=root.name)
    return out


def write_cifar_batches(folder, arrays: CifarArrays, pieces: int = 5) -> dict:
    """``arrays`` in CIFAR-10's python format (``data_batch_1..5``, ``test_batch``, ``batches.meta``); returns the md5
    table of the batches (for ``read_cifar_batches``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}" for i in range(1, 6)]

    def dump(name, x, y):
        d = {b"batch_label": name.encode(), b"labels": [int(v) for v in y],
             b"data": np.ascontiguousarray(x.transpose(0, 3, 1, 2).reshape(len(x), 3072)),
             b"filenames": [f"{name}_{i}.png".encode() for i in range(len(x))]}
        with open(folder / name, "wb") as f:
            pickle.dump(d, f, protocol=2)

    chunks = np.array_split(np.arange(len(arrays.y_train)), pieces)
    for name, idx in zip(names, chunks):
        dump(name, arrays.x_train[idx], arrays.y_train[idx])
    dump("test_batch", arrays.x_test, arrays.y_test)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [c.encode() for c in CLASSES], b"num_cases_per_batch": len(chunks[0])}, f, 2)
    return {n: file_hash(folder / n, "md5") for n in [*names, "test_batch"]}


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
# (the run-file tests of test_files, test_runfolder, test_sweep, test_main, ...)
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
