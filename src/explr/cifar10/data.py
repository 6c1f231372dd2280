"""Where CIFAR-10 comes from: :func:`load_cifar10` reads every source of ``--data`` into :class:`CifarArrays`:
``auto`` (downloaded, md5-checked), CIFAR-10's python batches (md5-checked before a restricted unpickler reads them),
a ``.npz`` (headers checked, no pickles), an image-folder tree or a tar of one (:func:`load_image_folder`) and
``synthetic``.  Bad data is one :class:`DataError` line naming the file (the CLI exits 2); nothing is created.
"""
from __future__ import annotations

import bz2
import contextlib
import errno
import gzip
import hashlib
import io
import lzma
import math
import os
import pickle
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
from typing import NamedTuple

import numpy as np

from ..params import is_int
from .config import available_memory
from .files import atomic_write, remove_stale_leftovers


CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR10_ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_FOLDER = "cifar-10-batches-py"
#: md5 of each official python batch (the table torchvision checks).
CIFAR10_FILES_MD5 = dict(zip(
    ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"),
    ("c99cafc152244af753f735de768cd75f", "d4bba439e000b95fd0a9bffe97cbabec", "54ebc095f3ab1f0389bbae665268c751",
     "634d18415352ddfa80567beed471001a", "482c414d41f54cd18b22e5b47cb7c3cb", "40351d587109b95175f43aff81a1287e")))
TRAIN_FILES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5")
BATCH_FILES = (*TRAIN_FILES, "test_batch")
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz")
SPLITS = ("train", "test")
#: the largest file accepted as one 32×32 image (CIFAR's PNG or JPEG files are a few KiB).
MAX_IMAGE_BYTES = 1 << 20
#: the decoder's version, in the cache's name: raise it when the decoding or the labels change.
CACHE_VERSION = 3
INSTALL_PILLOW = "pip install 'explr-book[cifar10]'"
HOW_TO_GET = (
    "Get CIFAR-10 with `--data auto` (downloads {url} into --data-root, md5 {md5}), or download and extract "
    "that archive yourself and pass its folder, or pass a .npz with uint8 arrays x_train (N,32,32,3), "
    "y_train (N,), x_test (M,32,32,3), y_test (M,), or an image-folder tree train/<class>/*.png|jpg and "
    "test/<class>/*.png|jpg (or a .tar/.tar.gz/.tgz of it)."
).format(url=CIFAR10_URL, md5=CIFAR10_ARCHIVE_MD5)


class DataError(ValueError):
    """The data is missing or not what was expected; the message says how to get it."""


#: which data a run trains on, without the images: its source's name, the arrays' sha256, the training images.
DataIdentity = NamedTuple("DataIdentity", [("source", str), ("sha256", str), ("n_train", int)])


@dataclass(frozen=True)
class CifarArrays:
    """CIFAR-10 in memory: images uint8 ``(N, 32, 32, 3)`` RGB, labels int64 in 0..9; ``source`` a *name* (no path of
    this machine), ``kind`` its format, ``files`` the checksums verified, ``sha256`` :func:`arrays_sha256`'s."""

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
        """Per-channel mean and standard deviation of the training images in [0, 1] units; :class:`DataError`
        where a channel is constant (max == min, exact in uint8): nothing to learn, and normalising divides by 0."""
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

    @property
    def identity(self) -> DataIdentity:
        return DataIdentity(self.source, self.sha256, int(len(self.y_train)))

    def describe(self) -> dict:  # the data as a run's manifest records it
        return {"source": self.source, "kind": self.kind, "sha256": self.sha256, "files": dict(self.files),
                "n_train": int(len(self.y_train)), "n_test": int(len(self.y_test)),
                "image_shape": list(self.x_train.shape[1:])}


