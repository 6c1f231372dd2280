"""CIFAR-10 for the training engine: loading (download, python batches, ``.npz``) and a device-resident sampler.

Sources accepted by :func:`load_cifar10` (the CLI's ``--data``):

* ``"auto"`` -- the real CIFAR-10 (Krizhevsky 2009).  If ``<root>/cifar-10-batches-py`` is absent, the
  archive is downloaded with torchvision's ``download_url`` into ``root`` and md5-checked before it is
  extracted; every python batch is md5-checked against the official table (:data:`CIFAR10_FILES_MD5`)
  *before* it is unpickled, and the unpickler only accepts the few numpy globals an array needs.
* a directory holding ``cifar-10-batches-py/`` or the batch files themselves (same checks);
* a ``.npz`` file with ``x_train, y_train, x_test, y_test`` (images uint8 ``(N, 32, 32, 3)`` HWC RGB,
  labels integers in 0..9), read with ``np.load(allow_pickle=False)``;
* an image-folder tree ``train/<class>/*`` and ``test/<class>/*`` (32×32 RGB PNG or JPEG files, class
  folders named after CIFAR-10's classes, labels in sorted class-name order), or a ``.tar``, ``.tar.gz``
  or ``.tgz`` holding one (at its top level or under one folder).  It is decoded once with Pillow and
  the uint8 arrays are cached in ``<data_root>/cache/`` under the source's sha256, so later runs load
  in about a second;
* ``"synthetic"`` -- a small generated, learnable stand-in (tests, smoke runs).

:class:`DeviceData` keeps the whole dataset on the training device as uint8 and produces normalised,
augmented batches there (random 32×32 crop of the zero-padded 40×40 image, horizontal flip with
probability ½, a fresh permutation every epoch -- the standard CIFAR recipe of He et al. 2016), with
one gather per batch and no per-image Python.  The randomness of epoch ``e`` is drawn on the CPU
from ``(seed, e)`` alone, so a run is reproducible across devices and resumes exactly.
"""
from __future__ import annotations

import hashlib
import io
import os
import pickle
import sys
import tarfile
import zipfile
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from .files import atomic_write

__all__ = [
    "CLASSES",
    "CIFAR10_URL",
    "CIFAR10_ARCHIVE_MD5",
    "CIFAR10_FILES_MD5",
    "CifarArrays",
    "DeviceData",
    "EpochPlan",
    "download_cifar10",
    "load_cifar10",
    "load_image_folder",
    "load_npz",
    "make_synthetic",
    "read_cifar_batches",
    "write_cifar_batches",
    "write_image_folder",
    "write_npz",
]

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR10_ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_FOLDER = "cifar-10-batches-py"
#: md5 of each official python batch (the same table torchvision checks).
CIFAR10_FILES_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}
TRAIN_FILES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5")
TEST_FILES = ("test_batch",)
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")

HOW_TO_GET = (
    "Get CIFAR-10 with `--data auto` (downloads {url} into --data-root, md5 {md5}), or download and extract "
    "that archive yourself and pass its folder, or pass a .npz with uint8 arrays x_train (N,32,32,3), "
    "y_train (N,), x_test (M,32,32,3), y_test (M,), or an image-folder tree train/<class>/*.png|jpg and "
    "test/<class>/*.png|jpg (or a .tar/.tar.gz/.tgz of it)."
).format(url=CIFAR10_URL, md5=CIFAR10_ARCHIVE_MD5)


class DataError(ValueError):
    """The data is missing or not what was expected; the message says how to get it."""


