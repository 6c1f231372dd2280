"""explr.cifar10.arrays: the decode cache's edges (issue 41 items 3, 5, 6): a forged seal and the decode key's path
(a folder, a file where its folder goes, unreadable, no home, a relative ``XDG_CACHE_HOME``): a rebuilt cache or one
line naming the path and what to do, never a traceback; the .npz format (every header checked before anything is
allocated, no pickles) and the checks every source's arrays pass.  (Another host's temporary files in a shared
``--data-root``: test_files.py.)

Every tree here is generated in a temporary folder; nothing needs the shared CIFAR-10 files.
"""
import errno
import io
import os
import zipfile

import numpy as np
import pytest

from explr.cifar10 import arrays as arrays_module
from explr.cifar10 import hardware
from explr.cifar10.arrays import CifarArrays, DataError, cache_key, load_npz, write_npz
from explr.cifar10.image_folder import load_image_folder, write_image_folder
from explr.cifar10.sources import load_cifar10, make_synthetic, read_cifar_batches


@pytest.fixture(autouse=True)
def key_home(tmp_path, monkeypatch):
    """The decode key's folder (``$XDG_CACHE_HOME/explr``) in this test's folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return tmp_path / "xdg-cache" / "explr"


@pytest.fixture()
def archive(tmp_path):
    return write_image_folder(tmp_path / "c", make_synthetic(n_train=40, n_test=20, seed=3), archive="tar.gz")


@pytest.fixture(scope="module")
def small():
    return make_synthetic(n_train=60, n_test=20, seed=1)


def test_a_forged_non_ascii_seal_is_rebuilt_not_a_crash(archive, tmp_path, capsys):
    """Item 3: a seal that is a non-ASCII string made hmac.compare_digest raise TypeError on every run."""
    cache = tmp_path / "cache"
    first = load_image_folder(archive, cache_dir=cache, progress=False)
    (npz,) = cache.glob("image-folder-*.npz")
    for seal in ("é" * 64, "\ud800" * 64, b"\xff" * 64, 7, ["a"]):
        with np.load(npz) as f:
            content = {k: f[k] for k in f.files}
        np.savez(npz, **{**content, "seal": np.array(seal)})
        assert load_image_folder(archive, cache_dir=cache, progress=False).sha256 == first.sha256
        assert "its seal does not match" in capsys.readouterr().err, seal
    assert load_image_folder(archive, cache_dir=cache, progress=False).sha256 == first.sha256
    assert capsys.readouterr().err == "", "rebuilt: read silently"


# ----------------------------------------------------------------------------- items 5 and 6: the decode key
def _one_line(match):
    with pytest.raises(DataError, match=match) as err:
        cache_key()
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_key_that_is_a_folder_is_one_line(key_home):
    """Item 5: IsADirectoryError."""
    (key_home / "decode-cache.key").mkdir(parents=True)
    _one_line(rf"^{key_home / 'decode-cache.key'} is not a regular file \(a folder\); delete it")


@pytest.mark.parametrize("where", ["explr", "xdg"])
def test_a_file_where_the_keys_folder_goes_is_one_line(key_home, where):
    """Item 5: NotADirectoryError."""
    blocker = key_home if where == "explr" else key_home.parent
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a folder")
    _one_line(rf"^{blocker} is a file, not a folder: the decode cache's key {key_home / 'decode-cache.key'} cannot be "
              r"kept there; move it away or set XDG_CACHE_HOME to a folder of yours$")


def test_a_key_this_user_cannot_read_is_one_line(key_home, monkeypatch):
    """Item 5: a key chmod 000 raised PermissionError for a user other than root (root reads it anyway, so the
    refusal the kernel gives a user is given by a patched ``os.open``)."""
    cache_key()
    key = key_home / "decode-cache.key"
    opened = os.open

    def refused(path, *args, **kwargs):
        if os.fspath(path) == str(key):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return opened(path, *args, **kwargs)
    monkeypatch.setattr(os, "open", refused)
    _one_line(rf"^{key} cannot be read \(Permission denied\); make it readable by you \(chmod 600 {key}\) or delete "
              r"it \(a new key is made")


def test_no_home_folder_is_one_line(monkeypatch):
    """Item 5: HOME unset for a uid without a passwd entry (``docker --user``) raised RuntimeError."""
    import pwd

    def no_entry(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    _one_line(rf"^cannot find the decode cache's key: HOME is not set and uid {os.getuid()} has no home folder; set "
              r"HOME or XDG_CACHE_HOME to a folder of yours$")
    monkeypatch.setenv("HOME", "relative/home")  # the same hazard as a relative XDG_CACHE_HOME (item 6)
    _one_line(r"^cannot find the decode cache's key: HOME=relative/home is not an absolute path; set HOME or "
              r"XDG_CACHE_HOME to a folder of yours$")


def test_a_relative_xdg_cache_home_is_ignored(tmp_path, monkeypatch):
    """Item 6: a relative XDG_CACHE_HOME put the key under the current folder (the XDG spec: such values are
    invalid and ignored), so each folder made its own key and rebuilt the caches."""
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert arrays_module._cache_key_path() == tmp_path / "home" / ".cache" / "explr" / "decode-cache.key"
    first = cache_key()
    assert (tmp_path / "home" / ".cache" / "explr" / "decode-cache.key").read_bytes() == first
    assert not (tmp_path / "relative").exists()


# ----------------------------------------------------------------------------- the .npz format
def test_missing_or_bad_data_says_what_was_expected(tmp_path, small):
    with pytest.raises(DataError, match=r"data_batch_1.*missing.*--data auto"):
        read_cifar_batches(tmp_path)
    with pytest.raises(DataError, match="no such file or folder"):
        load_cifar10(str(tmp_path / "nope"))
    with pytest.raises(DataError, match="no such file"):
        load_npz(tmp_path / "nope.npz")
    arrays = {k: getattr(small, k) for k in ("x_train", "y_train", "x_test", "y_test")}
    cases = {
        "lacks \\['y_test'\\]": {k: v for k, v in arrays.items() if k != "y_test"},
        "x_train must be uint8": {**arrays, "x_train": arrays["x_train"].astype(np.float32)},
        "x_test must be uint8 of shape \\(N, 32, 32, 3\\)": {**arrays, "x_test": arrays["x_test"][:, :16]},
        "labels in 0..9": {**arrays, "y_train": arrays["y_train"] + 5},
        "y_test must be integer labels": {**arrays, "y_test": arrays["y_test"][:-1]},
        "the array y_train \\(object\\) would need pickle to load, which is refused":
            {**arrays, "y_train": np.array([object()] * 60)},
    }
    for message, content in cases.items():
        path = tmp_path / "bad.npz"
        np.savez(path, **content)
        with pytest.raises(DataError, match=message):
            load_npz(path)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="not a readable .npz"):
        load_npz(tmp_path / "junk.npz")


# ----------------------------------------------------------------------------- hostile input (issue 23)
def npz_with_headers(path, small, headers: dict):
    """A .npz whose arrays are ``small``'s, except those in ``headers``: name → raw .npy bytes (a header, no data)."""
    with zipfile.ZipFile(path, "w") as zf:
        for key in ("x_train", "y_train", "x_test", "y_test"):
            if key in headers:
                zf.writestr(f"{key}.npy", headers[key])
            else:
                buf = io.BytesIO()
                np.save(buf, getattr(small, key))
                zf.writestr(f"{key}.npy", buf.getvalue())
    return path


