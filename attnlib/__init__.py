"""attnlib: models, theory solvers and simulations for *The theory of attention layers*.

The public API is re-exported here; the book's chapter ``00-attention`` introduces the notation.
"""

from . import attention, plotting
from ._runtime import DEVICES, PROFILES, Run, resolve_device, seed_everything, start_chapter
from ._store import load_result, provenance, save_result, stored_or_compute
from ._sweep import sweep
from ._validation import ParameterError, check_choice, check_float, check_int

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "attention",
    "plotting",
    "DEVICES",
    "PROFILES",
    "ParameterError",
    "Run",
    "check_choice",
    "check_float",
    "check_int",
    "load_result",
    "provenance",
    "resolve_device",
    "save_result",
    "seed_everything",
    "start_chapter",
    "stored_or_compute",
    "sweep",
]
