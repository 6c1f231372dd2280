"""explr.cifar10.sources: CIFAR-10's python batches (the row layout, the md5 gate before anything is unpickled), the
download, and load_cifar10 over the sources (a folder of batches, a .npz, a batch larger than the training set)."""
import functools
import hashlib
import http.server
import os
import pickle
import sys
import tarfile
import threading
import types
from pathlib import Path

import numpy as np
import pytest

from explr.cifar10.arrays import DataError, write_npz
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


# ----------------------------------------------------------------------------- hostile input (issue 23)
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
