"""Image-folder trees ``train/<class>/*`` and ``test/<class>/*`` (8-bit RGB PNG or JPEG) and
``.tar``/``.tar.gz``/``.tgz`` archives of one: walked or streamed with every entry checked (regular files of at most
:data:`MAX_IMAGE_BYTES`, links only inside the tree), decoded once with Pillow and cached, sealed for the
source and :data:`DECODER` (:mod:`explr.cifar10.arrays`).

A source's digest, the key of its cache, is computed first (an archive's sha256; a folder tree is listed and
validated, then its images read for it).  If no cache holds it, an archive is listed and validated, and the source
decoded, each pass hashing the very bytes it reads: a source whose digest changes between the passes is refused,
so a cache is only ever sealed for the bytes its images came from.  An archive's image members are checked one by one as they stream (one member in
memory at a time), and the tree's listing and its decoded pixels are bounded by the memory available
(:class:`_Budget`).
"""
from __future__ import annotations

import functools
import hashlib
import io
import os
import posixpath
import stat
import sys
import tarfile
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np

from . import hardware
from .archives import stream_tar
from .files import remove_stale_leftovers
from .arrays import CLASSES, HOW_TO_GET, CifarArrays, DataError
from .arrays import _check_batch_size, _check_cache_folder, _file_hash, _one_line, _read_cache, _shown, _size, _write_cache


__all__ = ["DECODER", "MAX_IMAGE_BYTES", "load_image_folder", "write_image_folder"]

#: the version of the decoding (raise the number when :func:`_decode_image` or the labels change): a cache made by
#: another decoder is rebuilt.  ``decoder()`` adds Pillow's version, which stands for its libjpeg and libpng.
DECODER = "explr image-folder decoder 2"
#: how to install Pillow, which only image-folder sources need.
INSTALL_PILLOW = "pip install 'explr-book[cifar10]'"


def decoder() -> str:
    """:data:`DECODER` and Pillow's installed version, read from its metadata: importing ``explr.cifar10`` must
    not need Pillow, which only an image-folder source uses."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{DECODER}, Pillow {version('pillow')}"
    except PackageNotFoundError:
        return f"{DECODER}, no Pillow"


def _check_pillow(source: str) -> None:
    """Refuse an image-folder source where Pillow is not installed, in one line naming the extra that installs it."""
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        raise DataError(f"--data {source}: an image folder needs Pillow, which is not installed; {INSTALL_PILLOW}") \
            from None


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


def _too_large(size: int, shown: str) -> str | None:
    """Why a file of ``size`` bytes is no image: larger than :data:`MAX_IMAGE_BYTES` (it would be read into memory,
    and no 32×32 image is that large); None if it is not."""
    if size > MAX_IMAGE_BYTES:
        return (f"{shown}: {_size(size)}, larger than a 32×32 image file can be (at most {_size(MAX_IMAGE_BYTES)}); "
                "expected a 32×32 PNG or JPEG")
    return None


def _check_image_bytes(size: int, shown: str) -> None:
    """Refuse a file larger than :data:`MAX_IMAGE_BYTES` (:func:`_too_large`)."""
    if message := _too_large(size, shown):
        raise DataError(message)


#: bytes of one decoded image (uint8 32×32×3), and the memory one listed entry of a tree is charged: its names and
#: bookkeeping (an over-estimate: listing takes about 300 bytes an archive member and 1 KiB a folder entry).
IMAGE_BYTES = 32 * 32 * 3
ENTRY_BYTES = 2048


class _Budget:
    """The memory a source may take while it is read: each entry of its tree is charged as it is listed
    (:data:`ENTRY_BYTES` and its name), then its images' pixels (:data:`IMAGE_BYTES` each); a source whose charge
    passes the memory available (:func:`~explr.cifar10.hardware.available_memory`, taken once; unbounded where
    unknown) is refused in one line, before it is decoded."""

    def __init__(self, source: str):
        self.source, self.available, self.used, self.entries = source, hardware.available_memory(), 0, 0

    def entry(self, name: str) -> None:
        self.entries += 1
        self.used += ENTRY_BYTES + len(name)
        self._check(f"its entries ({self.entries} listed so far)")

    def images(self, n: int) -> None:
        self.used += n * IMAGE_BYTES
        self._check(f"{n} images of 32×32 RGB and the tree's listing")

    def _check(self, what: str) -> None:
        if self.available is not None and self.used > self.available:
            raise DataError(f"{self.source}: {what} need {_size(self.used)}, more than the {_size(self.available)} "
                            "of memory available")


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


def _tree_entries_from_folder(root: Path, budget: _Budget):
    """(relative posix path, is_dir, read()) of ``root``'s splits, their class folders and those folders' entries,
    each charged to ``budget`` as it is listed.

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
            budget.entry(name)
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