@dataclass(frozen=True)
class CifarArrays:
    """CIFAR-10 in memory: images uint8 ``(N, H, W, 3)`` RGB, labels int64 in 0..9.

    ``source`` says where it came from (a file or folder *name*, never the machine's absolute path),
    ``kind`` its format, ``sha256`` is a checksum of the four arrays' bytes (the same
    for the same pixels, whatever the file format), ``files`` the per-file checksums that were verified.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    source: str
    kind: str
    files: dict = field(default_factory=dict)
    sha256: str = ""

    def __post_init__(self):
        if not self.sha256:
            object.__setattr__(self, "sha256", arrays_sha256(self.x_train, self.y_train, self.x_test, self.y_test))

    @cached_property
    def channel_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel mean and standard deviation of the training images in [0, 1] units (for normalisation).

        Raises :class:`DataError` if a channel is constant (std 0): nothing to learn from it, and
        normalising would divide by zero.
        """
        flat = self.x_train.reshape(-1, self.x_train.shape[-1])
        sums, sq = np.zeros(flat.shape[1]), np.zeros(flat.shape[1])
        for chunk in np.array_split(flat, max(1, len(flat) // 4_000_000)):
            c64 = chunk.astype(np.float64) / 255.0
            sums += c64.sum(0)
            sq += np.square(c64).sum(0)
        mean = sums / len(flat)
        std = np.sqrt(np.maximum(sq / len(flat) - mean**2, 0.0))
        if not np.all(std > 0):
            constant = [int(c) for c in np.flatnonzero(~(std > 0))]
            raise DataError(f"{self.source}: the training images are constant in channel(s) {constant} (std 0): "
                            f"nothing to learn, and normalising would divide by zero. {HOW_TO_GET}")
        return mean, std

    def describe(self) -> dict:
        """JSON-able summary for a run's manifest."""
        return {
            "source": self.source,
            "kind": self.kind,
            "sha256": self.sha256,
            "files": dict(self.files),
            "n_train": int(len(self.y_train)),
            "n_test": int(len(self.y_test)),
            "image_shape": list(self.x_train.shape[1:]),
        }


def arrays_sha256(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def _file_hash(path, algorithm="md5") -> str:
    h = hashlib.new(algorithm, usedforsecurity=False) if algorithm == "md5" else hashlib.new(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------- validation
def _check_split(name: str, x, y, source: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[1:] != (32, 32, 3):
        raise DataError(
            f"{source}: x_{name} must be uint8 of shape (N, 32, 32, 3) (HWC, RGB); got {x.dtype} {x.shape}. {HOW_TO_GET}"
        )
    if not np.issubdtype(y.dtype, np.integer) or y.ndim != 1 or len(y) != len(x):
        raise DataError(
            f"{source}: y_{name} must be integer labels of shape ({len(x)},); got {y.dtype} {y.shape}. {HOW_TO_GET}"
        )
    if len(y) == 0:
        raise DataError(f"{source}: the {name} split is empty. {HOW_TO_GET}")
    if y.min() < 0 or y.max() > 9:
        raise DataError(f"{source}: y_{name} must hold labels in 0..9; found {int(y.min())}..{int(y.max())}")
    return x, y.astype(np.int64)


# ----------------------------------------------------------------------------- .npz
def load_npz(path) -> CifarArrays:
    """Read ``x_train, y_train, x_test, y_test`` from a ``.npz`` (no pickles: ``allow_pickle=False``)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"--data {path}: no such file. {HOW_TO_GET}")
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":
            raise DataError(f"{path}: not a readable .npz file (not a zip archive). {HOW_TO_GET}")
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in NPZ_KEYS if k not in f.files]
            if missing:
                raise DataError(
                    f"{path}: the .npz lacks {missing}; expected the arrays {list(NPZ_KEYS)} "
                    f"(it holds {sorted(f.files)}). {HOW_TO_GET}"
                )
            arrays = {k: f[k] for k in NPZ_KEYS}
    except DataError:
        raise
    except ValueError as err:  # object arrays need pickle, which is refused
        raise DataError(f"{path}: holds arrays that need pickle to load, which is refused ({err}). {HOW_TO_GET}") from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as err:  # truncated or damaged
        raise DataError(f"{path}: not a readable .npz file, truncated or damaged ({err}). {HOW_TO_GET}") from None
    x_train, y_train = _check_split("train", arrays["x_train"], arrays["y_train"], str(path))
    x_test, y_test = _check_split("test", arrays["x_test"], arrays["y_test"], str(path))
    return CifarArrays(x_train, y_train, x_test, y_test, source=path.name, kind="npz",
                       files={path.name: "sha256:" + _file_hash(path, "sha256")})


def write_npz(path, arrays: CifarArrays | dict) -> Path:
    """Write the four arrays in the ``.npz`` schema :func:`load_npz` reads (``savez_compressed``)."""
    get = arrays.get if isinstance(arrays, dict) else lambda k: getattr(arrays, k)
    path = Path(path)
    np.savez_compressed(path, **{k: np.asarray(get(k)) for k in NPZ_KEYS})
    return path


# ----------------------------------------------------------------------------- CIFAR's python batches
class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, bytes/str and numpy arrays -- nothing that can run code."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),  # how Python 3 writes bytes under pickle protocol 2 (str → bytes, harmless)
    }

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load the global {module}.{name} from a CIFAR batch")
        return super().find_class(module, name)


def _get(d: dict, key: str):
    """CIFAR's batches were pickled by Python 2: keys are ``'data'`` (latin1) or ``b'data'``."""
    if key in d:
        return d[key]
    if key.encode() in d:
        return d[key.encode()]
    raise KeyError(key)


def read_cifar_batches(folder, md5: dict | None = None) -> CifarArrays:
    """Read CIFAR-10's python batches from ``folder``, md5-checking each file before unpickling it.

    ``md5`` maps file name → md5 (default: the official :data:`CIFAR10_FILES_MD5`; tests pass the
    checksums of the small files they generate).  Rows of ``data`` are 3072 bytes: the 1024 red,
    then green, then blue values of a 32×32 image in row-major order; they are returned as HWC.
    """
    folder = Path(folder)
    md5 = CIFAR10_FILES_MD5 if md5 is None else md5
    names = TRAIN_FILES + TEST_FILES
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise DataError(f"{folder}: the CIFAR-10 python batches {missing} are missing. {HOW_TO_GET}")
    out, files = {}, {}
    for n in names:
        digest = _file_hash(folder / n, "md5")
        if md5.get(n) != digest:
            raise DataError(
                f"{folder / n}: md5 {digest} does not match the expected {md5.get(n)}; the file is corrupt or "
                f"not the official CIFAR-10 (it was not unpickled). Delete it and download again. {HOW_TO_GET}"
            )
        files[n] = "md5:" + digest
        with open(folder / n, "rb") as f:
            try:
                d = _ArrayUnpickler(f, encoding="latin1").load()
                data, labels = np.asarray(_get(d, "data")), np.asarray(_get(d, "labels"))
            except (pickle.UnpicklingError, KeyError, TypeError, EOFError, AttributeError) as err:
                raise DataError(f"{folder / n}: not a CIFAR-10 python batch ({err!r}). {HOW_TO_GET}") from None
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
            raise DataError(f"{folder / n}: expected uint8 data of shape (N, 3072) and N labels; got "
                            f"{data.dtype} {data.shape} and {labels.shape}")
        out[n] = (data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels)
    x_train = np.ascontiguousarray(np.concatenate([out[n][0] for n in TRAIN_FILES]))
    y_train = np.concatenate([out[n][1] for n in TRAIN_FILES])
    x_test, y_test = np.ascontiguousarray(out["test_batch"][0]), out["test_batch"][1]
    x_train, y_train = _check_split("train", x_train, y_train, str(folder))
    x_test, y_test = _check_split("test", x_test, y_test, str(folder))
    return CifarArrays(x_train, y_train, x_test, y_test, source=folder.name, kind="cifar-python",
                       files=files)


def write_cifar_batches(folder, arrays: CifarArrays, pieces: int = 5) -> dict:
    """Write ``arrays`` in CIFAR-10's on-disk python format (``data_batch_1..5``, ``test_batch``, ``batches.meta``).

    Returns the md5 table of the written files (for :func:`read_cifar_batches`).  Used to test the
    reader without the real download.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def dump(name, x, y):
        d = {
            b"batch_label": name.encode(),
            b"labels": [int(v) for v in y],
            b"data": np.ascontiguousarray(x.transpose(0, 3, 1, 2).reshape(len(x), 3072)),
            b"filenames": [f"{name}_{i}.png".encode() for i in range(len(x))],
        }
        with open(folder / name, "wb") as f:
            pickle.dump(d, f, protocol=2)

    chunks = np.array_split(np.arange(len(arrays.y_train)), pieces)
    for name, idx in zip(TRAIN_FILES, chunks):
        dump(name, arrays.x_train[idx], arrays.y_train[idx])
    dump("test_batch", arrays.x_test, arrays.y_test)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [c.encode() for c in CLASSES], b"num_cases_per_batch": len(chunks[0])}, f, 2)
    return {n: _file_hash(folder / n, "md5") for n in TRAIN_FILES + TEST_FILES}


def download_cifar10(root, url: str = CIFAR10_URL, archive_md5: str = CIFAR10_ARCHIVE_MD5) -> Path:
    """Download the CIFAR-10 python archive into ``root`` (md5-checked) and extract it; return the batch folder.

    Uses torchvision's ``download_url`` (which skips the download if a file with the right md5 is
    already there).  Only the archive's regular files under ``cifar-10-batches-py/`` are extracted.
    """
    root = Path(root).expanduser()
    try:
        from torchvision.datasets.utils import download_url
    except ImportError:  # pragma: no cover - torchvision is in requirements.txt
        raise DataError(f"--data auto needs torchvision to download CIFAR-10 into {root}. {HOW_TO_GET}") from None
    try:
        download_url(url, str(root), CIFAR10_ARCHIVE, archive_md5)
    except Exception as err:  # network errors, or torchvision's "File not found or corrupted."
        bad = root / CIFAR10_ARCHIVE
        if bad.is_file():
            bad.unlink()  # a wrong or partial archive: never extracted, removed so that a retry downloads again
        raise DataError(
            f"could not download CIFAR-10 from {url} into {root} with md5 {archive_md5} ({err}). "
            f"If this machine is offline, copy {CIFAR10_ARCHIVE} there or use --data PATH. {HOW_TO_GET}"
        ) from None
    archive = root / CIFAR10_ARCHIVE
    with tarfile.open(archive, "r:gz") as tar:
        members = [m for m in tar.getmembers()
                   if m.isfile() and m.name.startswith(CIFAR10_FOLDER + "/") and ".." not in m.name]
        tar.extractall(root, members=members, filter="data")
    return root / CIFAR10_FOLDER


# ----------------------------------------------------------------------------- image-folder trees
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz")
SPLITS = ("train", "test")


def _is_archive(path: Path) -> bool:
    return path.name.lower().endswith(ARCHIVE_SUFFIXES)


def _is_image_folder(path: Path) -> bool:
    return path.is_dir() and any((path / s).is_dir() for s in SPLITS)


def _tree_entries_from_folder(root: Path):
    """(relative posix path, is_dir, read()) of everything under ``root``, sorted by path."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = Path(dirpath).relative_to(root)
        for d in dirnames:
            yield (rel / d).as_posix(), True, None
        for f in sorted(filenames):
            full = Path(dirpath) / f
            yield (rel / f).as_posix(), False, full.read_bytes


def _tree_entries_from_tar(path: Path):
    """Like :func:`_tree_entries_from_folder` for a tar archive, read in one sequential pass (gzip cannot seek
    cheaply); the tree may sit at the archive's top level or under one folder."""
    items = []
    try:
        with tarfile.open(path, "r:*") as tar:
            for m in tar:
                name = m.name.strip("/").removeprefix("./")
                if ".." in name.split("/"):
                    continue
                if m.isdir():
                    items.append((name, True, None))
                elif m.isfile():
                    items.append((name, False, tar.extractfile(m).read()))
    except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
        raise DataError(f"{path.name}: not a readable tar archive, or truncated ({err}). {HOW_TO_GET}") from None
    tops = {n.split("/")[0] for n, _, _ in items if n}
    prefix = next(iter(tops)) + "/" if len(tops) == 1 and not tops & set(SPLITS) else ""
    for name, is_dir, raw in sorted(items, key=lambda item: item[0]):
        if name.startswith(prefix) and name != prefix.rstrip("/"):
            yield name[len(prefix):], is_dir, (None if is_dir else (lambda raw=raw: raw))


def _decode_image(name: str, raw: bytes) -> np.ndarray:
    """One 32×32 RGB PNG/JPEG → uint8 (32, 32, 3); anything else is a :class:`DataError` naming the file."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw)) as im:
            if im.format not in ("PNG", "JPEG"):
                raise DataError(f"{name}: a {im.format} image; expected PNG or JPEG")
            if im.mode != "RGB":
                raise DataError(f"{name}: image mode {im.mode}; expected RGB (8-bit, 3 channels)")
            if im.size != (32, 32):
                raise DataError(f"{name}: image size {im.size[0]}×{im.size[1]}; expected 32×32")
            im.load()
            return np.asarray(im, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"{name}: not a readable PNG or JPEG image ({err})") from None


def _read_tree(entries, source: str, progress: bool):
    """Validate an image-folder tree and decode it; returns x_train, y_train, x_test, y_test, digest.

    ``digest`` is a sha256 over every file's relative path and bytes (sorted), so equal trees,
    wherever they are, share a cache entry.
    """
    from tqdm import tqdm

    files = {s: {} for s in SPLITS}
    for rel, is_dir, read in entries:
        parts = rel.split("/")
        if any(p.startswith(".") for p in parts) or rel in ("", "."):
            continue  # hidden files (.DS_Store, ._*) and the root itself
        if parts[0] not in SPLITS:
            continue  # other top-level content (a README, a LICENSE) is not part of the data
        split = parts[0]
        if len(parts) == 1:
            continue
        if len(parts) == 2:
            if not is_dir:
                raise DataError(f"{source}: {rel}: a file where {split}/ should hold only class folders")
            if parts[1] not in CLASSES:
                raise DataError(f"{source}: {rel}/: unknown class folder {parts[1]!r}; expected CIFAR-10's classes "
                                f"{', '.join(CLASSES)}")
            files[split].setdefault(parts[1], [])
            continue
        if len(parts) > 3:
            raise DataError(f"{source}: {rel}: nested too deep; expected {split}/<class>/<image>")
        cls = parts[1]
        if cls not in CLASSES:
            raise DataError(f"{source}: {split}/{cls}/: unknown class folder {cls!r}; expected CIFAR-10's classes "
                            f"{', '.join(CLASSES)}")
        if is_dir:
            raise DataError(f"{source}: {rel}/: a folder inside a class folder; expected only image files")
        if not parts[2].lower().endswith(IMAGE_SUFFIXES):
            raise DataError(f"{source}: {rel}: not an image file (expected {', '.join(IMAGE_SUFFIXES)})")
        files[split].setdefault(cls, []).append((rel, read))
    for split in SPLITS:
        if not files[split]:
            raise DataError(f"{source}: the {split}/ split is missing or holds no class folders; expected "
                            f"{split}/<class>/*.png|jpg. {HOW_TO_GET}")
        for cls, items in files[split].items():
            if not items:
                raise DataError(f"{source}: {split}/{cls}/: empty class folder")
    if set(files["train"]) != set(files["test"]):
        only_train = sorted(set(files["train"]) - set(files["test"]))
        only_test = sorted(set(files["test"]) - set(files["train"]))
        raise DataError(f"{source}: train/ and test/ hold different classes (only in train: {only_train or 'none'}; "
                        f"only in test: {only_test or 'none'})")
    digest = hashlib.sha256()
    total = sum(len(v) for split in SPLITS for v in files[split].values())
    out = []
    with tqdm(total=total, desc=f"decoding {source}", unit="img", file=sys.stderr, disable=not progress,
              leave=False) as bar:
        for split in SPLITS:
            xs, ys = [], []
            for cls in sorted(files[split]):
                for rel, read in sorted(files[split][cls]):
                    raw = read()
                    digest.update(rel.encode() + b"\0" + hashlib.sha256(raw).digest())
                    xs.append(_decode_image(f"{source}: {rel}", raw))
                    ys.append(CLASSES.index(cls))
                    bar.update()
            out += [np.stack(xs), np.asarray(ys, dtype=np.int64)]
    return (*out, digest.hexdigest())


def _tree_digest(root: Path) -> str:
    """The digest :func:`_read_tree` computes, without decoding (for the cache lookup of a folder)."""
    digest = hashlib.sha256()
    for split in SPLITS:
        for cls in sorted(d.name for d in (root / split).iterdir() if d.is_dir() and not d.name.startswith(".")) \
                if (root / split).is_dir() else []:
            for f in sorted(p.name for p in (root / split / cls).iterdir()
                            if p.is_file() and not p.name.startswith(".")):
                rel = f"{split}/{cls}/{f}"
                digest.update(rel.encode() + b"\0" + hashlib.sha256((root / rel).read_bytes()).digest())
    return digest.hexdigest()


def load_image_folder(path, cache_dir="data/cache", progress: bool = True) -> CifarArrays:
    """An image-folder tree or a ``.tar``/``.tar.gz``/``.tgz`` of one, decoded once and cached (module docstring).

    The cache file is ``<cache_dir>/image-folder-<sha256>.npz``, keyed by the archive's sha256 (for a
    folder: the digest of its files' paths and bytes); ``cache_dir=None`` disables it.
    """
    path = Path(path).expanduser()
    archive = path.is_file() and _is_archive(path)
    if not (archive or path.is_dir()):
        raise DataError(f"--data {path}: no such image folder or archive. {HOW_TO_GET}")
    kind = "image-folder-tar" if archive else "image-folder"
    key = _file_hash(path, "sha256") if archive else _tree_digest(path)
    cache = None if cache_dir is None else Path(cache_dir).expanduser() / f"image-folder-{key}.npz"
    if cache is not None and cache.is_file():
        try:
            with np.load(cache, allow_pickle=False) as f:
                arrays = [f[k] for k in NPZ_KEYS]
            x_train, y_train = _check_split("train", arrays[0], arrays[1], str(cache))
            x_test, y_test = _check_split("test", arrays[2], arrays[3], str(cache))
            return CifarArrays(x_train, y_train, x_test, y_test, source=path.name, kind=kind,
                               files={path.name: "sha256:" + key})
        except (DataError, OSError, ValueError, KeyError, EOFError):
            cache.unlink(missing_ok=True)  # a damaged cache is rebuilt from the source
    entries = _tree_entries_from_tar(path) if archive else _tree_entries_from_folder(path)
    x_train, y_train, x_test, y_test, digest = _read_tree(entries, path.name, progress)
    if not archive:
        key = digest
        cache = None if cache_dir is None else cache.with_name(f"image-folder-{key}.npz")
    arrays = CifarArrays(x_train, y_train, x_test, y_test, source=path.name, kind=kind,
                         files={path.name: "sha256:" + key})
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cache, lambda f: np.savez(f, **{k: getattr(arrays, k) for k in NPZ_KEYS}))
    return arrays


def write_image_folder(root, arrays: CifarArrays | dict, fmt: str = "png", archive: str | None = None) -> Path:
    """Write ``arrays`` as ``train/<class>/NNNN.<fmt>`` and ``test/<class>/NNNN.<fmt>`` (tests, examples).

    ``fmt`` is ``png`` (lossless) or ``jpg``; ``archive="tar.gz"`` (or ``"tar"``, ``"tgz"``) also packs
    the tree into ``<root>.<archive>`` and returns that path.
    """
    from PIL import Image

    get = arrays.get if isinstance(arrays, dict) else lambda k: getattr(arrays, k)
    root = Path(root)
    for split in SPLITS:
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


def load_cifar10(data="auto", root="data", md5: dict | None = None, progress: bool = True) -> CifarArrays:
    """Load CIFAR-10 from ``data``: ``"auto"``, ``"synthetic"``, a ``.npz``, a batch folder, an image-folder tree
    or an archive of one (module docstring).  ``root`` is the download folder; decoded images are cached in
    ``root/cache``."""
    if isinstance(data, CifarArrays):
        return data
    data = str(data)
    if data == "synthetic":
        return make_synthetic()
    if data == "auto":
        folder = Path(root).expanduser() / CIFAR10_FOLDER
        if not all((folder / n).is_file() for n in TRAIN_FILES + TEST_FILES):
            folder = download_cifar10(root)
        return read_cifar_batches(folder, md5)
    path = Path(data).expanduser()
    if _is_image_folder(path) or (path.is_file() and _is_archive(path)):
        return load_image_folder(path, Path(root).expanduser() / "cache", progress=progress)
    if path.is_dir():
        folder = path / CIFAR10_FOLDER if (path / CIFAR10_FOLDER).is_dir() else path
        return read_cifar_batches(folder, md5)
    if path.suffix == ".npz" or path.is_file():
        return load_npz(path)
    raise DataError(f"--data {data}: no such file or folder (expected 'auto', 'synthetic', a .npz, a folder with "
                    f"CIFAR-10's python batches, an image-folder tree or a .tar/.tar.gz/.tgz of one). {HOW_TO_GET}")


# ----------------------------------------------------------------------------- synthetic data
def make_synthetic(n_train: int = 2560, n_test: int = 512, seed: int = 0, noise: float = 40.0) -> CifarArrays:
    """A learnable CIFAR-shaped stand-in: each class is a smooth random colour pattern plus pixel noise.

    Images are uint8 ``(N, 32, 32, 3)``, labels balanced and shuffled.  For tests and smoke runs only.
    """
    for name, v in (("n_train", n_train), ("n_test", n_test)):
        if not (isinstance(v, (int, np.integer)) and v >= 1):
            raise ValueError(f"{name} must be a positive integer; got {v!r}")
    rng = np.random.default_rng(seed)
    templates = np.kron(rng.normal(size=(10, 4, 4, 3)), np.ones((1, 8, 8, 1)))  # blocky 32×32 patterns

    def split(n):
        y = rng.permutation(np.arange(n) % 10)
        x = 128 + 50 * templates[y] + noise * rng.normal(size=(n, 32, 32, 3))
        return np.clip(np.rint(x), 0, 255).astype(np.uint8), y.astype(np.int64)

    x_train, y_train = split(n_train)
    x_test, y_test = split(n_test)
    return CifarArrays(x_train, y_train, x_test, y_test, source=f"synthetic(n_train={n_train}, n_test={n_test}, "
                       f"seed={seed})", kind="synthetic")


# ----------------------------------------------------------------------------- on-device sampler
@dataclass(frozen=True)
class EpochPlan:
    """One epoch's randomness on the device: example order, crop offsets and flips (length ``steps·batch``)."""

    epoch: int
    index: torch.Tensor  # (n,) example ids, in the order they are used
    base: torch.Tensor  # (n,) pixel offset of each example's crop window in the padded uint8 store
    flip: torch.Tensor  # (n, 1) bool
    steps: int
    batch_size: int


def _epoch_seed(seed: int, epoch: int) -> int:
    return int(np.random.SeedSequence([int(seed), int(epoch), 0xC1FA]).generate_state(1, np.uint64)[0] >> 1)


class DeviceData:
    """The dataset on ``device`` as uint8, batched, augmented and normalised there.

    ``mean``/``std`` (per channel, in [0, 1] units) default to the training set's own statistics.
    Training batches: ``x = (crop_flip(x_uint8) / 255 − mean) / std``, returned as ``(B, 3, H, W)``
    in channels_last memory format (or contiguous NCHW with ``channels_last=False``), in ``dtype``.
    Each epoch uses ``steps = n_train // batch_size`` full batches (the remainder of the permutation
    is skipped, so every step has the same shape).
    """

    def __init__(self, arrays: CifarArrays, device="cpu", dtype=torch.float32, channels_last=True,
                 pad: int = 4, augment: bool = True, mean=None, std=None):
        if not (isinstance(pad, int) and pad >= 0):
            raise ValueError(f"pad must be an integer >= 0; got {pad!r}")
        self.device = torch.device(device)
        self.dtype, self.channels_last, self.pad, self.augment = dtype, channels_last, pad, augment
        x = arrays.x_train
        self.n_train, self.h, self.w, self.c = x.shape
        self.n_test = len(arrays.y_test)
        if mean is None or std is None:
            mean, std = arrays.channel_stats
        self.mean = np.asarray(mean, dtype=np.float64)
        self.std = np.asarray(std, dtype=np.float64)
        if self.mean.shape != (self.c,) or self.std.shape != (self.c,) or not np.all(self.std > 0):
            raise ValueError(f"mean and std must have {self.c} entries, std > 0; got {mean!r}, {std!r}")
        # (x/255 − mean)/std = x·scale + shift
        self._scale = torch.tensor(1.0 / (255.0 * self.std), dtype=dtype, device=self.device)
        self._shift = torch.tensor(-self.mean / self.std, dtype=dtype, device=self.device)
        p = pad
        padded = np.zeros((self.n_train, self.h + 2 * p, self.w + 2 * p, self.c), dtype=np.uint8)
        padded[:, p:p + self.h, p:p + self.w] = x
        self.hp, self.wp = self.h + 2 * p, self.w + 2 * p
        self._train = torch.from_numpy(padded).to(self.device).reshape(-1, self.c)  # one row per padded pixel
        self._y_train = torch.from_numpy(arrays.y_train).to(self.device)
        self._test = torch.from_numpy(np.ascontiguousarray(arrays.x_test)).to(self.device)
        self._y_test = torch.from_numpy(arrays.y_test).to(self.device)
        # pixel offsets inside one crop window of the padded store: rows (1, H, 1), columns (1, W)
        ar_h = torch.arange(self.h, device=self.device)
        ar_w = torch.arange(self.w, device=self.device)
        self._rows = (ar_h * self.wp).view(1, self.h, 1)
        self._cols = ar_w.view(1, self.w)
        self._cols_flipped = (self.w - 1 - ar_w).view(1, self.w)

    def steps_per_epoch(self, batch_size: int) -> int:
        if not (isinstance(batch_size, (int, np.integer)) and 1 <= batch_size <= self.n_train):
            raise ValueError(f"batch_size must be an integer in [1, n_train = {self.n_train}]; got {batch_size!r}")
        return self.n_train // batch_size

    def epoch_plan(self, seed: int, epoch: int, batch_size: int) -> EpochPlan:
        """The permutation, crop offsets and flips of ``epoch``, drawn on the CPU from ``(seed, epoch)``."""
        steps = self.steps_per_epoch(batch_size)
        n = self.n_train
        g = torch.Generator().manual_seed(_epoch_seed(seed, epoch))
        index = torch.randperm(n, generator=g)
        if self.augment:
            oy = torch.randint(0, 2 * self.pad + 1, (n,), generator=g)
            ox = torch.randint(0, 2 * self.pad + 1, (n,), generator=g)
            flip = torch.randint(0, 2, (n,), generator=g).bool()
        else:
            oy = ox = torch.full((n,), self.pad)
            flip = torch.zeros(n, dtype=torch.bool)
        base = index * (self.hp * self.wp) + oy * self.wp + ox
        dev = self.device
        return EpochPlan(epoch, index.to(dev), base.to(dev), flip.view(n, 1).to(dev), steps, batch_size)

    def _normalise(self, x_uint8: torch.Tensor) -> torch.Tensor:
        x = torch.addcmul(self._shift, x_uint8.to(self.dtype), self._scale)  # (B, H, W, C)
        x = x.permute(0, 3, 1, 2)  # NCHW view with channels_last strides
        return x if self.channels_last else x.contiguous()

    def train_batch(self, plan: EpochPlan, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch ``step`` of ``plan``: augmented, normalised images and their labels (one pixel gather)."""
        s = slice(step * plan.batch_size, (step + 1) * plan.batch_size)
        cols = torch.where(plan.flip[s], self._cols_flipped, self._cols)  # (B, W), reversed where flipped
        idx = plan.base[s].view(-1, 1, 1) + self._rows + cols.view(-1, 1, self.w)  # (B, H, W) pixel ids
        x = self._train.index_select(0, idx.view(-1)).view(-1, self.h, self.w, self.c)
        return self._normalise(x), self._y_train[plan.index[s]]

    def test_batches(self, batch_size: int = 1000):
        """The test set in order, normalised, no augmentation."""
        for i in range(0, self.n_test, batch_size):
            yield self._normalise(self._test[i:i + batch_size]), self._y_test[i:i + batch_size]
