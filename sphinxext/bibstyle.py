"""Sphinx extension of the book: bibliography labels in author-year form, "[Li and Arora, 2020]".

The citations in the text use sphinxcontrib-bibtex's ``author_year`` reference style, which prints
"[Li and Arora, 2020]"; pybtex's ``alpha`` labels of the bibliography would print "[LA20]". This
registers the formatting style ``authoryear`` (pybtex's ``plain`` with author-year labels), which
``bibtex_default_style`` in _config.yml selects, so that both read the same.
"""
from __future__ import annotations

from collections import Counter

from pybtex.plugin import register_plugin
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle


def _surname(person) -> str:
    return " ".join(person.prelast_names + person.last_names)


class AuthorYearLabels(BaseLabelStyle):
    """"Ioffe and Szegedy, 2015", "Sutskever et al., 2013"; a/b/... for equal labels."""

    def format_label(self, entry) -> str:
        persons = entry.persons.get("author") or entry.persons.get("editor") or []
        names = [_surname(p) for p in persons]
        if not names:
            who = entry.key
        elif len(names) == 1:
            who = names[0]
        elif len(names) == 2:
            who = f"{names[0]} and {names[1]}"
        else:
            who = f"{names[0]} et al."
        year = entry.fields.get("year", "")
        return f"{who}, {year}" if year else who

    def format_labels(self, sorted_entries):
        labels = [self.format_label(e) for e in sorted_entries]
        count, seen = Counter(labels), Counter()
        for label in labels:
            if count[label] == 1:
                yield label
            else:
                yield label + chr(ord("a") + seen[label])
                seen[label] += 1


class AuthorYearStyle(PlainStyle):
    default_label_style = AuthorYearLabels
    default_sorting_style = "author_year_title"


def setup(app):
    register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
