"""explr.cifar10.data: CIFAR-10 python batches and .npz on generated files, the md5 gate, the device sampler."""
import functools
import hashlib
import http.server
import io
import os
import pickle
import sys
import tarfile
import threading
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from explr.cifar10 import hardware
from explr.cifar10.arrays import CifarArrays, DataError, load_npz, write_npz
from explr.cifar10.data import DeviceData
from explr.cifar10.sources import (download_cifar10, load_cifar10, make_synthetic, read_cifar_batches,
                                   write_cifar_batches)


@pytest.fixture(scope="module")
def small():
    return make_synthetic(n_train=60, n_test=20, seed=1)


def md5(path):
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_reader_decodes_cifars_row_layout(tmp_path):
    """A row is 1024 red, 1024 green, 1024 blue bytes, each plane row-major: written here by hand."""
    rng = np.random.default_rng(0)
    planes = rng.integers(0, 256, size=(3, 3, 1024), dtype=np.uint8)  # 3 images × (R, G, B)
    table = {}
    for name in ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"]:
        with open(tmp_path / name, "wb") as f:
            pickle.dump({b"data": planes.reshape(3, 3072), b"labels": [7, 0, 9]}, f, protocol=2)
        table[name] = md5(tmp_path / name)
    data = read_cifar_batches(tmp_path, md5=table)
    assert data.x_train.shape == (15, 32, 32, 3) and data.x_test.shape == (3, 32, 32, 3)
    i, j = 5, 17
    for c in range(3):
        assert data.x_train[1, i, j, c] == planes[1, c, 32 * i + j]
    assert list(data.y_test) == [7, 0, 9] and data.y_train.dtype == np.int64


def test_batches_and_npz_round_trip_to_the_same_arrays(tmp_path, small):
    table = write_cifar_batches(tmp_path / "cifar-10-batches-py", small)
    from_batches = load_cifar10(str(tmp_path), md5=table)  # a folder holding cifar-10-batches-py/
    npz = write_npz(tmp_path / "c.npz", small)
    from_npz = load_cifar10(str(npz))
    for got in (from_batches, from_npz):
        np.testing.assert_array_equal(got.x_train, small.x_train)
        np.testing.assert_array_equal(got.y_test, small.y_test)
        assert got.sha256 == small.sha256  # the checksum is of the pixels, whatever the file format
    assert from_batches.kind == "cifar-python" and from_npz.kind == "npz"
    assert all(v.startswith("md5:") for v in from_batches.files.values())
    assert from_npz.describe()["n_train"] == 60


def test_md5_is_checked_before_anything_is_unpickled(tmp_path, small):
    folder = tmp_path / "b"
    table = write_cifar_batches(folder, small)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    with open(folder / "data_batch_3", "wb") as f:
        pickle.dump({b"data": Evil(), b"labels": []}, f, protocol=2)
    with pytest.raises(DataError, match="md5 .* does not match .* not unpickled"):
        read_cifar_batches(folder, md5=table)
    assert not marker.exists()
    # even a file whose md5 is "right" may only hold arrays: the unpickler refuses any other global
    table["data_batch_3"] = md5(folder / "data_batch_3")
    with pytest.raises(DataError, match="refusing to load the global"):
        read_cifar_batches(folder, md5=table)
    assert not marker.exists()
    # generated files never pass the official table
    with pytest.raises(DataError, match="official CIFAR-10"):
        read_cifar_batches(folder)


def test_missing_or_bad_data_says_what_was_expected(tmp_path, small):
    with pytest.raises(DataError, match=r"data_batch_1.*missing.*--data auto"):
        read_cifar_batches(tmp_path)
    with pytest.raises(DataError, match="no such file or folder"):
        load_cifar10(str(tmp_path / "nope"))
    with pytest.raises(DataError, match="no such file"):
        load_npz(tmp_path / "nope.npz")
    arrays = {k: getattr(small, k) for k in ("x_train", "y_train", "x_test", "y_test")}
    cases = {
        "lacks \\['y_test'\\]": {k: v for k, v in arrays.items() if k != "y_test"},
        "x_train must be uint8": {**arrays, "x_train": arrays["x_train"].astype(np.float32)},
        "x_test must be uint8 of shape \\(N, 32, 32, 3\\)": {**arrays, "x_test": arrays["x_test"][:, :16]},
        "labels in 0..9": {**arrays, "y_train": arrays["y_train"] + 5},
        "y_test must be integer labels": {**arrays, "y_test": arrays["y_test"][:-1]},
        "the array y_train \\(object\\) would need pickle to load, which is refused":
            {**arrays, "y_train": np.array([object()] * 60)},
    }
    for message, content in cases.items():
        path = tmp_path / "bad.npz"
        np.savez(path, **content)
        with pytest.raises(DataError, match=message):
            load_npz(path)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="not a readable .npz"):
        load_npz(tmp_path / "junk.npz")


