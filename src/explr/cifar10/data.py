"""CIFAR-10 for the training engine: loading (download, python batches, ``.npz``) and a device-resident sampler.

Sources accepted by :func:`load_cifar10` (the CLI's ``--data``):

* ``"auto"`` -- the real CIFAR-10 (Krizhevsky 2009).  If ``<root>/cifar-10-batches-py`` is absent, the
  archive is downloaded with torchvision's ``download_url`` into ``root`` and md5-checked before it is
  extracted; every python batch is md5-checked against the official table (:data:`CIFAR10_FILES_MD5`)
  *before* it is unpickled, and the unpickler only accepts the few numpy globals an array needs.
* a directory holding ``cifar-10-batches-py/`` or the batch files themselves (same checks);
* a ``.npz`` file with ``x_train, y_train, x_test, y_test`` (images uint8 ``(N, 32, 32, 3)`` HWC RGB,
  labels integers in 0..9), read with ``np.load(allow_pickle=False)`` after every ``.npy`` header has
  been checked (readable, no pickle, the declared sizes within the memory available);
* an image-folder tree ``train/<class>/*`` and ``test/<class>/*`` (32×32 RGB PNG or JPEG files, class
  folders named after CIFAR-10's classes, labels in sorted class-name order), or a ``.tar``, ``.tar.gz``
  or ``.tgz`` holding one (at its top level or under one folder; the archive is streamed, and only its
  image members are read).  Only regular files of at most :data:`MAX_IMAGE_BYTES` are read, and links
  only where they stay inside the tree.  It is decoded once with Pillow and the uint8 arrays are cached
  in ``<data_root>/cache/`` under the source's sha256 (with the checksum of the arrays, verified on
  load; a damaged or mismatched cache is rebuilt), so later runs load in about a second;
* ``"synthetic"`` -- a small generated, learnable stand-in (tests, smoke runs).

Bad data is one :class:`DataError` line (a ``ValueError``: the CLI prints it and exits with code 2)
naming the file, tar member or array, and nothing is created.

:class:`DeviceData` keeps the whole dataset on the training device as uint8 and produces normalised,
augmented batches there (random 32×32 crop of the zero-padded 40×40 image, horizontal flip with
probability ½, a fresh permutation every epoch -- the standard CIFAR recipe of He et al. 2016), with
one gather per batch and no per-image Python.  The randomness of epoch ``e`` is drawn on the CPU
from ``(seed, e)`` alone, so a run is reproducible across devices and resumes exactly.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import io
import lzma
import math
import os
import pickle
import posixpath
import stat
import sys
import tarfile
import tempfile
import warnings
import zipfile
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from .files import atomic_write, remove_stale_leftovers

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

        Raises :class:`DataError` if a channel is constant (its largest uint8 value is its smallest: exact,
        where a spread computed in floating point is rounding noise): nothing to learn from it, and
        normalising would divide by (almost) zero.
        """
        lo, hi = self.x_train.min(axis=(0, 1, 2)), self.x_train.max(axis=(0, 1, 2))
        if np.any(lo == hi):
            constant = ", ".join(f"channel {c} is {lo[c]} everywhere" for c in np.flatnonzero(lo == hi))
            raise DataError(f"{self.source}: the training images are constant ({constant}): nothing to learn, and "
                            f"normalising would divide by zero. {HOW_TO_GET}")
        flat = self.x_train.reshape(-1, self.x_train.shape[-1])
        sums, sq = np.zeros(flat.shape[1]), np.zeros(flat.shape[1])
        for chunk in np.array_split(flat, max(1, len(flat) // 4_000_000)):
            c64 = chunk.astype(np.float64) / 255.0
            sums += c64.sum(0)
            sq += np.square(c64).sum(0)
        mean = sums / len(flat)
        return mean, np.sqrt(np.maximum(sq / len(flat) - mean**2, 0.0))

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


def _shown(name) -> str:
    """A file or member name as it can be printed: bytes that are not UTF-8 (kept by ``surrogateescape``) as ``\\xNN``."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def _one_line(err: BaseException) -> str:
    """An exception's text on one line (tarfile's "could not be opened" lists one line per compression)."""
    return " ".join(str(err).split()) or type(err).__name__


def _size(n: int) -> str:
    """``n`` bytes for a message: ``2.79 TiB``."""
    value, unit = float(n), "bytes"
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.3g} {unit}"


def _available_memory() -> int:
    """Bytes of memory that can be allocated now: psutil's ``available`` if psutil is installed, else
    ``MemAvailable`` of ``/proc/meminfo``, else the physical memory."""
    try:
        import psutil
    except ImportError:
        pass
    else:
        return int(psutil.virtual_memory().available)
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


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
def _npy_header(path: Path, zf: zipfile.ZipFile, key: str) -> tuple[tuple, np.dtype]:
    """Shape and dtype that the array ``key`` of a ``.npz`` declares, from its ``.npy`` header alone (nothing allocated)."""
    from numpy.lib import format as npy

    try:
        with zf.open(f"{key}.npy") as fp:
            version = npy.read_magic(fp)
            read_header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
            shape, _, dtype = read_header(fp)
    except Exception as err:  # noqa: BLE001  (numpy's header parser raises ValueError, SyntaxError, TokenError...)
        raise DataError(f"{path}: the header of the array {key} is corrupt or unreadable ({_one_line(err)})") from None
    return shape, dtype


def _check_fits_in_memory(path: Path, headers: dict) -> None:
    """Refuse a ``.npz`` whose arrays, as their headers declare them, need more than the memory available."""
    available, total = _available_memory(), 0
    for key, (shape, dtype) in headers.items():
        size = math.prod(shape) * dtype.itemsize
        total += size
        if total > available:
            with_before = f"; {_size(total)} with the arrays before it" if total > size else ""
            raise DataError(f"{path}: the array {key} declares shape {shape} {dtype}, {_size(size)}{with_before}: "
                            f"more than the {_size(available)} of memory available")


def _read_npz(path: Path, keys) -> dict:
    """The arrays ``keys`` of the ``.npz`` at ``path``; a :class:`DataError` line when it is not one, lacks one,
    is damaged, needs pickle or is too large for the memory.

    Every ``.npy`` header is read and checked before anything is allocated; the data is then read with
    ``np.load(allow_pickle=False)``.
    """
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":
            raise DataError(f"{path}: not a readable .npz file (not a zip archive)")
    try:
        with zipfile.ZipFile(path) as zf:
            held = sorted(n.removesuffix(".npy") for n in zf.namelist())
            missing = [k for k in keys if k not in held]
            if missing:
                raise DataError(f"{path}: the .npz lacks {missing}; expected the arrays {list(keys)} (it holds {held})")
            headers = {k: _npy_header(path, zf, k) for k in keys}
        for key, (_, dtype) in headers.items():
            if dtype.hasobject:
                raise DataError(f"{path}: the array {key} ({dtype}) would need pickle to load, which is refused")
        _check_fits_in_memory(path, headers)
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in keys}
    except DataError:
        raise
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error) as err:
        raise DataError(f"{path}: not a readable .npz file, truncated or damaged ({_one_line(err)})") from None


def load_npz(path) -> CifarArrays:
    """Read ``x_train, y_train, x_test, y_test`` from a ``.npz`` (:func:`_read_npz`: headers checked first, no pickles)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"--data {path}: no such file. {HOW_TO_GET}")
    try:
        arrays = _read_npz(path, NPZ_KEYS)
    except DataError as err:
        raise DataError(f"{err}. {HOW_TO_GET}") from None
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


