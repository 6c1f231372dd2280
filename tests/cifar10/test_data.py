"""explr.cifar10.data: every source of --data: CIFAR-10's python batches (the md5 gate before anything is
unpickled), the download, .npz headers, image-folder trees and their archives, decoded once and cached by sha256."""
import errno
import functools
import hashlib
import http.server
import io
import json
import os
import pickle
import re
import struct
import subprocess
import sys
import tarfile
import threading
import time
import types
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from explr.cifar10 import data, runfolder
from explr.cifar10.data import (
    CLASSES, CifarArrays, DataError, download_cifar10, load_cifar10, load_image_folder,
    load_npz, make_synthetic, read_cifar_batches,
)

from cifar10_helpers import deadline, write_cifar_batches, write_image_folder, write_npz



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
    """The real download code (torchvision's download_and_extract_archive) against a local HTTP server, no internet."""
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
    """Item 21: `--data auto` offline left an empty data/ folder (torchvision's download creates it)."""
    fake = types.ModuleType("torchvision.datasets.utils")

    def offline(url, root, md5):
        os.makedirs(root, exist_ok=True)
        (Path(root) / os.path.basename(url)).write_bytes(b"partial")  # torchvision's name for the download
        raise OSError("<urlopen error [Errno -3] Temporary failure in name resolution>")

    fake.download_and_extract_archive = offline
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


# ----------------------------------------------------------------------------- items 5 and 6: the decode key
# ----------------------------------------------------------------------------- the .npz format
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
        "y_train must be 60 integer labels in 0..9": {**arrays, "y_train": arrays["y_train"] + 5},
        "y_test must be 20 integer labels in 0..9; got int64 \\(19,\\)": {**arrays, "y_test": arrays["y_test"][:-1]},
        "bad\\.npz: not a readable \\.npz file.*allow_pickle=False": {**arrays, "y_train": np.array([object()] * 60)},
    }
    for message, content in cases.items():
        path = tmp_path / "bad.npz"
        np.savez(path, **content)
        with pytest.raises(DataError, match=message):
            load_npz(path)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="not a readable .npz"):
        load_npz(tmp_path / "junk.npz")


# ----------------------------------------------------------------------------- hostile input (issue 23)
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


def test_declared_sizes_are_checked_against_memory_before_allocating(tmp_path, small, monkeypatch):
    """Item 13: a header declaring (10⁹, 32, 32, 3) gave "Unable to allocate 2.79 TiB"; the arrays' sizes together
    are checked, from their headers alone."""
    def header(n):
        out = io.BytesIO()
        np.lib.format.write_array_header_2_0(out, {"descr": "|u1", "fortran_order": False, "shape": (n, 32, 32, 3)})
        return out.getvalue()
    monkeypatch.setattr(data, "available_memory", lambda: 8 << 30)
    with pytest.raises(DataError, match=r"huge\.npz: its arrays declare 2,861\.0 GiB, more than the 8\.0 GiB of memory "
                                        r"available"):
        load_npz(npz_with_headers(tmp_path / "huge.npz", small, {"x_train": header(10**9)}))
    with pytest.raises(DataError, match=r"two\.npz: its arrays declare 10\.0 GiB, more than the 8\.0 GiB"):
        load_npz(npz_with_headers(tmp_path / "two.npz", small, {"x_train": header(1_750_000),
                                                                "x_test": header(1_750_000)}))  # 5 GiB each


def test_a_corrupt_npy_header_is_named_as_such(tmp_path, small):
    """Item 20: a corrupt .npy header read "holds arrays that need pickle to load"."""
    path = npz_with_headers(tmp_path / "bad.npz", small, {"y_test": b"\x93NUMPY\x01\x00\x10\x00{'descr': garbage"})
    with pytest.raises(DataError, match=r"bad\.npz: not a readable \.npz file, truncated or damaged"):
        load_npz(path)


@pytest.fixture(scope="module")
def small40():
    return make_synthetic(n_train=40, n_test=20, seed=3)


