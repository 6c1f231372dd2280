"""The locked environment: requirements.lock agrees with requirements.txt, is exactly the environment the tests
run in, and binder/requirements.txt is derived from it (.ci/lock.py, `make lock`)."""
import importlib.util
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("ci_lock", ROOT / ".ci" / "lock.py")
lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock)

FIX = "run `make lock` (it installs requirements.txt into .venv and rewrites the lock) and commit both"


def _pins() -> dict[str, str]:
    return lock.read_lock((ROOT / "requirements.lock").read_text())


def test_the_lock_satisfies_every_line_of_requirements_txt():
    pins = _pins()
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        spec = line.split("#", 1)[0].strip()
        if not spec:
            continue
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pins, f"requirements.txt asks for {spec}, the lock has no {name}: {FIX}"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"requirements.txt asks for {spec}, the lock has {name}=={pins[name]}: {FIX}"


def test_the_lock_is_exactly_the_running_environment():
    installed = {name: d.version for name, d in lock.installed().items()}
    pins = _pins()
    unlocked = sorted(f"{n}=={v}" for n, v in installed.items() if pins.get(n) != v)
    missing = sorted(f"{n}=={v}" for n, v in pins.items() if n not in installed)
    assert not unlocked, f"installed but not in requirements.lock (at that version): {unlocked}; {FIX}, or uninstall"
    assert not missing, f"in requirements.lock but not installed: {missing}; `make install` installs the lock"


def test_binder_is_derived_from_the_lock():
    pins = _pins()
    binder = (ROOT / "binder" / "requirements.txt").read_text()
    assert binder == lock.binder_text(pins, lock.installed()), f"binder/requirements.txt is stale: {FIX}"
    binder_pins = {Requirement(x).name: str(Requirement(x).specifier)[2:] for x in binder.splitlines()
                   if x and not x.startswith(("#", "--"))}
    assert binder_pins["torch"] == pins["torch"] + "+cpu" and not any(n.startswith("nvidia-") for n in binder_pins)


def test_the_book_cache_is_cleared_when_the_library_changed_and_kept_otherwise(tmp_path):
    import shutil
    import subprocess
    import sys

    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "book_cache_guard.py", tmp_path / ".ci")
    shutil.copytree(ROOT / "src" / "explr", tmp_path / "src" / "explr", ignore=shutil.ignore_patterns("__pycache__"))
    cache = tmp_path / "_build" / ".jupyter_cache"

    def run_guard():
        r = subprocess.run([sys.executable, str(tmp_path / ".ci" / "book_cache_guard.py")], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stderr

    def executed():  # stands for the chapters jupyter-cache holds
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "executed").write_text("outputs")

    assert run_guard() == "" and not cache.exists()  # a fresh clone: nothing cached, the digest is recorded
    executed()
    assert run_guard() == "" and (cache / "executed").exists()  # the library did not change: kept
    module = tmp_path / "src" / "explr" / "schedules.py"
    module.write_text(module.read_text().replace("\n", "\n# one line more\n", 1))
    assert "cleared" in run_guard() and not cache.exists()
    executed()
    assert run_guard() == "" and (cache / "executed").exists()  # executed with the changed library: kept
    (cache.with_name(".jupyter_cache.explr-sha256")).unlink()
    assert "cleared" in run_guard() and not cache.exists()  # a cache of unknown provenance is not trusted