def _missing_folders(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first (what creating ``path`` would add)."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def download_cifar10(root, url: str = CIFAR10_URL, archive_md5: str = CIFAR10_ARCHIVE_MD5) -> Path:
    """Download the CIFAR-10 python archive into ``root`` (md5-checked) and extract it; return the batch folder.

    Uses torchvision's ``download_url`` (which skips the download if a file with the right md5 is
    already there).  Only the archive's regular files under ``cifar-10-batches-py/`` are extracted.  A failed
    download (offline, wrong md5) removes the partial archive and the folders it created.
    """
    root = Path(root).expanduser()
    created = _missing_folders(root)
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
        for folder in created:  # and the folders download_url created for it: a failure leaves nothing behind
            with contextlib.suppress(OSError):
                folder.rmdir()
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


def _hidden(name: str) -> bool:
    """Hidden entries (``.DS_Store``, AppleDouble ``._*`` files of macOS) are never part of a tree."""
    return name.startswith(".")


#: the largest file accepted as one 32×32 image (PNG or JPEG files of CIFAR images are a few KiB).
MAX_IMAGE_BYTES = 1 << 20
_STAT_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
               stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link"}
_TAR_KINDS = {tarfile.DIRTYPE: "a folder", tarfile.SYMTYPE: "a symbolic link", tarfile.LNKTYPE: "a hard link",
              tarfile.FIFOTYPE: "a FIFO", tarfile.CHRTYPE: "a character device", tarfile.BLKTYPE: "a block device"}


def _check_image_bytes(size: int, shown: str) -> None:
    """Refuse a file larger than :data:`MAX_IMAGE_BYTES`: not a 32×32 image, and it would be read into memory."""
    if size > MAX_IMAGE_BYTES:
        raise DataError(f"{shown}: {_size(size)}, larger than a 32×32 image file can be (at most "
                        f"{_size(MAX_IMAGE_BYTES)}); expected a 32×32 PNG or JPEG")


def _read_image_file(path: Path, shown: str) -> bytes:
    """The bytes of one image file of a folder tree: a regular file of at most :data:`MAX_IMAGE_BYTES` (a FIFO
    would block, a device never end), else a :class:`DataError` naming it (``shown``)."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            kind = _STAT_KINDS.get(stat.S_IFMT(st.st_mode), "a special file")
            raise DataError(f"{shown}: not a regular file ({kind}); expected a 32×32 PNG or JPEG")
        _check_image_bytes(st.st_size, shown)
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as f:
            raw = f.read(MAX_IMAGE_BYTES + 1)
    except OSError as err:
        raise DataError(f"{shown}: cannot be read ({err.strerror or _one_line(err)})") from None
    _check_image_bytes(len(raw), shown)
    return raw


def _inside_tree(path: Path, top: Path, shown: str) -> Path:
    """``path``, or where it links to if that is inside the tree ``top`` (resolved); a link that leaves the tree
    is refused in one line naming it (``shown``)."""
    if not path.is_symlink():
        return path
    target = Path(os.path.realpath(path))
    if not target.is_relative_to(top):
        raise DataError(f"{shown}: a symbolic link to {_shown(target)}, outside the tree; copy what it points to "
                        f"into the tree")
    return target


def _tree_entries_from_folder(root: Path):
    """(relative posix path, is_dir, read()) of ``root``'s splits, their class folders and those folders' entries.

    Hidden entries and top-level content other than the splits are skipped unvisited; the walk stops at the
    depth of the images (``<split>/<class>/<file>``), so a link loop cannot trap it.  A symbolic link is
    followed where it resolves inside the tree (:func:`_inside_tree`), and files are read by
    :func:`_read_image_file` (regular files only, bounded), only when the tree uses them.
    """
    top = root.resolve()

    def walk(folder: Path, rel: str, depth: int):
        try:
            found = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as err:
            raise DataError(f"{root.name}: {_shown(rel or '.')}: cannot be listed ({err.strerror})") from None
        for entry in found:
            name = rel + entry.name
            if _hidden(entry.name) or (depth == 0 and entry.name not in SPLITS):
                continue
            shown = f"{root.name}: {_shown(name)}"
            path = _inside_tree(Path(entry.path), top, shown)
            if path.is_dir():
                yield name, True, None
                if depth < 2:
                    yield from walk(path, name + "/", depth + 1)
            else:
                yield name, False, functools.partial(_read_image_file, path, shown)

    yield from walk(root, "", 0)


def _member_name(name: str) -> str | None:
    """A tar member's path in normal form (``./x``, ``x/`` and ``a//b`` become ``x`` and ``a/b``), or None for the
    archive's root and for paths that climb out of it (``..``)."""
    if ".." in name.split("/"):
        return None
    return posixpath.normpath("/" + name).lstrip("/") or None


def _may_be_image(name: str) -> bool:
    """Whether a tar member may be an image of the tree: ``<split>/<class>/<image>``, at the top or under one
    folder.  Only these members are read."""
    parts = name.split("/")
    return (not any(_hidden(p) for p in parts) and parts[-1].lower().endswith(IMAGE_SUFFIXES)
            and ((len(parts) == 3 and parts[0] in SPLITS) or (len(parts) == 4 and parts[1] in SPLITS)))


def _tar_member_reader(tar: tarfile.TarFile, member: tarfile.TarInfo, shown: str):
    """read() for a member that may be an image: its bytes, read now (the archive is streamed) if it is a regular
    file of at most :data:`MAX_IMAGE_BYTES`; otherwise read() raises the :class:`DataError` naming it (so only
    a member the tree uses is refused)."""
    if member.isfile():
        try:
            _check_image_bytes(member.size, shown)
        except DataError as err:
            message = str(err)
        else:
            raw = tar.extractfile(member).read()
            return lambda: raw
    else:
        kind = _TAR_KINDS.get(member.type, "a special file")
        message = f"{shown}: not a regular file in the archive ({kind}); expected a 32×32 PNG or JPEG"

    def refuse():
        raise DataError(message)

    return refuse


def _tree_entries_from_tar(path: Path):
    """Like :func:`_tree_entries_from_folder` for a tar archive, streamed in one pass (``r|*``: gzip cannot seek
    cheaply, and nothing but the images is kept).  Member names are normalised (:func:`_member_name`); a name
    that occurs twice is refused.  Only members that may be images are read (:func:`_tar_member_reader`);
    the others are skipped unread.  The tree may sit at the archive's top level or under one folder
    (hidden entries beside it, such as AppleDouble ``._<folder>`` files, do not count).
    """
    members = {}  # normal name -> (name in the archive, is_dir, read)
    try:
        with tarfile.open(path, "r|*") as tar:
            for m in tar:
                name = _member_name(m.name)
                if name is None:
                    continue
                if name in members and not (m.isdir() and members[name][1]):
                    raise DataError(f"{path.name}: the archive holds {_shown(members[name][0])!r} and "
                                    f"{_shown(m.name)!r}, both {_shown(name)}; keep one")
                shown = f"{path.name}: {_shown(name)}"
                members[name] = (m.name, m.isdir(), _tar_member_reader(tar, m, shown) if _may_be_image(name) else None)
    except (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError) as err:
        raise DataError(f"{path.name}: not a readable tar archive, or truncated ({_one_line(err)}). {HOW_TO_GET}") \
            from None
    tops = {top for top in (n.split("/")[0] for n in members) if not _hidden(top)}
    prefix = next(iter(tops)) + "/" if len(tops) == 1 and not tops & set(SPLITS) else ""
    for name in sorted(members):
        if name.startswith(prefix):
            _, is_dir, read = members[name]
            yield name[len(prefix):], is_dir, read


def _decode_image(name: str, raw: bytes) -> np.ndarray:
    """One 32×32 RGB PNG/JPEG → uint8 (32, 32, 3); anything else is a :class:`DataError` naming the file.

    Every failure of Pillow is caught here, in one place: a decompression bomb (a header declaring a huge
    image: an error, or a warning made one), a truncated or malformed file, whatever exception it raises.
    """
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(raw)) as im:
                if im.format not in ("PNG", "JPEG"):
                    raise DataError(f"{name}: a {im.format} image; expected PNG or JPEG")
                if im.mode != "RGB":
                    raise DataError(f"{name}: image mode {im.mode}; expected RGB (8-bit, 3 channels)")
                if im.size != (32, 32):
                    raise DataError(f"{name}: image size {im.size[0]}×{im.size[1]}; expected 32×32")
                im.load()
                return np.asarray(im, dtype=np.uint8)
    except DataError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise DataError(f"{name}: declares a huge image ({_one_line(err)}); expected 32×32") from None
    except Exception as err:  # noqa: BLE001  (Pillow raises many types on malformed files)
        raise DataError(f"{name}: not a readable PNG or JPEG image ({_one_line(err)})") from None


