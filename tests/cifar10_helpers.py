"""Shared settings and data of the CIFAR-10 engine tests: PreResNet8 on 192 generated images, batch 32
(6 steps per epoch), seconds per run on a CPU.  A test module registers the data as module fixtures::

    arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
    npz = pytest.fixture(tiny_npz, scope="module", name="npz")
"""
import hashlib
import json
import signal
from contextlib import contextmanager

import torch

from explr.cifar10.config import TrainConfig, config_to_argv
from explr.cifar10.sources import make_synthetic
from explr.cifar10.arrays import write_npz
from explr.cifar10.metrics import TIMING_KEYS

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
