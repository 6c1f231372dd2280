"""The library's floors, as the README and ``explr.__init__`` draw them: the paper's maths at the
bottom, the book's simulations (``explr.book``) and the CIFAR-10 engine (``explr.cifar10``) above it,
neither importing the other, and no source file so long that it must hold several concerns."""
import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "explr"
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
