"""explr.cifar10.archives: tar archives read as a stream -- a compression told by its magic bytes, a truncated or
non-tar file refused in one line, and the headers that tarfile would hold whole refused before they are read.

Every archive here is generated in a temporary folder; nothing needs the shared CIFAR-10 files."""
import re
import tarfile

import numpy as np
import pytest

from explr.cifar10 import image_folder as image_folder_module
from explr.cifar10.arrays import DataError
from explr.cifar10.image_folder import load_image_folder, write_image_folder
from explr.cifar10.sources import make_synthetic

@pytest.fixture(scope="module")
def small():
    return make_synthetic(n_train=40, n_test=20, seed=3)


@pytest.mark.parametrize("compression", ["bz2", "lzma"])
def test_a_tar_compressed_otherwise_is_read_as_tarfiles_r_star_would(tmp_path, small, compression):
    """A ``.tar`` that is bzip2- or xz-compressed is recognised by its magic bytes, as tarfile's ``r|*`` does."""
    plain = write_image_folder(tmp_path / "t", small, archive="tar")
    packed = tmp_path / "packed" / "t.tar"
    packed.parent.mkdir()
    packed.write_bytes(__import__(compression).compress(plain.read_bytes()))
    assert packed.read_bytes()[:3] != plain.read_bytes()[:3]
    got = load_image_folder(packed, cache_dir=None, progress=False)
    np.testing.assert_array_equal(got.x_train, load_image_folder(plain, cache_dir=None, progress=False).x_train)


def test_a_truncated_tarball_is_refused(tmp_path, small):
    src = write_image_folder(tmp_path / "t", small, archive="tar.gz")
    src.write_bytes(src.read_bytes()[: len(src.read_bytes()) // 2])
    with pytest.raises(DataError, match="t.tar.gz: not a readable tar archive, or truncated"):
        load_image_folder(src, cache_dir=None, progress=False)


def test_an_archive_that_is_not_gzip_is_one_line(tmp_path):
    """Item 20: a .tar.gz that is not gzip got a 5-line message (one line per compression tried)."""
    src = tmp_path / "bad.tar.gz"
    src.write_bytes(b"hello\nworld\n" * 100)
    with pytest.raises(DataError, match="bad.tar.gz: not a readable tar archive") as err:
        load_image_folder(src, cache_dir=None, progress=False)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- headers that tarfile would hold whole
def _tar_header(name, kind, size):
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info.tobuf(tarfile.USTAR_FORMAT)


def test_tar_headers_that_tarfile_would_hold_whole_are_refused_before_they_are_read(tmp_path):
    """Issue 41 item 1, in tarfile itself: a pax header is read whole into memory (a 16 MiB one from a 16 KiB
    .tar.gz), a chain of them recursively (RecursionError), and a GNU sparse map grows with the archive."""
    import gzip
    import tracemalloc

    record = b"19 path=abcdefghij\n"
    archives = {
        "pax.tar.gz": _tar_header("././@PaxHeader", tarfile.XHDTYPE, 16 << 20) + bytes(16 << 20),
        "chain.tar.gz": (_tar_header("././@PaxHeader", tarfile.XHDTYPE, len(record)) + record.ljust(512, b"\0"))
        * 3000,
        "sparse.tar.gz": _tar_header("cifar/train/cat/0.png", tarfile.GNUTYPE_SPARSE, 0),
    }
    for name, content in archives.items():
        with gzip.open(tmp_path / name, "wb") as f:
            f.write(content + bytes(1024))
        tracemalloc.start()
        try:
            with pytest.raises(DataError, match=rf"^{re.escape(name)}: not a readable tar archive") as err:
                load_image_folder(tmp_path / name, cache_dir=None, progress=False)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 8 * image_folder_module.MAX_IMAGE_BYTES, f"{name}: peak {peak / 2**20:.1f} MiB"
        assert "\n" not in str(err.value)
