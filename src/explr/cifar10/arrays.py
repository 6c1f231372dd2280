"""CIFAR-10 in memory and on disk as arrays: :class:`CifarArrays` (checksum, channel statistics), the checks
every source passes (:class:`DataError`, one line saying how to get the data), the ``.npz`` format
(:func:`load_npz`: every ``.npy`` header checked before anything is allocated, no pickles; :func:`write_npz`)
and the decode cache of image folders.

The decode cache is a ``.npz`` of the decoded arrays and their *seal*: an HMAC-SHA256, under a secret key of
this user (:func:`cache_key`), of the arrays' checksum, the source's sha256 and the decoder's version.  A
checksum alone would not do: anyone who can write the cache file (a shared or copied ``--data-root``, another
user of a group-writable folder) could put other images there and recompute any plain sha256, and the runs
would train on them while their manifests name the archive's sha256.  Without the key no one can seal other
arrays, or a cache made for another source or by another decoder version.  The key is kept apart from the
caches, in ``$XDG_CACHE_HOME/explr`` (``~/.cache/explr`` where ``XDG_CACHE_HOME`` is unset or relative): a regular
file of this user that no one else may read (anything else, or a path that cannot hold it, is refused in one line
naming the path and what to do).  A cache that is not sealed for its source, its decoder and
this key (from another machine or user, an older format, or changed since) is rebuilt, with one line on stderr.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import math
import os
import secrets
import stat
import sys
import tempfile
import zipfile
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

import numpy as np

from . import hardware
from .files import atomic_write


__all__ = [
    "CLASSES",
    "CIFAR10_URL",
    "CIFAR10_ARCHIVE_MD5",
    "NPZ_KEYS",
    "DataError",
    "CifarArrays",
    "DataIdentity",
    "arrays_sha256",
    "cache_key",
    "load_npz",
    "write_npz",
]

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR10_ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_FOLDER = "cifar-10-batches-py"
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")

HOW_TO_GET = (
    "Get CIFAR-10 with `--data auto` (downloads {url} into --data-root, md5 {md5}), or download and extract "
    "that archive yourself and pass its folder, or pass a .npz with uint8 arrays x_train (N,32,32,3), "
    "y_train (N,), x_test (M,32,32,3), y_test (M,), or an image-folder tree train/<class>/*.png|jpg and "
    "test/<class>/*.png|jpg (or a .tar/.tar.gz/.tgz of it)."
).format(url=CIFAR10_URL, md5=CIFAR10_ARCHIVE_MD5)


class DataError(ValueError):
    """The data is missing or not what was expected; the message says how to get it."""


class DataIdentity(NamedTuple):
    """Which data a run trains on, without the images: its source's name, the arrays' sha256, the training images."""

    source: str
    sha256: str
    n_train: int


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

    @property
    def identity(self) -> DataIdentity:
        return DataIdentity(self.source, self.sha256, int(len(self.y_train)))

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
    """Refuse a ``.npz`` whose arrays, as their headers declare them, need more than the memory available
    (:func:`~explr.cifar10.hardware.available_memory`; nothing is refused where it is unknown)."""
    available, total = hardware.available_memory(), 0
    if available is None:
        return
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
    """Read ``x_train, y_train, x_test, y_test`` from a ``.npz`` (``_read_npz``: headers checked first, no pickles)."""
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


# ----------------------------------------------------------------------------- the decode cache
CACHE_KEYS = NPZ_KEYS + ("seal",)
KEY_BYTES = 32


def _cache_key_path() -> Path:
    """``$XDG_CACHE_HOME/explr/decode-cache.key``, or ``~/.cache/explr/...`` where ``XDG_CACHE_HOME`` is unset, empty
    or relative (the XDG Base Directory spec: a relative path is invalid and is ignored)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "explr" / "decode-cache.key"
    remedy = "set HOME or XDG_CACHE_HOME to a folder of yours"
    try:
        home = Path.home()
    except RuntimeError:  # HOME unset and no passwd entry for this uid (docker --user)
        raise DataError(f"cannot find the decode cache's key: HOME is not set and uid {os.getuid()} has no home "
                        f"folder; {remedy}") from None
    if not home.is_absolute():
        raise DataError(f"cannot find the decode cache's key: HOME={home} is not an absolute path; {remedy}")
    return home / ".cache" / "explr" / "decode-cache.key"


def _not_a_folder(path: Path) -> DataError:
    """The error for a key ``path`` under a file (``ENOTDIR``), naming the file that stands where a folder goes."""
    blocker = next((p for p in reversed(path.parents) if p.exists() and not p.is_dir()), path.parent)
    return DataError(f"{blocker} is a file, not a folder: the decode cache's key {path} cannot be kept there; move it "
                     "away or set XDG_CACHE_HOME to a folder of yours")


