"""One rule vocabulary for every parameter of the book: the chapters' parameters and the engine's settings.

A rule says what values a parameter may take, in one line: ``rule.ok(value)``, ``rule.rule()`` (``Int(1)``: "an
integer >= 1") and ``rule.parse(text)`` for a command-line value.  :class:`~explr.cifar10.TrainConfig` declares each
setting with one; a chapter checks its ``parameters`` cell with :func:`check_parameters` (``ValueError: steps = 3:
must be an integer >= 20``), a library function one argument with :func:`checked`.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["MAX_SEED", "FLOAT64_MAX", "Choice", "Int", "Float", "Flag", "Text", "Folder", "Numbers", "check_parameters",
           "checked"]


# The book's two number rules, written here once: every int or real-number check in ``src/`` goes through them
# (tests/test_params.py scans for an inline ``isinstance(v, (int, float))`` or ``isinstance(v, bool)``).
def is_int(v) -> bool:
    """An integer (Python's or numpy's), not a boolean."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_real_type(t: type) -> bool:
    """A real-number type (Python or numpy ints and floats), not a boolean."""
    return issubclass(t, numbers.Real) and not issubclass(t, (bool, np.bool_))


def is_real(v) -> bool:
    """A finite real number (:func:`is_real_type`) that a float64 holds, not a boolean: an int beyond float64's
    range (10**400) is refused, not an ``OverflowError``."""
    try:
        return is_real_type(type(v)) and math.isfinite(v)
    except OverflowError:
        return False


@dataclass(frozen=True)
class Choice:
    """One of ``choices``."""

    #: the values allowed.
    choices: tuple
    #: appended to the rule's words.
    note: str = ""

    def rule(self) -> str:
        return f"one of {', '.join(map(str, self.choices))}{self.note}"

    def ok(self, v) -> bool:
        return v in self.choices

    def parse(self, text: str):
        return text


@dataclass(frozen=True)
class Int:
    """An integer in [minimum, maximum], optionally ≡ r (mod m)."""

    #: the smallest value allowed.
    minimum: int
    #: (m, r): only v ≡ r (mod m); None: any.
    modulo: tuple | None = None
    #: appended to the rule's words.
    note: str = ""
    #: the largest value allowed; None: no limit.
    maximum: int | None = None

    def rule(self) -> str:
        if self.modulo:
            m, r = self.modulo
            n_min = -(-(self.minimum - r) // m)  # the smallest n with m n + r >= minimum
            if self.maximum is not None:
                return f"{m}n + {r} with n in [{n_min}, {(self.maximum - r) // m}]{self.note}"
            return f"{m}n + {r} with n >= {n_min}{self.note}"
        if self.maximum is not None:
            return f"an integer in [{self.minimum}, {self.maximum}]{self.note}"
        return f"an integer >= {self.minimum}{self.note}"

    def ok(self, v) -> bool:
        return (is_int(v) and v >= self.minimum and (self.maximum is None or v <= self.maximum)
                and (not self.modulo or v % self.modulo[0] == self.modulo[1]))

    def parse(self, text: str):
        return int(text)


#: the largest finite float64
FLOAT64_MAX = float(np.finfo(np.float64).max)
#: what ``torch.manual_seed`` accepts at most (it refuses 2**64).
MAX_SEED = 2**64 - 1


@dataclass(frozen=True)
class Float:
    """A finite real number in the interval (lo, hi), each end open or closed."""

    #: the lower end.
    lo: float
    #: the upper end (inf: float64's largest value, closed).
    hi: float = math.inf
    #: whether ``lo`` itself is refused.
    lo_open: bool = True
    #: whether ``hi`` itself is refused.
    hi_open: bool = True
    #: appended to the rule's words.
    note: str = ""

    def rule(self) -> str:
        # no upper bound: float64's largest value is the largest accepted, and a huge int is refused by it
        hi, hi_open = (FLOAT64_MAX, False) if self.hi == math.inf else (self.hi, self.hi_open)
        interval = f"{'(' if self.lo_open else '['}{self.lo:g}, {hi:g}{')' if hi_open else ']'}"
        return f"a finite number in {interval}{self.note}"

    def ok(self, v) -> bool:
        if not is_real(v):
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

    #: the rule's words.
    what: str

    def rule(self) -> str:
        return self.what

    def ok(self, v) -> bool:
        return isinstance(v, str) and bool(v)

    def parse(self, text: str):
        return text


@dataclass(frozen=True)
class Folder:
    """An existing folder, described by ``what``; or one of ``fetchable``, which the caller fetches when absent
    (the chapters' ``results/...`` folders, downloaded from the repository archive on Colab)."""

    #: what the folder holds, the rule's first words.
    what: str
    #: names accepted even when absent (the caller fetches them).
    fetchable: tuple = ()

    def rule(self) -> str:
        also = f" (or one of {', '.join(self.fetchable)}, fetched when absent)" if self.fetchable else ""
        return f"{self.what}: an existing folder{also}"

    def ok(self, v) -> bool:
        return isinstance(v, str) and bool(v) and (v in self.fetchable or Path(v).is_dir())


@dataclass(frozen=True)
class Numbers:
    """A list of values that each pass ``item``: at least ``min_len`` of them, and optionally strictly
    increasing or pairwise distinct, or ``None`` (the default) if ``none_ok``."""

    #: the rule each value passes.
    item: object
    #: the fewest values allowed.
    min_len: int = 1
    #: whether the values must be strictly increasing.
    increasing: bool = False
    #: whether they must be pairwise distinct.
    distinct: bool = False
    #: whether ``None`` (the default) is allowed too.
    none_ok: bool = False
    #: appended to the rule's words.
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
    turn comes, so its bounds may use the parameters before it (``lambda: Float(0, 1 / lr)``)."""
    for name, rule in rules.items():
        if name not in namespace:
            raise ValueError(f"{name}: no such parameter")
        checked(name, namespace[name], rule() if callable(rule) and not hasattr(rule, "ok") else rule)


def checked(name: str, value, rule):
    """``value`` when ``rule.ok(value)``; otherwise ``ValueError("name = value: must be <rule>")``, the one-line
    error of :func:`check_parameters`, for a library function's arguments."""
    if not rule.ok(value):
        try:
            shown = repr(value)
        except ValueError:  # an int past Python's 4,300 digits of str(), or a list holding one
            shown = f"<a {type(value).__name__} too large to print>"
        if len(shown) > 60:  # a 401-digit int, a long list: its middle cut out
            shown = f"{shown[:30]}…{shown[-10:]} ({len(shown)} characters)"
        raise ValueError(f"{name} = {shown}: must be {rule.rule()}")
    return value
