"""Sweep checkpoints: what keys them, where they live, how a line is written and checked.

A sweep's checkpoint is ``<name>.<sweep key[:16]>.jsonl`` in the run's sweep folder (in a book
build ``book/_cache/sweeps/<slot>/``). The sweep key (:func:`sweep_key`) follows what can change
a point's numbers, never the chapter's prose (:func:`attnbook.sweep`'s notes list what it reads;
a book build passes the chapter's ``code_hashes``, pins and device in ``$ATTNLIB_SWEEP_INPUTS``).
Each line is ``{"key", "point", "rows", "sha256"}``, checked when read (:func:`read_checkpoint`).
``used.json`` in a slot's folder names the checkpoints its executions opened (``done``: the last
successful one's; ``since``: every later one's): ``attnbook clean --stale`` keeps those.
"""

from __future__ import annotations

import contextlib
import dataclasses
import dis
import functools
import json
import os
import re
import sys
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .layout import _atomic_write, _sha

__all__ = ["point_key", "checkpoint_line", "read_checkpoint", "checkpoint_path", "sweep_key",
           "begin_execution", "end_execution", "resumable", "saved_points", "stale_paths"]

ENV_DIR, ENV_INPUTS = "ATTNLIB_SWEEP_DIR", "ATTNLIB_SWEEP_INPUTS"
FIELDS = ("key", "point", "rows", "sha256")
USED = "used.json"
_KEYED = re.compile(r"^(.+\.[0-9a-f]{16})\.[^/]+$")  # <name>.<key>.<suffix>: a keyed file
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_GLOBAL_OPS = {"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS"}


# ---- lines ---------------------------------------------------------------------------------------
def point_key(point: Mapping[str, Any]) -> str:
    """A point's canonical key: its JSON with sorted keys."""
    from .runs import _jsonable

    return json.dumps(_jsonable(dict(point)), sort_keys=True)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _line_sha(key: str, point: dict, rows: list) -> str:
    return _sha(_canonical({"key": key, "point": point, "rows": rows}).encode())


def checkpoint_line(point: Mapping[str, Any], rows: list[dict]) -> str:
    """One checkpoint line (with its newline) holding ``rows`` of ``point``."""
    from .runs import _jsonable

    point, rows = _jsonable(dict(point)), _jsonable(list(rows))
    key = point_key(point)
    entry = {"key": key, "point": point, "rows": rows, "sha256": _line_sha(key, point, rows)}
    return json.dumps(entry, allow_nan=False) + "\n"


def _check(raw: bytes) -> tuple[str, list[dict]] | None:
    """``(key, rows)`` of a checkpoint line, or ``None`` when it fails a check."""
    try:
        entry = json.loads(raw.decode("utf-8"))
        if not isinstance(entry, dict) or set(entry) != set(FIELDS):
            return None
        key, point, rows, sha = (entry[f] for f in FIELDS)
        if not (isinstance(key, str) and isinstance(point, dict) and isinstance(sha, str)
                and isinstance(rows, list) and all(isinstance(r, dict) for r in rows)):
            return None
        if point_key(point) != key or _line_sha(key, point, rows) != sha:
            return None
    except (UnicodeDecodeError, ValueError, TypeError, RecursionError):
        return None
    return key, rows


def _scan(path: Path) -> tuple[dict[str, list[dict]], list[bytes], list[bytes]]:
    """Finished points of ``path``, its good lines and its bad ones (a last line cut short, with
    no newline, is neither)."""
    done: dict[str, list[dict]] = {}
    good, bad = [], []
    for raw in path.read_bytes().split(b"\n")[:-1]:
        if raw.strip():
            checked = _check(raw)
            (bad if checked is None else good).append(raw)
            done.update([checked] if checked else [])
    return done, good, bad


def read_checkpoint(path: str | Path) -> dict[str, list[dict]]:
    """``{point key: rows}`` of the checkpoint ``path`` (empty when there is none).

    Lines that fail their check are appended to ``<path>.rejected``, the file is rewritten without
    them (atomically) and one warning line naming the file goes to stderr (and to the build's
    progress file): their points count as not done. A last line cut short is ignored.
    """
    path = Path(path)
    if not path.exists():
        return {}
    done, good, bad = _scan(path)
    if bad:
        rejected = path.with_name(path.name + ".rejected")
        with rejected.open("ab") as fh:
            fh.write(b"".join(raw + b"\n" for raw in bad))
            fh.flush()
            os.fsync(fh.fileno())
        _atomic_write(path, b"".join(raw + b"\n" for raw in good))
        n = len(bad)
        message = (f"warning: checkpoint {path}: {n} line{'s' * (n != 1)} failed the check (not "
                   f"UTF-8, not JSON, wrong fields or checksum), set aside in {rejected.name}; "
                   f"{'their points are' if n != 1 else 'its point is'} recomputed")
        print(message, file=sys.stderr)
        if os.environ.get("ATTNLIB_PROGRESS_FILE"):  # a book build: the CLI prints it too
            with open(os.environ["ATTNLIB_PROGRESS_FILE"], "a") as fh:
                fh.write(message + "\n")
    return done


