"""Where CIFAR-10 comes from: :func:`load_cifar10` reads every source of ``--data`` into :class:`CifarArrays` (the
sources and their checks: docs/cifar10-engine.md); bad data is one :class:`DataError` line naming the file."""
from __future__ import annotations

import bz2
import gzip
import hashlib
import importlib.util
import io
import lzma
import math
import os
import pickle
import sys
import tarfile
import warnings
import zipfile
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..params import is_int
from .config import available_memory
from .runfolder import DataIdentity, atomic_write, remove_leftovers


CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_FOLDER = "cifar-10-batches-py"
BATCH_FILES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch")
#: md5 of each official python batch (the table torchvision checks).
CIFAR10_FILES_MD5 = dict(zip(BATCH_FILES, ("c99cafc152244af753f735de768cd75f", "d4bba439e000b95fd0a9bffe97cbabec",
    "54ebc095f3ab1f0389bbae665268c751", "634d18415352ddfa80567beed471001a", "482c414d41f54cd18b22e5b47cb7c3cb",
    "40351d587109b95175f43aff81a1287e")))
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz")
SPLITS = ("train", "test")
#: the largest file accepted as one 32×32 image (CIFAR's PNG or JPEG files are a few KiB).
MAX_IMAGE_BYTES = 1 << 20
#: the decoder's version, in the cache's name: raise it when the decoding or the labels change.
CACHE_VERSION = 3
HOW_TO_GET = (f"Get CIFAR-10 with --data auto (downloads {CIFAR10_URL}), or pass its extracted folder, a .npz of uint8 "
              "x_train (N,32,32,3), y_train (N,), x_test, y_test, a tree train|test/<class>/*.png|jpg or its tar.")


class DataError(ValueError):
    """The data is missing or not what was expected: one line, file names that are not UTF-8 shown as ``\\xNN``."""

    def __init__(self, message: str):
        super().__init__(" ".join(os.fsencode(message).decode("utf-8", "backslashreplace").split()))