@pytest.mark.slow
def test_download_is_md5_checked_then_extracted(tmp_path, small):
    """The real download code (torchvision's download_url) against a local HTTP server, no internet."""
    src = tmp_path / "server"
    table = write_cifar_batches(src / "cifar-10-batches-py", small)
    archive = src / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src / "cifar-10-batches-py", arcname="cifar-10-batches-py")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(src)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/cifar-10-python.tar.gz"
    try:
        folder = download_cifar10(tmp_path / "root", url=url, archive_md5=md5(archive))
        assert read_cifar_batches(folder, md5=table).sha256 == small.sha256
        with pytest.raises(DataError, match="could not download .* md5 0{32}"):
            download_cifar10(tmp_path / "root2", url=url, archive_md5="0" * 32)
        assert not (tmp_path / "root2" / "cifar-10-python.tar.gz").exists()
        assert not (tmp_path / "root2" / "cifar-10-batches-py").exists()
    finally:
        server.shutdown()


# ----------------------------------------------------------------------------- device sampler
def denormalise(data, x):
    mean = torch.tensor(data.mean).view(1, 3, 1, 1)
    std = torch.tensor(data.std).view(1, 3, 1, 1)
    return torch.round((x.double() * std + mean) * 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def test_batches_are_crops_and_flips_of_the_padded_images(small):
    data = DeviceData(small)
    plan = data.epoch_plan(seed=3, epoch=0, batch_size=16)
    assert plan.steps == 3
    idx = plan.index.numpy()
    assert sorted(idx) == list(range(60))  # a permutation: every image once per epoch
    base = plan.base.numpy() - idx * 40 * 40
    oy, ox, flip = base // 40, base % 40, plan.flip.numpy().ravel()
    padded = np.pad(small.x_train, ((0, 0), (4, 4), (4, 4), (0, 0)))
    for step in range(plan.steps):
        x, y = data.train_batch(plan, step)
        assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32
        assert x.is_contiguous(memory_format=torch.channels_last)
        got = denormalise(data, x)
        for b in range(16):
            k = step * 16 + b
            want = padded[idx[k], oy[k]:oy[k] + 32, ox[k]:ox[k] + 32]
            np.testing.assert_array_equal(got[b], want[:, ::-1] if flip[k] else want)
            assert y[b] == small.y_train[idx[k]]
    assert oy.min() >= 0 and max(oy.max(), ox.max()) <= 8 and len(np.unique(ox)) > 4 and 0 < flip.mean() < 1


def test_plans_are_reproducible_and_change_with_seed_and_epoch(small):
    data = DeviceData(small)
    a, b = data.epoch_plan(0, 5, 10), data.epoch_plan(0, 5, 10)
    assert torch.equal(a.base, b.base) and torch.equal(a.flip, b.flip)
    assert not torch.equal(a.index, data.epoch_plan(0, 6, 10).index)
    assert not torch.equal(a.index, data.epoch_plan(1, 5, 10).index)


def test_no_augmentation_gives_normalised_originals_and_test_set(small):
    data = DeviceData(small, augment=False, channels_last=False)
    plan = data.epoch_plan(0, 0, 20)
    x, y = data.train_batch(plan, 1)
    assert x.is_contiguous()
    np.testing.assert_array_equal(denormalise(data, x), small.x_train[plan.index[20:40].numpy()])
    xs = torch.cat([data.train_batch(plan, k)[0] for k in range(3)])
    assert xs.mean(dim=(0, 2, 3)).abs().max() < 1e-5  # train statistics: mean 0, std 1 per channel
    assert (xs.std(dim=(0, 2, 3), unbiased=False) - 1).abs().max() < 1e-5
    tests = list(data.test_batches(batch_size=8))
    assert [len(t[1]) for t in tests] == [8, 8, 4]
    np.testing.assert_array_equal(denormalise(data, torch.cat([t[0] for t in tests])), small.x_test)
    np.testing.assert_array_equal(torch.cat([t[1] for t in tests]).numpy(), small.y_test)


def test_sampler_and_generator_reject_bad_input(small):
    data = DeviceData(small)
    for bad in (0, 61, 2.5):
        with pytest.raises(ValueError, match=r"batch_size must be an integer in \[1, n_train = 60\]"):
            data.epoch_plan(0, 0, bad)
    with pytest.raises(ValueError, match="std > 0"):
        DeviceData(small, mean=[0.5, 0.5, 0.5], std=[0.2, 0.0, 0.2])
    with pytest.raises(ValueError, match="n_train"):
        make_synthetic(n_train=0)
    assert isinstance(make_synthetic(20, 10), CifarArrays)


# ----------------------------------------------------------------------------- hostile input (issue 23)
def test_constant_channels_are_refused_exactly(small):
    """Item 5: every pixel 7 passed (std 4e-8 from E[x²]−E[x]² rounding); so did one constant channel."""
    seven = CifarArrays(np.full_like(small.x_train, 7), small.y_train, small.x_test, small.y_test, "s", "test")
    with pytest.raises(DataError, match="constant .*channel 0 is 7 everywhere, channel 1 is 7 everywhere"):
        seven.channel_stats  # noqa: B018
    x = small.x_train.copy()
    x[..., 2] = 200
    with pytest.raises(DataError, match=r"constant \(channel 2 is 200 everywhere\)"):
        CifarArrays(x, small.y_train, small.x_test, small.y_test, "s", "test").channel_stats  # noqa: B018
    x[0, 0, 0, 2] = 201  # one pixel differs: a real (tiny) spread
    assert CifarArrays(x, small.y_train, small.x_test, small.y_test, "s", "test").channel_stats[1][2] > 0


def npz_with_headers(path, small, headers: dict):
    """A .npz whose arrays are ``small``'s, except those in ``headers``: name → raw .npy bytes (a header, no data)."""
    with zipfile.ZipFile(path, "w") as zf:
        for key in ("x_train", "y_train", "x_test", "y_test"):
            if key in headers:
                zf.writestr(f"{key}.npy", headers[key])
            else:
                buf = io.BytesIO()
                np.save(buf, getattr(small, key))
                zf.writestr(f"{key}.npy", buf.getvalue())
    return path


def test_declared_sizes_are_checked_against_memory_before_allocating(tmp_path, small, monkeypatch):
    """Item 13: a header declaring (10⁹, 32, 32, 3) gave "Unable to allocate 2.79 TiB"."""
    header = io.BytesIO()
    np.lib.format.write_array_header_2_0(header, {"descr": "|u1", "fortran_order": False,
                                                  "shape": (10**9, 32, 32, 3)})
    path = npz_with_headers(tmp_path / "huge.npz", small, {"x_train": header.getvalue()})
    monkeypatch.setattr(hardware, "available_memory", lambda: 8 << 30)
    with pytest.raises(DataError, match=r"huge\.npz: the array x_train declares shape \(1000000000, 32, 32, 3\) "
                                        r"uint8, 2\.79 TiB: more than the 8 GiB of memory available"):
        load_npz(path)
    monkeypatch.setattr(hardware, "available_memory", lambda: 200_000)  # x_train fits, x_test no more
    with pytest.raises(DataError, match=r"the array x_test declares shape \(20, 32, 32, 3\) uint8, 60 KiB; 240 KiB "
                                        r"with the arrays before it: more than the 195 KiB of memory available"):
        load_npz(write_npz(tmp_path / "small.npz", small))


def test_a_corrupt_npy_header_is_named_as_such(tmp_path, small):
    """Item 20: a corrupt .npy header read "holds arrays that need pickle to load"."""
    path = npz_with_headers(tmp_path / "bad.npz", small, {"y_test": b"\x93NUMPY\x01\x00\x10\x00{'descr': garbage"})
    with pytest.raises(DataError, match=r"bad\.npz: the header of the array y_test is corrupt or unreadable"):
        load_npz(path)


def test_a_failed_download_leaves_no_folder(tmp_path, monkeypatch):
    """Item 21: `--data auto` offline left an empty data/ folder (torchvision's download_url creates it)."""
    fake = types.ModuleType("torchvision.datasets.utils")

    def offline(url, root, filename, md5):
        os.makedirs(root, exist_ok=True)
        (Path(root) / filename).write_bytes(b"partial")
        raise OSError("<urlopen error [Errno -3] Temporary failure in name resolution>")

    fake.download_url = offline
    monkeypatch.setitem(sys.modules, "torchvision.datasets.utils", fake)
    (tmp_path / "kept").mkdir()
    with pytest.raises(DataError, match="could not download CIFAR-10 .*name resolution"):
        load_cifar10("auto", root=tmp_path / "kept" / "new" / "data")
    assert list(tmp_path.iterdir()) == [tmp_path / "kept"] and not list((tmp_path / "kept").iterdir())


def test_a_batch_larger_than_the_training_set_is_refused_for_every_source(tmp_path, small):
    """Item 21: the batch-size check is part of loading (the CLI passes --batch-size)."""
    with pytest.raises(DataError, match=r"batch_size \(--batch-size\) 61 exceeds the 60 training images of c\.npz"):
        load_cifar10(str(write_npz(tmp_path / "c.npz", small)), batch_size=61)
    assert len(load_cifar10(str(tmp_path / "c.npz"), batch_size=60).y_train) == 60
