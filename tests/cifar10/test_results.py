"""explr.cifar10.results: the committed results fetched from a repository archive (a local file:// URL here), and
the runs of one experiment in a results tree."""
import io
import json
import random
import tarfile
from pathlib import Path

import pytest

from explr.cifar10.results import committed_results, experiment_runs
from explr.cifar10.runfolder import load_runs

RESULTS = Path(__file__).resolve().parents[2] / "results"


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
    with pytest.raises(FileNotFoundError, match="repo.tar.gz could not be fetched or is truncated or damaged") as err:
        committed_results(tmp_path / "results" / "cifar10-subset", cache_dir=tmp_path / "cache",
                          archive_url=src.as_uri())
    assert "\n" not in str(err.value)
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


# ----------------------------------------------------------------------------- one experiment of a results tree
def finished_run(folder: Path, schedule: str, seed: int) -> None:
    """A finished run of one epoch in ``folder/<schedule>/seed<seed>``: its manifest and metrics, as the engine
    writes them."""
    run = folder / schedule / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"config": {"schedule": schedule, "seed": seed},
                                                   "status": "finished"}))
    (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "test_acc": 0.5 + seed / 10}) + "\n")


def pairs(runs) -> list:
    return sorted((r["schedule"], r["seed"]) for r in runs)


def test_an_experiment_is_its_folder_of_a_plans_tree(tmp_path):
    for schedule in ("step", "texp"):
        for seed in (0, 1):
            finished_run(tmp_path / "main", schedule, seed)
    finished_run(tmp_path / "ablation-none", "texp", 0)
    assert pairs(experiment_runs(tmp_path, "main")) == [("step", 0), ("step", 1), ("texp", 0), ("texp", 1)]
    assert pairs(experiment_runs(tmp_path, "main", schedules=("texp",), seeds=[1])) == [("texp", 1)]
    assert pairs(experiment_runs(tmp_path, "ablation-none")) == [("texp", 0)]  # not main's runs
    assert experiment_runs(tmp_path, "paper-scale") == []  # an experiment that was not trained
    # seeds it lacks: kept out silently, or refused where a comparison must hold them all
    assert pairs(experiment_runs(tmp_path, "ablation-none", seeds=[0, 1])) == [("texp", 0)]
    with pytest.raises(ValueError, match=r"seeds = \[0, 2\]: \[2\] not in .*main \(it holds seeds \[0, 1\]\)"):
        experiment_runs(tmp_path, "main", seeds=[0, 2], require_seeds=True)
    assert pairs(experiment_runs(tmp_path, "main", seeds=[0, 1], require_seeds=True)) == pairs(
        experiment_runs(tmp_path, "main"))


def test_a_tree_of_the_main_comparison_alone_is_main(tmp_path):
    """Like results/cifar10-subset: the runs at the top of the tree are main's; no other experiment is there."""
    finished_run(tmp_path, "step", 0)
    finished_run(tmp_path, "cosine", 3)
    assert pairs(experiment_runs(tmp_path, "main")) == [("cosine", 3), ("step", 0)]
    assert experiment_runs(tmp_path, "ablation-none") == []
    with pytest.raises(ValueError, match=r"\[0\] not in"):
        experiment_runs(tmp_path, "main", schedules=("cosine",), seeds=[0, 3], require_seeds=True)


@pytest.mark.parametrize("tree, name", [("cifar10-full", "main"), ("cifar10-full", "ablation-none"),
                                        ("cifar10-full", "paper-scale"), ("cifar10-subset", "main")])
def test_the_committed_trees_experiments_are_their_folders_runs(tree, name):
    root = RESULTS / tree
    folder = root / name if (root / name).is_dir() else root
    runs = experiment_runs(root, name)
    assert runs and pairs(runs) == pairs(load_runs(folder))
    held = sorted({seed for _, seed in pairs(runs)})
    assert pairs(experiment_runs(root, name, seeds=held, require_seeds=True)) == pairs(runs)
    with pytest.raises(ValueError, match="not in"):
        experiment_runs(root, name, seeds=[*held, max(held) + 1], require_seeds=True)
