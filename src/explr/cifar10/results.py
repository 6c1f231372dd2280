"""Chapter 6's committed results (:func:`committed_results`: ``results/`` of a clone, or, where only a pip install
is around, e.g. Colab, its ``results/`` from the repository archive at the revision pip recorded, PEP 610) and the
runs of one experiment in a results tree (:func:`experiment_runs`: ``<tree>/<name>/``, or the main comparison at
the top, ``<tree>/<schedule>/seed<seed>/``).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import shutil
import tarfile
import urllib.request
import zlib
from pathlib import Path, PurePosixPath

from .runfolder import load_runs


RESULT_SUFFIXES = (".json", ".jsonl", ".md")


def _installed_distribution() -> importlib.metadata.Distribution | None:
    """The installed distribution that provides the ``explr`` package (``explr-book``: the name is pyproject's)."""
    for name in importlib.metadata.packages_distributions().get("explr", []):
        try:
            return importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def release_archive_url() -> str:
    """``<repository>/archive/<revision>.tar.gz`` of the installed explr: the URL and revision pip recorded
    (``direct_url.json``), else the distribution's ``Repository`` project URL (``[project.urls]`` of
    pyproject.toml, derived from ``repository.url`` of _config.yml) at the tag ``v<version>``.

    Raises ``FileNotFoundError`` where explr is not installed as a distribution (only on ``sys.path``)."""
    from .. import __version__

    dist = _installed_distribution()
    if dist is None:
        raise FileNotFoundError("explr is not installed as a distribution, so the repository it came from is "
                                "unknown: clone the repository (results/ is committed) or pip install it")
    try:
        info = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        info = {}
    vcs = info.get("vcs_info", {})
    if info.get("url") and vcs.get("vcs") == "git" and "github.com" in info["url"]:
        repo = info["url"].removesuffix(".git").rstrip("/")
        return f"{repo}/archive/{vcs.get('commit_id') or vcs.get('requested_revision')}.tar.gz"
    urls = dict(line.split(", ", 1) for line in dist.metadata.get_all("Project-URL") or [] if ", " in line)
    if "Repository" not in urls:
        raise FileNotFoundError(f"the installed {dist.metadata['Name']} names no Repository URL in its metadata "
                                "([project.urls] of pyproject.toml): clone the repository (results/ is committed)")
    return f"{urls['Repository'].rstrip('/')}/archive/v{__version__}.tar.gz"


def committed_results(path="../results/cifar10-subset", *, cache_dir=None, archive_url: str | None = None) -> Path:
    """``path`` if it is a folder; else the same ``results/...`` folder from the repository archive (module docstring).

    ``cache_dir`` defaults to ``~/.cache/explr``; ``archive_url`` to :func:`release_archive_url`.
    Raises ``FileNotFoundError`` (saying what was tried) if neither has it, also when the archive is truncated
    or damaged; a failed extraction leaves no temporary folder.
    """
    path = Path(path)
    if path.is_dir():
        return path
    if "results" not in path.parts:
        raise FileNotFoundError(f"{path}: no such folder, and not a results/... folder of the repository")
    rel = Path(*path.parts[path.parts.index("results"):]).as_posix()
    url = archive_url or release_archive_url()
    cache = Path(cache_dir or Path.home() / ".cache" / "explr") / hashlib.sha256(url.encode()).hexdigest()[:16]
    if (cache / rel).is_dir():
        return cache / rel
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            raw = response.read()
    except OSError as err:
        raise FileNotFoundError(f"{path} is absent and the repository archive {url} could not be fetched ({err}); "
                                "clone the repository (results/ is committed) or train with train=True") from None
    partial = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")  # renamed when complete: never half a cache
    shutil.rmtree(partial, ignore_errors=True)
    files = _result_files(raw, url)
    try:
        for inner, data in files.items():
            (partial / inner).parent.mkdir(parents=True, exist_ok=True)
            (partial / inner).write_bytes(data)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if not (partial / rel).is_dir():
        shutil.rmtree(partial, ignore_errors=True)
        raise FileNotFoundError(f"{path} is absent, and the repository archive {url} holds no {rel}/")
    shutil.rmtree(cache, ignore_errors=True)
    os.replace(partial, cache)
    return cache / rel


def _result_files(raw: bytes, url: str) -> dict[str, bytes]:
    """The result files (:data:`RESULT_SUFFIXES`) under ``results/`` of the repository archive ``raw``, by their path
    inside the repository.  A truncated or damaged archive, or one holding a file that is also a folder of other
    files (``a.json`` and ``a.json/b.json``), is a ``FileNotFoundError`` line naming the archive."""
    files = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as tar:
            for member in tar:
                inner = member.name.split("/", 1)[1] if "/" in member.name else ""  # strip "<repo>-<revision>/"
                if (member.isfile() and inner.startswith("results/") and ".." not in inner.split("/")
                        and inner.endswith(RESULT_SUFFIXES)):
                    files[inner] = tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, zlib.error, OSError) as err:
        raise FileNotFoundError(f"the repository archive {url} is truncated or damaged ({' '.join(str(err).split())}); "
                                "clone the repository (results/ is committed) or train with train=True") from None
    clashes = sorted(files.keys() & {str(p) for name in files for p in PurePosixPath(name).parents})
    if clashes:
        raise FileNotFoundError(f"the repository archive {url} holds both the file {clashes[0]} and files under "
                                f"{clashes[0]}/; clone the repository (results/ is committed) or train with "
                                "train=True")
    return files


def experiment_runs(source, name: str, *, schedules=None, seeds=None, require_seeds: bool = False) -> list[dict]:
    """The runs (:func:`~explr.cifar10.runfolder.load_runs`) of experiment ``name`` in the results tree ``source``:
    those of ``source/name``, or, for ``name == "main"`` where there is no such folder, those at the top of
    ``source`` (a tree of the main comparison alone); ``[]`` where the experiment has no folder.

    ``schedules``: only the runs of these schedules (``None``: all); ``seeds``: only the runs of these seeds.
    ``require_seeds``: a ``ValueError`` naming the folder and the seeds it holds when one of ``seeds`` has no run
    there (a comparison over seeds that were never trained would silently shrink)."""
    source = Path(source)
    folder = source / name if (source / name).is_dir() else (source if name == "main" else None)
    found = [r for r in (load_runs(folder) if folder else []) if schedules is None or r["schedule"] in schedules]
    if seeds is None:
        return found
    held = sorted({r["seed"] for r in found})
    missing = sorted(set(seeds) - set(held)) if require_seeds else []
    if missing:
        raise ValueError(f"seeds = {list(seeds)}: {missing} not in {folder} (it holds seeds {held})")
    return [r for r in found if r["seed"] in seeds]
