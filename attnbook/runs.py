"""Run context of a chapter: parameter validation, seeding, device choice, summary.

A chapter's first code cell (tagged ``parameters``) sets ``profile``, ``device`` and ``seed``;
the next cell calls :func:`start_chapter`, which validates them before anything is computed.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import attnlib
from attnlib._validation import ParameterError, check_choice, check_int

__all__ = [
    "PROFILES",
    "DEVICES",
    "Run",
    "start_chapter",
    "seed_everything",
    "resolve_device",
    "source_hash",
    "module_hash",
    "SEED_MAX",
    "SEED_STRIDE",
    "git_commit",
    "device_name",
]

PROFILES = ("quick", "full")
DEVICES = ("auto", "cpu", "cuda")
#: Largest accepted ``seed`` (NumPy's legacy generator takes 32-bit seeds; offsets stay in range).
SEED_MAX = 2**32 - 1
#: Streams per seed (:meth:`Run.seed_for`): ``SEED_STRIDE * SEED_MAX`` stays below 2**63.
SEED_STRIDE = 10**9
#: the science package: every file in it is result code
_PACKAGE_DIR = Path(attnlib.__file__).resolve().parent


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and CUDA)."""
    seed = check_int("seed", seed, minimum=0, maximum=SEED_MAX)
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 (the legacy global generator is what users call)
    torch.manual_seed(seed)


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Map ``"auto" | "cpu" | "cuda"`` to a :class:`torch.device`.

    ``"auto"`` picks CUDA when a GPU is visible and the CPU otherwise; ``"cuda"`` without a GPU
    raises :class:`ParameterError` instead of failing later inside a computation.
    """
    if isinstance(device, torch.device):
        device = device.type
    check_choice("device", device, DEVICES)
    has_cuda = torch.cuda.is_available()
    if device == "cuda" and not has_cuda:
        raise ParameterError(
            "device='cuda' but no CUDA GPU is available here; choose one of: 'auto', 'cpu'"
        )
    if device == "auto":
        device = "cuda" if has_cuda else "cpu"
    return torch.device(device)


def device_name(device: torch.device) -> str:
    """Human-readable name of ``device`` for provenance records and the reproducibility page."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.machine()}, {os.cpu_count()} cores)"


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    """Remove the docstring of the module and of every class and function in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                node.body = body[1:] or [ast.Pass()]
    return tree


def module_hash(path: str | Path) -> str:
    """SHA-256 of a Python module's code: its syntax tree without docstrings.

    Comments, formatting and docstrings do not change the hash; any change of what the module
    computes does. A file that does not parse is hashed byte by byte.
    """
    return code_hash(Path(path).read_bytes())


def code_hash(source: bytes) -> str:
    """:func:`module_hash` of a module's source text (e.g. an older version read from git)."""
    try:
        tree = _strip_docstrings(ast.parse(source))
    except (SyntaxError, ValueError):
        return hashlib.sha256(b"unparsed:" + source).hexdigest()
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


def source_hash() -> str:
    """SHA-256 over the code (:func:`module_hash`) of every module of :mod:`attnlib`, the science
    package (every file in it is result code; the machinery lives in :mod:`attnbook`)."""
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE_DIR.rglob("*.py")):
        digest.update(path.relative_to(_PACKAGE_DIR).as_posix().encode())
        digest.update(module_hash(path).encode())
    return digest.hexdigest()