@dataclass(frozen=True)
class CifarArrays:
    """CIFAR-10 in memory: images uint8 ``(N, 32, 32, 3)`` RGB, labels int64 in 0..9; ``source`` a *name*, ``kind``
    its format, ``files`` the checksums verified, ``sha256`` over each array's dtype, shape and bytes."""

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
            h = hashlib.sha256()
            for a in (self.x_train, self.y_train, self.x_test, self.y_test):
                h.update(f"{a.dtype.str}{a.shape}".encode() + a.tobytes())
            object.__setattr__(self, "sha256", h.hexdigest())

    @cached_property
    def channel_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel mean and standard deviation of the training images in [0, 1]; a constant channel: DataError."""
        lo, hi = self.x_train.min(axis=(0, 1, 2)), self.x_train.max(axis=(0, 1, 2))
        if np.any(lo == hi):
            constant = ", ".join(f"channel {c} is {lo[c]} everywhere" for c in np.flatnonzero(lo == hi))
            raise DataError(f"{self.source}: the training images are constant ({constant}): nothing to learn, and "
                            "normalising would divide by zero")
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
        return DataIdentity(self.source, self.sha256, len(self.y_train))

    def describe(self) -> dict:  # the data as a run's manifest records it
        return {"source": self.source, "kind": self.kind, "sha256": self.sha256, "files": dict(self.files),
                "n_train": len(self.y_train), "n_test": len(self.y_test), "image_shape": list(self.x_train.shape[1:])}


def file_hash(path, algorithm="md5") -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _checked(arrays: dict, path, **fields) -> CifarArrays:
    """``arrays`` (x_train, y_train, x_test, y_test; a new dict) read from ``path``, checked, as CifarArrays."""
    for s in SPLITS:
        x = arrays[f"x_{s}"] = np.ascontiguousarray(arrays[f"x_{s}"])
        y = np.asarray(arrays[f"y_{s}"])
        if x.dtype != np.uint8 or x.shape[1:] != (32, 32, 3) or len(x) == 0:
            raise DataError(f"{path}: x_{s} must be uint8 of shape (N, 32, 32, 3), N ≥ 1; got {x.dtype} {x.shape}")
        if not np.issubdtype(y.dtype, np.integer) or y.shape != (len(x),) or y.min() < 0 or y.max() > 9:
            raise DataError(f"{path}: y_{s} must be {len(x)} integer labels in 0..9; got {y.dtype} {y.shape}")
        arrays[f"y_{s}"] = y.astype(np.int64)
    return CifarArrays(**arrays, **fields)


def check_batch_size(n_train: int, batch_size: int | None, source: str) -> None:
    """A ``batch_size`` larger than the ``n_train`` images of ``source`` is a DataError (``None``: not checked)."""
    if batch_size is not None and batch_size > n_train:
        raise DataError(f"batch_size (--batch-size) {batch_size} exceeds the {n_train} training images of {source}")


def _read_npz(path: Path, keys) -> dict:
    """The arrays ``keys`` of a ``.npz`` (no pickles), once their ``.npy`` headers show that they fit in memory."""
    npy = np.lib.format
    try:
        with zipfile.ZipFile(path) as zf:
            if missing := [k for k in keys if f"{k}.npy" not in zf.namelist()]:
                raise DataError(f"{path}: the .npz lacks {missing}; expected the arrays {list(keys)}")
            need = 0
            for key in keys:
                with zf.open(f"{key}.npy") as fp:
                    read = npy.read_array_header_1_0 if npy.read_magic(fp) == (1, 0) else npy.read_array_header_2_0
                    shape, _, dtype = read(fp)
                need += math.prod(shape) * dtype.itemsize
        if need > (available := available_memory() or math.inf):
            raise DataError(f"{path}: its arrays declare {need / 2**30:,.1f} GiB, more than the "
                            f"{available / 2**30:,.1f} GiB of memory available")
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in keys}
    except DataError:
        raise
    except Exception as err:  # zipfile, zlib and numpy's header parser raise many types
        raise DataError(f"{path}: not a readable .npz file, truncated or damaged ({err})") from None


def load_npz(path) -> CifarArrays:
    """``x_train, y_train, x_test, y_test`` of a ``.npz`` (uint8 HWC images, integer labels)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"--data {path}: no such file. {HOW_TO_GET}")
    try:
        return _checked(_read_npz(path, NPZ_KEYS), path, source=path.name, kind="npz",
                        files={path.name: "sha256:" + file_hash(path, "sha256")})
    except DataError as err:
        raise DataError(f"{err}. {HOW_TO_GET}") from None


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, bytes/str and numpy arrays -- nothing that can run code."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load the global {module}.{name} from a CIFAR batch")
        return super().find_class(module, name)


def read_cifar_batches(folder, md5: dict | None = None) -> CifarArrays:
    """CIFAR-10's python batches in ``folder``, unpickled once md5-checked (``md5``: name → md5; default: official)."""
    folder = Path(folder)
    md5 = CIFAR10_FILES_MD5 if md5 is None else md5
    if missing := [n for n in BATCH_FILES if not (folder / n).is_file()]:
        raise DataError(f"{folder}: the CIFAR-10 python batches {missing} are missing. {HOW_TO_GET}")
    out, files = {}, {}
    for n in BATCH_FILES:
        if md5.get(n) != (digest := file_hash(folder / n, "md5")):
            raise DataError(f"{folder / n}: md5 {digest} does not match the expected {md5.get(n)}; the file is "
                            "corrupt or not the official CIFAR-10 (it was not unpickled). Delete it and download again")
        files[n] = "md5:" + digest
        with open(folder / n, "rb") as f:
            try:
                d = _ArrayUnpickler(f, encoding="latin1").load()  # pickled by Python 2: keys 'data' or b'data'
                data, labels = (np.asarray(d[k] if k in d else d[k.encode()]) for k in ("data", "labels"))
                out[n] = (data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels)
            except (pickle.UnpicklingError, KeyError, TypeError, EOFError, AttributeError, ValueError) as err:
                raise DataError(f"{folder / n}: not a CIFAR-10 python batch ({err!r})") from None
    x, y = (np.concatenate([out[n][i] for n in BATCH_FILES[:5]]) for i in (0, 1))
    return _checked({"x_train": x, "y_train": y, "x_test": out["test_batch"][0], "y_test": out["test_batch"][1]},
                    folder, source=folder.name, kind="cifar-python", files=files)