def arrays_sha256(*arrays) -> str:
    """sha256 over each array's dtype, shape and bytes."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def file_hash(path, algorithm="md5") -> str:
    h = hashlib.new(algorithm, usedforsecurity=False) if algorithm == "md5" else hashlib.new(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _shown(name) -> str:
    """A file name as it can be printed (bytes that are not UTF-8 as ``\\xNN``)."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def _size(n: int) -> str:
    """``n`` bytes for a message: ``2.79 TiB``."""
    power = min(4, max(0, (int(n).bit_length() - 1) // 10))
    return f"{n / 1024**power:.3g} {('bytes', 'KiB', 'MiB', 'GiB', 'TiB')[power]}"


def _check_split(name: str, x, y, source: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[1:] != (32, 32, 3):
        raise DataError(f"{source}: x_{name} must be uint8 of shape (N, 32, 32, 3) (HWC, RGB); got {x.dtype} "
                        f"{x.shape}. {HOW_TO_GET}")
    if not np.issubdtype(y.dtype, np.integer) or y.ndim != 1 or len(y) != len(x):
        raise DataError(f"{source}: y_{name} must be integer labels of shape ({len(x)},); got {y.dtype} {y.shape}. "
                        f"{HOW_TO_GET}")
    if len(y) == 0:
        raise DataError(f"{source}: the {name} split is empty. {HOW_TO_GET}")
    if y.min() < 0 or y.max() > 9:
        raise DataError(f"{source}: y_{name} must hold labels in 0..9; found {int(y.min())}..{int(y.max())}")
    return x, y.astype(np.int64)


def _check_batch_size(n_train: int, batch_size: int | None, source: str) -> None:
    if batch_size is not None and batch_size > n_train:
        raise DataError(f"batch_size (--batch-size) {batch_size} exceeds the {n_train} training images of {source}")


# ----------------------------------------------------------------------------- .npz
def _npy_header(path: Path, zf: zipfile.ZipFile, key: str) -> tuple[tuple, np.dtype]:
    """Shape and dtype that the array ``key`` of a ``.npz`` declares, from its ``.npy`` header alone."""
    from numpy.lib import format as npy

    try:
        with zf.open(f"{key}.npy") as fp:
            version = npy.read_magic(fp)
            shape, _, dtype = (npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0)(fp)
    except Exception as err:  # noqa: BLE001  (numpy's header parser raises ValueError, SyntaxError, TokenError...)
        raise DataError(f"{path}: the header of the array {key} is corrupt or unreadable ({_one_line(err)})") from None
    return shape, dtype


def _read_npz(path: Path, keys) -> dict:
    """The arrays ``keys`` of the ``.npz`` at ``path``, every header checked first (present, no pickle, within the
    memory available), then read with ``np.load(allow_pickle=False)``; one :class:`DataError` line otherwise."""
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":
            raise DataError(f"{path}: not a readable .npz file (not a zip archive)")
    try:
        with zipfile.ZipFile(path) as zf:
            held = sorted(n.removesuffix(".npy") for n in zf.namelist())
            if missing := [k for k in keys if k not in held]:
                raise DataError(f"{path}: the .npz lacks {missing}; expected the arrays {list(keys)} (it holds {held})")
            headers = {k: _npy_header(path, zf, k) for k in keys}
        available, total = available_memory(), 0
        for key, (shape, dtype) in headers.items():
            if dtype.hasobject:
                raise DataError(f"{path}: the array {key} ({dtype}) would need pickle to load, which is refused")
            size = math.prod(shape) * dtype.itemsize
            total += size
            if available is not None and total > available:
                before = f"; {_size(total)} with the arrays before it" if total > size else ""
                raise DataError(f"{path}: the array {key} declares shape {shape} {dtype}, {_size(size)}{before}: "
                                f"more than the {_size(available)} of memory available")
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in keys}
    except DataError:
        raise
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error) as err:
        raise DataError(f"{path}: not a readable .npz file, truncated or damaged ({_one_line(err)})") from None


def load_npz(path) -> CifarArrays:
    """``x_train, y_train, x_test, y_test`` of a ``.npz`` (uint8 HWC images, integer labels)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"--data {path}: no such file. {HOW_TO_GET}")
    try:
        arrays = _read_npz(path, NPZ_KEYS)
    except DataError as err:
        raise DataError(f"{err}. {HOW_TO_GET}") from None
    return CifarArrays(*_check_split("train", arrays["x_train"], arrays["y_train"], str(path)),
                       *_check_split("test", arrays["x_test"], arrays["y_test"], str(path)), source=path.name,
                       kind="npz", files={path.name: "sha256:" + file_hash(path, "sha256")})


# ----------------------------------------------------------------------------- CIFAR's python batches
class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, bytes/str and numpy arrays -- nothing that can run code."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load the global {module}.{name} from a CIFAR batch")
        return super().find_class(module, name)


def _get(d: dict, key: str):
    """CIFAR's batches were pickled by Python 2: keys are ``'data'`` (latin1) or ``b'data'``."""
    return d[key] if key in d else d[key.encode()]


def read_cifar_batches(folder, md5: dict | None = None) -> CifarArrays:
    """CIFAR-10's python batches in ``folder``, each md5-checked (``md5``: name → md5, default
    :data:`CIFAR10_FILES_MD5`) before it is unpickled; rows of 3072 bytes (R, G, B planes of 32×32) become HWC."""
    folder = Path(folder)
    md5 = CIFAR10_FILES_MD5 if md5 is None else md5
    if missing := [n for n in BATCH_FILES if not (folder / n).is_file()]:
        raise DataError(f"{folder}: the CIFAR-10 python batches {missing} are missing. {HOW_TO_GET}")
    out, files = {}, {}
    for n in BATCH_FILES:
        digest = file_hash(folder / n, "md5")
        if md5.get(n) != digest:
            raise DataError(f"{folder / n}: md5 {digest} does not match the expected {md5.get(n)}; the file is "
                            "corrupt or not the official CIFAR-10 (it was not unpickled). Delete it and download "
                            f"again. {HOW_TO_GET}")
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
    train = [np.ascontiguousarray(np.concatenate([out[n][i] for n in TRAIN_FILES])) for i in (0, 1)]
    test = [np.ascontiguousarray(a) for a in out["test_batch"]]
    return CifarArrays(*_check_split("train", *train, str(folder)), *_check_split("test", *test, str(folder)),
                       source=folder.name, kind="cifar-python", files=files)


def download_cifar10(root, url: str = CIFAR10_URL, archive_md5: str = CIFAR10_ARCHIVE_MD5) -> Path:
    """Download CIFAR-10's python archive into ``root`` (torchvision's ``download_url``, md5-checked) and extract its
    regular files under ``cifar-10-batches-py/``; a failed download removes the archive and the folders it made."""
    root = Path(root).expanduser()
    created = [p for p in (root, *root.parents) if not p.exists()]  # deepest first
    from torchvision.datasets.utils import download_url

    try:
        download_url(url, str(root), CIFAR10_ARCHIVE, archive_md5)
    except Exception as err:  # network errors, or torchvision's "File not found or corrupted."
        (root / CIFAR10_ARCHIVE).unlink(missing_ok=True)
        for folder in created:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise DataError(f"could not download CIFAR-10 from {url} into {root} with md5 {archive_md5} ({err}). If this "
                        f"machine is offline, copy {CIFAR10_ARCHIVE} there or use --data PATH. {HOW_TO_GET}") from None
    with tarfile.open(root / CIFAR10_ARCHIVE, "r:gz") as tar:
        members = [m for m in tar.getmembers()
                   if m.isfile() and m.name.startswith(CIFAR10_FOLDER + "/") and ".." not in m.name]
        tar.extractall(root, members=members, filter="data")
    return root / CIFAR10_FOLDER


# ----------------------------------------------------------------------------- image folders and their archives
def _decode_image(name: str, raw: bytes) -> np.ndarray:
    """One 32×32 8-bit RGB PNG/JPEG → uint8 (32, 32, 3); anything else (a decompression bomb, a 16-bit PNG, whose
    high bytes Pillow keeps, a damaged file) is a :class:`DataError` naming the file."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(raw)) as im:
                if im.format not in ("PNG", "JPEG"):
                    raise DataError(f"{name}: a {im.format} image; expected PNG or JPEG")
                if im.mode != "RGB":
                    raise DataError(f"{name}: image mode {im.mode}; expected RGB (8-bit, 3 channels)")
                depth = raw[24] if raw[12:16] == b"IHDR" and len(raw) > 24 else None  # PNG: IHDR comes first
                if im.format == "PNG" and depth != 8:
                    what = f"a {depth}-bit PNG" if depth else "a PNG whose first chunk is not its IHDR"
                    raise DataError(f"{name}: {what}; expected 8 bits per channel (convert it: only the high byte "
                                    "of each value would be kept)")
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


def _too_large(size: int, shown: str) -> None:
    if size > MAX_IMAGE_BYTES:
        raise DataError(f"{shown}: {_size(size)}, larger than a 32×32 image file can be (at most "
                        f"{_size(MAX_IMAGE_BYTES)}); expected a 32×32 PNG or JPEG")


def _folder_entries(root: Path, source: str):
    """(relative path, is a folder, its bytes or None) of ``root``'s ``train/`` and ``test/`` trees: only regular
    files of at most :data:`MAX_IMAGE_BYTES` are read, and links only where they stay inside ``root``."""
    top = root.resolve()
    for split in SPLITS:
        todo = [(root / split, split)] if (root / split).is_dir() else []
        while todo:
            folder, rel = todo.pop()
            yield rel, True, None
            for p in sorted(folder.iterdir()):
                name, shown = f"{rel}/{p.name}", f"{source}: {_shown(rel + '/' + p.name)}"
                if p.name.startswith(".") or name.count("/") > 2:
                    yield name, p.is_dir(), None  # hidden, or too deep: refused by _tree
                    continue
                if not p.resolve().is_relative_to(top):
                    raise DataError(f"{shown}: a symbolic link to {_shown(p.resolve())}, outside the tree")
                st = p.stat()
                if stat.S_ISDIR(st.st_mode):
                    todo.append((p, name))
                elif not stat.S_ISREG(st.st_mode):
                    kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device or a socket"
                    raise DataError(f"{shown}: not a regular file ({kind}); expected an image file")
                else:
                    _too_large(st.st_size, shown)
                    yield name, False, p.read_bytes() if p.suffix.lower() in IMAGE_SUFFIXES else None


#: a compressed tar by its magic bytes, decompressed in bounded chunks (``tarfile``'s ``r|*`` inflates zeros whole)
_COMPRESSIONS = ((b"\x1f\x8b", lambda f: gzip.GzipFile(fileobj=f, mode="rb")), (b"BZh", bz2.BZ2File),
                 (b"\xfd7z", lzma.LZMAFile))


def _tar_entries(path: Path, source: str, key: str):
    """The entries of an archive (as :func:`_folder_entries`), member by member: image members (regular, at most
    :data:`MAX_IMAGE_BYTES`) decoded as they come; refused if the archive's sha256 is no longer ``key``."""
    entries, seen, top = [], {}, None
    with open(path, "rb") as f:
        magic = f.read(3)
        f.seek(0)
        opener = next((o for m, o in _COMPRESSIONS if magic.startswith(m)), contextlib.nullcontext)
        try:
            with opener(f) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
                for m in tar:
                    name = m.name.removeprefix("./").rstrip("/")
                    if name in seen:
                        raise DataError(f"{source}: the archive holds {_shown(seen[name])!r} and {_shown(m.name)!r}, "
                                        "the same member twice")
                    seen[name] = m.name
                    if top is None and not name.startswith("."):
                        first = name.split("/")[0]
                        top = "" if first in SPLITS else first + "/"
                    if top is None or not name.startswith(top) or name == top.rstrip("/"):
                        continue
                    rel, shown = name.removeprefix(top), f"{source}: {_shown(name.removeprefix(top))}"
                    image = rel.lower().endswith(IMAGE_SUFFIXES) and not rel.rsplit("/", 1)[-1].startswith(".")
                    if image and not m.isfile():
                        raise DataError(f"{shown}: not a regular file in the archive")
                    if image:
                        _too_large(m.size, f"{source}: {_shown(name)}")
                    pixels = _decode_image(shown, tar.extractfile(m).read()) if image and rel.count("/") == 2 \
                        else (b"" if image else None)
                    entries.append((rel, m.isdir(), pixels))
        except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
            raise DataError(f"{source}: not a readable tar archive, or truncated ({_one_line(err)})") from None
    if file_hash(path, "sha256") != key:
        raise DataError(f"{source} changed while it was read (other bytes than those first hashed); nothing was cached: "
                        "run again when nothing writes to it")
    return entries


def _tree(entries, source: str) -> dict:
    """``{split: {class: [(rel, bytes), ...]}}`` of a validated tree ``train/<class>/<image>``, ``test/...``;
    hidden entries and top-level files beside the splits are ignored."""
    files = {s: {} for s in SPLITS}
    for rel, is_dir, raw in entries:
        parts = rel.split("/")
        if parts[0] not in SPLITS or len(parts) == 1 or any(p.startswith(".") for p in parts):
            continue
        split, shown, cls = parts[0], _shown(rel), parts[1]
        if len(parts) == 2 and not is_dir:
            raise DataError(f"{source}: {shown}: a file where {split}/ should hold only class folders")
        if cls not in CLASSES:
            raise DataError(f"{source}: {split}/{_shown(cls)}/: unknown class folder {_shown(cls)!r}; expected "
                            f"CIFAR-10's classes {', '.join(CLASSES)}")
        if len(parts) > 3:
            raise DataError(f"{source}: {shown}: nested too deep; expected {split}/<class>/<image>")
        files[split].setdefault(cls, [])
        if len(parts) == 3:
            if is_dir:
                raise DataError(f"{source}: {shown}/: a folder inside a class folder; expected only image files")
            if raw is None:
                raise DataError(f"{source}: {shown}: not an image file (expected {', '.join(IMAGE_SUFFIXES)})")
            files[split][cls].append((rel, raw))
    for split in SPLITS:
        if not files[split]:
            raise DataError(f"{source}: the {split}/ split is missing or holds no class folders; expected "
                            f"{split}/<class>/*.png|jpg. {HOW_TO_GET}")
        if empty := next((c for c, items in files[split].items() if not items), None):
            raise DataError(f"{source}: {split}/{empty}/: empty class folder")
    if (train := set(files["train"])) != (test := set(files["test"])):
        raise DataError(f"{source}: train/ and test/ hold different classes (only in train: {sorted(train - test)}; "
                        f"only in test: {sorted(test - train)})")
    return files


def _in_order(files: dict, split: str):
    """(rel, bytes, label) of a split's images in sorted class name, then file name."""
    for cls in sorted(files[split]):
        for rel, raw in sorted(files[split][cls], key=lambda item: item[0]):
            yield rel, raw, CLASSES.index(cls)


def _read_cache(cache: Path, source: str, kind: str, key: str) -> CifarArrays | None:
    """The arrays cached in ``cache`` if they hash to the sha256 it records, else None (a line on stderr: rebuilt)."""
    if not cache.is_file():
        return None
    try:
        a = _read_npz(cache, (*NPZ_KEYS, "sha256"))
        x_train, y_train = _check_split("train", a["x_train"], a["y_train"], str(cache))
        x_test, y_test = _check_split("test", a["x_test"], a["y_test"], str(cache))
        digest = arrays_sha256(x_train, y_train, x_test, y_test)
        if a["sha256"].shape != () or a["sha256"].dtype.kind != "U" or a["sha256"].item() != digest:
            raise DataError(f"{cache}: its arrays do not hash to the sha256 it records (changed since)")
    except DataError as err:
        print(f"{err}; rebuilding the cache from {source}", file=sys.stderr)
        return None
    return CifarArrays(x_train, y_train, x_test, y_test, source, kind, {source: "sha256:" + key}, digest)


def _check_cache_folder(cache_dir: Path) -> None:
    """Refuse, before anything is decoded, a cache folder where nothing can be written (a probe file, removed)."""
    probe = next(p for p in (cache_dir, *cache_dir.parents) if p.exists())
    if not probe.is_dir():
        raise DataError(f"--data-root: {probe} is a file, not a folder: cannot create the cache {cache_dir}; "
                        "choose another --data-root")
    try:
        fd, name = tempfile.mkstemp(dir=probe, prefix=".explr-write-test-")
        os.close(fd)
        os.unlink(name)
    except OSError as err:
        raise DataError(f"--data-root: cannot write the decode cache in {probe} ({err.strerror or _one_line(err)}); "
                        "choose another --data-root") from None


def _write_cache(cache: Path, arrays: CifarArrays) -> None:
    """The arrays and their sha256, written atomically; a full disk or another error is one :class:`DataError`."""
    content = {**{k: getattr(arrays, k) for k in NPZ_KEYS}, "sha256": np.array(arrays.sha256)}
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cache, lambda f: np.savez(f, **content))
    except OSError as err:
        full = err.errno in (errno.ENOSPC, errno.EDQUOT)
        why = "disk full while writing" if full else f"cannot write ({err.strerror or _one_line(err)})"
        raise DataError(f"{why} the cache at {cache}; free space or choose another --data-root") from None


