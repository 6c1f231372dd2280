"""The library as its users install it: a wheel that holds the package, its data and its licence and nothing of
the book, installed with ``--no-deps`` next to the locked torch, importable without the book's stack; and the
build works with the oldest setuptools that ``[build-system]`` allows.

The wheel is built by ``python -m build --wheel --no-isolation`` (offline: the build backend is the
locked setuptools) from a copy of the checkout's files (``git ls-files``: tracked and untracked, not
ignored), so the build sees what a clone holds and writes nothing into the working tree.

The venv it goes into is fresh and sees exactly what ``pyproject.toml`` declares: ``--without-pip``
and without system site-packages, its one extra path a folder of symlinks to the files of explr's
declared dependencies (numpy, torch, tqdm) and of everything they require in turn, taken from the
locked .venv. matplotlib, scipy, jupyter, IPython and scikit-learn are installed in .venv but not
reachable from it, so an import of one of them fails there, and ``sys.modules`` is checked besides.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import tomllib

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DATA = "explr/book/analysis_plan.json"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: the wheel's file-name form of the distribution name (explr-book -> explr_book)
WHEEL_NAME = canonicalize_name(PROJECT["project"]["name"]).replace("-", "_")
BOOK_STACK = ("matplotlib", "scipy", "jupyter", "jupyter_core", "jupyter_client", "IPython", "ipykernel",
              "sklearn", "nbformat", "papermill", "pandas")


def wheel_problems(names: list[str]) -> list[str]:
    """What is wrong with a wheel of explr, from the names of its files."""
    problems = []
    if DATA not in names:
        problems.append(f"{DATA} (package data read by explr.book.registration) is missing")
    modules = sorted(p.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src" / "explr").rglob("*.py"))
    missing = [m for m in modules if m not in names]
    if missing:
        problems.append(f"modules of src/explr missing: {missing}")
    if not any(re.fullmatch(rf"{WHEEL_NAME}-[^/]+\.dist-info/licenses/LICENSE", n) for n in names):
        problems.append("the licence (LICENSE) is missing from the .dist-info")
    for name in names:
        top = name.split("/")[0]
        if not (top == "explr" or re.fullmatch(rf"{WHEEL_NAME}-[^/]+\.dist-info", top)):
            problems.append(f"{name}: outside the package")
        elif re.search(r"(^|/)(tests?|results|_build|__pycache__)/|\.ipynb$|\.pyc$", name):
            problems.append(f"{name}: tests, chapters, results or build output in the wheel")
    return problems


def test_the_wheel_check_catches_a_bad_wheel():
    good = [p.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src" / "explr").rglob("*.py")]
    good += [DATA, f"{WHEEL_NAME}-0.1.0.dist-info/METADATA", f"{WHEEL_NAME}-0.1.0.dist-info/licenses/LICENSE"]
    assert wheel_problems(good) == []
    bad = [n for n in good if n not in (DATA, "explr/cifar10/runs.py") and not n.endswith("LICENSE")]
    bad += ["tests/test_sgd.py", "explr/book/06_cifar10.ipynb", "results/cifar10-full/README.md",
            "explr-0.1.0.dist-info/METADATA"]
    found = "\n".join(wheel_problems(bad))
    for expected in ("analysis_plan.json (package data", "explr/cifar10/runs.py", "tests/test_sgd.py: outside",
                     "06_cifar10.ipynb: tests, chapters", "results/cifar10-full/README.md: outside",
                     "the licence (LICENSE) is missing", "explr-0.1.0.dist-info/METADATA: outside"):
        assert expected in found, f"{expected!r} not reported:\n{found}"


def metadata_problems(meta: str) -> list[str]:
    """What is wrong with a wheel's METADATA: the name, version, licence, authors, the repository URL of
    _config.yml (through pyproject's [project.urls], .ci/colab_cell.py) and the extras."""
    fields: dict[str, list[str]] = {}
    for key, value in re.findall(r"^([A-Za-z-]+): (.*)$", meta.split("\n\n", 1)[0], re.M):
        fields.setdefault(key, []).append(value)
    version = re.search(r'^__version__ = "(.+)"$', (ROOT / "src" / "explr" / "__init__.py").read_text(), re.M)[1]
    repo = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    want = {"Name": [PROJECT["project"]["name"]], "Version": [version], "License-Expression": ["MIT"],
            "License-File": ["LICENSE"]}
    problems = [f"{k}: {fields.get(k)} instead of {v}" for k, v in want.items() if fields.get(k) != v]
    if f"Repository, {repo}" not in fields.get("Project-URL", []):
        problems.append(f"Project-URL: no 'Repository, {repo}' in {fields.get('Project-URL')}")
    if not fields.get("Author-email"):
        problems.append("Author-email: none")
    missing = {"book", "cifar10", "test"} - set(fields.get("Provides-Extra", []))
    if missing:
        problems.append(f"Provides-Extra: {sorted(missing)} missing")
    return problems


def test_the_metadata_check_catches_bad_metadata():
    bad = "Metadata-Version: 2.4\nName: explr\nVersion: 0.0.9\nLicense: MIT\nProvides-Extra: book\n\nbody\n"
    found = "\n".join(metadata_problems(bad))
    for expected in ("Name: ['explr'] instead of ['explr-book']", "Version: ['0.0.9']", "License-Expression: None",
                     "License-File: None", "Project-URL: no 'Repository,", "Author-email: none",
                     "['cifar10', 'test'] missing"):
        assert expected in found, f"{expected!r} not reported:\n{found}"


def _copy_checkout(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def _closure(names: list[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions of ``names`` and, recursively, of everything they require, with the
    requirements of the extras asked for (torch's ``cuda-toolkit[cublas,cudart,...]``), markers evaluated here."""
    found: dict[str, metadata.Distribution] = {}
    seen: set[tuple[str, str]] = set()
    todo = [(canonicalize_name(n), "") for n in names]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        dist = found.setdefault(name, metadata.distribution(name))
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": extra}):
                todo.append((canonicalize_name(req.name), ""))
                todo += [(canonicalize_name(req.name), e) for e in req.extras]
    return found


def _link_distributions(dists: dict[str, metadata.Distribution], site: Path, dest: Path) -> None:
    """Symlink into ``dest`` the files of ``dists`` that lie in ``site``: a folder whose every file
    belongs to them as one link, a folder shared with other distributions (a namespace such as
    ``nvidia/``) as a real folder of links to its own files' ancestors."""
    ours: set[Path] = set()
    everyone: dict[Path, set[str]] = {}
    for dist in metadata.distributions(path=[str(site)]):
        key = canonicalize_name(dist.metadata["Name"])
        for f in dist.files or []:
            rel = Path(os.path.normpath(f))
            if rel.parts[0] == "..":
                continue  # scripts in bin/
            for i in range(1, len(rel.parts) + 1):
                everyone.setdefault(Path(*rel.parts[:i]), set()).add(key)
            if key in dists:
                ours.add(rel)

    def link(rel: Path) -> None:
        if everyone.get(rel, set()) <= dists.keys() or (site / rel).is_file():
            (dest / rel).symlink_to(site / rel)
            return
        (dest / rel).mkdir()
        for child in sorted((site / rel).iterdir()):
            child_rel = child.relative_to(site)
            if everyone.get(child_rel, set()) & dists.keys():
                link(child_rel)

    for top in sorted({rel.parts[0] for rel in ours}):
        if (site / top).exists():
            link(Path(top))


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONNOUSERSITE"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


PROBE = r"""
import json, runpy, sys
import explr, explr.cifar10
from explr import PerStepLR, texp
from explr.cifar10 import TrainConfig, train_run
from explr.cifar10.results import release_archive_url
after_import = sorted(sys.modules)
archive = release_archive_url()
sys.argv = ["python -m explr.cifar10", "--help"]
try:
    runpy.run_module("explr.cifar10", run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code
print(json.dumps({"file": explr.__file__, "version": explr.__version__, "help_exit": code, "archive": archive,
                  "after_import": after_import, "after_help": sorted(sys.modules)}))
"""


@pytest.mark.slow  # builds a wheel and starts python four times
def test_wheel_installs_clean_and_imports_without_the_book_stack(tmp_path):
    # 1. build the wheel from a copy of the checkout
    src = tmp_path / "checkout"
    _copy_checkout(src)
    dist_dir = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist_dir)],
                           cwd=src, capture_output=True, text=True, env=_clean_env())
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (wheel,) = dist_dir.glob(f"{WHEEL_NAME}-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        licence = zf.read(next(n for n in names if n.endswith(".dist-info/licenses/LICENSE")))
    assert not wheel_problems(names), "\n".join(wheel_problems(names))
    assert licence == (ROOT / "LICENSE").read_bytes()
    assert metadata_problems(meta) == [], metadata_problems(meta)
    requires = [Requirement(v) for k, v in re.findall(r"^(Requires-Dist): (.*)$", meta, re.M)]
    runtime = {r.name for r in requires if r.marker is None}
    assert runtime == {"numpy", "torch", "tqdm"}, f"the wheel's runtime dependencies: {sorted(runtime)}"

    # 2. a fresh venv whose one extra path holds explr's declared dependencies from the locked .venv
    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, system_site_packages=False, symlinks=True).create(target)
    py = target / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    deps_dir = tmp_path / "deps"
    deps_dir.mkdir()
    declared = [r.name for r in requires if r.marker is None]
    deps = _closure(declared)
    locked_site = Path(metadata.distribution("torch").locate_file(""))
    _link_distributions(deps, locked_site, deps_dir)
    (site / "explr-test-deps.pth").write_text(f"{deps_dir}\n")
    assert not deps.keys() & {canonicalize_name(n) for n in ("matplotlib", "scipy", "jupyter-core", "ipython",
                                                              "scikit-learn")}

    # 3. pip install --no-deps (the .venv's pip, acting on the fresh venv's interpreter)
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps",
                              "--no-index", "--quiet", str(wheel)], capture_output=True, text=True, env=_clean_env())
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    # 4. the book's stack is not reachable, and the library does not import it
    run = tmp_path / "elsewhere"  # not the checkout: no src/ on the path
    run.mkdir()
    unreachable = subprocess.run(
        [str(py), "-c", "import importlib.util as u, sys; "
                        "sys.exit(any(u.find_spec(m) for m in ('matplotlib', 'scipy', 'IPython', 'sklearn')))"],
        cwd=run, env=_clean_env())
    assert unreachable.returncode == 0, "the fresh venv sees matplotlib, scipy, IPython or sklearn"
    probe = subprocess.run([str(py), "-c", PROBE], cwd=run, capture_output=True, text=True, env=_clean_env())
    assert probe.returncode == 0, probe.stderr[-3000:]
    report = json.loads(probe.stdout.strip().splitlines()[-1])
    assert Path(report["file"]).is_relative_to(site), f"explr imported from {report['file']}, not the wheel"
    assert report["help_exit"] == 0
    repo = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    assert report["archive"] == f"{repo}/archive/v{report['version']}.tar.gz", \
        "chapter 6's download of results does not derive from the installed metadata's Repository URL"
    for when in ("after_import", "after_help"):
        stack = sorted({m for m in report[when] if m.split(".")[0] in BOOK_STACK})
        assert not stack, f"{when.replace('_', ' ')}: the book's stack was imported: {stack[:20]}"
    cli = subprocess.run([str(py), "-m", "explr.cifar10", "--help"], cwd=run, capture_output=True, text=True,
                         env=_clean_env())
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert "--schedule" in cli.stdout and "--resume" in cli.stdout