def _tree_files(entries, source: str) -> dict:
    """Validate an image-folder tree from its entries, reading nothing: ``{split: {class: [(rel, read), ...]}}``."""
    files = {s: {} for s in SPLITS}
    for rel, is_dir, read in entries:
        parts = rel.split("/")
        if any(_hidden(p) for p in parts) or rel in ("", "."):
            continue  # hidden files (.DS_Store, ._*) and the root itself
        if parts[0] not in SPLITS:
            continue  # other top-level content (a README, a LICENSE) is not part of the data
        split, shown = parts[0], _shown(rel)
        if len(parts) == 1:
            continue
        if len(parts) == 2:
            if not is_dir:
                raise DataError(f"{source}: {shown}: a file where {split}/ should hold only class folders")
            if parts[1] not in CLASSES:
                raise DataError(f"{source}: {shown}/: unknown class folder {_shown(parts[1])!r}; expected CIFAR-10's "
                                f"classes {', '.join(CLASSES)}")
            files[split].setdefault(parts[1], [])
            continue
        if len(parts) > 3:
            raise DataError(f"{source}: {shown}: nested too deep; expected {split}/<class>/<image>")
        cls = parts[1]
        if cls not in CLASSES:
            raise DataError(f"{source}: {split}/{_shown(cls)}/: unknown class folder {_shown(cls)!r}; expected "
                            f"CIFAR-10's classes {', '.join(CLASSES)}")
        if is_dir:
            raise DataError(f"{source}: {shown}/: a folder inside a class folder; expected only image files")
        if not parts[2].lower().endswith(IMAGE_SUFFIXES):
            raise DataError(f"{source}: {shown}: not an image file (expected {', '.join(IMAGE_SUFFIXES)})")
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
    return files