def load_image_folder(path, cache_dir="data/cache", progress: bool = True, batch_size: int | None = None) \
        -> CifarArrays:
    """A tree ``train/<class>/*``, ``test/<class>/*`` of 32×32 RGB PNG/JPEG files (Pillow), or a tar of one, decoded
    once and cached as ``<cache_dir>/image-folder-v<CACHE_VERSION>-<sha256>.npz`` (``cache_dir=None``: no cache)."""
    path = Path(path).expanduser()
    archive = path.is_file() and path.name.lower().endswith(ARCHIVE_SUFFIXES)
    if not (archive or path.is_dir()):
        raise DataError(f"--data {path}: no such image folder or archive. {HOW_TO_GET}")
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        raise DataError(f"--data {path.name}: an image folder needs Pillow, which is not installed; "
                        f"{INSTALL_PILLOW}") from None
    source, kind = path.name, "image-folder-tar" if archive else "image-folder"
    files = None
    if archive:
        key = file_hash(path, "sha256")
    else:
        files = _tree(_folder_entries(path, source), source)
        digest = hashlib.sha256()
        for split in SPLITS:
            for rel, raw, _ in _in_order(files, split):
                digest.update(os.fsencode(rel) + b"\0" + hashlib.sha256(raw).digest())
        key = digest.hexdigest()
    cache_dir = None if cache_dir is None else Path(cache_dir).expanduser()
    cache = None if cache_dir is None else cache_dir / f"image-folder-v{CACHE_VERSION}-{key}.npz"
    if cache is not None and cache_dir.is_dir():
        remove_stale_leftovers(cache_dir)
    if cache is not None and (arrays := _read_cache(cache, source, kind, key)) is not None:
        _check_batch_size(len(arrays.y_train), batch_size, source)
        return arrays
    if cache is not None:
        _check_cache_folder(cache_dir)
    files = files or _tree(_tar_entries(path, source, key), source)
    _check_batch_size(sum(len(v) for v in files["train"].values()), batch_size, source)
    from tqdm import tqdm

    decoded = []
    with tqdm(total=sum(len(v) for s in SPLITS for v in files[s].values()), desc=f"decoding {source}", unit="img",
              file=sys.stderr, disable=not progress or archive, leave=False) as bar:
        for split in SPLITS:
            items = list(_in_order(files, split))
            x = np.empty((len(items), 32, 32, 3), dtype=np.uint8)
            for i, (rel, image, _) in enumerate(items):
                x[i] = image if isinstance(image, np.ndarray) else _decode_image(f"{source}: {_shown(rel)}", image)
                bar.update()
            decoded += [x, np.asarray([label for *_, label in items], dtype=np.int64)]
    arrays = CifarArrays(*decoded, source=source, kind=kind, files={source: "sha256:" + key})
    arrays.channel_stats  # noqa: B018  (constant images raise DataError before anything is written)
    if cache is not None:
        _write_cache(cache, arrays)
    return arrays