def drop_cut_line(path: Path) -> None:
    """Remove a last line cut short by a kill, so that the next line appended is whole."""
    data = path.read_bytes() if path.exists() else b""
    if data and not data.endswith(b"\n"):
        os.truncate(path, data.rfind(b"\n") + 1)


# ---- the sweep key ---------------------------------------------------------------------------
class _Describer:
    """JSON-able description of a point function and of every value it reads."""

    MAX_DEPTH = 24

    def __init__(self, globals_: dict | None):
        self.globals = globals_
        self.seen: set[int] = set()
        self.module_hashes: dict[str, str] = {}

    def code(self, co: types.CodeType) -> list:
        return ["code", co.co_code.hex(), [self.const(c) for c in co.co_consts], list(co.co_names),
                list(co.co_varnames), list(co.co_freevars), list(co.co_cellvars), co.co_argcount,
                co.co_posonlyargcount, co.co_kwonlyargcount, co.co_flags,
                getattr(co, "co_exceptiontable", b"").hex()]

    def const(self, c: Any) -> Any:
        if isinstance(c, types.CodeType):
            return self.code(c)
        if isinstance(c, tuple):
            return ["tuple", [self.const(x) for x in c]]
        if isinstance(c, frozenset):
            return ["frozenset", sorted(_canonical(self.const(x)) for x in c)]
        return [type(c).__name__, repr(c)]

    @staticmethod
    def global_names(co: types.CodeType) -> set[str]:
        names = {ins.argval for ins in dis.get_instructions(co) if ins.opname in _GLOBAL_OPS}
        return names.union(*(_Describer.global_names(c) for c in co.co_consts
                             if isinstance(c, types.CodeType)))

    def attnlib(self, obj: Any) -> list:
        module = getattr(obj, "__module__", "") or ""
        if module not in self.module_hashes:
            from .runs import module_hash

            file = getattr(sys.modules.get(module), "__file__", None)
            self.module_hashes[module] = module_hash(file)[:16] if file else ""
        return ["attnlib", module, getattr(obj, "__qualname__", ""), self.module_hashes[module]]

    def function(self, fn: types.FunctionType, depth: int, root: bool = False) -> list:
        module = fn.__module__ or ""
        if module == "attnlib" or module.startswith("attnlib."):
            return self.attnlib(fn)
        if not root and fn.__globals__ is not self.globals:
            return ["function", module, fn.__qualname__]  # another module's: pinned or out of reach
        if id(fn) in self.seen:
            return ["again", fn.__qualname__]
        self.seen.add(id(fn))
        try:
            closure = [self.value(c.cell_contents, depth + 1) for c in fn.__closure__ or ()]
        except ValueError:  # a cell not yet filled
            closure = ["an empty cell"]
        g = fn.__globals__
        reads = {n: self.value(g[n], depth + 1) for n in sorted(self.global_names(fn.__code__)) if n in g}
        return ["function", self.code(fn.__code__), self.value(fn.__defaults__, depth + 1),
                self.value(fn.__kwdefaults__, depth + 1), closure, reads]

    def value(self, v: Any, depth: int = 0) -> Any:  # noqa: C901, PLR0911, PLR0912 (one case per kind)
        if depth > self.MAX_DEPTH:
            return ["deep", type(v).__qualname__]
        if v is None or isinstance(v, bool | int | str):
            return v
        if isinstance(v, float):
            return ["float", repr(v)]
        if isinstance(v, list | tuple):
            return [type(v).__name__, [self.value(x, depth + 1) for x in v]]
        if isinstance(v, dict):
            items = [[self.value(k, depth + 1), self.value(x, depth + 1)] for k, x in v.items()]
            return ["dict", sorted(items, key=lambda kv: _canonical(kv[0]))]
        if isinstance(v, set | frozenset):
            return ["set", sorted(_canonical(self.value(x, depth + 1)) for x in v)]
        if isinstance(v, bytes | bytearray):
            return ["bytes", _sha(bytes(v))]
        if isinstance(v, types.ModuleType):
            return ["module", v.__name__]
        if isinstance(v, types.FunctionType):
            return self.function(v, depth)
        if isinstance(v, functools.partial):
            return ["partial", *(self.value(x, depth + 1) for x in (v.func, v.args, v.keywords))]
        if isinstance(v, types.MethodType):
            return ["method", self.value(v.__func__, depth + 1), self.value(v.__self__, depth + 1)]
        kind, where = type(v), type(v).__module__ or ""
        np, torch, pd = (sys.modules.get(m) for m in ("numpy", "torch", "pandas"))
        if np is not None and isinstance(v, np.ndarray | np.generic):
            if isinstance(v, np.generic) or v.dtype == object:
                return ["ndarray", str(v.dtype), list(v.shape), self.value(v.tolist(), depth + 1)]
            return ["ndarray", str(v.dtype), list(v.shape), _sha(np.ascontiguousarray(v).tobytes())]
        if torch is not None:
            if isinstance(v, torch.Tensor) and v.layout == torch.strided:
                t = v.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
                return ["tensor", str(v.dtype), list(v.shape), _sha(t.numpy().tobytes())]
            if isinstance(v, torch.nn.Module):  # a model: its class and its weights
                return ["model", where, kind.__qualname__, self.value(dict(v.state_dict()), depth + 1)]
            if isinstance(v, torch.Generator):
                return ["generator", str(v.device), _sha(v.get_state().numpy().tobytes())]
            if isinstance(v, torch.device | torch.dtype):
                return ["torch", str(v)]
        if pd is not None and isinstance(v, pd.DataFrame | pd.Series):
            digest = _sha(pd.util.hash_pandas_object(v, index=True).to_numpy().tobytes())
            return ["pandas", [str(c) for c in getattr(v, "columns", [v.name])], str(v.dtypes), digest]
        if where == "attnbook.runs" and kind.__name__ == "Run":
            return ["Run", v.chapter, v.profile, v.device.type, v.seed]
        if isinstance(v, type):
            if where == "attnlib" or where.startswith("attnlib."):
                return self.attnlib(v)
            return ["type", where, v.__qualname__, {k: self.value(x, depth + 1) for k, x in vars(v).items()
                                                    if isinstance(x, types.FunctionType) or k[:2] != "__"}]
        if dataclasses.is_dataclass(v):
            fields = {f.name: self.value(getattr(v, f.name), depth + 1) for f in dataclasses.fields(v)}
            return ["dataclass", where, kind.__qualname__, fields]
        if callable(v) and not hasattr(v, "__dict__"):  # builtins and C callables
            return ["callable", getattr(v, "__module__", None) or where, getattr(v, "__qualname__", "")]
        try:
            text = repr(v)
        except Exception:  # noqa: BLE001 (a repr that fails counts by the type alone)
            text = ""
        if (not text or _ADDRESS.search(text)) and hasattr(v, "__dict__"):
            if id(v) in self.seen:
                return ["again", kind.__qualname__]
            self.seen.add(id(v))
            return ["object", where, kind.__qualname__, self.value(vars(v), depth + 1)]
        return ["repr", where, kind.__qualname__, _ADDRESS.sub("", text)]