def _in_order(files: dict, split: str):
    """(rel, read, label) of a split's images in decoding order: sorted class name, then file name."""
    for cls in sorted(files[split]):
        for rel, read in sorted(files[split][cls], key=lambda item: item[0]):
            yield rel, read, CLASSES.index(cls)


def _tree_digest(files: dict) -> str:
    """sha256 over every image's relative path and bytes (in decoding order): equal trees share a cache entry."""
    digest = hashlib.sha256()
    for split in SPLITS:
        for rel, read, _ in _in_order(files, split):
            digest.update(os.fsencode(rel) + b"\0" + hashlib.sha256(read()).digest())
    return digest.hexdigest()


def _decode_tree(files: dict, source: str, progress: bool) -> list[np.ndarray]:
    """Decode a validated tree (:func:`_tree_files`): ``[x_train, y_train, x_test, y_test]``."""
    from tqdm import tqdm

    total = sum(len(v) for split in SPLITS for v in files[split].values())
    out = []
    with tqdm(total=total, desc=f"decoding {source}", unit="img", file=sys.stderr, disable=not progress,
              leave=False) as bar:
        for split in SPLITS:
            xs, ys = [], []
            for rel, read, label in _in_order(files, split):
                xs.append(_decode_image(f"{source}: {_shown(rel)}", read()))
                ys.append(label)
                bar.update()
            out += [np.stack(xs), np.asarray(ys, dtype=np.int64)]
    return out


