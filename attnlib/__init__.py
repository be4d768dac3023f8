"""attnlib: models, theory solvers and simulations for *The theory of attention layers*.

The science only: every module here computes, and its code is what makes a stored table or a
sweep checkpoint stale. The book's machinery (runs, sweeps, stored tables, the site, the CLI) is
the separate package :mod:`attnbook`, which imports this one and never the reverse. One module
per model, named after it; the book's chapter ``00-attention`` introduces the notation.

- :mod:`attnlib.attention`  softmax and multi-head attention (chapter 0)
- :mod:`attnlib.random_qk`  random query-key (random-feature) attention, Fu et al. 2023 (chapter 1)
- :mod:`attnlib.mha`        multi-head attention on Boolean inputs, Chen & Li 2024 (chapter 2)
- :mod:`attnlib.dotattn`    tied low-rank dot-product attention, Cui et al. 2024 (chapter 3)
- :mod:`attnlib.paths`      attention paths in deep networks, Tiberi et al. 2024 (chapter 4)
- :mod:`attnlib.glyphs`     a generated Omniglot-like set of characters from many scripts (chapter 4)
"""

from . import attention, dotattn, glyphs, mha, paths, random_qk
from ._validation import ParameterError, check_choice, check_float, check_int

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "attention",
    "dotattn",
    "glyphs",
    "mha",
    "paths",
    "random_qk",
    "ParameterError",
    "check_choice",
    "check_float",
    "check_int",
]