# ----------------------------------------------------------------------------- every source of --data
def load_cifar10(data="auto", root="data", md5: dict | None = None, progress: bool = True,
                 batch_size: int | None = None) -> CifarArrays:
    """CIFAR-10 from ``data`` (module docstring); ``root``: the download folder, image folders cached in
    ``root/cache``; ``batch_size`` (if given) must not exceed the training images (checked before decoding)."""
    if isinstance(data, CifarArrays):
        arrays = data
    elif str(data) == "synthetic":
        arrays = make_synthetic()
    elif str(data) == "auto":
        folder = Path(root).expanduser() / CIFAR10_FOLDER
        if not all((folder / n).is_file() for n in BATCH_FILES):
            folder = download_cifar10(root)
        arrays = read_cifar_batches(folder, md5)
    else:
        path = Path(str(data)).expanduser()
        tree = path.is_dir() and any((path / s).is_dir() for s in SPLITS)
        if tree or (path.is_file() and path.name.lower().endswith(ARCHIVE_SUFFIXES)):
            return load_image_folder(path, Path(root).expanduser() / "cache", progress=progress, batch_size=batch_size)
        if path.is_dir():
            arrays = read_cifar_batches(path / CIFAR10_FOLDER if (path / CIFAR10_FOLDER).is_dir() else path, md5)
        elif path.is_file():
            arrays = load_npz(path)
        else:
            raise DataError(f"--data {data}: no such file or folder (expected 'auto', 'synthetic' or a path). "
                            f"{HOW_TO_GET}")
    _check_batch_size(len(arrays.y_train), batch_size, arrays.source)
    return arrays


