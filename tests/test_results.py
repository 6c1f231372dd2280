"""explr.cifar10.results: the committed results fetched from a repository archive (a local file:// URL here)."""
import io
import random
import tarfile

import pytest

from explr.cifar10.results import committed_results
import json
from explr.cifar10 import load_runs


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


def test_committed_results_come_from_the_repository_archive_when_absent(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in [("results/cifar10-subset/step/seed0/manifest.json",
                            json.dumps({"config": {"schedule": "step", "seed": 0}, "status": "finished"})),
                           ("results/cifar10-subset/step/seed0/metrics.jsonl", '{"epoch": 1, "test_acc": 0.5}\n'),
                           ("results/cifar10-subset/step/seed0/checkpoint.pt", "not extracted"),
                           ("book/06_cifar10.ipynb", "{}")]:
            info = tarfile.TarInfo(f"explr-0.1.0/{name}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    (tmp_path / "archive.tar.gz").write_bytes(buf.getvalue())
    url = (tmp_path / "archive.tar.gz").as_uri()
    local = tmp_path / "clone" / "results" / "cifar10-subset"
    local.mkdir(parents=True)
    assert committed_results(local, archive_url=url) == local  # a clone: used as is
    got = committed_results(tmp_path / "colab" / "results" / "cifar10-subset", cache_dir=tmp_path / "cache",
                            archive_url=url)
    runs = load_runs(got)
    assert [(r["schedule"], list(r["metrics"]["test_acc"])) for r in runs] == [("step", [0.5])]
    assert not list(got.rglob("*.pt")) and not list((tmp_path / "cache").rglob("*.ipynb"))
    with pytest.raises(FileNotFoundError, match="holds no results/cifar10-full"):
        committed_results("../results/cifar10-full", cache_dir=tmp_path / "cache2", archive_url=url)
    with pytest.raises(FileNotFoundError, match="could not be fetched"):
        committed_results("../results/cifar10-subset", cache_dir=tmp_path / "cache3",
                          archive_url=(tmp_path / "missing.tar.gz").as_uri())