def describe(fn: Callable) -> Any:
    """The JSON-able description of ``fn`` that :func:`sweep_key` hashes (for inspection)."""
    inner = fn
    while isinstance(inner, functools.partial | types.MethodType):
        inner = getattr(inner, "func", None) or inner.__func__
    desc = _Describer(getattr(inner, "__globals__", None))
    return desc.function(fn, 0, root=True) if isinstance(fn, types.FunctionType) else desc.value(fn)


def _inputs(run: Any) -> dict:
    """Code hashes, pins and device: from ``attnbook`` in a book build, else from the package."""
    text = os.environ.get(ENV_INPUTS)
    if text:
        with_inputs = json.loads(text)
        return {k: with_inputs.get(k) for k in ("code", "pins", "device")}
    import attnlib

    from .runs import source_hash

    pins = Path(attnlib.__file__).resolve().parent.parent / "constraints.txt"
    import numpy
    import torch

    # an installed attnlib (Colab) has no constraints.txt: the versions that matter
    pinned = (_sha(pins.read_bytes())[:16] if pins.exists()
              else f"torch {torch.__version__}, numpy {numpy.__version__}")
    dev = None if run is None else run.device
    device = None if dev is None else (
        f"cuda:{torch.cuda.get_device_name(dev)}" if dev.type == "cuda" else dev.type)
    return {"code": {"attnlib": source_hash()[:16]}, "pins": pinned, "device": device}


