"""explr.cifar10.preflight: every run of a sweep is checked before the first one starts, and nothing is created on a
refusal -- the settings, the device, the data (read once, with the sweep's progress setting and largest batch),
every run's schedule and every run folder."""
import numpy as np
import pytest
import torch

from explr.cifar10.arrays import CifarArrays, write_npz

from cifar10_helpers import (CLI_TINY, cli, edit_manifest, fails_in_one_line, one_line,
                             tiny_arrays, tiny_npz)

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


# ----------------------------------------------------------------------------- hostile run files
class TestHostileRunFiles:
    """Run folders and flags a hostile or careless user can hand the engine: each is one line naming the file or
    flag (exit code 2, or 6 for a full disk), and nothing outside the engine's own files is written or deleted."""

    def test_a_bogus_status_of_a_finished_run_is_one_line_naming_it_before_the_other_runs_train(self, finished, npz,
                                                                                                 capsys):
        """Issue 41 item 16: it was noticed after the other runs trained, as an exit 2 naming no file."""
        out = finished.parents[1]
        edit_manifest(finished, status="bogus")
        err = one_line([*cli(out, npz, "--epochs", "1", "--seed", "0", "1"), "--resume"], capsys, "'bogus'")
        assert str(finished / "manifest.json") in err, err
        assert not (out / "step" / "seed1").exists()


# ----------------------------------------------------------------------------- validated before anything starts
def test_every_run_is_checked_before_the_first_starts(npz, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    base = ["--data", npz, "--out", str(out), *CLI_TINY]
    # texp cannot be built at lr 1, wd 0.01: step must not have trained first
    fails_in_one_line([*base, "--schedule", "step", "texp", "--lr", "1", "--wd", "0.01"], capsys, "schedule texp")
    fails_in_one_line([*base, "--schedule", "step", "texp", "--rescale-above", "0.05"], capsys, "--rescale-above")
    fails_in_one_line([*base, "--jobs", "2", "--seed", "0", "1", "--batch-size", "500"], capsys, "--batch-size")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    fails_in_one_line([*base, "--device", "cuda"], capsys, "CUDA is not available")
    assert not out.exists()


def test_truncated_npz_and_constant_images_are_refused_before_start(arrays, tmp_path, capsys):
    good = write_npz(tmp_path / "good.npz", arrays).read_bytes()
    (tmp_path / "cut.npz").write_bytes(good[: len(good) // 2])
    fails_in_one_line(["--data", str(tmp_path / "cut.npz"), "--out", str(tmp_path / "o"), *CLI_TINY], capsys,
                      "truncated or damaged")
    for value in (0, 77):
        flat = CifarArrays(np.full_like(arrays.x_train, value), arrays.y_train, arrays.x_test, arrays.y_test,
                           source="flat", kind="npz")
        write_npz(tmp_path / "flat.npz", flat)
        fails_in_one_line(["--data", str(tmp_path / "flat.npz"), "--out", str(tmp_path / "o"), *CLI_TINY], capsys,
                          "constant")  # the words are data.py's
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- the data, read once
def test_the_sweep_decodes_with_the_progress_setting_and_checks_the_largest_batch(npz, tmp_path, monkeypatch):
    """--no-progress reaches the decoder, and the batch size is checked by the loader before anything is cached."""
    import explr.cifar10.preflight as sweep_mod
    from explr.cifar10 import TrainConfig

    seen = {}
    real = sweep_mod.load_cifar10

    def recording(data, root, **kwargs):
        seen.update(kwargs)
        return real(data, root, **kwargs)

    monkeypatch.setattr(sweep_mod, "load_cifar10", recording)
    configs = [TrainConfig(schedule="step", seed=0, data=npz, epochs=1, batch_size=32, depth=8, threads=1),
               TrainConfig(schedule="texp", seed=0, data=npz, epochs=1, batch_size=64, depth=8, threads=1)]
    sweep_mod.prepare(configs, tmp_path, progress=False)
    assert seen == {"progress": False, "batch_size": 64}