def download_cifar10(root, url: str = CIFAR10_URL, archive_md5: str = CIFAR10_ARCHIVE_MD5) -> Path:
    """Download and extract CIFAR-10's archive into ``root`` (torchvision, md5-checked); a failure leaves nothing."""
    root = Path(root).expanduser()
    created = [p for p in (root, *root.parents) if not p.exists()]  # deepest first
    from torchvision.datasets.utils import download_and_extract_archive

    try:
        download_and_extract_archive(url, str(root), md5=archive_md5)
    except Exception as err:  # network errors, or torchvision's "File not found or corrupted."
        (root / url.rsplit("/", 1)[-1]).unlink(missing_ok=True)
        for folder in (p for p in created if p.is_dir() and not any(p.iterdir())):  # lazily: deepest first
            folder.rmdir()
        raise DataError(f"could not download CIFAR-10 from {url} into {root} with md5 {archive_md5} ({err}). If this "
                        f"machine is offline, copy that archive there or use --data PATH. {HOW_TO_GET}") from None
    return root / CIFAR10_FOLDER


def _decode_image(name: str, raw: bytes) -> np.ndarray:
    """One 32×32 8-bit RGB PNG/JPEG → uint8 (32, 32, 3) (Pillow); anything else (a 16-bit PNG too) is a DataError."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(raw), formats=("PNG", "JPEG")) as im:
                mode = im.tile[0][3] if im.format == "PNG" else im.mode  # a 16-bit PNG: mode RGB, raw mode RGB;16B
                if mode == "RGB" and im.size == (32, 32):
                    return np.asarray(im, dtype=np.uint8)
                what = f"a {im.size[0]}×{im.size[1]} {im.format} of mode {mode}"
    except Exception as err:  # Pillow raises many types on malformed files
        what = f"not a readable PNG or JPEG image ({err})"
    raise DataError(f"{name}: {what}; expected a 32×32 8-bit RGB PNG or JPEG")


def _folder_entries(root: Path):
    """(relative path, kind, size, read) of ``root``'s splits and what they hold, links followed inside ``root``."""
    top, todo = root.resolve(), [root / s for s in SPLITS if (root / s).exists()]
    while todo:
        p = todo.pop()
        rel = p.relative_to(root).as_posix()
        if not p.resolve().is_relative_to(top):
            raise DataError(f"{root.name}: {rel}: a symbolic link to {p.resolve()}, outside the tree")
        kind = "dir" if p.is_dir() else "file" if p.is_file() else "other"
        yield rel, kind, p.stat().st_size, p.read_bytes
        if kind == "dir":
            todo += sorted((c for c in p.iterdir() if not c.name.startswith(".")), reverse=True)


def _tar_entries(path: Path):
    """(path in the tree, kind, size, read) of a tar's members, streamed: ``read`` only before the next member."""
    top = None
    with open(path, "rb") as f:
        # by its magic bytes, read in bounded chunks (tarfile's r|* inflates each 10 KiB whole: a bz2 bomb fills GBs)
        magic = {b"\x1f\x8b": gzip.open, b"BZh": bz2.open, b"\xfd7zXZ": lzma.open}
        opener = next((o for m, o in magic.items() if f.peek(5).startswith(m)), lambda f: f)
        with opener(f) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            for m in tar:
                name = m.name.removeprefix("./").rstrip("/")
                if top is None and not name.startswith("."):
                    top = "" if name.split("/")[0] in SPLITS else name.split("/")[0] + "/"
                if top is not None and name.startswith(top):
                    kind = "dir" if m.isdir() else "file" if m.isfile() else "other"
                    yield name.removeprefix(top), kind, m.size, lambda m=m: tar.extractfile(m).read()


