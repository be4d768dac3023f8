"""attnbook: the machinery of the book *The theory of attention layers*, which never changes a number.

It runs chapters (parameters, cache keys, execution, output slots), sweeps their points (serially
or on Dask, resuming from checkpoints), stores and audits paper-scale tables with provenance,
builds the site, its editions and the Colab twins, and holds the plotting theme and the number
formatter. The science lives in :mod:`attnlib`; this package imports it, never the reverse.

A chapter uses the kit through ``import attnbook as ab``: :func:`start_chapter`, :func:`sweep`,
:func:`stored_sweep` / :func:`stored_or_compute` for a table that may be stored at paper scale,
:func:`stored_full` for the stored one drawn beside a quick run, :func:`source_phrase` for the
caption saying where a figure's data come from, :func:`profile_sizes`, :func:`committed_file`,
:mod:`attnbook.plotting` (its ``FULL_STYLE`` draws stored points), and :func:`claim`, which
records a headline claim with its control and its held-out check for the *Claims and evidence*
page. The command line is ``attnbook`` (:mod:`attnbook.cli`).
"""

from attnlib import ParameterError

from . import plotting
from .chapter_params import profile_sizes
from .claims import ClaimError, claim
from .repo import committed_file
from .runs import DEVICES, PROFILES, Run, resolve_device, seed_everything, start_chapter
from .store import (
    load_result,
    provenance,
    save_result,
    source_phrase,
    stored_full,
    stored_or_compute,
    stored_phrase,
    stored_sweep,
)
from .sweeps import SweepError, checkpoint_path, sweep

__all__ = [
    "plotting",
    "DEVICES",
    "ParameterError",
    "PROFILES",
    "Run",
    "SweepError",
    "ClaimError",
    "claim",
    "checkpoint_path",
    "committed_file",
    "load_result",
    "profile_sizes",
    "provenance",
    "resolve_device",
    "save_result",
    "seed_everything",
    "start_chapter",
    "stored_full",
    "stored_or_compute",
    "stored_phrase",
    "stored_sweep",
    "source_phrase",
    "sweep",
]
