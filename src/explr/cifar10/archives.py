"""Tar archives read as a stream, once, front to back (:func:`stream_tar`): hashed from the very bytes parsed, and
in memory that does not grow with the archive (decompression bounded per read, no list of members kept, the
headers tarfile would hold whole bounded by :data:`MAX_TAR_HEADER_BYTES`).
"""
from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import lzma
import tarfile
import zlib
from pathlib import Path

from .arrays import HOW_TO_GET, DataError
from .arrays import _one_line, _shown, _size

__all__ = ["MAX_TAR_HEADER_BYTES", "stream_tar"]


class _HashedReader:
    """A binary file read front to back, with the sha256 of exactly the bytes read from it: what is parsed is what
    is hashed, whatever happens to the file's path meanwhile."""

    def __init__(self, f):
        self._f, self._sha256 = f, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(size)
        self._sha256.update(data)
        return data

    def sha256(self) -> str:
        """The sha256 of the whole file: what is left of it is read (and hashed) first."""
        while self.read(1 << 20):
            pass
        return self._sha256.hexdigest()


#: the largest extended header (pax, GNU long name) of a member: a path is at most 4 KiB (``PATH_MAX``), and
#: extended attributes add a few more.
MAX_TAR_HEADER_BYTES = 64 << 10
_EXTENDED = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
             tarfile.GNUTYPE_LONGLINK)


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile's member header, refusing what tarfile would read whole into memory before it reads it: an extended
    header larger than :data:`MAX_TAR_HEADER_BYTES`, or a GNU sparse member (its map grows with the archive, and
    no image file is sparse)."""

    def _proc_member(self, tar):
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise tarfile.HeaderError(f"{_shown(self.name)} is a GNU sparse file; expected 32×32 PNG or JPEG files")
        if self.type in _EXTENDED and self.size > MAX_TAR_HEADER_BYTES:
            raise tarfile.HeaderError(f"an extended header of {_size(self.size)}, more than a member's "
                                      f"{_size(MAX_TAR_HEADER_BYTES)}")
        return super()._proc_member(tar)


#: the compressions of a tar archive, by their magic bytes (those of tarfile's ``r|*``).
_COMPRESSIONS = ((b"\x1f\x8b", lambda f: gzip.GzipFile(fileobj=f, mode="rb")), (b"BZh", bz2.BZ2File),
                 (b"\xfd7zXZ\x00", lzma.LZMAFile))


def stream_tar(path: Path, visit) -> str:
    """Read the tar archive at ``path`` once, front to back, calling ``visit(tar, member)`` on each member in order,
    and return the sha256 of the file, hashed from the very bytes parsed (:class:`_HashedReader`).

    The archive is streamed (``r|``: gzip cannot seek cheaply); gzip, bzip2 and xz are decompressed by their
    modules' readers, which bound the bytes each read makes, tarfile's list of the members read is emptied as it
    goes, and headers tarfile would hold whole are bounded (:class:`_BoundedTarInfo`): memory does not grow with
    the archive.  An unreadable archive is one :class:`DataError` line.
    """
    try:
        with open(path, "rb") as f, contextlib.ExitStack() as stack:
            hashed = _HashedReader(f)
            head = f.peek(6)[:6]
            decompress = next((open_ for magic, open_ in _COMPRESSIONS if head.startswith(magic)), None)
            raw = hashed if decompress is None else stack.enter_context(decompress(hashed))
            tar = stack.enter_context(tarfile.open(fileobj=raw, mode="r|", tarinfo=_BoundedTarInfo))
            while (member := tar.next()) is not None:
                tar.members.clear()  # tarfile keeps every member it has read; a stream needs none of them
                visit(tar, member)
            return hashed.sha256()
    except (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError, RecursionError) as err:
        # RecursionError: tarfile reads a chain of extended headers recursively
        raise DataError(f"{path.name}: not a readable tar archive, or truncated ({_one_line(err)}). {HOW_TO_GET}") \
            from None
