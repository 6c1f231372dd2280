"""The book's figure style: one colour per schedule, SVG figures at most :data:`FIGURE_WIDTH` inches wide (the ~700
px text column; dense curves pass ``rasterized=True``), two panels a row at most."""
from __future__ import annotations

__all__ = ["COLORS", "FIGURE_WIDTH", "setup"]

#: One colour per schedule/run kind, used by every chapter.
COLORS = {
    "step": "#1f77b4",        # Step Decay + WD (the original run)
    "texp": "#d62728",        # TEXP / exponential LR equivalent
    "texp++": "#ff7f0e",
    "texp--": "#9467bd",
    "cosine": "#2ca02c",
    "cosine-texp": "#8c564b",
    "no-correction": "#7f7f7f",
    "float32": "#17becf",
    "bf16": "#bcbd22",
    "eps": "#e377c2",
    "theory": "#000000",
}

#: The widest figure, in inches: it is shown at about the column's width (7.5 in at 96 px/in ≈ 720 px).
FIGURE_WIDTH = 7.5


def setup():
    """Matplotlib defaults for the book: SVG output, readable fonts, light grid, one figure width."""
    import matplotlib as mpl
    from matplotlib_inline.backend_inline import set_matplotlib_formats

    set_matplotlib_formats("svg")
    mpl.rcParams.update({
        "figure.figsize": (FIGURE_WIDTH, 3.4),
        "savefig.dpi": 200,          # the rasterized parts of a vector figure
        "svg.fonttype": "none",      # text as text: sharp at any zoom, and small
        "svg.hashsalt": "explr",     # stable element ids: a re-run changes only what changed
        "font.family": "DejaVu Sans",
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "legend.frameon": False,
        "font.size": 10,
        "legend.fontsize": 9,
        "axes.titlesize": 10,
    })
