"""Chapter 6's committed results (:func:`committed_results`: a clone's ``results/``, or the repository archive's where
only a pip install is around) and the runs of one experiment in a results tree (:func:`experiment_runs`)."""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tarfile
import tempfile
import urllib.request
import zlib
from pathlib import Path

from .runfolder import load_runs

RESULT_SUFFIXES = (".json", ".jsonl", ".md")
CLONE = "clone the repository (results/ is committed) or train with train=True"


def release_archive_url() -> str:
    """``<repository>/archive/<revision>.tar.gz`` of the installed explr: the git URL and commit pip recorded (PEP
    610), else the ``Repository`` project URL at the tag ``v<version>``; else ``FileNotFoundError``."""
    from .. import __version__

    names = importlib.metadata.packages_distributions().get("explr", [])
    if not names:
        raise FileNotFoundError("explr is not installed as a distribution, so the repository it came from is "
                                f"unknown: pip install it, or {CLONE}")
    dist = importlib.metadata.distribution(names[0])
    info = json.loads(dist.read_text("direct_url.json") or "{}")
    vcs = info.get("vcs_info", {})
    if info.get("url") and vcs.get("vcs") == "git" and "github.com" in info["url"]:
        return f"{info['url'].removesuffix('.git').rstrip('/')}/archive/{vcs.get('commit_id')}.tar.gz"
    urls = dict(line.split(", ", 1) for line in dist.metadata.get_all("Project-URL") or [] if ", " in line)
    if "Repository" not in urls:
        raise FileNotFoundError(f"the installed {dist.metadata['Name']} names no Repository URL in its metadata "
                                f"([project.urls] of pyproject.toml): {CLONE}")
    return f"{urls['Repository'].rstrip('/')}/archive/v{__version__}.tar.gz"


def committed_results(path="../results/cifar10-subset", *, cache_dir=None, archive_url: str | None = None) -> Path:
    """``path`` if it is a folder; else that ``results/...`` folder of the archive at ``archive_url`` (default
    :func:`release_archive_url`), extracted once into ``cache_dir`` (``~/.cache/explr``); else ``FileNotFoundError``."""
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
    cache.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(".tmp", dir=cache.parent, ignore_cleanup_errors=True) as partial:
        try:  # extracted beside the cache and renamed when complete: never half a cache
            with urllib.request.urlopen(url, timeout=60) as response, tarfile.open(fileobj=response, mode="r|*") as tar:
                for member in tar:  # <repo>-<revision>/results/...: the prefix stripped, only the result files
                    inner = member.name.partition("/")[2]
                    if (member.isfile() and inner.startswith("results/") and inner.endswith(RESULT_SUFFIXES)
                            and ".." not in inner.split("/")):
                        Path(partial, inner).parent.mkdir(parents=True, exist_ok=True)
                        Path(partial, inner).write_bytes(tar.extractfile(member).read())
        except (tarfile.TarError, EOFError, zlib.error, OSError) as err:  # also a file that is a folder of other files
            raise FileNotFoundError(f"{path} is absent, and the repository archive {url} could not be fetched or is "
                                    f"truncated or damaged ({' '.join(str(err).split())}): {CLONE}") from None
        if not Path(partial, rel).is_dir():
            raise FileNotFoundError(f"{path} is absent, and the repository archive {url} holds no {rel}/")
        shutil.rmtree(cache, ignore_errors=True)
        os.replace(partial, cache)
    return cache / rel


def experiment_runs(source, name: str, *, schedules=None, seeds=None, require_seeds: bool = False) -> list[dict]:
    """The runs of experiment ``name`` (``source/name``, or ``source`` for ``main``), of ``schedules`` and ``seeds`` if
    given; ``[]`` where it has no folder.  ``require_seeds``: a ``ValueError`` naming the seeds it lacks."""
    source = Path(source)
    folder = source / name if (source / name).is_dir() else (source if name == "main" else None)
    found = [r for r in (load_runs(folder) if folder else []) if schedules is None or r["schedule"] in schedules]
    held = sorted({r["seed"] for r in found})
    if require_seeds and (missing := sorted(set(seeds or ()) - set(held))):
        raise ValueError(f"seeds = {list(seeds)}: {missing} not in {folder} (it holds seeds {held})")
    return [r for r in found if seeds is None or r["seed"] in seeds]