class _Member(NamedTuple):
    """A tar member that may be an image of the tree: its normal name, and why it cannot be one (raised only if
    the tree uses it), or None."""

    name: str
    refusal: str | None


def _member_refusal(member: tarfile.TarInfo, shown: str) -> str | None:
    """Why ``member`` cannot be an image, from its header alone: not a regular file, or larger than
    :data:`MAX_IMAGE_BYTES`; None if it may be one."""
    if not member.isfile():
        kind = _TAR_KINDS.get(member.type, "a special file")
        return f"{shown}: not a regular file in the archive ({kind}); expected a 32×32 PNG or JPEG"
    return _too_large(member.size, shown)


def _tree_entries_from_tar(path: Path, budget: _Budget) -> tuple[str, list]:
    """The archive's sha256 and, like :func:`_tree_entries_from_folder`, its entries (relative path, is_dir,
    :class:`_Member` or None), from one pass (:func:`~explr.cifar10.archives.stream_tar`) that reads no member's
    content.

    Member names are normalised (:func:`_member_name`); a name that occurs twice is refused; each member is
    charged to ``budget`` as it is listed.  Members that may be images (:func:`_may_be_image`) carry their
    :class:`_Member`.  The tree may sit at the archive's top level or under one folder (hidden entries beside it,
    such as AppleDouble ``._<folder>`` files, do not count).
    """
    members = {}  # normal name -> (name in the archive, is_dir, _Member or None)

    def visit(tar, m):
        name = _member_name(m.name)
        if name is None:
            return
        if name in members and not (m.isdir() and members[name][1]):
            raise DataError(f"{path.name}: the archive holds {_shown(members[name][0])!r} and {_shown(m.name)!r}, "
                            f"both {_shown(name)}; keep one")
        budget.entry(m.name)
        image = _Member(name, _member_refusal(m, f"{path.name}: {_shown(name)}")) if _may_be_image(name) else None
        members[name] = (m.name, m.isdir(), image)

    digest = stream_tar(path, visit)
    tops = {top for top in (n.split("/")[0] for n in members) if not _hidden(top)}
    prefix = next(iter(tops)) + "/" if len(tops) == 1 and not tops & set(SPLITS) else ""
    return digest, [(name[len(prefix):], *members[name][1:]) for name in sorted(members) if name.startswith(prefix)]


def _png_bit_depth(raw: bytes) -> int | None:
    """The bit depth a PNG's IHDR chunk declares (byte 24: the 8-byte signature, then IHDR's length, type, width
    and height, 4 bytes each; the PNG spec puts IHDR first); None if IHDR is not there."""
    return raw[24] if raw[12:16] == b"IHDR" and len(raw) > 24 else None


def _decode_image(name: str, raw: bytes) -> np.ndarray:
    """One 32×32 RGB PNG/JPEG → uint8 (32, 32, 3); anything else is a :class:`DataError` naming the file.

    Every failure of Pillow is caught here, in one place: a decompression bomb (a header declaring a huge
    image: an error, or a warning made one), a truncated or malformed file, whatever exception it raises.
    A PNG of 16 bits per channel, which Pillow opens as mode RGB keeping only the high byte of each value, is
    refused by the bit depth its IHDR chunk declares (:func:`_png_bit_depth`).
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
                if im.format == "PNG" and (depth := _png_bit_depth(raw)) != 8:
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


def _digest_entry(rel: str, raw: bytes) -> bytes:
    """What one image adds to a folder tree's digest: its relative path and the sha256 of its bytes."""
    return os.fsencode(rel) + b"\0" + hashlib.sha256(raw).digest()


def _tree_digest(files: dict) -> str:
    """sha256 over every image's relative path and bytes (in decoding order): equal trees share a cache entry."""
    digest = hashlib.sha256()
    for split in SPLITS:
        for rel, read, _ in _in_order(files, split):
            digest.update(_digest_entry(rel, read()))
    return digest.hexdigest()