# ----------------------------------------------------------------------------- the decode cache
CACHE_KEYS = NPZ_KEYS + ("source_sha256", "arrays_sha256")


def _check_cache_folder(cache_dir: Path) -> None:
    """Refuse, before anything is decoded, a cache folder that cannot be written (read-only, not a folder):
    a probe file is created in the nearest existing folder and removed."""
    probe = cache_dir
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise DataError(f"--data-root: {probe} is a file, not a folder: cannot create the cache {cache_dir}; "
                        f"choose another --data-root")
    try:
        fd, name = tempfile.mkstemp(dir=probe, prefix=".explr-write-test-")
        os.close(fd)
        os.unlink(name)
    except OSError as err:
        raise DataError(f"--data-root: cannot write the decode cache in {probe} ({err.strerror or _one_line(err)}); "
                        f"choose another --data-root") from None


def _read_cache(cache: Path, key: str, source: str, kind: str) -> CifarArrays | None:
    """The arrays cached for the source with digest ``key``, or None.

    The cache must be a readable ``.npz`` (:func:`_read_npz`) of valid splits that records ``key`` as its
    source and the checksum of its arrays; one that is not (truncated, an older format, other arrays) is
    reported in one line on stderr and None is returned, so that it is rebuilt.
    """
    if not cache.is_file():
        return None
    try:
        a = _read_npz(cache, CACHE_KEYS)
        x_train, y_train = _check_split("train", a["x_train"], a["y_train"], str(cache))
        x_test, y_test = _check_split("test", a["x_test"], a["y_test"], str(cache))
        if str(a["source_sha256"]) != key:
            raise DataError(f"{cache}: the cache of another source")
        digest = arrays_sha256(x_train, y_train, x_test, y_test)
        if str(a["arrays_sha256"]) != digest:
            raise DataError(f"{cache}: its arrays do not match the checksum it recorded")
    except DataError as err:
        print(f"{err}; rebuilding the cache from {source}", file=sys.stderr)
        return None
    return CifarArrays(x_train, y_train, x_test, y_test, source=source, kind=kind, files={source: "sha256:" + key},
                       sha256=digest)


def _write_cache(cache: Path, arrays: CifarArrays, key: str) -> None:
    """Write the arrays, the source's digest ``key`` and the arrays' checksum to ``cache`` atomically; a full disk
    or another write error is one :class:`DataError` line, and the temporary file is removed."""
    content = {k: getattr(arrays, k) for k in NPZ_KEYS}
    content.update(source_sha256=np.array(key), arrays_sha256=np.array(arrays.sha256))
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cache, lambda f: np.savez(f, **content))
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DataError(f"disk full while writing the cache at {cache}; free space or choose another "
                            f"--data-root") from None
        raise DataError(f"cannot write the cache at {cache} ({err.strerror or _one_line(err)}); choose another "
                        f"--data-root") from None


