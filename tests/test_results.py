"""explr.cifar10.results: the committed results fetched from a repository archive (a local file:// URL here)."""
import io
import random
import tarfile

import pytest

from explr.cifar10.results import committed_results


def archive(tmp_path, files: dict, name="repo.tar.gz"):
    """A repository archive ``<repo>-<revision>/...`` holding ``files`` (path → bytes); returns its file:// URL."""
    path = tmp_path / name
    with tarfile.open(path, "w:gz") as tar:
        for inner, data in files.items():
            info = tarfile.TarInfo(f"explr-abc123/{inner}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def leftovers(cache):
    return [p.name for p in cache.iterdir() if p.name.endswith(".tmp")] if cache.is_dir() else []


def test_results_are_extracted_once_from_the_archive(tmp_path):
    src = archive(tmp_path, {"results/cifar10-subset/a.json": b"{}", "results/cifar10-subset/README.md": b"hi",
                             "book/x.ipynb": b"{}"})
    got = committed_results(tmp_path / "results" / "cifar10-subset", cache_dir=tmp_path / "cache",
                            archive_url=src.as_uri())
    assert sorted(p.name for p in got.iterdir()) == ["README.md", "a.json"]
    assert not leftovers(tmp_path / "cache")


def test_a_file_that_is_also_a_folder_in_the_archive_is_one_error_and_leaves_no_temp_folder(tmp_path):
    """Before: FileExistsError from mkdir, and the .tmp folder stayed."""
    src = archive(tmp_path, {"results/cifar10-subset/a.json": b"{}", "results/cifar10-subset/a.json/b.json": b"{}"})
    with pytest.raises(FileNotFoundError, match=r"holds both the file results/cifar10-subset/a\.json and files under"):
        committed_results(tmp_path / "results" / "cifar10-subset", cache_dir=tmp_path / "cache",
                          archive_url=src.as_uri())
    assert not leftovers(tmp_path / "cache")


def test_a_truncated_archive_is_file_not_found_as_documented_and_leaves_no_temp_folder(tmp_path):
    """Before: EOFError (the docstring promises FileNotFoundError), and the .tmp folder stayed."""
    src = archive(tmp_path, {f"results/cifar10-subset/{i}.json": random.Random(i).randbytes(4096) for i in range(20)})
    src.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    with pytest.raises(FileNotFoundError, match="truncated or damaged") as err:
        committed_results(tmp_path / "results" / "cifar10-subset", cache_dir=tmp_path / "cache",
                          archive_url=src.as_uri())
    assert "\n" not in str(err.value)
    assert not leftovers(tmp_path / "cache")