def setuptools_floor() -> str:
    """The version of ``setuptools>=X`` in pyproject's ``[build-system] requires``."""
    (req,) = [r for r in map(Requirement, PROJECT["build-system"]["requires"]) if r.name == "setuptools"]
    (spec,) = req.specifier
    assert spec.operator == ">=", f"[build-system] requires {req}: expected setuptools>=X"
    return spec.version


@pytest.mark.slow  # installs setuptools into a side venv and builds a wheel
def test_the_wheel_builds_with_the_oldest_setuptools_declared(tmp_path):
    """With exactly the floor of ``[build-system]`` (no build isolation, so no newer setuptools can stand in):
    pip fetches ``setuptools==<floor>`` from its cache or the package index into a venv of its own."""
    floor = setuptools_floor()
    side = tmp_path / "side"
    venv.EnvBuilder(with_pip=False, system_site_packages=False, symlinks=True).create(side)
    py = side / "bin" / "python"
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet",
                              "--no-deps", f"setuptools=={floor}"], capture_output=True, text=True, env=_clean_env())
    assert install.returncode == 0, f"pip could not install setuptools=={floor} (from its cache or the index):\n" \
        + install.stderr[-2000:]
    src = tmp_path / "checkout"
    _copy_checkout(src)
    out = tmp_path / "dist"
    out.mkdir()
    build = subprocess.run(
        [str(py), "-c", "import sys, setuptools, setuptools.build_meta as backend; "
                        "print('built', setuptools.__version__, backend.build_wheel(sys.argv[1]))", str(out)],
        cwd=src, capture_output=True, text=True, env=_clean_env())
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    used, name = build.stdout.strip().splitlines()[-1].split()[1:]
    assert used == floor, f"the build ran setuptools {used}, not the floor {floor}"
    with zipfile.ZipFile(out / name) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert not wheel_problems(names), "\n".join(wheel_problems(names))
    assert metadata_problems(meta) == [], metadata_problems(meta)
