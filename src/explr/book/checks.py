"""How a chapter asserts its claims (:class:`Checks`) and shows what it measured (:func:`shown`).

The round-off rule: a deviation checked against a tolerance ≤ :data:`EXACTNESS` is shown as ``< B``, B =
10^⌊log10(tolerance / 10)⌋, so that a committed output reads the same on every machine.  :func:`count`,
:func:`most` and :func:`seed_rule` bound a chapter's parameters.  Why: docs/maths-notes.md, "The round-off rule".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..params import MAX_SEED, Int, is_int, is_real, is_real_type

__all__ = ["Checks", "EXACTNESS", "MEMORY", "bound", "count", "held", "most", "seed_rule", "shown"]

#: the largest tolerance of a claim of exactness up to round-off (float64 eps is 2.2e-16; float32's 1.2e-7)
EXACTNESS = 1e-6

#: the memory a chapter's arrays may take: a third of a free Colab session's 12.7 GiB, half of an 8 GiB laptop's
MEMORY = 4 * 2**30


def _bytes(n: float) -> str:
    """``n`` bytes in B (up to 1023), KiB, MiB or GiB (three significant digits)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.4g} B"


def most(bytes_each: float, share: int = 1) -> int:
    """The most units of ``bytes_each`` bytes that fit in a ``share``-th of :data:`MEMORY`: ⌊MEMORY / (share ·
    bytes_each)⌋."""
    if not bytes_each > 0:
        raise ValueError(f"bytes_each = {bytes_each!r}: must be a number > 0")
    return int(MEMORY // (share * bytes_each))


def held(what: str, bytes_each: float, share: int = 1, note: str = "") -> str:
    """Why :func:`most` bounds a count, as a rule's note: " (note; what: 64 KiB each, at most 4 GiB in all)"."""
    part = f", 1/{share} of {_bytes(MEMORY)}" if share > 1 else ""
    reason = f"{what}: {_bytes(bytes_each)} each, at most {_bytes(MEMORY / share)} in all{part}"
    return f" ({note}; {reason})" if note else f" ({reason})"


def count(minimum: int, what: str, bytes_each: float, share: int = 1, note: str = "") -> Int:
    """The rule of a count from ``minimum`` of units (``what``) of ``bytes_each`` bytes: at most :func:`most`."""
    return Int(minimum, maximum=most(bytes_each, share), note=held(what, bytes_each, share, note))


def seed_rule(used: int = 1) -> Int:
    """The rule of a ``seed`` when ``seed`` ... ``seed + used - 1`` go to ``torch.manual_seed``: [0, MAX_SEED - used +
    1]."""
    note = " (what torch.manual_seed takes" + (f", up to seed + {used - 1})" if used > 1 else ")")
    return Int(0, maximum=MAX_SEED - (used - 1), note=note)


def bound(tolerance: float) -> float:
    """10^⌊log10(tolerance / 10)⌋, below which a deviation is shown as ``< bound``; 0 for a tolerance above
    :data:`EXACTNESS`."""
    if not 0 < tolerance <= EXACTNESS:
        return 0.0
    return 10.0 ** math.floor(math.log10(tolerance / 10) + 1e-9)


def shown(value, tolerance=None) -> str:
    """``value`` as a check line shows it: "< 1e-10" under :func:`bound` of its tolerance, else a float at three
    significant digits, anything else as ``str``."""
    if not is_real_type(type(value)):
        return str(value)
    if is_real(tolerance) and 0 <= value < bound(tolerance):
        return f"< {bound(tolerance):.0e}"
    return str(value) if is_int(value) else f"{value:.3g}"


@dataclass
class Checks:
    """A chapter's claims: :meth:`claim` prints "✓ claim: measured …, tolerance …" or raises ``AssertionError``
    with ✗ and every digit; :meth:`skip` prints "SKIPPED (not asserted): claim; needs …"; :meth:`table` closes the
    chapter with the claims by kind of tolerance, and why."""

    rows: list = field(default_factory=list)

    def claim(self, text: str, ok, *, measured=None, tolerance=None) -> None:
        measured_ = shown(measured, tolerance) if measured is not None else ""
        tolerance_ = shown(tolerance) if tolerance is not None else ""
        numbers = ", ".join(part for part in (
            f"measured {measured_}" if measured_ else "", f"tolerance {tolerance_}" if tolerance_ else "") if part)
        line = f"{text}: {numbers}" if numbers else text
        if not bool(ok):
            full = ", ".join(f"{name} {v}" for name, v in (("measured", measured), ("tolerance", tolerance))
                             if v is not None)  # str of a float is its repr: every digit
            raise AssertionError(f"✗ {text}: {full}" if full else f"✗ {text}")  # every digit: it failed
        self.rows.append(("✓", text, measured_, tolerance_))
        print(f"✓ {line}")

    def skip(self, text: str, needs: str) -> None:
        self.rows.append(("skipped", text, "", needs))
        print(f"SKIPPED (not asserted): {text}; {needs}")

    @property
    def skipped(self) -> list:
        return [text for status, text, *_ in self.rows if status == "skipped"]

    def markdown(self) -> str:
        """A markdown table of the claims by :data:`KINDS`: how many of each kind (the skipped ones by name), and
        why such a tolerance."""
        kinds = {kind: [] for kind in KINDS}
        for status, text, measured, limit in self.rows:
            kinds[_kind(status, measured, limit)].append(f"{text} ({limit})" if status == "skipped" else text)
        lines = ["| kind of claim | claims | why this tolerance |", "|---|---|---|"]
        for kind, texts in kinds.items():
            if texts:
                count_ = "; ".join(texts) if kind == "skipped" else str(len(texts))
                lines.append(f"| {kind} | {count_} | {KINDS[kind]} |".replace("\n", " "))
        return "\n".join(lines)

    def table(self):
        """The markdown table, displayed (in a notebook) and returned."""
        from IPython.display import Markdown

        return Markdown(self.markdown())


#: the kinds of claim of :meth:`Checks.markdown`, and why each is held to its kind of tolerance
KINDS = {
    "exact up to round-off": f"a deviation below a tolerance ≤ {EXACTNESS:g}: rounding (float64: about 1e-16 an "
                             "operation) or an ODE solver's tolerance stays under it over a run; a wrong formula "
                             "would not",
    "a value against its threshold": "a slope, a ratio, a rate or a change held below or above the threshold its ✓ "
                                     "line states: set by what a run of this length resolves, or, for a change "
                                     "that must show, far above rounding",
    "holds or not": "an inequality or an event: no tolerance",
    "skipped": "the parameters do not reach the claim's regime: not asserted",
}


def _kind(status: str, measured: str, tolerance: str) -> str:
    """A row's kind: exact when its tolerance is ≤ :data:`EXACTNESS` and its value below it."""
    if status == "skipped":
        return "skipped"
    if not tolerance:
        return "holds or not"
    try:
        exact = 0 < float(tolerance) <= EXACTNESS and (measured.startswith("<") or float(measured) < float(tolerance))
    except ValueError:  # a tolerance shown as words ("> 2 orders")
        exact = False
    return "exact up to round-off" if exact else "a value against its threshold"