def _check_batch_size(n_train: int, batch_size: int | None, source: str) -> None:
    """Refuse a batch larger than the training set (for an image folder before anything is decoded or cached)."""
    if batch_size is not None and batch_size > n_train:
        raise DataError(f"batch_size (--batch-size) {batch_size} exceeds the {n_train} training images of {source}")


def load_image_folder(path, cache_dir="data/cache", progress: bool = True, batch_size: int | None = None) \
        -> CifarArrays:
    """An image-folder tree or a ``.tar``/``.tar.gz``/``.tgz`` of one, decoded once and cached (module docstring).

    The cache file is ``<cache_dir>/image-folder-<sha256>.npz``, keyed by the archive's sha256 (for a
    folder: the digest of its images' paths and bytes); ``cache_dir=None`` disables it.  A damaged or
    mismatched cache is rebuilt (one line on stderr), and temporary files of killed cache writes are removed.
    Before anything is decoded, the tree is validated, the batch size (``batch_size``, if given) checked
    against its training images and the cache folder checked for writing; constant images are refused
    before the cache is written.
    """
    path = Path(path).expanduser()
    archive = path.is_file() and _is_archive(path)
    if not (archive or path.is_dir()):
        raise DataError(f"--data {path}: no such image folder or archive. {HOW_TO_GET}")
    kind = "image-folder-tar" if archive else "image-folder"
    cache_dir = None if cache_dir is None else Path(cache_dir).expanduser()
    if cache_dir is not None and cache_dir.is_dir():
        remove_stale_leftovers(cache_dir)
    if archive:
        key, files = _file_hash(path, "sha256"), None
    else:
        files = _tree_files(_tree_entries_from_folder(path), path.name)
        key = _tree_digest(files)
    cache = None if cache_dir is None else cache_dir / f"image-folder-{key}.npz"
    arrays = None if cache is None else _read_cache(cache, key, path.name, kind)
    if arrays is not None:
        _check_batch_size(len(arrays.y_train), batch_size, path.name)
        return arrays
    if files is None:
        files = _tree_files(_tree_entries_from_tar(path), path.name)
    _check_batch_size(sum(len(v) for v in files["train"].values()), batch_size, path.name)
    if cache is not None:
        _check_cache_folder(cache_dir)
    arrays = CifarArrays(*_decode_tree(files, path.name, progress), source=path.name, kind=kind,
                         files={path.name: "sha256:" + key})
    arrays.channel_stats  # noqa: B018  (constant images raise DataError before anything is written)
    if cache is not None:
        _write_cache(cache, arrays, key)
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


def load_cifar10(data="auto", root="data", md5: dict | None = None, progress: bool = True,
                 batch_size: int | None = None) -> CifarArrays:
    """Load CIFAR-10 from ``data``: ``"auto"``, ``"synthetic"``, a ``.npz``, a batch folder, an image-folder tree
    or an archive of one (module docstring).  ``root`` is the download folder; decoded images are cached in
    ``root/cache``.  ``progress`` shows the decoding bar of an image folder; ``batch_size`` (if given) must not
    exceed the training images (checked before an image folder is decoded or cached)."""
    if isinstance(data, CifarArrays):
        arrays = data
    elif str(data) == "synthetic":
        arrays = make_synthetic()
    elif str(data) == "auto":
        folder = Path(root).expanduser() / CIFAR10_FOLDER
        if not all((folder / n).is_file() for n in TRAIN_FILES + TEST_FILES):
            folder = download_cifar10(root)
        arrays = read_cifar_batches(folder, md5)
    else:
        path = Path(str(data)).expanduser()
        if _is_image_folder(path) or (path.is_file() and _is_archive(path)):
            return load_image_folder(path, Path(root).expanduser() / "cache", progress=progress, batch_size=batch_size)
        if path.is_dir():
            folder = path / CIFAR10_FOLDER if (path / CIFAR10_FOLDER).is_dir() else path
            arrays = read_cifar_batches(folder, md5)
        elif path.suffix == ".npz" or path.is_file():
            arrays = load_npz(path)
        else:
            raise DataError(f"--data {data}: no such file or folder (expected 'auto', 'synthetic', a .npz, a folder "
                            f"with CIFAR-10's python batches, an image-folder tree or a .tar/.tar.gz/.tgz of one). "
                            f"{HOW_TO_GET}")
    _check_batch_size(len(arrays.y_train), batch_size, arrays.source)
    return arrays


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