def sweep_key(fn: Callable, run: Any = None) -> str:
    """SHA-256 of what a sweep's numbers depend on, its prose excluded (see the module's notes)."""
    ingredients = {
        "fn": describe(fn),
        "python": list(sys.version_info[:2]),
        "run": None if run is None else [run.chapter, run.profile, run.device.type, run.seed],
        **_inputs(run),
    }
    return _sha(_canonical(ingredients).encode())


def checkpoint_path(name: str, run: Any = None, path: str | Path | None = None,
                    fn: Callable | None = None) -> Path:
    """The checkpoint of sweep ``name``: ``path`` when given, else
    ``<run.sweep_dir>/<name>.<sweep_key(fn, run)[:16]>.jsonl``. A checkpoint in the folder of a
    book execution (``$ATTNLIB_SWEEP_DIR``) is listed in its ``used.json``."""
    if path is not None:
        return Path(path)
    if run is None or fn is None:
        raise ValueError("sweep() needs either run= or path=" if run is None else
                         f"the checkpoint of sweep {name!r} is keyed by its point function: give fn=")
    out = Path(run.sweep_dir) / f"{name}.{sweep_key(fn, run)[:16]}.jsonl"
    _note_use(out)
    return out


# ---- which checkpoints a slot's runs use ---------------------------------------------------------
def _load_used(folder: Path, empty: bool = False) -> dict | None:
    try:
        used = json.loads((folder / USED).read_text())
        return {k: [str(s) for s in used.get(k, [])] for k in ("done", "since", "current")}
    except (OSError, ValueError, AttributeError, TypeError):
        return {"done": [], "since": [], "current": []} if empty else None


def _save_used(folder: Path, used: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    _atomic_write(folder / USED, (json.dumps(used, indent=1, sort_keys=True) + "\n").encode())


def _note_use(path: Path) -> None:
    folder = os.environ.get(ENV_DIR)
    if not folder or Path(folder).resolve() != path.parent.resolve():
        return
    m = _KEYED.match(path.name)
    stem = m.group(1) if m else path.name
    used = _load_used(path.parent, empty=True)
    if stem not in used["since"] or stem not in used["current"]:
        _save_used(path.parent, {k: sorted(set(v) | ({stem} if k != "done" else set()))
                                 for k, v in used.items()})


def begin_execution(folder: Path, inputs: Mapping[str, Any]) -> dict[str, str]:
    """Start an execution whose sweeps keep their checkpoints in ``folder`` (a slot's); returns the
    environment the kernel needs (the folder, and the chapter's code hashes, pins and device)."""
    folder.mkdir(parents=True, exist_ok=True)
    used = _load_used(folder, empty=True)
    _save_used(folder, dict(used, current=[]))
    return {ENV_DIR: str(folder),
            ENV_INPUTS: json.dumps({k: inputs.get(k) for k in ("code", "pins", "device")}, sort_keys=True)}


def end_execution(folder: Path) -> None:
    """An execution succeeded: its checkpoints are the slot's, the older ones no longer needed."""
    used = _load_used(folder, empty=True)
    _save_used(folder, {"done": used["current"], "since": [], "current": used["current"]})


def _kept(folder: Path) -> set[str] | None:
    return None if (used := _load_used(folder)) is None else {s for v in used.values() for s in v}


def resumable(folder: Path) -> list[Path]:
    """The checkpoints of a slot's folder that its next run resumes from: those its last successful
    execution and any later one used (every ``*.jsonl`` when no execution listed them)."""
    kept = _kept(folder)
    if kept is None:
        return sorted(folder.glob("*.jsonl"))
    return [p for stem in sorted(kept) if (p := folder / f"{stem}.jsonl").exists()]


def saved_points(folder: Path) -> int:
    """Finished points in the checkpoints of ``folder`` that the slot's next run resumes from."""
    n = 0
    for path in resumable(folder):
        with contextlib.suppress(OSError):
            n += len(_scan(path)[0])
    return n


def stale_paths(folder: Path) -> list[Path]:
    """Files and folders of a slot's sweep folder that no run resumes from: folders of the former
    layout (one per chapter cache key) and keyed files ``<name>.<key>.*`` that neither the last
    successful execution nor any later one used. Without ``used.json`` only the folders."""
    if not folder.is_dir():
        return []
    kept = _kept(folder)
    return [p for p in sorted(folder.iterdir()) if p.is_dir() or (
        kept is not None and (m := _KEYED.match(p.name.lstrip("."))) and m.group(1) not in kept)]
