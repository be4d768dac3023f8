"""attnlib: models, theory solvers and simulations for *The theory of attention layers*.

The public API is re-exported here; the book's chapter ``00-attention`` introduces the notation.
One module per model, named after it:

- :mod:`attnlib.attention`  softmax and multi-head attention (chapter 0)
- :mod:`attnlib.random_qk`  random query-key (random-feature) attention, Fu et al. 2023 (chapter 1)
- :mod:`attnlib.mha`        multi-head attention on Boolean inputs, Chen & Li 2024 (chapter 2)
- :mod:`attnlib.dotattn`    tied low-rank dot-product attention, Cui et al. 2024 (chapter 3)
- :mod:`attnlib.paths`      attention paths in deep networks, Tiberi et al. 2024 (chapter 4)
- :mod:`attnlib.glyphs`     a generated Omniglot-like set of characters from many scripts (chapter 4)
"""

from . import attention, dotattn, glyphs, mha, paths, plotting, random_qk
from ._chapter_params import profile_sizes
from ._repo import committed_file
from ._runtime import DEVICES, PROFILES, Run, resolve_device, seed_everything, start_chapter
from ._store import load_result, provenance, save_result, stored_full, stored_or_compute, stored_phrase
from ._sweep import SweepError, sweep
from ._validation import ParameterError, check_choice, check_float, check_int

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "attention",
    "dotattn",
    "glyphs",
    "mha",
    "paths",
    "plotting",
    "random_qk",
    "DEVICES",
    "PROFILES",
    "ParameterError",
    "Run",
    "SweepError",
    "check_choice",
    "check_float",
    "check_int",
    "committed_file",
    "profile_sizes",
    "load_result",
    "provenance",
    "resolve_device",
    "save_result",
    "seed_everything",
    "start_chapter",
    "stored_full",
    "stored_or_compute",
    "stored_phrase",
    "sweep",
]
