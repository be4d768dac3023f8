"""The book's one plotting theme and a few figure helpers.

Every chapter calls :func:`set_theme` through :func:`attnbook.start_chapter`: seaborn's
colour-blind-safe palette, book-sized figures, SVG output in notebooks, no titles (captions live in
the text). Theory is drawn as lines (:data:`THEORY_STYLE`), simulation as markers with error bars
(:data:`SIM_STYLE`).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

__all__ = [
    "PALETTE",
    "THEORY_STYLE",
    "SIM_STYLE",
    "SEQUENTIAL",
    "DIVERGING",
    "WIDTH",
    "set_theme",
    "figure",
    "attention_heatmaps",
]

#: Colour-blind-safe qualitative palette (seaborn "colorblind", after Okabe & Ito).
PALETTE = sns.color_palette("colorblind")
#: Colour-blind-safe, perceptually uniform colour maps: for magnitudes (weights, errors, densities)
#: and for signed quantities centred at zero (order parameters, differences).
SEQUENTIAL = "viridis"
DIVERGING = "vlag"
#: Figure width in inches of a full-width figure in the book's text column.
WIDTH = 7.0
#: Keyword arguments for theory curves (``ax.plot(x, y, **THEORY_STYLE)``).
THEORY_STYLE = {"linestyle": "-", "linewidth": 1.8, "zorder": 2}
#: Keyword arguments for simulation points (``ax.errorbar(x, y, yerr, **SIM_STYLE)``).
SIM_STYLE = {"marker": "o", "linestyle": "none", "markersize": 5, "capsize": 2.5, "zorder": 3}
#: Points of a stored paper-scale run (``results/``) drawn beside a quick run's: open circles.
FULL_STYLE = {"marker": "o", "markerfacecolor": "none", "linestyle": "none", "markersize": 7}


def set_theme() -> None:
    """Apply the book theme to matplotlib (and SVG output when running inside IPython)."""
    sns.set_theme(
        context="notebook",
        style="ticks",
        palette=PALETTE,
        font_scale=0.95,
        rc={
            "figure.figsize": (WIDTH, 0.6 * WIDTH),
            "figure.dpi": 100,
            "savefig.bbox": "tight",
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "legend.frameon": False,
            # legend and tick labels close to the axis labels, so they stay legible once the
            # figure is scaled to the text column (and to a phone screen)
            "axes.labelsize": 11.5,
            "legend.fontsize": 10.5,
            "legend.title_fontsize": 10.5,
            "xtick.labelsize": 10.5,
            "ytick.labelsize": 10.5,
            "image.cmap": SEQUENTIAL,
            "svg.fonttype": "path",
        },
    )
    try:
        from IPython import get_ipython

        if get_ipython() is not None:
            from matplotlib_inline.backend_inline import set_matplotlib_formats

            set_matplotlib_formats("svg")
    except ImportError:  # plain Python: nothing to configure
        pass


def figure(ncols: int = 1, nrows: int = 1, height: float | None = None, **kwargs):
    """A book-width figure with ``nrows x ncols`` axes (constrained layout).

    ``height`` defaults to a panel aspect of about 4:3 for several columns and 5:3 for one.
    Returns ``(fig, ax)`` for a single panel and ``(fig, axes)`` otherwise.
    """
    if height is None:
        panel_w = WIDTH / ncols
        height = nrows * panel_w * (0.6 if ncols == 1 else 0.8)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(WIDTH, height), layout="constrained", squeeze=True, **kwargs
    )
    return fig, axes


def attention_heatmaps(weights, labels=None, axes=None, cmap="rocket_r", vmax=None):
    """Draw attention matrices side by side.

    Parameters
    ----------
    weights : array-like, shape ``(panels, queries, keys)``
        Attention weights; rows sum to one for softmax attention.
    labels : list of str, optional
        Short panel labels drawn inside each panel's corner (not titles).
    axes : sequence of matplotlib Axes, optional
        Where to draw; a new book-width figure is made otherwise.
    vmax : float, optional
        Common upper end of the colour scale (default: the largest weight).

    Returns
    -------
    matplotlib.figure.Figure
    """
    w = np.asarray(weights)
    if w.ndim != 3:
        raise ValueError(f"weights must have shape (panels, queries, keys), got {w.shape}")
    if axes is None:
        fig, axes = figure(ncols=w.shape[0], height=WIDTH / max(w.shape[0], 1) * 0.95)
    axes = np.atleast_1d(axes)
    fig = axes[0].figure
    vmax = float(w.max()) if vmax is None else vmax
    for i, ax in enumerate(axes):
        im = ax.imshow(w[i], cmap=cmap, vmin=0.0, vmax=vmax, interpolation="nearest")
        ax.set_xlabel("key token $j$")
        ax.grid(False)
        if i == 0:
            ax.set_ylabel("query token $i$")
        else:
            ax.set_yticklabels([])
        if labels is not None:
            ax.text(0.03, 0.97, labels[i], transform=ax.transAxes, va="top", ha="left",
                    fontsize="small", color="black",
                    bbox={"facecolor": "white", "alpha": 0.8, "linewidth": 0})
    fig.colorbar(im, ax=list(axes), shrink=0.8, label="attention weight $A_{ij}$")
    return fig
