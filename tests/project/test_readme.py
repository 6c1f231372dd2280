"""The project as its users first meet it: a README of one screen or two whose scheduler example runs as
written, one repository URL from which every link, button and install cell derives (.ci/colab_cell.py), and a
licence and citation that agree with the package's metadata."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
_spec = importlib.util.spec_from_file_location("colab_cell", ROOT / ".ci" / "colab_cell.py")
colab_cell = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(colab_cell)

MAX_LINES, MAX_WORDS, ANSWERS_BY = 150, 1200, 100
#: what the README answers, in this order, within its first ANSWERS_BY lines (its second-level headings)
SECTIONS = ["Two commands", "Read the book", "Rerun a chapter with your own parameters",
            "Use the scheduler in your own training loop", "Install the library", "Validate and publish a fork", "Cite it",
            "More"]
#: links to files that another change of the same issue adds (docs/ci.md: the CI work of issue 38, item 7).
#: Each must be absent: once it exists, this exemption fails and goes.
PENDING: set = set()


# ----------------------------------------------------------------------------- the README's shape
def headings(text: str) -> list[tuple[int, str]]:
    """(line number from 1, title) of every ``## `` heading outside code blocks."""
    out, fenced = [], False
    for i, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("## "):
            out.append((i, line[3:].strip()))
    return out


def shape_problems(text: str) -> list[str]:
    lines, words = text.splitlines(), len(text.split())
    problems = [f"{len(lines)} lines, more than {MAX_LINES}"] if len(lines) > MAX_LINES else []
    if words > MAX_WORDS:
        problems.append(f"{words} words, more than {MAX_WORDS}")
    found = headings(text)
    titles = [t for _, t in found]
    missing = [s for s in SECTIONS if s not in titles]
    if missing:
        return problems + [f"sections missing: {missing}"]
    order = [titles.index(s) for s in SECTIONS]
    if order != sorted(order):
        problems.append(f"sections out of order: {[titles[i] for i in sorted(order)]}")
    last = next(i for i, (_, t) in enumerate(found) if t == SECTIONS[-1])
    end = found[last + 1][0] - 1 if last + 1 < len(found) else len(lines)
    while end > 0 and not lines[end - 1].strip():  # the last answer's text ends here
        end -= 1
    if end > ANSWERS_BY:
        problems.append(f"the answers end on line {end}, after line {ANSWERS_BY}")
    if "](docs/landing.svg)" not in "\n".join(lines[:found[0][0]]):
        problems.append("no landing figure before the first section")
    return problems


def test_the_readme_answers_in_order_within_one_screen_or_two():
    assert shape_problems(README.read_text()) == []


def test_the_shape_check_catches_a_long_readme_and_a_misplaced_answer():
    good = README.read_text()
    long = good + "## Appendix\n" + "word\n" * 80  # a section after the answers: only the length is wrong
    assert shape_problems(long) == [f"{len(good.splitlines()) + 81} lines, more than {MAX_LINES}"]
    assert any("words, more than" in p for p in shape_problems(good + "word " * MAX_WORDS))
    swapped = good.replace("## Read the book", "## @").replace("## Cite it", "## Read the book").replace("## @",
                                                                                                       "## Cite it")
    assert any("out of order" in p for p in shape_problems(swapped))
    padded = good.replace("## Two commands", "\n" * 40 + "## Two commands")
    assert any("answers end on line" in p for p in shape_problems(padded))


def local_links(text: str) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:|#", t)]


@pytest.mark.parametrize("name", ["README.md", "CONTRIBUTING.md", "CHANGELOG.md", "docs/cifar10-engine.md"])
def test_every_local_link_resolves(name):
    path = ROOT / name
    targets = {(path.parent / t.split("#")[0]).resolve().relative_to(ROOT).as_posix() for t in
               local_links(path.read_text())}
    assert targets, f"{name} links to nothing in the repository"
    missing = sorted(t for t in targets - PENDING if not (ROOT / t).exists())
    assert not missing, f"{name} links to files that do not exist: {missing}"
    landed = sorted(t for t in PENDING if (ROOT / t).exists())
    assert not landed, f"{landed} exist now: remove them from PENDING in {Path(__file__).name}"