def _images(path: Path, source: str, archive: bool) -> dict:
    """``{path: bytes}`` (a tar's decoded), sorted, of a tree's images (the rule: docs/cifar10-engine.md)."""
    images = {}
    try:
        for rel, kind, size, read in _tar_entries(path) if archive else _folder_entries(path):
            parts = rel.split("/")
            if parts[0] not in SPLITS or len(parts) == 1 or any(p.startswith(".") for p in parts):
                continue
            if parts[1] not in CLASSES or len(parts) == 2 and kind != "dir":
                raise DataError(f"{source}: {rel}: {parts[0]}/ may hold only the class folders {', '.join(CLASSES)}")
            if len(parts) == 3 and kind == "file" and size <= MAX_IMAGE_BYTES and rel.lower().endswith(IMAGE_SUFFIXES):
                images[rel] = _decode_image(f"{source}: {rel}", read()) if archive else read()
            elif len(parts) > 2:
                raise DataError(f"{source}: {rel}: not an image file; {parts[0]}/<class>/ may hold only regular files "
                                f"of at most {MAX_IMAGE_BYTES >> 20} MiB named *{'|*'.join(IMAGE_SUFFIXES)}")
    except (OSError, EOFError, tarfile.TarError, zlib.error, lzma.LZMAError) as err:
        raise DataError(f"{source}: not a readable tar archive or image folder ({err})") from None
    return {r: images[r] for r in sorted(images, key=lambda r: (SPLITS.index(r.split("/")[0]), r.split("/")))}


def _arrays(images: dict, source: str, kind: str, key: str, batch_size: int | None, progress: bool) -> CifarArrays:
    """The images labelled by their class folder, once both splits hold images of the same classes; bytes decoded."""
    order = {s: [r for r in images if r.startswith(s + "/")] for s in SPLITS}
    train, test = ({r.split("/")[1] for r in order[s]} for s in SPLITS)
    if not train or train != test:
        raise DataError(f"{source}: train/ and test/ must hold images of the same classes (only in train: "
                        f"{sorted(train - test)}; only in test: {sorted(test - train)}). {HOW_TO_GET}")
    check_batch_size(len(order["train"]), batch_size, source)
    for rel in tqdm([r for r, v in images.items() if isinstance(v, bytes)], desc=f"decoding {source}", unit="img",
                    file=sys.stderr, disable=not progress, leave=False):
        images[rel] = _decode_image(f"{source}: {rel}", images[rel])
    x = {s: np.stack([images[r] for r in order[s]]) for s in SPLITS}
    y = {s: np.array([CLASSES.index(r.split("/")[1]) for r in order[s]], dtype=np.int64) for s in SPLITS}
    return CifarArrays(x["train"], y["train"], x["test"], y["test"], source, kind, {source: "sha256:" + key})