@pytest.fixture()
def tree(tmp_path, small40):
    return write_image_folder(tmp_path / "cifar", small40, fmt="png")


def test_png_tree_and_its_tarballs_give_the_original_pixels_in_sorted_class_order(tmp_path, small40):
    for archive in (None, "tar", "tar.gz", "tgz"):
        src = write_image_folder(tmp_path / f"tree-{archive}", small40, fmt="png", archive=archive)
        got = load_cifar10(str(src), root=tmp_path / "root", progress=False)
        order = np.argsort(small40.y_train, kind="stable")  # class-major, then file name (= original index)
        np.testing.assert_array_equal(got.x_train, small40.x_train[order])
        np.testing.assert_array_equal(got.y_train, small40.y_train[order])
        assert got.y_test.tolist() == sorted(small40.y_test.tolist())
        assert got.kind == ("image-folder" if archive is None else "image-folder-tar")
        d = got.describe()
        assert d["source"] == src.name and str(tmp_path) not in json.dumps(d), "no machine path in the manifest"
        assert d["files"][src.name].startswith("sha256:")


def test_jpeg_tree_decodes_close_to_the_pixels(tmp_path, small40):
    src = write_image_folder(tmp_path / "jpg", small40, fmt="jpg")
    got = load_image_folder(src, cache_dir=None, progress=False)
    order = np.argsort(small40.y_train, kind="stable")
    want = small40.x_train[order].astype(int)
    err = np.abs(got.x_train.astype(int) - want).mean()
    other = np.abs(got.x_train.astype(int) - np.roll(want, 1, axis=0)).mean()  # each decoded vs another image
    assert 0 < err < 0.6 * other, "lossy, but each file decodes to its own image"


def test_a_tree_under_one_top_folder_in_the_archive_is_found(tmp_path, small40):
    src = write_image_folder(tmp_path / "nested", small40, archive="tar.gz")  # arcname = "nested/"
    with tarfile.open(src) as tar:
        assert all(n.startswith("nested") for n in tar.getnames())
    assert len(load_image_folder(src, cache_dir=None, progress=False).y_train) == 40


def test_second_load_comes_from_the_cache_keyed_by_sha256(tmp_path, small40, monkeypatch):
    src = write_image_folder(tmp_path / "c", small40, archive="tar.gz")
    cache = tmp_path / "cache"
    first = load_image_folder(src, cache_dir=cache, progress=False)
    files = list(cache.glob("image-folder-*.npz"))
    assert len(files) == 1 and first.files[src.name].removeprefix("sha256:") in files[0].name
    assert not list(cache.glob("*.tmp")) and (files[0].stat().st_mode & 0o044) == 0o044, "readable, no leftovers"
    with monkeypatch.context() as patch:  # the second load decodes nothing: it reads the cache
        _no_decoding(patch)
        again = load_image_folder(src, cache_dir=cache, progress=False)
    assert again.sha256 == first.sha256
    files[0].write_bytes(b"garbage")  # a damaged cache is rebuilt, not trusted
    assert load_image_folder(src, cache_dir=cache, progress=False).sha256 == first.sha256


def _png(mode="RGB", size=(32, 32)):
    buf = io.BytesIO()
    Image.new(mode, size).save(buf, format="PNG")
    return buf.getvalue()