def make_synthetic(n_train: int = 2560, n_test: int = 512, seed: int = 0, noise: float = 40.0) -> CifarArrays:
    """A learnable CIFAR-shaped stand-in (tests, smoke runs): each class a blocky random colour pattern plus pixel
    noise; uint8 ``(N, 32, 32, 3)`` images, balanced shuffled labels."""
    if bad := next(((k, v) for k, v in (("n_train", n_train), ("n_test", n_test)) if not (is_int(v) and v >= 1)), 0):
        raise ValueError(f"{bad[0]} must be a positive integer; got {bad[1]!r}")
    rng = np.random.default_rng(seed)
    templates = np.kron(rng.normal(size=(10, 4, 4, 3)), np.ones((1, 8, 8, 1)))

    def split(n):
        y = rng.permutation(np.arange(n) % 10)
        x = 128 + 50 * templates[y] + noise * rng.normal(size=(n, 32, 32, 3))
        return np.clip(np.rint(x), 0, 255).astype(np.uint8), y.astype(np.int64)

    x_train, y_train = split(n_train)
    x_test, y_test = split(n_test)
    return CifarArrays(x_train, y_train, x_test, y_test, source=f"synthetic(n_train={n_train}, n_test={n_test}, "
                       f"seed={seed})", kind="synthetic")