def load_image_folder(path, cache_dir="data/cache", progress=True, batch_size: int | None = None) -> CifarArrays:
    """A tree ``train|test/<class>/*`` of 32×32 RGB PNG/JPEG files, or a tar of one, decoded once and cached as
    ``<cache_dir>/image-folder-v<CACHE_VERSION>-<key>.npz``, key the archive's sha256 or a folder's over its images."""
    path = Path(path).expanduser()
    source, archive = path.name, path.is_file() and path.name.lower().endswith(ARCHIVE_SUFFIXES)
    kind = "image-folder-tar" if archive else "image-folder"
    if importlib.util.find_spec("PIL") is None:
        raise DataError(f"--data {source}: an image folder needs Pillow, which is not installed; "
                        "pip install 'explr-book[cifar10]'")
    images = None if archive else _images(path, source, archive)
    key = file_hash(path, "sha256") if archive else hashlib.sha256(b"".join(
        os.fsencode(rel) + b"\0" + hashlib.sha256(raw).digest() for rel, raw in images.items())).hexdigest()
    cache = None if cache_dir is None else Path(cache_dir).expanduser() / f"image-folder-v{CACHE_VERSION}-{key}.npz"
    if cache is not None and cache.parent.is_dir():
        remove_leftovers(cache.parent, 3600)  # of killed writes (several processes may write there at once)
    if cache is not None and cache.is_file():  # used if its arrays hash to the sha256 it records, else rebuilt
        try:
            content = _read_npz(cache, (*NPZ_KEYS, "sha256"))
            arrays = CifarArrays(*(content[k] for k in NPZ_KEYS), source, kind, {source: "sha256:" + key})
            if str(content["sha256"]) == arrays.sha256:
                return arrays
            raise DataError(f"{cache}: its arrays do not hash to the sha256 it records (changed since)")
        except DataError as err:
            print(f"{err}; rebuilding the cache from {source}", file=sys.stderr)
    if archive:
        images = _images(path, source, archive)
        if file_hash(path, "sha256") != key:
            raise DataError(f"{source} changed while it was read (nothing cached): run again when nothing writes to it")
    arrays = _arrays(images, source, kind, key, batch_size, progress)
    arrays.channel_stats  # noqa: B018  (constant images raise DataError before anything is written)
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(cache, lambda f: np.savez(f, sha256=arrays.sha256, **{k: vars(arrays)[k] for k in NPZ_KEYS}))
        except OSError as err:
            raise DataError(f"cannot write the cache at {cache} ({err.strerror or err}); free space or choose "
                            "another --data-root") from None
    return arrays


def load_cifar10(data="auto", root="data", md5=None, progress=True, batch_size: int | None = None) -> CifarArrays:
    """CIFAR-10 from ``data`` (``--data``); ``root``: the download folder, image folders cached in ``root/cache``;
    ``batch_size`` (if given) must not exceed the training images (checked before decoding)."""
    root = Path(root).expanduser()
    path = Path(str(data)).expanduser()
    if str(data) == "synthetic":
        arrays = make_synthetic()
    elif str(data) == "auto":
        there = all((root / CIFAR10_FOLDER / n).is_file() for n in BATCH_FILES)
        arrays = read_cifar_batches(root / CIFAR10_FOLDER if there else download_cifar10(root), md5)
    elif any((path / s).is_dir() for s in SPLITS) or path.is_file() and path.name.lower().endswith(ARCHIVE_SUFFIXES):
        arrays = load_image_folder(path, root / "cache", progress=progress, batch_size=batch_size)
    elif path.is_dir():
        arrays = read_cifar_batches(path / CIFAR10_FOLDER if (path / CIFAR10_FOLDER).is_dir() else path, md5)
    elif path.is_file():
        arrays = load_npz(path)
    else:
        raise DataError(f"--data {data}: no such file or folder (expected 'auto', 'synthetic' or a path). {HOW_TO_GET}")
    check_batch_size(len(arrays.y_train), batch_size, arrays.source)
    return arrays


def make_synthetic(n_train: int = 2560, n_test: int = 512, seed: int = 0, noise: float = 40.0) -> CifarArrays:
    """A learnable CIFAR-shaped stand-in (tests, smoke runs): each class a blocky colour pattern, plus pixel noise."""
    if bad := next(((k, v) for k, v in (("n_train", n_train), ("n_test", n_test)) if not (is_int(v) and v >= 1)), 0):
        raise ValueError(f"{bad[0]} must be a positive integer; got {bad[1]!r}")
    rng, arrays = np.random.default_rng(seed), []
    templates = np.kron(rng.normal(size=(10, 4, 4, 3)), np.ones((1, 8, 8, 1)))
    for n in (n_train, n_test):
        y = rng.permutation(np.arange(n) % 10)
        x = 128 + 50 * templates[y] + noise * rng.normal(size=(n, 32, 32, 3))
        arrays += [np.clip(np.rint(x), 0, 255).astype(np.uint8), y.astype(np.int64)]
    return CifarArrays(*arrays, source=f"synthetic(n_train={n_train}, n_test={n_test}, seed={seed})", kind="synthetic")