def test_the_readme_figure_is_the_landing_pages():
    """docs/landing.svg is the landing page's committed figure (book/index.ipynb, fig-landing), byte for byte."""
    nb = json.loads((ROOT / "book" / "index.ipynb").read_text())
    cell = next(c for c in nb["cells"]
                if c["metadata"].get("mystnb", {}).get("figure", {}).get("name") == "fig-landing")
    svg = next("".join(o["data"]["image/svg+xml"]) for o in cell["outputs"] if "image/svg+xml" in o.get("data", {}))
    assert (ROOT / "docs" / "landing.svg").read_text() == svg, \
        "docs/landing.svg is stale: write the fig-landing cell's image/svg+xml output of book/index.ipynb to it"


# ----------------------------------------------------------------------------- the scheduler example runs
def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, re.M | re.S)


def test_the_readme_scheduler_example_runs_as_written_and_prints_what_the_readme_says(monkeypatch, capsys):
    text = README.read_text()
    (block,) = python_blocks(text)
    monkeypatch.syspath_prepend(str(ROOT / "src"))
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    (printed,) = capsys.readouterr().out.splitlines()
    assert f"It prints `{printed}`" in " ".join(text.split()), f"the README does not quote what its example prints: {printed}"
    opt, sched, schedule, lr = (namespace[k] for k in ("opt", "sched", "schedule", "lr"))
    assert sched.last_epoch == len(lr), "the loop plays the whole schedule"
    assert opt.param_groups[0]["lr"] == pytest.approx(schedule.lr[-1], rel=1e-12)
    trained = [p for p in namespace["model"].parameters() if p.requires_grad]
    assert trained and all(p.grad is not None and torch.isfinite(p).all() for p in trained)
    # the numbers it prints are the schedules': Step Decay's last lr and TEXP's (no rescaling in 32 steps)
    assert printed == (f"last step: Step Decay's lr {lr[-1]:.3g} with WD 5e-4, "
                       f"TEXP's {schedule.lr[-1]:.3g} without")


def test_the_readme_names_the_books_theorem_numbers():
    """The book numbers the paper's results its own way (book/notation.md): TEXP, the paper's Thm 2.12, is the
    book's Theorem 3.2; the README may name the paper's number only beside the book's."""
    text = README.read_text()
    assert "Theorem 3.2" in text and not re.search(r"Theorem 2\.1[23]", text)


def test_the_readme_says_what_the_wheel_holds():
    """What pyproject.toml ships beside the code (package data) is what the README says the wheel holds."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["explr"]
    text = " ".join(README.read_text().split())
    assert any("analysis_plan" in f for f in data) and "chapter 6's analysis plans" in text
    assert any("registrations" in f for f in data) and "their registration record" in text
    assert "Nothing of the book comes with it" not in text


def test_the_example_check_catches_an_example_that_is_not_self_contained():
    """The README's example as it was (``model``, ``batches`` and ``loss_fn`` undefined) fails."""
    old = "import torch\nfrom explr import PerStepLR\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    with pytest.raises(NameError, match="model"):
        exec(compile(old, "README.md", "exec"), {})


# ----------------------------------------------------------------------------- one repository URL
FAKE = "https://github.com/Fake-Owner/fake-book"


def _copy_for_the_url(dest: Path) -> list[Path]:
    """The files that carry the repository URL, in ``dest`` as in the checkout; returns the text files."""
    texts = [Path(p) for p in ("_config.yml", "_toc.yml", "pyproject.toml", "CITATION.cff", "README.md",
                               "src/explr/__init__.py")]
    chapters = [p.relative_to(ROOT) for p in colab_cell.toc_chapters()]
    for rel in texts + chapters:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    return texts + chapters


def _run_colab_cell(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / ".ci" / "colab_cell.py"), "--root", str(root), *args],
                          capture_output=True, text=True)


def test_everything_derived_is_current():
    run = _run_colab_cell(ROOT, "--check")
    assert run.returncode == 0, run.stdout


