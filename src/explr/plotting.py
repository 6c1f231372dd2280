"""Shared figure style: one colour per schedule across all chapters, lean PNG figures."""
from __future__ import annotations

__all__ = ["COLORS", "setup"]

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
    "eps": "#e377c2",
    "theory": "#000000",
}


def setup():
    """Matplotlib defaults for the book: readable fonts, light grid, modest DPI (small notebooks)."""
    import matplotlib as mpl

    mpl.rcParams.update({
        "figure.dpi": 90,
        "savefig.dpi": 90,
        "figure.figsize": (7.5, 3.6),
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "legend.frameon": False,
        "font.size": 10,
    })
