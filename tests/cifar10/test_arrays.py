"""The decode cache's edges (issue 41 items 3-6): a forged seal, another host's temporary files in a shared
``--data-root``, and the decode key's path (a folder, a file where its folder goes, unreadable, no home, a relative
``XDG_CACHE_HOME``): a rebuilt cache or one line naming the path and what to do, never a traceback.

Every tree here is generated in a temporary folder; nothing needs the shared CIFAR-10 files.
"""
import errno
import os
import time

import numpy as np
import pytest

from explr.cifar10 import arrays as arrays_module
from explr.cifar10 import files
from explr.cifar10.arrays import DataError, cache_key
from explr.cifar10.image_folder import load_image_folder, write_image_folder
from explr.cifar10.sources import make_synthetic


@pytest.fixture(autouse=True)
def key_home(tmp_path, monkeypatch):
    """The decode key's folder (``$XDG_CACHE_HOME/explr``) in this test's folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return tmp_path / "xdg-cache" / "explr"


@pytest.fixture()
def archive(tmp_path):
    return write_image_folder(tmp_path / "c", make_synthetic(n_train=40, n_test=20, seed=3), archive="tar.gz")


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


# ----------------------------------------------------------------------------- item 4: a --data-root shared by hosts
DEAD_PID = 999_999_999  # no such process here


def test_another_hosts_fresh_temp_file_survives_this_hosts_cleanup(tmp_path, monkeypatch):
    """Item 4: host A deleted host B's fresh .tmp mid-write because B's pid was not alive on A, and B's write failed
    with "No such file or directory"."""
    cache = tmp_path / "cache"
    cache.mkdir()
    target = cache / "image-folder-b.npz"
    this_host_getpid, host_a = os.getpid, getattr(files, "HOST", None)

    def write_as_host_b(f):
        f.write(b"half a cache")
        with monkeypatch.context() as as_host_a:  # meanwhile on host A, which shares the folder
            as_host_a.setattr(os, "getpid", this_host_getpid)
            as_host_a.setattr(files, "HOST", host_a, raising=False)
            assert files.remove_stale_leftovers(cache) == []
        f.write(b", the other half")

    with monkeypatch.context() as as_host_b:
        as_host_b.setattr(os, "getpid", lambda: DEAD_PID)  # B's pid, not alive on A
        as_host_b.setattr(files, "HOST", "0123abcd" if host_a != "0123abcd" else "4567cdef", raising=False)
        files.atomic_write(target, write_as_host_b)
    assert target.read_bytes() == b"half a cache, the other half"


def test_the_pid_rule_applies_to_this_hosts_files_and_the_hour_rule_to_other_hosts(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    here, there = files.HOST, "0123abcd" if files.HOST != "0123abcd" else "4567cdef"
    names = {
        "dead here": f".image-folder-a.npz.{DEAD_PID}@{here}.k2j4m7xa.tmp",
        "alive here": f".image-folder-b.npz.{os.getpid()}@{here}.x8_qz3ab.tmp",
        "fresh there": f".image-folder-c.npz.{DEAD_PID}@{there}.q1w2e3r4.tmp",
        "old there": f".image-folder-d.npz.{os.getpid()}@{there}.t5y6u7i8.tmp",
        "fresh, no host": f".image-folder-e.npz.{DEAD_PID}.a1s2d3f4.tmp",
        "old, no host": f".image-folder-f.npz.{DEAD_PID}.g5h6j7k8.tmp",
    }
    for case, name in names.items():
        (cache / name).write_bytes(b"half a cache")
        if case.startswith("old"):
            os.utime(cache / name, (time.time() - 2 * files.STALE_AFTER_S,) * 2)
    removed = files.remove_stale_leftovers(cache)
    assert sorted(removed) == sorted(names[c] for c in ("dead here", "old there", "old, no host"))
    assert sorted(p.name for p in cache.iterdir()) == sorted(names[c] for c in ("alive here", "fresh there",
                                                                                "fresh, no host"))
    assert len(files.remove_leftovers(cache)) == 3, "a locked folder's cleanup takes every temporary file"


def test_atomic_write_names_its_temporary_file_with_this_host(tmp_path):
    seen = []
    files.atomic_write(tmp_path / "x.npz", lambda f: seen.extend(p.name for p in tmp_path.iterdir()))
    (name,) = seen
    match = files.TMP_NAME.fullmatch(name)
    assert match and match["target"] == "x.npz" and int(match["pid"]) == os.getpid() and match["host"] == files.HOST


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