@pytest.mark.slow  # five runs of .ci/colab_cell.py and one of jupyter-book
def test_setting_the_repository_url_once_changes_every_link_button_and_install_cell(tmp_path):
    files = _copy_for_the_url(tmp_path)
    assert _run_colab_cell(tmp_path, "--published").returncode == 1, "the placeholder passes --published"
    config = tmp_path / "_config.yml"
    config.write_text(config.read_text().replace(colab_cell.PLACEHOLDER, FAKE))
    stale = _run_colab_cell(tmp_path, "--check")
    assert stale.returncode == 1 and "README.md" in stale.stdout and "06_cifar10.ipynb" in stale.stdout
    assert _run_colab_cell(tmp_path, "--fix").returncode == 0
    check = _run_colab_cell(tmp_path, "--check")
    assert check.returncode == 0, check.stdout
    assert _run_colab_cell(tmp_path, "--published").returncode == 0
    old = re.compile(r"github\.com/OWNER/|(?<![\w-])owner\.github\.io|explr-book/explr", re.I)
    for rel in files:
        text = (tmp_path / rel).read_text()
        assert not old.search(text), f"{rel} still points at the placeholder: {old.search(text)[0]}"
    tag = colab_cell.release_tag(ROOT)
    for rel in files:
        if rel.suffix == ".ipynb":
            assert f"explr-book[book] @ git+{FAKE}@{tag}" in (tmp_path / rel).read_text(), rel
    readme = (tmp_path / "README.md").read_text()
    assert "**Online:** <https://fake-owner.github.io/fake-book/>" in readme
    assert f'pip install "explr-book @ git+{FAKE}@{tag}"' in readme
    urls = tomllib.loads((tmp_path / "pyproject.toml").read_text())["project"]["urls"]
    assert urls["Repository"] == FAKE and urls["Homepage"] == "https://fake-owner.github.io/fake-book/"
    cff = yaml.safe_load((tmp_path / "CITATION.cff").read_text())
    assert cff["repository-code"] == FAKE and cff["url"] == urls["Homepage"]
    # the HTML's launch buttons and repository button: Jupyter Book's Sphinx configuration of the copy
    subprocess.run([str(Path(sys.executable).parent / "jupyter-book"), "config", "sphinx", str(tmp_path)],
                   check=True, capture_output=True)
    conf = (tmp_path / "conf.py").read_text()
    assert f"'repository_url': '{FAKE}'" in conf and "'colab_url': 'https://colab.research.google.com'" in conf
    assert not old.search(conf)


def test_book_url_is_github_pages_address():
    assert colab_cell.book_url("https://github.com/Ab-C/repo.x") == "https://ab-c.github.io/repo.x/"
    assert colab_cell.book_url("https://github.com/abc/abc.github.io") == "https://abc.github.io/"
    with pytest.raises(ValueError, match="repository.url"):
        colab_cell.book_url("https://gitlab.com/a/b")


class _Meta(dict):
    def get_all(self, key):
        return self.get(key)


class _Dist:
    """An installed distribution as importlib.metadata gives it: its metadata and its ``direct_url.json``."""

    def __init__(self, urls, direct_url=None):
        self.metadata = _Meta({"Name": "explr-book", "Project-URL": [f"{k}, {v}" for k, v in urls.items()]})
        self._direct = direct_url

    def read_text(self, name):
        return json.dumps(self._direct) if name == "direct_url.json" and self._direct else None


def _install(monkeypatch, dist):
    from explr.cifar10 import results

    monkeypatch.setattr(results.importlib.metadata, "packages_distributions",
                        lambda: {"explr": ["explr-book"]} if dist else {})
    monkeypatch.setattr(results.importlib.metadata, "distribution", lambda name: dist)
    return results