def test_constant_channels_are_refused_exactly(small):
    """Item 5: every pixel 7 passed (std 4e-8 from E[x²]−E[x]² rounding); so did one constant channel."""
    seven = CifarArrays(np.full_like(small.x_train, 7), small.y_train, small.x_test, small.y_test, "s", "test")
    with pytest.raises(DataError, match="constant .*channel 0 is 7 everywhere, channel 1 is 7 everywhere"):
        seven.channel_stats  # noqa: B018
    x = small.x_train.copy()
    x[..., 2] = 200
    with pytest.raises(DataError, match=r"constant \(channel 2 is 200 everywhere\)"):
        CifarArrays(x, small.y_train, small.x_test, small.y_test, "s", "test").channel_stats  # noqa: B018
    x[0, 0, 0, 2] = 201  # one pixel differs: a real (tiny) spread
    assert CifarArrays(x, small.y_train, small.x_test, small.y_test, "s", "test").channel_stats[1][2] > 0


def test_declared_sizes_are_checked_against_memory_before_allocating(tmp_path, small, monkeypatch):
    """Item 13: a header declaring (10⁹, 32, 32, 3) gave "Unable to allocate 2.79 TiB"."""
    header = io.BytesIO()
    np.lib.format.write_array_header_2_0(header, {"descr": "|u1", "fortran_order": False,
                                                  "shape": (10**9, 32, 32, 3)})
    path = npz_with_headers(tmp_path / "huge.npz", small, {"x_train": header.getvalue()})
    monkeypatch.setattr(hardware, "available_memory", lambda: 8 << 30)
    with pytest.raises(DataError, match=r"huge\.npz: the array x_train declares shape \(1000000000, 32, 32, 3\) "
                                        r"uint8, 2\.79 TiB: more than the 8 GiB of memory available"):
        load_npz(path)
    monkeypatch.setattr(hardware, "available_memory", lambda: 200_000)  # x_train fits, x_test no more
    with pytest.raises(DataError, match=r"the array x_test declares shape \(20, 32, 32, 3\) uint8, 60 KiB; 240 KiB "
                                        r"with the arrays before it: more than the 195 KiB of memory available"):
        load_npz(write_npz(tmp_path / "small.npz", small))


def test_a_corrupt_npy_header_is_named_as_such(tmp_path, small):
    """Item 20: a corrupt .npy header read "holds arrays that need pickle to load"."""
    path = npz_with_headers(tmp_path / "bad.npz", small, {"y_test": b"\x93NUMPY\x01\x00\x10\x00{'descr': garbage"})
    with pytest.raises(DataError, match=r"bad\.npz: the header of the array y_test is corrupt or unreadable"):
        load_npz(path)
