"""Image-folder trees and tarballs as CIFAR-10 sources: decoded once, cached by sha256, bad trees refused in one line.

Every tree here is generated in a temporary folder; nothing needs the shared CIFAR-10 files.
"""
import io
import json
import subprocess
import sys
import tarfile
import time

import numpy as np
import pytest
from PIL import Image

from explr.cifar10.data import CLASSES, DataError, load_cifar10, load_image_folder, make_synthetic, write_image_folder


@pytest.fixture(scope="module")
def small():
    return make_synthetic(n_train=40, n_test=20, seed=3)


@pytest.fixture()
def tree(tmp_path, small):
    return write_image_folder(tmp_path / "cifar", small, fmt="png")


def test_png_tree_and_its_tarballs_give_the_original_pixels_in_sorted_class_order(tmp_path, small):
    for archive in (None, "tar", "tar.gz", "tgz"):
        src = write_image_folder(tmp_path / f"tree-{archive}", small, fmt="png", archive=archive)
        got = load_cifar10(str(src), root=tmp_path / "root", progress=False)
        order = np.argsort(small.y_train, kind="stable")  # class-major, then file name (= original index)
        np.testing.assert_array_equal(got.x_train, small.x_train[order])
        np.testing.assert_array_equal(got.y_train, small.y_train[order])
        assert got.y_test.tolist() == sorted(small.y_test.tolist())
        assert got.kind == ("image-folder" if archive is None else "image-folder-tar")
        d = got.describe()
        assert d["source"] == src.name and str(tmp_path) not in json.dumps(d), "no machine path in the manifest"
        assert d["files"][src.name].startswith("sha256:")


def test_jpeg_tree_decodes_close_to_the_pixels(tmp_path, small):
    src = write_image_folder(tmp_path / "jpg", small, fmt="jpg")
    got = load_image_folder(src, cache_dir=None, progress=False)
    order = np.argsort(small.y_train, kind="stable")
    want = small.x_train[order].astype(int)
    err = np.abs(got.x_train.astype(int) - want).mean()
    other = np.abs(got.x_train.astype(int) - np.roll(want, 1, axis=0)).mean()  # each decoded vs another image
    assert 0 < err < 0.6 * other, "lossy, but each file decodes to its own image"


def test_a_tree_under_one_top_folder_in_the_archive_is_found(tmp_path, small):
    src = write_image_folder(tmp_path / "nested", small, archive="tar.gz")  # arcname = "nested/"
    with tarfile.open(src) as tar:
        assert all(n.startswith("nested") for n in tar.getnames())
    assert len(load_image_folder(src, cache_dir=None, progress=False).y_train) == 40


def test_second_load_comes_from_the_cache_keyed_by_sha256(tmp_path, small):
    src = write_image_folder(tmp_path / "c", small, archive="tar.gz")
    cache = tmp_path / "cache"
    first = load_image_folder(src, cache_dir=cache, progress=False)
    files = list(cache.glob("image-folder-*.npz"))
    assert len(files) == 1 and first.files[src.name].removeprefix("sha256:") in files[0].name
    assert not list(cache.glob("*.tmp")) and (files[0].stat().st_mode & 0o044) == 0o044, "readable, no leftovers"
    t0 = time.perf_counter()
    again = load_image_folder(src, cache_dir=cache, progress=False)
    assert time.perf_counter() - t0 < 2.0
    assert again.sha256 == first.sha256
    files[0].write_bytes(b"garbage")  # a damaged cache is rebuilt, not trusted
    assert load_image_folder(src, cache_dir=cache, progress=False).sha256 == first.sha256


def _png(mode="RGB", size=(32, 32)):
    buf = io.BytesIO()
    Image.new(mode, size).save(buf, format="PNG")
    return buf.getvalue()


BAD_TREES = {
    "missing split": (lambda r: __import__("shutil").rmtree(r / "test"), "test/ split is missing"),
    "empty class folder": (lambda r: [p.unlink() for p in (r / "train" / "cat").iterdir()], r"train/cat/: empty"),
    "unknown class folder": (lambda r: (r / "train" / "unicorn").mkdir(), "unknown class folder 'unicorn'"),
    "non-image file": (lambda r: (r / "train" / "cat" / "notes.txt").write_text("hi"), r"notes\.txt: not an image"),
    "unreadable image": (lambda r: (r / "train" / "cat" / "broken.png").write_bytes(b"\x89PNG garbage"),
                         r"broken\.png: not a readable"),
    "wrong size": (lambda r: (r / "train" / "cat" / "big.png").write_bytes(_png(size=(33, 32))), r"big\.png: image size 33"),
    "wrong mode": (lambda r: (r / "test" / "dog" / "grey.png").write_bytes(_png("L")), r"grey\.png: image mode L"),
    "different classes": (lambda r: __import__("shutil").rmtree(r / "test" / "cat"), "different classes"),
    "file among class folders": (lambda r: (r / "train" / "stray.png").write_bytes(_png()), r"stray\.png: a file where"),
}


@pytest.mark.parametrize("case", list(BAD_TREES))
def test_bad_trees_are_refused_with_a_message_naming_the_file(tree, case):
    damage, message = BAD_TREES[case]
    damage(tree)
    with pytest.raises(DataError, match=message):
        load_image_folder(tree, cache_dir=None, progress=False)


def test_a_truncated_tarball_is_refused(tmp_path, small):
    src = write_image_folder(tmp_path / "t", small, archive="tar.gz")
    src.write_bytes(src.read_bytes()[: len(src.read_bytes()) // 2])
    with pytest.raises(DataError, match="t.tar.gz: not a readable tar archive, or truncated"):
        load_image_folder(src, cache_dir=None, progress=False)


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
def test_cli_trains_on_a_tarball_and_records_it_by_name(tmp_path, small):
    src = write_image_folder(tmp_path / "tiny", small, fmt="png", archive="tar.gz")
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-m", "explr.cifar10", "--data", str(src), "--data-root", str(tmp_path / "root"),
                        "--out", str(out), "--epochs", "1", "--depth", "8", "--batch-size", "16", "--device", "cpu",
                        "--no-progress"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    manifest = json.loads((out / "step" / "seed0" / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["data"]["kind"] == "image-folder-tar"
    assert manifest["data"]["source"] == "tiny.tar.gz" and str(tmp_path) not in json.dumps(manifest)
