"""The landing page's results table, generated from the executed chapters (so it cannot go stale).

For each result of the paper (Li & Arora, ICLR 2020) that the book checks, one group of rows: the
paper's number, the book's number (a ``{prf:ref}`` role, which Sphinx resolves to "Theorem 2.1"),
the chapter, and every check line the chapter printed for it, with what was measured and the
tolerance.  Everything comes from the committed notebooks ``book/NN_*.ipynb``:

* the book's label of a paper result: the ``prf`` directive whose title names it, as in
  ``:::{prf:theorem} TEXP (Li & Arora, Thm 2.12)`` with ``:label: thm-texp`` (else the label in
  ``RESULTS`` below, if the chapter defines it);
* its check lines: the lines the chapter's cells printed in the section (``##`` heading) that
  states the result, else in the sections whose text cites its label (``{prf:ref}`thm-texp```),
  else the lines that match the result's pattern in ``RESULTS``.  A check line is what ``explr.book.checks.Checks`` prints,
  "✓ <claim>: measured <x>, tolerance <y>" or "SKIPPED (not asserted): <claim>; <needs>", or, in a
  chapter not converted to it yet, a line ending in ": True".

    python .ci/results_table.py          # write book/_generated/results_table.md
    python .ci/results_table.py --check  # exit 1 if that file is not what the chapters give

tests/project/test_landing.py runs the check; book/index.ipynb includes the file.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
OUTPUT = BOOK / "_generated" / "results_table.md"

# The paper's results the book checks: (paper's name, its (kind, number) keys as a title writes them,
# the chapter, the label to use when no title names the result, a pattern for claims as fallback).
RESULTS = [
    ("Lemma 1.3", [("lemma", "1.3")], "01", "lem-scale-invariance", r"identit|invarian"),
    ("Thm 2.1", [("thm", "2.1")], "02", "thm-exp-lr", r"deviation|γ ="),
    ("Thm 2.5", [("thm", "2.5")], "02", "thm-exp-lr", r"deviation|γ ="),
    ("Lemma 2.7", [("lemma", "2.7")], "02", "lem-equivalent-scaling", r"c = |scaling"),
    ("Lemma B.1", [("lemma", "B.1")], "02", "lem-norm-growth", r"norm growth|B\.1"),
    ("Thm 2.12", [("thm", "2.12")], "03", "thm-texp", r"TEXP(?!\+)"),
    ("Thm 2.13", [("thm", "2.13")], "03", "thm-texp-plus-plus", r"TEXP\+\+"),
    ("Thm 3.1", [("thm", "3.1")], "04", "thm-bn-wd-nonconvergence", r"window|cone"),
    ("Sec. 4, proposition", [("prop", "4"), ("sec", "4")], "05", "prop-edge", r"edge|sharp"),
    # chapter 6 apart: what was tested (the float64 twins) and the accuracy claims that wait for the grid
    ("Sec. 5, TEXP ≡ Step Decay on PreResNet-32 (float64, tested)", [], "06", None, r"float64"),
    ("Secs 2.3 and 5, accuracy claims (await the registered grid)", [], "06", None, r"^C\d+: "),
]

SHOWN = 4  # check lines shown per result; the rest are counted, and listed in their chapter

KINDS = {"thm": "thm", "thms": "thm", "theorem": "thm", "theorems": "thm", "lemma": "lemma",
         "lemmas": "lemma", "lem": "lemma", "prop": "prop", "proposition": "prop", "sec": "sec",
         "section": "sec", "def": "def", "definition": "def", "cor": "cor", "corollary": "cor"}
DIRECTIVE = re.compile(r"^(?::{3,}|`{3,})\{prf:(\w+)\}[ \t]*(.*)$", re.M)
LABEL_OPTION = re.compile(r"^:label:\s*(\S+)", re.M)
CITED = re.compile(r"\{prf:ref\}`(?:[^`<]*<)?([\w-]+)>?`")
HEADING = re.compile(r"^(#{1,6})\s+(.*)$", re.M)
CHAPTER_LABEL = re.compile(r"^\(([\w-]+)\)=\s*$", re.M)


@dataclass
class Check:
    status: str  # "✓" or "skipped"
    claim: str
    measured: str = ""
    tolerance: str = ""


@dataclass
class Chapter:
    stem: str
    label: str | None
    titles: dict = field(default_factory=dict)  # label -> directive title
    sections: list = field(default_factory=list)  # (labels defined, labels cited, [Check])


def paper_keys(title: str) -> set:
    """The (kind, number) pairs of the paper a directive title names: "(Li & Arora, Thms 2.1 and 2.5)"."""
    keys = set()
    for group in re.findall(r"\((?:Li (?:&|and) Arora|the paper),?\s*([^)]*)\)", title):
        kind = None
        for word in re.findall(r"[A-Z]\.\d+|\d+(?:\.\d+)?|[A-Za-z]+\.?", group):
            if re.fullmatch(r"[A-Z]\.\d+|\d+(?:\.\d+)?", word):
                if kind:
                    keys.add((kind, word))
            elif word.rstrip(".").lower() in KINDS:
                kind = KINDS[word.rstrip(".").lower()]
    return keys


def parse_check(line: str) -> Check | None:
    line = line.strip()
    if line.startswith("✓ "):
        text = line[2:]
        claim, _, numbers = text.partition(": measured ")
        if not numbers and ": tolerance " in text:
            claim, _, numbers = text.partition(": tolerance ")
            return Check("✓", claim, "", numbers)
        measured, _, tolerance = numbers.partition(", tolerance ")
        return Check("✓", claim, measured, tolerance)
    m = re.match(r"SKIPPED \(not asserted\):\s*(.*?)(?:;\s*(.*))?$", line)
    if m:
        return Check("skipped", m.group(1), "", m.group(2) or "")
    m = re.match(r"(.*\S)\s*:\s*True$", line)  # a chapter not converted to explr.book.checks.Checks yet
    if m:
        return Check("✓", m.group(1), "holds", "")
    return None


def output_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream" and out.get("name") == "stdout":
            parts.append("".join(out.get("text", "")))
    return "".join(parts)


def read_chapter(path: Path) -> Chapter:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    first = "".join(cells[0]["source"]) if cells else ""
    label = CHAPTER_LABEL.search(first)
    chapter = Chapter(path.stem, label.group(1) if label else None)
    defined, cited, checks = set(), set(), []
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            pieces = re.split(r"(?m)^(?=#{2,6}\s)", source)
            for i, piece in enumerate(pieces):
                if i > 0 or (HEADING.match(piece) and not piece.startswith("# ")):
                    chapter.sections.append((defined, cited, checks))
                    defined, cited, checks = set(), set(), []
                for m in DIRECTIVE.finditer(piece):
                    rest = piece[m.end():]
                    lab = LABEL_OPTION.match(rest.lstrip("\n"))
                    if lab:
                        chapter.titles[lab.group(1)] = m.group(2).strip()
                        defined.add(lab.group(1))
                cited |= set(CITED.findall(piece))
        elif cell["cell_type"] == "code":
            for line in output_text(cell).splitlines():
                check = parse_check(line)
                if check:
                    checks.append(check)
    chapter.sections.append((defined, cited, checks))
    return chapter


SUPERSCRIPTS = {"j": "ʲ", "k": "ᵏ", "n": "ⁿ", "t": "ᵗ", "2": "²", "3": "³"}


def escape(text: str) -> str:
    """A check's text as a table cell: markdown characters escaped, ``^j`` as a superscript (the
    check lines are plain text), and hyphens that do not break, so that ``1e-12`` or ``TEXP--``
    stays on one line of a narrow column."""
    text = re.sub(r"\^(\w)\b", lambda m: SUPERSCRIPTS.get(m.group(1), m.group(0)), text)
    return re.sub(r"([\\`*_|$<>\[\]{}])", r"\\\1", text).replace("-", "\u2011")


def rows_for(chapter: Chapter, label: str | None, pattern: str) -> list[Check]:
    # the checks of the section that states the result; else of the sections that cite it; else
    # the chapter's checks that match the result's pattern
    found = [c for defined, _, checks in chapter.sections if label in defined for c in checks]
    if not found:
        found = [c for _, cited, checks in chapter.sections if label in cited for c in checks]
    if not found:
        found = [c for *_, checks in chapter.sections for c in checks if re.search(pattern, c.claim)]
    unique, seen = [], set()
    for c in found:
        if (c.claim, c.measured) not in seen:
            seen.add((c.claim, c.measured))
            unique.append(c)
    return unique


def table(book: Path = BOOK) -> str:
    chapters = {p.stem[:2]: read_chapter(p) for p in sorted(book.glob("[0-9][0-9]_*.ipynb"))}
    groups = []  # (paper names, chapter, label, checks)
    for name, keys, number, fallback, pattern in RESULTS:
        chapter = chapters.get(number)
        if chapter is None:
            continue
        named = [lab for lab, title in chapter.titles.items() if paper_keys(title) & set(keys)]
        label = named[0] if named else fallback if fallback in chapter.titles else None
        for group in groups:
            if group[1] is chapter and group[2] == label and label is not None:
                group[0].append(name)
                break
        else:
            groups.append(([name], chapter, label, rows_for(chapter, label, pattern)))
    lines = [
        "<!-- generated by .ci/results_table.py from the executed chapters: do not edit -->",
        "",
        "| Paper | Book | Ch. | What is checked | Measured (tolerance) |",
        "|---|---|---|---|---|",
    ]
    for names, chapter, label, checks in groups:
        number = str(int(chapter.stem[:2]))
        where = f"{{numref}}`%s <{chapter.label}>`" if chapter.label else number
        book_ref = f"{{prf:ref}}`{label}`" if label else f"{{numref}}`Chapter %s <{chapter.label}>`"
        head = [", ".join(names), book_ref, where]
        if not checks:
            lines.append("| " + " | ".join(head + ["(no check line printed)", ""]) + " |")
            continue
        for i, c in enumerate(checks[:SHOWN]):
            if c.status == "skipped":
                result = f"skipped: {escape(c.tolerance)}"
            else:
                result = "✓ " + escape(c.measured) + (f" ({escape(c.tolerance)})" if c.tolerance else "")
            cells = (head if i == 0 else ["", "", ""]) + [escape(c.claim), result.strip()]
            lines.append("| " + " | ".join(cells) + " |")
        if len(checks) > SHOWN:
            more = f"{len(checks) - SHOWN} more: the chapter's *What was checked*"
            lines.append(f"|  |  |  | {more} |  |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    args = parser.parse_args(argv)
    text = table()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.relative_to(ROOT)} is stale: run `python .ci/results_table.py`", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)}: {text.count(chr(10)) - 4} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