BAD_TREES = {
    "missing split": (lambda r: __import__("shutil").rmtree(r / "test"),
                      r"cifar: train/ and test/ must hold images of the same classes \(only in train: \['airplane',"),
    "empty class folder": (lambda r: [p.unlink() for p in (r / "train" / "cat").iterdir()],
                           r"same classes \(only in train: \[\]; only in test: \['cat'\]\)"),
    "unknown class folder": (lambda r: (r / "train" / "unicorn").mkdir(),
                             "train/unicorn: train/ may hold only the class folders"),
    "non-image file": (lambda r: (r / "train" / "cat" / "notes.txt").write_text("hi"), r"notes\.txt: not an image"),
    "unreadable image": (lambda r: (r / "train" / "cat" / "broken.png").write_bytes(b"\x89PNG garbage"),
                         r"broken\.png: not a readable"),
    "wrong size": (lambda r: (r / "train" / "cat" / "big.png").write_bytes(_png(size=(33, 32))),
                   r"big\.png: a 33×32 PNG of mode RGB; expected"),
    "wrong mode": (lambda r: (r / "test" / "dog" / "grey.png").write_bytes(_png("L")),
                   r"grey\.png: a 32×32 PNG of mode L;"),
    "different classes": (lambda r: __import__("shutil").rmtree(r / "test" / "cat"), "same classes"),
    "file among class folders": (lambda r: (r / "train" / "stray.png").write_bytes(_png()),
                                 r"train/stray\.png: train/ may hold"),
}


@pytest.mark.parametrize("case", list(BAD_TREES))
def test_bad_trees_are_refused_with_a_message_naming_the_file(tree, case):
    damage, message = BAD_TREES[case]
    damage(tree)
    with pytest.raises(DataError, match=message):
        load_image_folder(tree, cache_dir=None, progress=False)


def test_hidden_files_are_ignored(tree):
    (tree / "train" / "cat" / ".DS_Store").write_bytes(b"\0\0")
    assert len(load_image_folder(tree, cache_dir=None, progress=False).y_train) == 40


def test_every_class_name_maps_to_cifars_label(tree):
    assert sorted(CLASSES) == list(CLASSES)
    got = load_image_folder(tree, cache_dir=None, progress=False)
    assert set(got.y_train.tolist()) <= set(range(10))