def git_commit() -> str:
    """The repository's HEAD commit (suffixed ``-dirty`` if attnlib has local changes), or ``unknown``."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=_PACKAGE_DIR, capture_output=True, text=True,
            timeout=10, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "."], cwd=_PACKAGE_DIR, capture_output=True,
            text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def _in_ipython() -> bool:
    """Whether this code runs in an IPython shell or kernel (where a glued value is kept)."""
    ipython = sys.modules.get("IPython")
    return ipython is not None and ipython.get_ipython() is not None


def _jsonable(value: Any) -> Any:
    """Convert numbers, tensors and arrays to plain JSON values; reject NaN and infinities."""
    if isinstance(value, torch.Tensor | np.ndarray):
        value = value.tolist()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"summary value {value!r} is not finite")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot store {type(value).__name__} in a summary")


@dataclass(frozen=True)
class Run:
    """The validated parameters of one chapter execution.

    Attributes
    ----------
    chapter : str
        Chapter id, e.g. ``"00-attention"`` (the file name in ``chapters/`` without ``.md``).
    profile : str
        ``"quick"`` (2-core CPU sizes) or ``"full"`` (paper scale, one GPU).
    device : torch.device
        Where tensors are created.
    seed : int
        Base seed; :meth:`seed_for` derives the seed of each random stream from it.
    sweep_dir : pathlib.Path
        Where :func:`attnbook.sweep` checkpoints finished points (``<name>.<sweep key>.jsonl``).
    """

    chapter: str
    profile: str
    device: torch.device
    seed: int
    sweep_dir: Path
    started: float = field(default_factory=time.perf_counter)
    records: dict = field(default_factory=dict)

    def seed_for(self, stream: int = 0) -> int:
        """The seed of random stream ``stream`` of this run, the book's one seed rule:
        ``SEED_STRIDE * seed + stream``.

        A chapter numbers its streams (replicate ``s`` of an experiment, block ``b`` of a sweep,
        the data draw of a task) and takes each seed from here, so that seed 0 gives the streams
        0, 1, 2, ... and runs with different ``seed`` never share one (``0 <= stream <
        SEED_STRIDE``). The result fits :meth:`torch.Generator.manual_seed` and NumPy's
        ``default_rng``.
        """
        stream = check_int("stream", stream, minimum=0, maximum=SEED_STRIDE - 1)
        return SEED_STRIDE * self.seed + stream

    def generator(self, stream: int = 0) -> torch.Generator:
        """A fresh :class:`torch.Generator` on :attr:`device`, seeded with :meth:`seed_for`."""
        gen = torch.Generator(device=self.device)
        gen.manual_seed(self.seed_for(stream))
        return gen

    def record(self, **values: Any) -> None:
        """Add headline numbers to the chapter's summary (numbers, booleans, lists or dicts).

        Each number, string or boolean is also glued under its summary key, so that the text
        quotes it by the name the tests assert on (``{glue:text}`gd_eps_g_alpha2:.3f```): one name
        per number. Recording a key again with another value is refused (the page would quote the
        first one).
        """
        for key, value in values.items():
            stored = _jsonable(value)
            scalar = isinstance(stored, bool | int | float | str)  # what the text can quote
            if key in self.records:
                if scalar and stored != self.records[key]:
                    raise ValueError(f"summary key {key!r} recorded twice, as {self.records[key]!r} "
                                     f"and {stored!r}: the page quotes one number per name")
            elif scalar:
                self._glue(key, value)
            self.records[key] = stored

    def publish(self, glued: Mapping[str, Any] | None = None, /, **recorded: Any) -> None:
        """Glue each ``name: value`` of ``glued`` for the text (myst-nb ``glue``, not displayed)
        and add the keyword values to the summary (:meth:`record`, which glues them too, under
        their summary keys): the bookkeeping of a result cell in one call. NumPy and torch scalars
        are glued as Python numbers (myst-nb's format specs do not apply to ``np.float64(...)``)."""
        for name, value in (glued or {}).items():
            self._glue(name, value)
        self.record(**recorded)

    @staticmethod
    def _glue(name: str, value: Any) -> None:
        if not _in_ipython():  # nothing outside a kernel keeps it (and IPython's shell would start)
            return
        from myst_nb import glue

        if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
            value = value.item()  # a NumPy or torch scalar: glued as the Python number
        glue(name, value, display=False)

    @property
    def wall_s(self) -> float:
        """Seconds since :func:`start_chapter`."""
        return time.perf_counter() - self.started

    def write_summary(self, directory: str | Path | None = None) -> None:
        """Write ``<chapter>.summary.json`` (records plus profile, device, seed, wall_s).

        The file goes next to the executed notebook (the working directory papermill runs in)
        unless ``directory`` is given. Returns nothing, so that a chapter's last line shows no
        machine path in the executed notebook.
        """
        directory = Path.cwd() if directory is None else Path(directory)
        summary = dict(self.records)
        summary.update(
            chapter=self.chapter,
            profile=self.profile,
            device=self.device.type,
            device_name=device_name(self.device),
            seed=self.seed,
            wall_s=round(self.wall_s, 3),
            attnlib_version=_version(),
            torch_version=torch.__version__,
        )
        path = directory / f"{self.chapter}.summary.json"
        from .layout import _atomic_write

        _atomic_write(path, json.dumps(summary, indent=2, sort_keys=True) + "\n")  # whole or not at all


def _version() -> str:
    from attnlib import __version__

    return __version__


def start_chapter(
    chapter: str, profile: str = "quick", device: str = "auto", seed: int = 0, quiet: bool = False
) -> Run:
    """Validate a chapter's parameters, seed every generator, choose the device, set the theme.

    Raises :class:`ParameterError` (one line naming the parameter and the allowed values) before
    anything is computed. Prints a one-line banner with the versions, device and profile.
    """
    check_choice("profile", profile, PROFILES)
    seed = check_int("seed", seed, minimum=0, maximum=SEED_MAX)
    dev = resolve_device(device)
    seed_everything(seed)

    # each sweep's checkpoint there is named by its own key (code, globals read, attnlib code)
    sweep_root = os.environ.get("ATTNLIB_SWEEP_DIR")
    sweep_dir = Path(sweep_root) if sweep_root else Path.cwd() / "_sweeps" / chapter

    from . import plotting

    plotting.set_theme()
    run = Run(chapter=chapter, profile=profile, device=dev, seed=seed, sweep_dir=sweep_dir)
    if not quiet:
        print(
            f"attnlib {_version()} | torch {torch.__version__} | device {device_name(dev)} | "
            f"profile {profile} | seed {seed}"
        )
    return run
