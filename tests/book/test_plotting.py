"""explr.book.plotting: one colour per schedule across the chapters, and figures that are SVGs of the column's
width with their text kept as text and stable element ids."""
import io
import json
import re
from pathlib import Path

import matplotlib as mpl
import matplotlib.colors
import matplotlib_inline.backend_inline
from matplotlib.figure import Figure

from explr.book.plotting import COLORS, FIGURE_WIDTH, setup
from explr.cifar10.config import SCHEDULES

BOOK = Path(__file__).resolve().parents[2] / "book"


def colour_keys_read_by_the_chapters() -> set[str]:
    """Every ``COLORS["..."]`` in a chapter's code cells."""
    keys = set()
    for nb in sorted(BOOK.glob("*.ipynb")):
        for cell in json.loads(nb.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                keys |= set(re.findall(r"""COLORS\[["']([^"']+)["']\]""", "".join(cell["source"])))
    return keys


def test_every_schedule_and_every_colour_a_chapter_reads_has_one():
    read = colour_keys_read_by_the_chapters()
    assert {"step", "texp", "theory"} <= read  # the scan finds the chapters' colours
    assert read <= set(COLORS), f"colours the chapters read but COLORS lacks: {sorted(read - set(COLORS))}"
    assert set(SCHEDULES) <= set(COLORS), f"engine schedules without a colour: {sorted(set(SCHEDULES) - set(COLORS))}"


def test_the_colours_are_distinct_valid_colours():
    assert all(matplotlib.colors.is_color_like(c) for c in COLORS.values()), COLORS
    rgb = [matplotlib.colors.to_hex(c) for c in COLORS.values()]
    assert len(set(rgb)) == len(rgb), "two kinds of run share a colour"


def svg(figure: Figure) -> bytes:
    buf = io.BytesIO()
    figure.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def test_setup_makes_svg_figures_of_the_column_width_with_text_as_text_and_stable_ids(monkeypatch):
    formats = []
    monkeypatch.setattr(matplotlib_inline.backend_inline, "set_matplotlib_formats", lambda *f: formats.append(f))
    before = dict(mpl.rcParams)
    with mpl.rc_context():
        setup()
        assert formats == [("svg",)]  # the notebooks' inline figures are SVGs
        assert mpl.rcParams["figure.figsize"][0] == FIGURE_WIDTH
        figure = Figure()
        figure.add_subplot().plot([0, 1], [1, 0], color=COLORS["texp"], label="TEXP")
        figure.axes[0].legend()
        first = svg(figure)
        assert re.search(rb'<svg[^>]* width="%gpt"' % (FIGURE_WIDTH * 72), first), first[:400]
        assert b">TEXP</text>" in first  # text as text (svg.fonttype none), not glyph paths
        assert svg(figure) == first  # the same figure, the same file: only what changed shows in a diff
    assert dict(mpl.rcParams) == before  # the test leaves matplotlib as it found it