def _decode_tree(files: dict, source: str, progress: bool, archive: Path | None) -> tuple[list[np.ndarray], str]:
    """Decode a validated tree (:func:`_tree_files`): ``[x_train, y_train, x_test, y_test]``, and the digest of
    the bytes decoded (:func:`_tree_digest` of a folder tree, the sha256 of ``archive``), each file read once.

    A folder's images are read in decoding order, an archive's as they stream
    (:func:`~explr.cifar10.archives.stream_tar`), each decoded into arrays allocated for the tree's images at the
    start.
    """
    from tqdm import tqdm

    out, slots = [], {}  # slots: image (read() or _Member) -> (x array, position)
    for split in SPLITS:
        items = list(_in_order(files, split))
        x = np.empty((len(items), 32, 32, 3), dtype=np.uint8)
        out += [x, np.asarray([label for *_, label in items], dtype=np.int64)]
        slots.update({image: (x, i, rel) for i, (rel, image, _) in enumerate(items)})
    with tqdm(total=len(slots), desc=f"decoding {source}", unit="img", file=sys.stderr, disable=not progress,
              leave=False) as bar:
        def decode(image, raw):
            x, i, rel = slots[image]
            x[i] = _decode_image(f"{source}: {_shown(rel)}", raw)
            bar.update()

        if archive is None:
            digest = hashlib.sha256()
            for read, (_, _, rel) in slots.items():  # in decoding order, as _tree_digest reads them
                raw = read()
                digest.update(_digest_entry(rel, raw))
                decode(read, raw)
            return out, digest.hexdigest()
        members = {image.name: image for image in slots}

        def visit(tar, m):  # an archive that changed since it was listed is refused by its digest
            image = members.get(_member_name(m.name))
            if image is not None and _member_refusal(m, "") is None:
                decode(image, tar.extractfile(m).read(MAX_IMAGE_BYTES + 1))
        return out, stream_tar(archive, visit)


def _checked_tree(entries, source: str, budget: _Budget) -> dict:
    """The tree of ``entries`` validated (:func:`_tree_files`), its images charged to ``budget``, and no image it
    uses refused by its archive header (:class:`_Member`)."""
    files = _tree_files(entries, source)
    images = [image for split in SPLITS for _, image, _ in _in_order(files, split)]
    budget.images(len(images))
    if refused := next((m.refusal for m in images if isinstance(m, _Member) and m.refusal), None):
        raise DataError(refused)
    return files


def _check_unchanged(source: str, key: str, digest: str) -> None:
    """Refuse a source whose digest, read again, is not ``key`` (it changed between two reads): a cache is sealed
    only for the bytes its images were decoded from."""
    if digest != key:
        raise DataError(f"{source} changed while it was read (first sha256:{key[:16]}…, then other bytes); nothing "
                        "was cached: run again when nothing writes to it")


def load_image_folder(path, cache_dir="data/cache", progress: bool = True, batch_size: int | None = None) \
        -> CifarArrays:
    """An image-folder tree or a ``.tar``/``.tar.gz``/``.tgz`` of one, decoded once and cached (module docstring).

    The cache file is ``<cache_dir>/image-folder-<sha256>.npz``, keyed by the archive's sha256 (for a
    folder: the digest of its images' paths and bytes) and sealed for it and :data:`DECODER` under this user's key
    (:func:`~explr.cifar10.arrays.cache_key`); ``cache_dir=None`` disables it.  A damaged, mismatched or forged
    cache is rebuilt (one line on stderr), and temporary files of killed cache writes are removed.
    Before anything is decoded, Pillow's presence is checked, the tree is validated and its size bounded by the
    memory available, the batch size (``batch_size``, if given) checked against its training images and the cache
    folder checked for writing; a source that changed between its digest and its decoding is refused, and
    constant images are refused before the cache is written.
    """
    path = Path(path).expanduser()
    archive = path.is_file() and _is_archive(path)
    if not (archive or path.is_dir()):
        raise DataError(f"--data {path}: no such image folder or archive. {HOW_TO_GET}")
    _check_pillow(path.name)
    kind = "image-folder-tar" if archive else "image-folder"
    cache_dir = None if cache_dir is None else Path(cache_dir).expanduser()
    if cache_dir is not None and cache_dir.is_dir():
        remove_stale_leftovers(cache_dir)
    budget = _Budget(path.name)
    if archive:  # the cache's key from the file alone; the passes that list and decode it must read the same bytes
        key, files = _file_hash(path, "sha256"), None
    else:
        files = _checked_tree(_tree_entries_from_folder(path, budget), path.name, budget)
        key = _tree_digest(files)
    cache = None if cache_dir is None else cache_dir / f"image-folder-{key}.npz"
    arrays = None if cache is None else _read_cache(cache, key, decoder(), path.name, kind)
    if arrays is not None:
        _check_batch_size(len(arrays.y_train), batch_size, path.name)
        return arrays
    if files is None:
        listed, entries = _tree_entries_from_tar(path, budget)
        files = _checked_tree(entries, path.name, budget)
        _check_unchanged(path.name, key, listed)
    _check_batch_size(sum(len(v) for v in files["train"].values()), batch_size, path.name)
    if cache is not None:
        _check_cache_folder(cache_dir)
    decoded, digest = _decode_tree(files, path.name, progress, path if archive else None)
    _check_unchanged(path.name, key, digest)
    arrays = CifarArrays(*decoded, source=path.name, kind=kind, files={path.name: "sha256:" + key})
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