def _read_cache_key(path: Path) -> bytes:
    """The key at ``path``: a regular file (not a link) of this user, of :data:`KEY_BYTES` bytes, that no one else
    may read or write; :class:`DataError` naming it otherwise (``FileNotFoundError`` when there is none)."""
    remedy = "delete it (a new key is made, and the decode caches are rebuilt once)"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise DataError(f"{path} is not a regular file (a symbolic link); {remedy}") from None
        if err.errno == errno.ENOTDIR:
            raise _not_a_folder(path) from None
        if err.errno in (errno.EACCES, errno.EPERM):
            raise DataError(f"{path} cannot be read ({err.strerror}); make it readable by you (chmod 600 {path}) or "
                            f"{remedy}") from None
        raise DataError(f"{path} cannot be read ({err.strerror or _one_line(err)}); {remedy}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = " (a folder)" if stat.S_ISDIR(st.st_mode) else ""
            raise DataError(f"{path} is not a regular file{kind}; {remedy}")
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise DataError(f"{path} may be read by other users (mode {st.st_mode & 0o777:o}, owner uid {st.st_uid}): "
                            f"it is the secret that seals your decode caches; {remedy}")
        key = os.read(fd, KEY_BYTES + 1)
    except OSError as err:
        raise DataError(f"{path} cannot be read ({err.strerror or _one_line(err)}); {remedy}") from None
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise DataError(f"{path} is not a key of this engine ({KEY_BYTES} bytes); {remedy}")
    return key


def cache_key() -> bytes:
    """This user's secret key that seals the decode caches (module docstring), made on first use: random bytes in
    ``$XDG_CACHE_HOME/explr/decode-cache.key`` (mode 0600).  Processes that make it at once agree on one key (the
    first ``os.link`` wins).  :class:`DataError` naming the file if it cannot be made or is not safe."""
    path = _cache_key_path()
    with contextlib.suppress(FileNotFoundError):
        return _read_cache_key(path)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "wb") as f:
            f.write(secrets.token_bytes(KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
        try:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
    except OSError as err:
        if err.errno in (errno.ENOTDIR, errno.EEXIST) and not path.parent.is_dir():
            raise _not_a_folder(path) from None
        raise DataError(f"cannot make the decode cache's key {path} ({err.strerror or _one_line(err)}); set "
                        "XDG_CACHE_HOME to a folder of yours that can be written") from None
    return _read_cache_key(path)


def _seal(secret: bytes, key: str, decoder: str, digest: str) -> str:
    """The HMAC-SHA256 under ``secret`` of the arrays' checksum ``digest``, the source's digest ``key`` and
    ``decoder``: what a cache of those arrays, made from that source by that decoder, records."""
    return hmac.new(secret, f"explr decode cache\0{decoder}\0{key}\0{digest}".encode(), hashlib.sha256).hexdigest()


def _seal_matches(found: np.ndarray, expected: str) -> bool:
    """Whether a cache's ``seal`` array is the string ``expected``, compared in constant time; a seal of any other
    type or shape, or holding characters no seal has, does not match (it is someone's forgery, not an error)."""
    if found.shape != () or found.dtype.kind != "U":
        return False
    return hmac.compare_digest(found.item().encode("utf-8", "surrogatepass"), expected.encode())


def _check_cache_folder(cache_dir: Path) -> None:
    """Refuse, before anything is decoded, a cache folder that cannot be written (read-only, not a folder):
    a probe file is created in the nearest existing folder and removed.  The key that seals the cache
    (:func:`cache_key`) must be usable too."""
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
    cache_key()


def _read_cache(cache: Path, key: str, decoder: str, source: str, kind: str) -> CifarArrays | None:
    """The arrays cached for the source with digest ``key`` by ``decoder``, or None.

    The cache must be a readable ``.npz`` (:func:`_read_npz`) of valid splits whose seal is that of its arrays,
    ``key`` and ``decoder`` under :func:`cache_key` (module docstring); one that is not (truncated, an older
    format, other arrays, another source, decoder or key) is reported in one line on stderr and None is
    returned, so that it is rebuilt.
    """
    if not cache.is_file():
        return None
    secret = cache_key()
    try:
        a = _read_npz(cache, CACHE_KEYS)
        x_train, y_train = _check_split("train", a["x_train"], a["y_train"], str(cache))
        x_test, y_test = _check_split("test", a["x_test"], a["y_test"], str(cache))
        digest = arrays_sha256(x_train, y_train, x_test, y_test)
        if not _seal_matches(a["seal"], _seal(secret, key, decoder, digest)):
            raise DataError(f"{cache}: not written by this engine's decoder for {source} (its seal does not match: "
                            "arrays changed since, or made for another source, by another decoder version or under "
                            "another user's key)")
    except DataError as err:
        print(f"{err}; rebuilding the cache from {source}", file=sys.stderr)
        return None
    return CifarArrays(x_train, y_train, x_test, y_test, source=source, kind=kind, files={source: "sha256:" + key},
                       sha256=digest)


def _write_cache(cache: Path, arrays: CifarArrays, key: str, decoder: str) -> None:
    """Write the arrays and their seal for the source's digest ``key`` and ``decoder`` to ``cache`` atomically; a
    full disk or another write error is one :class:`DataError` line, and the temporary file is removed."""
    content = {k: getattr(arrays, k) for k in NPZ_KEYS}
    content.update(seal=np.array(_seal(cache_key(), key, decoder, arrays.sha256)))
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
