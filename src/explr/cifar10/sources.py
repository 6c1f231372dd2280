"""Where CIFAR-10 comes from: :func:`load_cifar10` (the CLI's ``--data``: auto, synthetic, a ``.npz``, a folder
of CIFAR-10's python batches, an image-folder tree or an archive of one), the download (md5-checked), the python
batches (each md5-checked against :data:`CIFAR10_FILES_MD5` before a restricted unpickler reads it) and
:func:`make_synthetic`.

Sources accepted by :func:`load_cifar10` (the CLI's ``--data``):

* ``"auto"`` -- the real CIFAR-10 (Krizhevsky 2009).  If ``<root>/cifar-10-batches-py`` is absent, the
  archive is downloaded with torchvision's ``download_url`` into ``root`` and md5-checked before it is
  extracted; every python batch is md5-checked against the official table (:data:`CIFAR10_FILES_MD5`)
  *before* it is unpickled, and the unpickler only accepts the few numpy globals an array needs.
* a directory holding ``cifar-10-batches-py/`` or the batch files themselves (same checks);
* a ``.npz`` file with ``x_train, y_train, x_test, y_test`` (images uint8 ``(N, 32, 32, 3)`` HWC RGB,
  labels integers in 0..9), read with ``np.load(allow_pickle=False)`` after every ``.npy`` header has
  been checked (readable, no pickle, the declared sizes within the memory available);
* an image-folder tree ``train/<class>/*`` and ``test/<class>/*`` (32×32 8-bit RGB PNG or JPEG files, class
  folders named after CIFAR-10's classes, labels in sorted class-name order), or a ``.tar``, ``.tar.gz``
  or ``.tgz`` holding one (at its top level or under one folder; the archive is streamed, and only its
  image members are read, each checked as it streams).  Only regular files of at most
  :data:`~explr.cifar10.image_folder.MAX_IMAGE_BYTES` are read, links only where they stay inside the tree, and
  the tree must fit in the memory available.  It needs Pillow (the ``cifar10`` extra), is decoded once and the
  uint8 arrays are cached in ``<data_root>/cache/`` under the sha256 of the bytes decoded (a source that changes
  while it is read is refused), sealed with an HMAC of the arrays, the source and the decoder's version under a
  key of this user (:mod:`~explr.cifar10.arrays`; verified on load: a damaged, mismatched or forged cache is
  rebuilt), so later runs load in about a second;
* ``"synthetic"`` -- a small generated, learnable stand-in (tests, smoke runs).

Bad data is one :class:`~explr.cifar10.arrays.DataError` line (a ``ValueError``: the CLI prints it and exits with
code 2) naming the file, tar member or array, and nothing is created.
"""
from __future__ import annotations

import contextlib
import pickle
import tarfile
from pathlib import Path

import numpy as np

from ..params import is_int
from .arrays import CIFAR10_ARCHIVE, CIFAR10_ARCHIVE_MD5, CIFAR10_URL, CLASSES, HOW_TO_GET, CifarArrays, DataError
from .arrays import _check_batch_size, _check_split, _file_hash, load_npz
from .image_folder import _is_archive, _is_image_folder, load_image_folder


__all__ = [
    "CIFAR10_FILES_MD5",
    "download_cifar10",
    "load_cifar10",
    "make_synthetic",
    "read_cifar_batches",
    "write_cifar_batches",
]

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
        if not (is_int(v) and v >= 1):
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
