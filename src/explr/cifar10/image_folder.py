"""Image-folder trees ``train/<class>/*`` and ``test/<class>/*`` (PNG or JPEG) and ``.tar``/``.tar.gz``/``.tgz``
archives of one: walked or streamed with every entry checked (regular files of at most
:data:`MAX_IMAGE_BYTES`, links only inside the tree), decoded once with Pillow and cached, sealed for the
source and :data:`DECODER` (:mod:`explr.cifar10.arrays`).
"""
from __future__ import annotations

import functools
import hashlib
import io
import lzma
import os
import posixpath
import stat
import sys
import tarfile
import warnings
import zlib
from pathlib import Path

import numpy as np

from .files import remove_stale_leftovers
from .arrays import CLASSES, HOW_TO_GET, CifarArrays, DataError
from .arrays import _check_batch_size, _check_cache_folder, _file_hash, _one_line, _read_cache, _shown, _size, _write_cache


__all__ = ["DECODER", "MAX_IMAGE_BYTES", "load_image_folder", "write_image_folder"]

#: the version of the decoding (raise the number when :func:`_decode_tree` or the labels change): a cache made by
#: another decoder is rebuilt.  ``decoder()`` adds Pillow's version, which stands for its libjpeg and libpng.
DECODER = "explr image-folder decoder 1"


def decoder() -> str:
    """:data:`DECODER` and Pillow's installed version, read from its metadata: importing ``explr.cifar10`` must
    not need Pillow, which only an image-folder source uses."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{DECODER}, Pillow {version('pillow')}"
    except PackageNotFoundError:
        return f"{DECODER}, no Pillow"


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


def load_image_folder(path, cache_dir="data/cache", progress: bool = True, batch_size: int | None = None) \
        -> CifarArrays:
    """An image-folder tree or a ``.tar``/``.tar.gz``/``.tgz`` of one, decoded once and cached (module docstring).

    The cache file is ``<cache_dir>/image-folder-<sha256>.npz``, keyed by the archive's sha256 (for a
    folder: the digest of its images' paths and bytes) and sealed for it and :data:`DECODER` under this user's key
    (:func:`~explr.cifar10.arrays.cache_key`); ``cache_dir=None`` disables it.  A damaged, mismatched or forged
    cache is rebuilt (one line on stderr), and temporary files of killed cache writes are removed.
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
    arrays = None if cache is None else _read_cache(cache, key, decoder(), path.name, kind)
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
        _write_cache(cache, arrays, key, decoder())
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