@pytest.mark.slow
def test_cli_reports_a_bad_tree_in_one_line_without_traceback(tree, tmp_path):
    (tree / "train" / "cat" / "notes.txt").write_text("hi")
    r = subprocess.run([sys.executable, "-m", "explr.cifar10", "--data", str(tree), "--out", str(tmp_path / "o"),
                        "--epochs", "1", "--depth", "8", "--device", "cpu", "--no-progress"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "notes.txt: not an image file" in r.stderr


@pytest.mark.slow
def test_cli_trains_on_a_tarball_and_records_it_by_name(tmp_path, small40):
    src = write_image_folder(tmp_path / "tiny", small40, fmt="png", archive="tar.gz")
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-m", "explr.cifar10", "--data", str(src), "--data-root", str(tmp_path / "root"),
                        "--out", str(out), "--epochs", "1", "--depth", "8", "--batch-size", "16", "--device", "cpu",
                        "--no-progress"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    manifest = json.loads((out / "step" / "seed0" / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["data"]["kind"] == "image-folder-tar"
    assert manifest["data"]["source"] == "tiny.tar.gz" and str(tmp_path) not in json.dumps(manifest)


# ----------------------------------------------------------------------------- hostile trees and archives (issue 23)
@pytest.fixture(name="deadline")
def five_seconds():
    """Fail a test that blocks (a FIFO read) after 5 s instead of hanging the suite."""
    with deadline(5):
        yield


def _tar(path, tree, extra=()):
    """A .tar.gz of ``tree`` (under its folder name; None: none) plus ``extra`` members: (name, bytes or TarInfo)."""
    with tarfile.open(path, "w:gz") as tar:
        if tree is not None:
            tar.add(tree, arcname=tree.name)
        for name, content in extra:
            info = content if isinstance(content, tarfile.TarInfo) else tarfile.TarInfo(name)
            info.name = name
            if isinstance(content, bytes):
                info.size = len(content)
            tar.addfile(info, io.BytesIO(content) if isinstance(content, bytes) else None)
    return path


def _no_decoding(monkeypatch):
    def decode(name, raw):
        raise AssertionError(f"{name} was decoded")
    monkeypatch.setattr(data, "_decode_image", decode)


def test_constant_images_are_refused_before_the_cache_is_written(tmp_path):
    """Item 5: every pixel 7 gave exit 0 (std 4e-8 from E[x²]−E[x]² rounding passed the std > 0 test)."""
    seven = {"x_train": np.full((20, 32, 32, 3), 7, np.uint8), "y_train": np.arange(20) % 10,
             "x_test": np.full((10, 32, 32, 3), 7, np.uint8), "y_test": np.arange(10)}
    tree = write_image_folder(tmp_path / "seven", seven)
    with pytest.raises(DataError, match="constant .*channel 0 is 7 everywhere"):
        load_image_folder(tree, cache_dir=tmp_path / "cache", progress=False)
    assert not (tmp_path / "cache").exists()


def test_a_fifo_in_the_tree_is_refused_not_read(tree, deadline):
    """Item 6: reading a FIFO named like an image blocked forever."""
    os.mkfifo(tree / "train" / "cat" / "f.png")
    with pytest.raises(DataError, match=r"cifar: train/cat/f\.png: not an image file; train/<class>/ may hold only"):
        load_image_folder(tree, cache_dir=None, progress=False)


@pytest.mark.parametrize("target", ["outside.png", "/dev/zero"])
def test_links_that_leave_the_tree_are_refused(tree, tmp_path, target):
    """Item 6: links were followed wherever they led (to /dev/zero: read until MemoryError)."""
    if target == "outside.png":
        (tmp_path / target).write_bytes(_png())
        target = tmp_path / target
    (tree / "train" / "cat" / "z.png").symlink_to(target)
    with pytest.raises(DataError, match=r"train/cat/z\.png: a symbolic link to .*, outside the tree"):
        load_image_folder(tree, cache_dir=None, progress=False)


def test_links_inside_the_tree_are_followed(tree, small40):
    """Item 6/20: a linked image and a linked class folder that stay inside the tree are read through the link."""
    (tree / "store").mkdir()
    (tree / "train" / "cat").rename(tree / "store" / "cat")
    (tree / "train" / "cat").symlink_to(tree / "store" / "cat")  # before: "train/cat/: empty class folder"
    first = sorted((tree / "test" / "dog").iterdir())[0]
    (tree / "test" / "dog" / "link.png").symlink_to(first)
    got = load_image_folder(tree, cache_dir=None, progress=False)
    assert len(got.y_train) == 40 and len(got.y_test) == 21


def test_a_class_folder_linked_outside_the_tree_is_named(tree, tmp_path):
    """Item 20: a linked class folder read "empty class folder"."""
    (tree / "train" / "cat").rename(tmp_path / "elsewhere")
    (tree / "train" / "cat").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(DataError, match=r"train/cat: a symbolic link to .*elsewhere, outside the tree"):
        load_image_folder(tree, cache_dir=None, progress=False)


def test_an_oversized_file_is_refused_without_reading_it(tree):
    """Item 6: each file is bounded (a 32×32 image file is a few KiB); a sparse 2 MiB file is not read."""
    with open(tree / "train" / "cat" / "big.png", "wb") as f:
        f.truncate(2 << 20)
    with pytest.raises(DataError, match=r"train/cat/big\.png: not an image file; .* at most 1 MiB"):
        load_image_folder(tree, cache_dir=None, progress=False)


def test_a_tar_is_streamed_and_ignored_members_are_never_read(tree, tmp_path, monkeypatch):
    """Item 7: every member was read into memory, a 1 GiB README included; now only image members are read."""
    src = _tar(tmp_path / "t.tar.gz", tree, [("cifar/README", bytes(3 << 20)), ("cifar/train/.hidden.png", b"x")])
    read = []
    extractfile = tarfile.TarFile.extractfile
    monkeypatch.setattr(tarfile.TarFile, "extractfile", lambda self, m: read.append(m.name) or extractfile(self, m))
    got = load_image_folder(src, cache_dir=None, progress=False)
    assert len(got.y_train) == 40
    assert len(read) == 60 and all(name.endswith(".png") and "/." not in name for name in read)


def test_an_oversized_tar_member_is_refused_by_its_header(tree, tmp_path, monkeypatch):
    """Item 7: an image member larger than the bound is named from its header, never read."""
    src = _tar(tmp_path / "t.tar.gz", tree, [("cifar/train/cat/big.png", bytes(2 << 20))])
    read = []
    extractfile = tarfile.TarFile.extractfile
    monkeypatch.setattr(tarfile.TarFile, "extractfile", lambda self, m: read.append(m.name) or extractfile(self, m))
    with pytest.raises(DataError, match=r"t\.tar\.gz: train/cat/big\.png: not an image file; .* at most 1 MiB"):
        load_image_folder(src, cache_dir=None, progress=False)
    assert "cifar/train/cat/big.png" not in read


def _png_header(width, height):
    """A PNG signature and IHDR declaring ``width``×``height`` RGB, and no pixels."""
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + \
        chunk(b"IEND", b"")


@pytest.mark.parametrize("side", [10_000, 20_000])
def test_a_decompression_bomb_header_is_one_line_naming_the_file(tree, side):
    """Item 8: 20000×20000 raised PIL's DecompressionBombError traceback."""
    (tree / "train" / "cat" / "bomb.png").write_bytes(_png_header(side, side))
    with pytest.raises(DataError, match=r"train/cat/bomb\.png: .*expected a 32×32") as err:
        load_image_folder(tree, cache_dir=None, progress=False)
    assert "\n" not in str(err.value)


def test_duplicate_tar_members_are_read_as_tar_would_extract_them(tree, tmp_path):
    """Item 9: members x and ./x crashed sorting (TypeError); now the last one wins, as with ``tar -x``."""
    first = sorted((tree / "train" / "cat").iterdir())[0]
    src = tmp_path / "dup.tar"
    with tarfile.open(src, "w") as tar:
        tar.add(tree, arcname="cifar")
        tar.add(first, arcname=f"./cifar/train/cat/{first.name}")
    assert len(load_image_folder(src, cache_dir=None, progress=False).y_train) == 40


def decoded_once(tmp_path, small40):
    """``small40`` as the archive ``c.tar.gz``, loaded once: (archive, cache folder, arrays, the cache's .npz)."""
    src = write_image_folder(tmp_path / "c", small40, archive="tar.gz")
    cache = tmp_path / "cache"
    first = load_image_folder(src, cache_dir=cache, progress=False)
    (npz,) = cache.glob("image-folder-*.npz")
    return src, cache, first, npz


def test_a_truncated_cache_is_rebuilt_with_a_notice(tmp_path, small40, capsys):
    """Item 16: a truncated cache .npz raised BadZipFile on every later run."""
    src, cache, first, npz = decoded_once(tmp_path, small40)
    npz.write_bytes(npz.read_bytes()[: npz.stat().st_size // 2])
    assert load_image_folder(src, cache_dir=cache, progress=False).sha256 == first.sha256
    assert "truncated or damaged" in capsys.readouterr().err
    assert load_image_folder(src, cache_dir=cache, progress=False).sha256 == first.sha256
    assert capsys.readouterr().err == "", "rebuilt: the third load reads the cache silently"


def test_a_cache_holding_other_arrays_is_rebuilt_with_a_notice(tmp_path, small40, capsys):
    """Item 16: a cache replaced by other valid arrays was used silently (n_train 320 instead of 201)."""
    src, cache, _, npz = decoded_once(tmp_path, small40)
    other = make_synthetic(n_train=32, n_test=10, seed=9)
    np.savez(npz, **{k: getattr(other, k) for k in ("x_train", "y_train", "x_test", "y_test")})
    assert len(load_image_folder(src, cache_dir=cache, progress=False).y_train) == 40
    assert "rebuilding the cache from c.tar.gz" in capsys.readouterr().err


def test_an_unwritable_cache_folder_is_one_line_and_holds_nothing(tree, tmp_path, monkeypatch):
    """Item 16: a read-only --data-root gave an OSError traceback after a full decode; now it is one line."""
    (tmp_path / "afile").write_text("")
    with pytest.raises(DataError, match=r"cannot write the cache at .*afile/cache/image-folder-.*; free space or "
                                        r"choose another --data-root"):
        load_image_folder(tree, cache_dir=tmp_path / "afile" / "cache", progress=False)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")
    # as root, a chmod would not stop the writes: the temporary file's open fails as on a read-only mount
    monkeypatch.setattr(runfolder, "open", read_only, raising=False)
    with pytest.raises(DataError, match=r"cannot write the cache at .*\(Read-only file system\)"):
        load_image_folder(tree, cache_dir=tmp_path / "cache", progress=False)
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_full_disk_while_writing_the_cache_is_one_line_and_leaves_no_temp_file(tree, tmp_path, monkeypatch):
    """Item 16: ENOSPC while writing the cache was an OSError traceback."""
    def full(f, **arrays):
        f.write(b"half a cache")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(np, "savez", full)
    with pytest.raises(DataError, match=r"cannot write the cache at .*\(No space left on device\); free space or "
                                        r"choose another --data-root"):
        load_image_folder(tree, cache_dir=tmp_path / "cache", progress=False)
    assert list((tmp_path / "cache").iterdir()) == []


def test_stale_temp_files_of_the_cache_are_removed(tree, tmp_path):
    """Item 16: a kill -9 during the cache write left .image-folder-*.npz.*.tmp behind forever; now one untouched for
    an hour goes (a fresh one may be another process's write in progress)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    old = cache / f".image-folder-a.npz.{os.getpid()}.k2j4m7xa.tmp"
    fresh = cache / ".image-folder-b.npz.999999999.x8_qz3ab.tmp"
    for p in (old, fresh):
        p.write_bytes(b"half a cache")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    load_image_folder(tree, cache_dir=cache, progress=False)
    assert not old.exists() and fresh.exists()


def test_a_non_utf8_file_name_is_named(tree):
    """Item 20: a file name that is not UTF-8 was not named (UnicodeEncodeError)."""
    with open(os.path.join(os.fsencode(tree / "train" / "cat"), b"\xff.png"), "wb") as f:
        f.write(b"not a png")
    with pytest.raises(DataError, match=r"train/cat/\\xff\.png: not a readable PNG") as err:
        load_image_folder(tree, cache_dir=None, progress=False)
    str(err.value).encode("utf-8")  # printable


def test_appledouble_entries_beside_the_tree_in_an_archive_are_ignored(tree, tmp_path):
    """Item 20: an AppleDouble ._cifar entry beside the tree read "the train/ split is missing"."""
    src = _tar(tmp_path / "mac.tar.gz", tree, [("._cifar", b"\0\5\26\7"), (".DS_Store", b"\0")])
    assert len(load_image_folder(src, cache_dir=None, progress=False).y_train) == 40


def test_a_batch_larger_than_the_tree_is_refused_before_decoding_or_caching(tree, tmp_path, monkeypatch):
    """Item 21: a refused oversized batch still wrote a cache (the check came after the decode)."""
    _no_decoding(monkeypatch)
    with pytest.raises(DataError, match=r"batch_size \(--batch-size\) 41 exceeds the 40 training images of cifar"):
        load_cifar10(str(tree), root=tmp_path / "root", progress=False, batch_size=41)
    assert not (tmp_path / "root").exists()


# ----------------------------------------------------------------------------- issue 41 (security) and issue 38
def _counting_extractfile(monkeypatch):
    """The names of the tar members read, in order (tarfile's extractfile counted)."""
    read = []
    extractfile = tarfile.TarFile.extractfile
    monkeypatch.setattr(tarfile.TarFile, "extractfile", lambda self, m: read.append(m.name) or extractfile(self, m))
    return read


def test_a_small_tar_gz_of_many_large_bad_images_is_refused_at_the_first(tmp_path, monkeypatch):
    """Issue 41 item 1: every member named like an image (up to 1 MiB each) was read into memory before any was
    checked, so 32 zero-filled 1 MiB members in a 34 KiB .tar.gz were all held at once.  Now each is checked as it
    streams: the peak of Python's allocations is a few copies of one member's bound (tarfile's stream buffers
    copy it), whatever the number of members."""
    import tracemalloc

    n = 32
    zeros = [(f"cifar/train/cat/{i:05d}.png", bytes(data.MAX_IMAGE_BYTES)) for i in range(n)]
    src = _tar(tmp_path / "bomb.tar.gz", None, [*zeros, ("cifar/test/cat/0.png", _png())])
    assert src.stat().st_size < n * data.MAX_IMAGE_BYTES / 100, "small40: about 1,000× amplification"
    read = _counting_extractfile(monkeypatch)
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=r"bomb\.tar\.gz: train/cat/00000\.png: not a readable PNG"):
            load_image_folder(src, cache_dir=None, progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * data.MAX_IMAGE_BYTES, f"peak {peak / 2**20:.1f} MiB for {n} members of 1 MiB"
    assert read == ["cifar/train/cat/00000.png"], "refused at the first bad image, the others never read"


def _swap_after(monkeypatch, step, swap):
    """Call ``swap()`` right after each call of ``step`` in :func:`load_image_folder` (``file_hash``: after the
    archive's sha256 is computed, before it is read)."""
    done = getattr(data, step)

    def then_swap(*args, **kwargs):
        result = done(*args, **kwargs)
        swap()
        return result
    monkeypatch.setattr(data, step, then_swap)


def _refusal(load) -> str:
    """The DataError line of ``load()``, or "" if it loaded."""
    try:
        load()
    except DataError as err:
        return str(err)
    return ""


@pytest.mark.parametrize("step", ["file_hash"])
def test_an_archive_swapped_between_hashing_and_decoding_cannot_seal_a_cache_for_other_images(tmp_path, small40,
                                                                                             monkeypatch, step):
    """Issue 41 item 2: the archive's sha256 was computed, then the file read again to decode it: swapped between the
    two reads and put back, it left a cache named and sealed for the original that held the other's images."""
    src = write_image_folder(tmp_path / "c", small40, archive="tar.gz")
    other = write_image_folder(tmp_path / "o", make_synthetic(n_train=40, n_test=20, seed=8), archive="tar.gz")
    want = load_image_folder(src, cache_dir=None, progress=False)
    original = src.read_bytes()
    cache = tmp_path / "cache"
    with monkeypatch.context() as patch:
        _swap_after(patch, step, lambda: src.write_bytes(other.read_bytes()))
        refused = _refusal(lambda: load_image_folder(src, cache_dir=cache, progress=False))
    src.write_bytes(original)
    got = load_image_folder(src, cache_dir=cache, progress=False)
    np.testing.assert_array_equal(got.x_train, want.x_train)
    assert got.sha256 == want.sha256
    assert re.fullmatch(r"c\.tar\.gz changed while it was read .*run again.*", refused), refused


def _png_16bit_rgb(rgb16, text_first=False):
    """A 16-bit-per-channel RGB PNG (which Pillow opens as mode RGB) of the uint16 image ``rgb16`` (H, W, 3); with
    ``text_first``, a tEXt chunk before its IHDR (against the PNG spec, but Pillow reads it)."""
    h, w, _ = rgb16.shape

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    rows = b"".join(b"\0" + row.astype(">u2").tobytes() for row in rgb16)
    return (b"\x89PNG\r\n\x1a\n" + (chunk(b"tEXt", b"k\0v") if text_first else b"")
            + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def test_a_16_bit_rgb_png_is_refused_not_cut_to_its_high_byte(tree):
    """Issue 41 item 17: Pillow reports a 16-bit RGB PNG as mode RGB and kept the high byte of each value."""
    rgb16 = np.random.default_rng(0).integers(0, 2**16, size=(32, 32, 3)).astype(np.uint16)
    raw = _png_16bit_rgb(rgb16)
    with Image.open(io.BytesIO(raw)) as im:
        assert im.mode == "RGB" and np.array_equal(np.asarray(im), (rgb16 >> 8).astype(np.uint8)), "what Pillow does"
    (tree / "train" / "cat" / "deep.png").write_bytes(raw)
    with pytest.raises(DataError, match=r"train/cat/deep\.png: a 32×32 PNG of mode RGB;16B; expected a 32×32 8-bit"):
        load_image_folder(tree, cache_dir=None, progress=False)
    (tree / "train" / "cat" / "deep.png").write_bytes(_png_16bit_rgb(rgb16, text_first=True))
    with pytest.raises(DataError, match=r"deep\.png: a 32×32 PNG of mode RGB;16B"):
        load_image_folder(tree, cache_dir=None, progress=False)


def test_an_image_folder_without_pillow_is_one_line_naming_the_extra(tree, monkeypatch):
    """Issue 38: without Pillow, --data <an image folder> gave a ModuleNotFoundError traceback."""
    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(DataError, match=r"^--data cifar: an image folder needs Pillow, which is not installed; "
                                        r"pip install 'explr-book\[cifar10\]'$"):
        load_image_folder(tree, cache_dir=None, progress=False)




@pytest.mark.parametrize("compression", ["bz2", "lzma"])
def test_a_tar_compressed_otherwise_is_read_as_tarfiles_r_star_would(tmp_path, small40, compression):
    """A ``.tar`` that is bzip2- or xz-compressed is recognised by its magic bytes, as tarfile's ``r|*`` does."""
    plain = write_image_folder(tmp_path / "t", small40, archive="tar")
    packed = tmp_path / "packed" / "t.tar"
    packed.parent.mkdir()
    packed.write_bytes(__import__(compression).compress(plain.read_bytes()))
    assert packed.read_bytes()[:3] != plain.read_bytes()[:3]
    got = load_image_folder(packed, cache_dir=None, progress=False)
    np.testing.assert_array_equal(got.x_train, load_image_folder(plain, cache_dir=None, progress=False).x_train)


def test_a_bzip2_bomb_in_a_tar_is_skipped_in_bounded_memory(tree, tmp_path):
    """tarfile's own ``r|*`` inflates each 10 KiB it reads whole: a hidden 64 MiB member of zeros, a few hundred
    bytes of bzip2, was held at once (190 MiB under tracemalloc) while it was skipped; each compression is read in
    bounded chunks instead."""
    import tracemalloc

    src = tmp_path / "bomb.tar"
    with tarfile.open(src, "w:bz2") as tar:
        tar.add(tree, arcname="cifar")
        info = tarfile.TarInfo("cifar/.zeros")
        info.size = 64 << 20
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    tracemalloc.start()
    try:
        assert len(load_image_folder(src, cache_dir=None, progress=False).y_train) == 40
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"peak {peak / 2**20:.1f} MiB"


def test_a_truncated_tarball_is_refused(tmp_path, small40):
    src = write_image_folder(tmp_path / "t", small40, archive="tar.gz")
    src.write_bytes(src.read_bytes()[: len(src.read_bytes()) // 2])
    with pytest.raises(DataError, match=r"t\.tar\.gz: not a readable tar archive"):
        load_image_folder(src, cache_dir=None, progress=False)


def test_an_archive_that_is_not_gzip_is_one_line(tmp_path):
    """Item 20: a .tar.gz that is not gzip got a 5-line message (one line per compression tried)."""
    src = tmp_path / "bad.tar.gz"
    src.write_bytes(b"hello\nworld\n" * 100)
    with pytest.raises(DataError, match="bad.tar.gz: not a readable tar archive") as err:
        load_image_folder(src, cache_dir=None, progress=False)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- headers that tarfile would hold whole
