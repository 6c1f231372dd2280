"""The library's floors, as ``explr.__init__`` draws them (CONTRIBUTING.md, "Where the code goes"): the paper's
maths at the bottom, the book's simulations (``explr.book``) and the CIFAR-10 engine (``explr.cifar10``) above it,
neither importing the other; no source file so long that it must hold several concerns; every name
imported from the module that defines it (only a package's ``__init__`` hands names on); and the tests laid out
like the sources (CONTRIBUTING.md, "Where the tests go"): each module's tests in its own test module."""
import ast
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from explr.cifar10.runfolder import RunState, Status

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "explr"
# A room is split by concern, not by line count: the cap only catches a file grown far past one concern
# (nanoGPT's and airbench's trainers are single files of about 500 lines; PerStepLR with its checks is 505).
MAX_LINES = 600
FILES = sorted(SRC.rglob("*.py"))
ALLOWED = {"maths": {"maths"}, "book": {"maths", "book"}, "cifar10": {"maths", "cifar10"}}


def explr_imports(source: str, package: str) -> set[str]:
    """The ``explr`` modules that ``source``, a module of ``package``, imports (relative ones resolved)."""
    parts, found = package.split("."), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "explr"}
        elif isinstance(node, ast.ImportFrom):
            base = parts[: len(parts) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            if name.split(".")[0] == "explr":
                found.add(name)
    return found


def floor(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ("book", "cifar10") else "maths"


def imports_of(path: Path) -> set[str]:
    package = ".".join(["explr", *path.parent.relative_to(SRC).parts])
    return explr_imports(path.read_text(encoding="utf-8"), package)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_each_module_imports_only_its_own_floor_and_the_maths_below(path):
    own = floor(".".join(["explr", *path.relative_to(SRC).parts]))
    wrong = {m for m in imports_of(path) if floor(m) not in ALLOWED[own]}
    assert not wrong, f"{path.relative_to(SRC)} ({own} floor) imports {sorted(wrong)}"


def test_no_source_file_is_long_enough_to_hold_several_concerns():
    long = {str(p.relative_to(SRC)): n for p in FILES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"source files over {MAX_LINES} lines: {long}"


def test_the_floor_rule_catches_upward_imports():
    """Deliberately wrong modules: the maths floor importing the engine or the book, the book the engine."""
    maths = explr_imports("from .cifar10 import TrainConfig\nimport explr.book.toy\n", "explr")
    assert {floor(m) for m in maths} - ALLOWED["maths"] == {"cifar10", "book"}
    book = explr_imports("from ..cifar10.config import SCHEDULES\nfrom ..schedules import texp\n", "explr.book")
    assert {floor(m) for m in book} - ALLOWED["book"] == {"cifar10"}


# ----------------------------------------------------------------------------- each name from where it is defined
def defined_names(source: str) -> set[str]:
    """The names a module defines at its top level: functions, classes and assigned names."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def handed_on(source: str) -> set[str]:
    """The names of a module's ``__all__`` that it does not define (a re-export)."""
    exported = next((ast.literal_eval(node.value) for node in ast.parse(source).body if isinstance(node, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)), [])
    return set(exported) - defined_names(source)


def imported_through(source: str, package: str, modules: dict[str, str]) -> list[str]:
    """``name from module`` for every name that ``source`` (in ``package``) imports from an ``explr`` module (not a
    package) that does not define it; ``modules``: {module name: its source}."""
    parts, wrong = package.split("."), []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = parts[: len(parts) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            if name in modules:
                defined = defined_names(modules[name])
                wrong += [f"{a.name} from {name}" for a in node.names if a.name not in defined]
    return wrong


MODULES = {".".join(["explr", *p.relative_to(SRC).with_suffix("").parts]): p.read_text(encoding="utf-8")
           for p in FILES if p.name != "__init__.py"}
READERS = [*FILES, *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py")),
           *sorted((ROOT / "experiments").glob("*.py"))]


def test_no_module_but_a_package_hands_on_names_it_does_not_define():
    wrong = {module: sorted(names) for module, source in MODULES.items() if (names := handed_on(source))}
    assert not wrong, f"__all__ names that these modules import instead of defining: {wrong}"


@pytest.mark.parametrize("path", READERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_is_imported_from_the_module_that_defines_it(path):
    package = ".".join(["explr", *path.parent.relative_to(SRC).parts]) if path.is_relative_to(SRC) else ""
    wrong = imported_through(path.read_text(encoding="utf-8"), package, MODULES)
    assert not wrong, f"{path.relative_to(ROOT)} imports {wrong}: import them from where they are defined"


def test_the_import_rules_catch_a_re_export():
    """Deliberately wrong modules: one handing on an imported name, one importing a name through it."""
    relay = "from .lock import RunError\nfrom .runfolder import pid_alive\n\ndef train():\n    pass\n\n" \
            "__all__ = ['RunError', 'train']\n"
    assert handed_on(relay) == {"RunError"}
    modules = {"explr.cifar10.relay": relay}
    assert imported_through("from explr.cifar10.relay import RunError, train\n", "", modules) == [
        "RunError from explr.cifar10.relay"]
    assert imported_through("from .relay import pid_alive\n", "explr.cifar10", modules) == [
        "pid_alive from explr.cifar10.relay"]


# ----------------------------------------------------------------------------- no public name without a reader
#: public names that only the tests read: the writers of the data formats that the loaders read (the tests make
#: their data with them).
READ_BY_TESTS_ONLY = {"write_image_folder", "write_cifar_batches"}


def chapter_code() -> str:
    """The code cells of every chapter (vulture reads no notebook)."""
    cells = [c for nb in sorted((ROOT / "book").glob("*.ipynb"))
             for c in json.loads(nb.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
    return "\n".join("".join(c["source"]) for c in cells)


def unread(modules: dict[str, str], readers: list[str]) -> list[str]:
    """``module.name`` for every name of a module's ``__all__`` that neither the module itself (outside ``__all__``)
    nor any of ``readers`` names.  (vulture counts a name in ``__all__`` as used, so it cannot see these.)"""
    missing = []
    for module, source in modules.items():
        own = re.sub(r"__all__ = \[.*?\]", "", source, flags=re.S)
        for name in sorted(set(defined_names(source)) - handed_on(source)):
            if name not in _all(source):
                continue
            word = re.compile(rf"\b{re.escape(name)}\b")
            if len(word.findall(own)) <= 1 and not any(word.search(text) for text in readers):
                missing.append(f"{module}.{name}")
    return missing


def _all(source: str) -> list[str]:
    return next((ast.literal_eval(node.value) for node in ast.parse(source).body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)), [])


def test_every_public_name_has_a_reader_besides_the_tests():
    others = [p.read_text(encoding="utf-8") for p in READERS if not p.is_relative_to(ROOT / "tests")]
    chapters, wrong = chapter_code(), []
    for module, source in MODULES.items():
        readers = [t for t in others if t != source] + [chapters]
        wrong += [m for m in unread({module: source}, readers) if m.rsplit(".", 1)[1] not in READ_BY_TESTS_ONLY]
    assert not wrong, f"public names that nothing but the tests reads (dead code, or a test of dead code): {wrong}"


def test_the_reader_rule_catches_a_name_only_its_module_exports():
    lonely = "def used():\n    return 1\n\ndef dead():\n    return used()\n\n__all__ = ['used', 'dead']\n"
    assert unread({"explr.lonely": lonely}, ["from explr.lonely import used\n"]) == ["explr.lonely.dead"]


# ----------------------------------------------------------------------------- one status vocabulary
#: the words of a run's status and of a run folder's state: written as the enums' members, never as strings.
STATUS_WORDS = {s.value for s in (*Status, *RunState)}
#: files that may compare a bare status word, and why.
STATUS_WORDS_EXEMPT = {
    # Chapter 6's registered rule: its sha256 is recorded with the analysis plan (registrations.json), so it may not
    # change; it reads `manifest.get("status") == "finished"`, the word Status.FINISHED writes.
    "src/explr/book/verdicts.py",
    # plan v4's registered path from run folders to verdicts, hashed with it; the book floor imports no engine enum.
    "src/explr/book/judging.py",
}
STATUS_READERS = [p for p in [*FILES, *sorted((ROOT / "experiments").glob("*.py"))]
                  if str(p.relative_to(ROOT)) not in STATUS_WORDS_EXEMPT]


def bare_status_words(source: str) -> list[str]:
    """``line: 'word'`` for every string constant of ``source`` that is a status word (:data:`STATUS_WORDS`) where a
    status is meant: an operand of a comparison (``==``, ``!=``, ``in``, ...), a dict's value, an argument of a call,
    a ``return`` value or the value assigned to an item or attribute, itself or as an element of a tuple, list or set
    or a branch of ``a if c else b`` there.  Dict keys, names assigned to and docstrings are other words that happen
    to be spelled alike (a timestamp "finished", a folder "failed")."""
    def words(node):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [w for n in node.elts for w in words(n)]
        if isinstance(node, ast.IfExp):
            return words(node.body) + words(node.orelse)
        return [node] if isinstance(node, ast.Constant) and node.value in STATUS_WORDS else []

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            places = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            places = node.values
        elif isinstance(node, ast.Call):
            places = [*node.args, *(k.value for k in node.keywords)]
        elif isinstance(node, ast.Return):
            places = [node.value] if node.value is not None else []
        elif isinstance(node, ast.Assign) and any(isinstance(n, (ast.Attribute, ast.Subscript))
                                                  for t in node.targets for n in ast.walk(t)):
            places = [node.value]
        else:
            continue
        found += [w for place in places for w in words(place)]
    return [f"{w.lineno}: {w.value!r}" for w in sorted(found, key=lambda w: (w.lineno, w.col_offset))]


@pytest.mark.parametrize("path", STATUS_READERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_status_is_written_as_a_bare_string(path):
    wrong = bare_status_words(path.read_text(encoding="utf-8"))
    assert not wrong, f"{path.relative_to(ROOT)} writes statuses as strings at {wrong}: use Status or RunState"


def test_the_status_rule_catches_bare_status_words_and_only_them():
    """Deliberately wrong snippets (each place a status is meant), and words spelled alike that are no status."""
    wrong = ('if m.get("status") == "finished":\n    pass\n'
             'ok = state != "resume" and s in ("diverged", "failed")\n'
             'record = {"status": "disk full"}\n'
             'manifest.update(status="interrupted")\n'
             'def state():\n    return "new"\n'
             'check = RunCheck("finished" if done else "resume")\n'
             'manifest["status"] = "running"\n')
    assert bare_status_words(wrong) == ["1: 'finished'", "3: 'resume'", "3: 'diverged'", "3: 'failed'",
                                        "4: 'disk full'", "5: 'interrupted'", "7: 'new'", "8: 'finished'",
                                        "8: 'resume'", "9: 'running'"]
    alike = ('"""A run that finished."""\nFAILED, MISSING = "failed", "missing.json"\nunit = {"finished": now}\n'
             'ok = m.get("status") == Status.FINISHED and state is RunState.NEW\nprint(f"{run} interrupted")\n')
    assert bare_status_words(alike) == []
    assert bare_status_words('if check.state == "finished":\n    pass\n') == ["1: 'finished'"]  # main f49cb6e's
    assert "src/explr/book/verdicts.py" in STATUS_WORDS_EXEMPT and bare_status_words(
        (SRC / "book" / "verdicts.py").read_text()) == ["67: 'finished'"]  # the exemption is still needed


# ----------------------------------------------------------------------------- the tests laid out like src/
TESTS = ROOT / "tests"
#: the folders of tests/ that mirror no package of src/explr (every other folder does), and what each holds
NOT_MODULES = {
    "browser": "the browser check of the built book (one build, one worker: grouping.SHARED)",
    "experiments": "the scripts of experiments/ that train the book's experiments",
    "notebooks": "the chapters run by papermill, and nbval's round-off guard",
    "project": "the product: README, wheel, API page, examples, locked environment, landing page, this layout",
    "schemas": "data: the CITATION.cff schema that test_readme validates against",
    "slurm": "the engine on a real SLURM cluster (one cluster, one worker: grouping.SHARED)",
    "suite": "the suite's own machinery: the xdist grouping plugin, conftest's rule for a missing tool",
}
#: the Python files of the mirror folders that are no test module: conftest.py and the helper modules
HELPERS = {"conftest.py", "cifar10_helpers.py", "digits_helpers.py", "book/flow_problems.py", "cifar10/conftest.py"}


def mirrored_test_path(module: Path, src: Path) -> Path:
    """Where the tests of the source file ``module`` live, relative to tests/: ``src/explr/X.py`` ->
    ``test_X.py``, ``src/explr/P/X.py`` -> ``P/test_X.py``; a dunder module loses its underscores
    (``cifar10/__main__.py`` -> ``cifar10/test_main.py``)."""
    rel = module.relative_to(src)
    return rel.with_name(f"test_{rel.stem.strip('_')}.py")


def layout_problems(src: Path, tests: Path, not_modules, helpers) -> list[str]:
    """How ``tests`` breaks the layout of ``src``: a module without its test module; a file in a mirror folder
    (``tests/`` for ``src``, ``tests/P/`` for the package ``src/P``) that is neither the test module of a module
    there, nor a declared helper; a folder that mirrors no package and is not one of ``not_modules``; two test
    modules of one name (no ``__init__.py``: pytest imports each by its name)."""
    problems = []
    packages = sorted(p.parent for p in src.rglob("__init__.py"))
    mirrors = {tests / p.relative_to(src) for p in packages}
    expected = {tests / mirrored_test_path(m, src): m for m in sorted(src.rglob("*.py")) if m.name != "__init__.py"}
    for test, module in sorted(expected.items()):
        if not test.is_file():
            problems.append(f"{module.relative_to(src)} has no test module {test.relative_to(tests)}")
    for folder in sorted(mirrors):
        for path in sorted(folder.glob("*.py")):
            rel = path.relative_to(tests).as_posix()
            if path in expected or rel in helpers:
                continue
            if path.name.startswith("test_"):
                package = "/".join([src.name, *folder.relative_to(tests).parts])
                problems.append(f"{rel} tests no module of {package}: its tests go to the test modules of the "
                                "modules they test")
            else:
                problems.append(f"{rel} is neither a test module nor a declared helper")
    for name in sorted(not_modules):
        if tests / name in mirrors or not (tests / name).is_dir():
            problems.append(f"{name}/ is declared as no package's folder, but is a package's or no folder")
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir()):
        rel = folder.relative_to(tests)
        if any(part.startswith((".", "__")) for part in rel.parts) or folder in mirrors or rel.parts[0] in not_modules:
            continue
        problems.append(f"{rel.as_posix()}/ mirrors no package of {src.name} and is not declared")
    names = Counter(p.name for p in tests.rglob("test_*.py"))
    problems += [f"{n} test modules named {name}" for name, n in sorted(names.items()) if n > 1]
    return problems


def test_every_module_has_its_test_module_and_every_test_module_its_module():
    assert layout_problems(SRC, TESTS, NOT_MODULES, HELPERS) == []


def test_the_layout_rule_catches_a_missing_test_module_a_theme_file_and_an_undeclared_folder(tmp_path):
    """A deliberately wrong tree: a module without its tests, a theme file, a stray helper, an undeclared folder,
    a test module's name twice, and a declared folder that is not there."""
    src, tests = tmp_path / "src" / "lib", tmp_path / "tests"
    for name in ("__init__.py", "alpha.py", "pkg/__init__.py", "pkg/beta.py", "pkg/__main__.py",
                 "../../tests/test_alpha.py", "../../tests/pkg/test_beta.py", "../../tests/pkg/test_main.py",
                 "../../tests/conftest.py", "../../tests/project/test_readme.py"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text("")
    assert layout_problems(src, tests, {"project": ""}, {"conftest.py"}) == []
    (tests / "pkg" / "test_beta.py").unlink()
    (tests / "test_hostile_inputs.py").write_text("")
    (tests / "pkg" / "helpers.py").write_text("")
    (tests / "misc").mkdir()
    (tests / "project" / "test_alpha.py").write_text("")
    assert layout_problems(src, tests, {"project": "", "gone": ""}, {"conftest.py"}) == [
        "pkg/beta.py has no test module pkg/test_beta.py",
        "test_hostile_inputs.py tests no module of lib: its tests go to the test modules of the modules they test",
        "pkg/helpers.py is neither a test module nor a declared helper",
        "gone/ is declared as no package's folder, but is a package's or no folder",
        "misc/ mirrors no package of lib and is not declared",
        "2 test modules named test_alpha.py",
    ]