def test_chapter_6s_download_of_results_derives_from_what_pip_installed(monkeypatch):
    from explr import __version__

    results = _install(monkeypatch, _Dist({"Repository": FAKE}))
    assert results.release_archive_url() == f"{FAKE}/archive/v{__version__}.tar.gz"
    results = _install(monkeypatch, _Dist({"Repository": FAKE}, {
        "url": "https://github.com/someone/fork.git", "vcs_info": {"vcs": "git", "commit_id": "abc123"}}))
    assert results.release_archive_url() == "https://github.com/someone/fork/archive/abc123.tar.gz"
    results = _install(monkeypatch, _Dist({"Homepage": "https://x.github.io/y/"}))
    with pytest.raises(FileNotFoundError, match="names no Repository URL"):
        results.release_archive_url()
    results = _install(monkeypatch, None)
    with pytest.raises(FileNotFoundError, match="not installed as a distribution"):
        results.release_archive_url()


# ----------------------------------------------------------------------------- licence and citation
SCHEMA = json.loads((ROOT / "tests" / "schemas" / "cff-1.2.0.schema.json").read_text())


def cff_problems(cff: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMA, format_checker=jsonschema.FormatChecker())
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in validator.iter_errors(cff)]


def test_citation_cff_is_valid_cff_1_2_and_cites_both_papers():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff_problems(cff) == []
    assert cff["cff-version"] == "1.2.0"
    titles = {r["title"].split(":")[0]: (r["authors"][0]["family-names"], r["year"]) for r in cff["references"]}
    assert titles == {"An Exponential Learning Rate Schedule for Deep Learning": ("Li", 2020),
                      "Toward Equation of Motion for Deep Neural Networks": ("Miyagawa", 2022)}


def test_the_cff_check_catches_an_invalid_file():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    bad = dict(cff, **{"cff-version": "1.2", "date-released": "2 Dec 2026"})
    bad.pop("message")
    bad["references"] = [dict(cff["references"][0], authors=[{"family": "Li"}])]
    found = "\n".join(cff_problems(bad))
    for expected in ("'message' is a required property", "cff-version", "date-released", "references/0/authors/0"):
        assert expected in found, f"{expected!r} not reported:\n{found}"


def test_licence_citation_and_metadata_name_the_same_authors_version_and_licence():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    names = [a["name"] for a in project["authors"]]
    assert [a["name"] for a in cff["authors"]] == names and config["author"] == ", ".join(names)
    assert [a["email"] for a in cff["authors"]] == [a["email"] for a in project["authors"]]
    licence = (ROOT / "LICENSE").read_text()
    assert licence.startswith("MIT License\n") and project["license"] == cff["license"] == "MIT"
    assert re.search(rf"^Copyright \(c\) {config['copyright']} {re.escape(', '.join(names))}$", licence, re.M)
    assert str(cff["version"]) == colab_cell.version(ROOT)
    assert project["dynamic"] == ["version"], "the version is set once, in src/explr/__init__.py"


def test_the_distribution_name_is_not_the_unrelated_pypi_project():
    """``explr`` on PyPI is another project (a process tracer): nothing may tell a reader to install it."""
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"] == "explr-book"
    for name in ("README.md", "CONTRIBUTING.md", "docs/cifar10-engine.md", "book/api.md"):
        text = (ROOT / name).read_text()
        wrong = re.findall(r"pip install [\"']?explr(?![-\w])[^\n]*", text)
        assert not wrong, f"{name} installs PyPI's unrelated explr: {wrong}"
    assert re.findall(r"pip install [\"']?explr(?![-\w])", 'pip install "explr @ git+x"'), "the rule catches it"


def test_the_install_cell_does_nothing_where_explr_is_importable_and_installs_the_pin_in_colab(monkeypatch):
    """A chapter run from a clone keeps its explr, offline: no pip; in Colab the cell installs the pinned release."""
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda args, **kw: calls.append(args))
    monkeypatch.syspath_prepend(str(ROOT / "src"))
    exec(compile(colab_cell.cell_source(), "install cell", "exec"), {})
    assert calls == [], "the install cell ran pip where explr is importable"
    monkeypatch.setitem(sys.modules, "google.colab", object())
    exec(compile(colab_cell.cell_source(), "install cell", "exec"), {})
    assert calls == [[sys.executable, "-m", "pip", "install", "--quiet", colab_cell.requirement()]]
