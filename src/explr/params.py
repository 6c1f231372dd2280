"""One rule vocabulary for every parameter of the book: the chapters' parameters and the engine's settings.

A *rule* says what values a parameter may take and how to say so in one line: ``rule.ok(value)`` and
``rule.rule()``, e.g. ``Int(1)`` → "an integer >= 1".  The engine's :class:`~explr.cifar10.TrainConfig`
declares each setting with one of these rules; a chapter checks its ``parameters`` cell with
:func:`check_parameters`::

    check_parameters(globals(), {
        "steps": Int(20),
        "lr": Float(0),
        "wd": lambda: Float(0, (1 - math.sqrt(momentum)) ** 2 / lr, hi_open=False),  # after lr and momentum
    })

which stops at the first parameter out of range with ``ValueError: steps = 3: must be an integer >= 20``.
A rule may be given as a zero-argument callable: it is built only once the parameters before it have
passed, so its bounds may use them.

:class:`Checks` is how a chapter asserts its claims: one visible line per claim (✓, or SKIPPED with what
the claim needs), an ``AssertionError`` naming the claim when it fails, and a closing table of what was
checked (:meth:`Checks.table`).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "Choice",
    "Int",
    "Float",
    "Flag",
    "Text",
    "Numbers",
    "check_parameters",
    "Checks",
]


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class Choice:
    """One of ``choices``."""

    choices: tuple

    def rule(self) -> str:
        return f"one of {', '.join(map(str, self.choices))}"

    def ok(self, v) -> bool:
        return v in self.choices

    def parse(self, text: str):
        return text


@dataclass(frozen=True)
class Int:
    """An integer in [minimum, maximum], optionally ≡ r (mod m)."""

    minimum: int
    modulo: tuple | None = None  # (m, r): v ≡ r (mod m)
    note: str = ""  # appended to the rule
    maximum: int | None = None

    def rule(self) -> str:
        if self.modulo:
            return f"{self.modulo[0]}n + {self.modulo[1]} with n >= 1{self.note}"
        if self.maximum is not None:
            return f"an integer in [{self.minimum}, {self.maximum}]{self.note}"
        return f"an integer >= {self.minimum}{self.note}"

    def ok(self, v) -> bool:
        return (_is_int(v) and v >= self.minimum and (self.maximum is None or v <= self.maximum)
                and (not self.modulo or v % self.modulo[0] == self.modulo[1]))

    def parse(self, text: str):
        return int(text)


@dataclass(frozen=True)
class Float:
    """A finite real number in the interval (lo, hi), each end open or closed."""

    lo: float
    hi: float = math.inf
    lo_open: bool = True
    hi_open: bool = True
    note: str = ""  # appended to the rule

    def rule(self) -> str:
        interval = f"{'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
        return f"a finite number in {interval}{self.note}"

    def ok(self, v) -> bool:
        if not _is_real(v):
            return False
        return (v > self.lo if self.lo_open else v >= self.lo) and (v < self.hi if self.hi_open else v <= self.hi)

    def parse(self, text: str):
        return float(text)


@dataclass(frozen=True)
class Flag:
    """True or False."""

    def rule(self) -> str:
        return "True or False"

    def ok(self, v) -> bool:
        return isinstance(v, (bool, np.bool_))


@dataclass(frozen=True)
class Text:
    """A non-empty string, described by ``what``."""

    what: str

    def rule(self) -> str:
        return self.what

    def ok(self, v) -> bool:
        return isinstance(v, str) and bool(v)

    def parse(self, text: str):
        return text


@dataclass(frozen=True)
class Numbers:
    """A list of values that each pass ``item``: at least ``min_len`` of them, and optionally strictly
    increasing or pairwise distinct.  ``none_ok``: ``None`` is allowed too (meaning "the default")."""

    item: object
    min_len: int = 1
    increasing: bool = False
    distinct: bool = False
    none_ok: bool = False
    note: str = ""

    def rule(self) -> str:
        order = " strictly increasing" if self.increasing else " distinct" if self.distinct else ""
        head = "None or " if self.none_ok else ""
        return f"{head}a list of >= {self.min_len}{order} values, each {self.item.rule()}{self.note}"

    def ok(self, v) -> bool:
        if v is None:
            return self.none_ok
        if not isinstance(v, (list, tuple)) or len(v) < self.min_len or not all(self.item.ok(x) for x in v):
            return False
        if self.increasing and not all(b > a for a, b in zip(v, v[1:])):
            return False
        return not self.distinct or len(set(v)) == len(v)


def check_parameters(namespace: dict, rules: dict) -> None:
    """Check ``namespace[name]`` against each rule of ``rules``, in order; the first value out of range raises
    ``ValueError("name = value: must be <rule>")``.  A rule given as a zero-argument callable is built when its
    turn comes, after every earlier parameter passed (so its bounds may use them)."""
    for name, rule in rules.items():
        if name not in namespace:
            raise ValueError(f"{name}: no such parameter")
        if callable(rule) and not hasattr(rule, "ok"):
            rule = rule()
        value = namespace[name]
        if not rule.ok(value):
            raise ValueError(f"{name} = {value!r}: must be {rule.rule()}")


def _shown(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


@dataclass
class Checks:
    """The claims a chapter asserts, each with one visible line, and the table of what was checked.

    ``checks.claim("TEXP ≡ Step Decay", deviation < 1e-9, measured=deviation, tolerance=1e-9)`` prints
    "✓ TEXP ≡ Step Decay: measured 3.6e-14, tolerance 1e-09" or raises ``AssertionError`` with that line
    and ✗.  ``checks.skip(claim, needs)`` prints "SKIPPED (not asserted): claim; needs …" for a claim whose
    regime the parameters do not reach.  :meth:`table` is the chapter's closing "What was checked".
    """

    rows: list = field(default_factory=list)

    def claim(self, text: str, ok, *, measured=None, tolerance=None) -> None:
        numbers_ = ", ".join(part for part in (
            f"measured {_shown(measured)}" if measured is not None else "",
            f"tolerance {_shown(tolerance)}" if tolerance is not None else "") if part)
        line = f"{text}: {numbers_}" if numbers_ else text
        if not bool(ok):
            raise AssertionError(f"✗ {line}")
        self.rows.append(("✓", text, _shown(measured) if measured is not None else "",
                          _shown(tolerance) if tolerance is not None else ""))
        print(f"✓ {line}")

    def skip(self, text: str, needs: str) -> None:
        self.rows.append(("skipped", text, "", needs))
        print(f"SKIPPED (not asserted): {text}; {needs}")

    @property
    def skipped(self) -> list:
        return [text for status, text, *_ in self.rows if status == "skipped"]

    def markdown(self) -> str:
        """The rows as a markdown table (claim, result, measured, tolerance or what a skipped claim needs)."""
        lines = ["| claim | result | measured | tolerance / needs |", "|---|---|---|---|"]
        for status, text, measured, bound in self.rows:
            lines.append(f"| {text} | {status} | {measured} | {bound} |".replace("\n", " "))
        return "\n".join(lines)

    def table(self):
        """The markdown table, displayed (in a notebook) and returned."""
        from IPython.display import Markdown

        return Markdown(self.markdown())
