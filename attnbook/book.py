"""``attnbook``: execute the chapters with papermill and build the site with Jupyter Book.

Commands::

    attnbook build [-p name=value ...]      execute changed chapters, then build the HTML
                  [--edition student]      (student: exercises without solutions, _build/student/html)
                  [--scheduler local]      every chapter's sweeps on Dask (as for run)
    attnbook run CHAPTER [-p name=value]    execute one chapter (e.g. -p profile=full -p seed=1)
                 [--scheduler local]       its sweeps on Dask: local, local:N or tcp://host:port
    attnbook list                           every output slot, whether it is current and why not
    attnbook audit [--results DIR]          every stored result in results/: commit, date, device,
                                            wall time, code changed since; exit 1 if one is unreadable
    attnbook sync                           rewrite the outputless chapters/*.ipynb from chapters/*.md
    attnbook clean [--stale]                remove executed chapters, caches and the built site
                                            (--stale: only checkpoints and leftovers no run needs)
    attnbook store CHAPTER TABLE ...        compute and store single tables of a chapter's full
                   [--defs FN] [--points K] profile with its own code (attnbook.tables_cli)
    attnbook slice CHAPTER TABLE [--idx I]  recompute a few points of a stored table with the current
                                            code and compare them; exit 1 if a value differs

Parameters are checked before a kernel starts, against the chapter's parameters cell (types from
the defaults, as papermill reads them) and the checks the chapter declares (see
:func:`chapter_checks`). A run with the default parameters writes the book's slot
``book/chapters/<id>.ipynb`` and ``<id>.summary.json``; any other run writes its own slot
``book/chapters/runs/<id>@<name>=<value>,.../``. A chapter executes into a temporary folder and
its outputs replace the previous ones only when it succeeds, so a failed or interrupted run keeps
the last good output (and the sweep points it finished, from which the next run resumes).

A slot is re-executed only when its cache key changes: a hash of the chapter source, the code of
the attnlib modules it imports (syntax trees without docstrings, so comments and formatting do
not count), the parameters, the pinned dependencies (``constraints.txt``), the device used and
the chapter's stored paper-scale tables (``results/<id>/``, which a quick page draws).
The site is rendered from a staging tree ``_build/src`` in which each chapter's page is its
executed notebook, so a page ``chapters/<id>`` has the committed, outputless
``chapters/<id>.ipynb`` as its launch target. ``$ATTNBOOK_ROOT`` moves the whole tree (chapters,
outputs, caches) elsewhere, e.g. for tests.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime as _dt
import hashlib
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import attnlib
from attnlib._validation import ParameterError

from . import checkpoints as _checkpoints
from . import edition as _edition
from . import tables_cli as _tables_cli

#: the science package whose modules a chapter's cache key and stored results depend on
PACKAGE = Path(attnlib.__file__).resolve().parent
ROOT = Path(os.environ.get("ATTNBOOK_ROOT") or PACKAGE.parent).resolve()
CHAPTERS = ROOT / "chapters"
EXECUTED = ROOT / "book" / "chapters"
CACHE = ROOT / "book" / "_cache"
BUILD = ROOT / "_build"
RECORDS = CACHE / "executions.json"
TABLE = EXECUTED / "execution-table.md"
#: Wall-clock limit of one cell (seconds) per profile; ``None`` means no limit.
CELL_TIMEOUT = {"quick": 900, "full": None}
#: Parameters every chapter has; their checks live in :mod:`attnlib._runtime`.
COMMON = ("profile", "device", "seed")
#: Parameters that choose how a chapter executes, not what it computes: they are checked, passed
#: to the chapter, and left out of the output slot's name and the cache key (a run on a Dask
#: cluster fills the same slot, and resumes the same sweep checkpoints, as a serial run).
EXECUTION_ONLY = ("scheduler",)


class BuildError(RuntimeError):
    """A chapter failed to execute or the site failed to build.

    ``str(err)`` is one line; ``err.details`` holds the failing cell and its traceback.
    """

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details or message


class Interrupted(BuildError):
    """An execution was interrupted (Ctrl-C, SIGTERM); the previous outputs are kept."""


def _rel(path: Path) -> str:
    try:
        return str(Path(path).relative_to(ROOT))
    except ValueError:
        return str(path)


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _atomic_write(path: Path, data: str | bytes) -> None:
    """Write ``path`` through a temporary file and a rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------
# locks
# --------------------------------------------------------------------------------------------
class Lock:
    """An exclusive ``flock`` on ``CACHE/locks/<name>.lock``, released when the process ends.

    A second holder waits and says so (``wait=True``) or raises :class:`BuildError` at once.
    """

    def __init__(self, name: str, what: str, wait: bool = True, log=print):
        self.path = CACHE / "locks" / f"{name}.lock"
        self.what, self.wait, self.log, self.fh = what, wait, log, None

    def __enter__(self) -> Lock:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.path, "a+")  # noqa: SIM115 (held until __exit__)
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.seek(0)
            holder = self.fh.read().strip() or "another process"
            if not self.wait:
                self.fh.close()
                raise BuildError(f"{self.what} is already running ({holder}); "
                                 "try again when it has finished") from None
            self.log(f"  waiting: {self.what} is already running ({holder}) ...")
            t0 = time.perf_counter()
            fcntl.flock(self.fh, fcntl.LOCK_EX)
            self.log(f"  waited {time.perf_counter() - t0:.0f} s for {self.what}")
        self.fh.seek(0)
        self.fh.truncate()
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%H:%M:%S UTC")
        self.fh.write(f"pid {os.getpid()}, since {stamp}")
        self.fh.flush()
        return self

    def __exit__(self, *exc) -> None:
        import fcntl

        if self.fh is not None:
            self.fh.seek(0)
            self.fh.truncate()
            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()
            self.fh = None


# --------------------------------------------------------------------------------------------
# chapters and their parameters
# --------------------------------------------------------------------------------------------
def toc_chapters(root: Path | None = None) -> list[str]:
    """Chapter ids (``chapters/<id>``) in the order of ``_toc.yml``."""
    import yaml

    toc = yaml.safe_load(((root or ROOT) / "_toc.yml").read_text())
    files: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(str(node["file"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(toc)
    return [f.split("/", 1)[1] for f in files if f.startswith("chapters/")]


def _read_chapter(chapter: str):
    import jupytext

    path = CHAPTERS / f"{chapter}.md"
    if not re.fullmatch(r"[A-Za-z0-9._-]+", chapter) or not path.exists():
        known = ", ".join(sorted(p.stem for p in CHAPTERS.glob("*.md"))) or "none"
        raise ParameterError(f"chapter={chapter!r} not found in chapters/; known chapters: {known}")
    return jupytext.read(path)


@dataclass(frozen=True)
class Parameter:
    """One assignment of a chapter's parameters cell: its name, default and trailing comment.

    The type of the default is the parameter's type (as papermill infers it).
    """

    name: str
    default: Any
    help: str = ""


def _parameters_cell(nb):
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            return cell
    raise BuildError("the chapter has no code cell tagged 'parameters'")


def parameter_schema(nb) -> dict[str, Parameter]:
    """The chapter's declared parameters, read from its ``parameters`` cell without running it."""
    source = _parameters_cell(nb).source
    comments: dict[int, str] = {}
    with contextlib.suppress(tokenize.TokenError, IndentationError):
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = tok.string.lstrip("#").strip()
    namespace: dict = {}
    schema: dict[str, Parameter] = {}
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else [])
        if len(targets) != 1 or not isinstance(targets[0], ast.Name):
            continue
        name = targets[0].id
        try:
            value = ast.literal_eval(node.value)
        except ValueError:  # e.g. 2**10: evaluate with the cell's earlier values
            value = eval(compile(ast.Expression(node.value), "<parameters>", "eval"), {}, namespace)  # noqa: S307
        namespace[name] = value
        if not name.startswith("_"):
            schema[name] = Parameter(name, value, comments.get(node.lineno, ""))
    return schema


def default_parameters(nb) -> dict:
    """The values assigned in the cell tagged ``parameters``."""
    return {name: p.default for name, p in parameter_schema(nb).items()}


_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


def _convert(name: str, raw: str, default: Any) -> Any:
    """Parse the command-line text ``raw`` of parameter ``name`` by the type of its default."""
    text = raw.strip()
    if isinstance(default, bool):
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ParameterError(f"{name}={raw!r} must be true or false")
    if isinstance(default, str) and not (len(text) >= 2 and text[0] == text[-1] and text[0] in "'\""):
        return raw
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError) as err:
        reason = getattr(err, "msg", None) or "only literals such as 3, 0.5, 'text', [1, 2], {'k': 1}"
        example = f"{name}={default!r}" if default is not None else f"{name}=1"
        raise ParameterError(f"{name}={raw!r} is not a valid Python literal ({reason}); "
                             f"write it like {example}") from None


def parse_parameters(pairs: list[str] | None, schema: dict[str, Parameter] | None = None) -> dict:
    """``["profile=full", "seed=3"]`` -> ``{"profile": "full", "seed": 3}``.

    With the chapter's ``schema`` each value is parsed by its parameter's type (``recompute=false``
    is ``False``); without one, values are Python literals or else strings.
    """
    out = {}
    for pair in pairs or []:
        name, sep, raw = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ParameterError(f"parameter {pair!r} must be written name=value")
        if name in EXECUTION_ONLY:  # a plain word or address: scheduler=local, scheduler=tcp://h:1
            out[name] = raw.strip()
        elif schema is not None and name in schema:
            out[name] = _convert(name, raw, schema[name].default)
        else:
            try:
                out[name] = ast.literal_eval(raw.strip())
            except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
                out[name] = raw
    return out


def _check_type(name: str, value: Any, default: Any) -> Any:
    """The value of parameter ``name`` must have the type of its default."""
    from attnlib._validation import check_bool, check_float, check_int

    if default is None:
        return value
    if isinstance(default, bool):
        return check_bool(name, value)
    if isinstance(default, int):
        return check_int(name, value, minimum=None)
    if isinstance(default, float):
        return check_float(name, value)
    for kind in (str, dict, list, tuple):
        if isinstance(default, kind):
            ok = isinstance(value, list | tuple) if kind in (list, tuple) else isinstance(value, kind)
            if not ok:
                raise ParameterError(f"{name}={value!r} must be a {kind.__name__}, like {default!r}")
    return value


_DECLARED = re.compile(r"#\s*attnbook:\s*check\s+(attnlib(?:\.\w+)*):(\w+)")


def declared_checks(nb) -> list[tuple[str, str]]:
    """``(module, function)`` of the checks declared in the parameters cell by a comment line
    ``# attnbook: check attnlib.<module>:<function>``."""
    return _DECLARED.findall(_parameters_cell(nb).source)


def chapter_checks(chapter: str, nb=None) -> list:
    """The chapter-specific parameter checks, each ``check(params)`` raising ParameterError.

    Two ways to declare one, both read without executing the chapter: a comment line in the
    parameters cell, ``# attnbook: check attnlib.<module>:<function>``; or, in a model module the
    chapter imports (or in :mod:`attnbook.chapter_params`), ``CHAPTER_CHECKS = {"<chapter id>":
    function}``. A check receives every
    parameter (defaults merged with the given values) and raises
    :class:`~attnlib.ParameterError` with one line naming the bad value.
    """
    import importlib

    nb = _read_chapter(chapter) if nb is None else nb
    checks = []
    for module, function in declared_checks(nb):
        try:
            checks.append(getattr(importlib.import_module(module), function))
        except (ImportError, AttributeError) as err:
            raise BuildError(f"chapter {chapter} declares the check {module}:{function}, "
                             f"which cannot be loaded ({err})") from None
    for module in ["attnbook.chapter_params", *sorted(chapter_modules(chapter, nb))]:
        declared = getattr(importlib.import_module(module), "CHAPTER_CHECKS", None) or {}
        if chapter in declared and declared[chapter] not in checks:
            checks.append(declared[chapter])
    return checks


def validate_parameters(chapter: str, params: dict, defaults: dict, nb=None) -> dict:
    """Merge ``params`` over the chapter defaults and check every one before anything runs.

    Unknown names, values of the wrong type, the common ``profile``/``seed``/``device`` and the
    chapter's declared checks (:func:`chapter_checks`, when ``nb`` is given) all raise
    :class:`ParameterError` with one line.
    """
    from attnlib._validation import check_choice, check_int

    from . import runs as _runtime

    unknown = sorted(set(params) - set(defaults))
    if unknown:
        allowed = ", ".join(sorted(defaults))
        raise ParameterError(
            f"{unknown[0]} is not a parameter of chapter {chapter}; its parameters are: {allowed}"
        )
    merged = {**defaults, **params}
    check_choice("profile", merged.get("profile"), _runtime.PROFILES)
    check_int("seed", merged.get("seed"), minimum=0, maximum=_runtime.SEED_MAX)
    _runtime.resolve_device(merged.get("device", "auto"))
    for name, value in params.items():
        if name not in COMMON:
            merged[name] = _check_type(name, value, defaults[name])
    if "scheduler" in merged and not (merged["scheduler"] == "auto"
                                      and defaults.get("scheduler") == "auto"):
        # "auto" only where the chapter's own default is "auto" (it resolves it itself)
        from .sweeps import check_scheduler

        check_scheduler(merged["scheduler"])
    if nb is not None:
        for check in chapter_checks(chapter, nb):
            check(dict(merged))
    return merged


# --------------------------------------------------------------------------------------------
# what a chapter depends on: the attnlib modules it imports, and what those import
# --------------------------------------------------------------------------------------------
_TOP = "attnlib"


def _module_file(module: str) -> Path | None:
    parts = module.split(".")[1:]
    base = PACKAGE.joinpath(*parts) if parts else PACKAGE
    if base.is_dir() and (base / "__init__.py").exists():
        return base / "__init__.py"
    file = base.with_suffix(".py")
    return file if parts and file.exists() else None


def _is_package(module: str) -> bool:
    file = _module_file(module)
    return file is not None and file.name == "__init__.py"


def _package_modules(module: str) -> list[str]:
    """``module`` and, for a subpackage, every module inside it."""
    file = _module_file(module)
    if file is None:
        return []
    if file.name != "__init__.py" or module == _TOP:
        return [module]
    out = []
    for path in sorted(file.parent.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("").parts
        out.append(".".join((_TOP, *rel[:-1])) if rel[-1] == "__init__" else ".".join((_TOP, *rel)))
    return out


def _resolve_from(module: str, node: ast.ImportFrom) -> str | None:
    """Absolute name of the module an ``ImportFrom`` inside ``module`` reads from."""
    if node.level == 0:
        return node.module
    package = module if _is_package(module) else module.rsplit(".", 1)[0]
    parts = package.split(".")
    if node.level - 1 > len(parts) - 1:
        return None
    base = ".".join(parts[: len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


def _imports(tree: ast.AST, module: str | None) -> tuple[set[str], dict[str, str]]:
    """attnlib modules imported in ``tree`` and the local names bound to the package itself."""
    found: set[str] = set()
    package_aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == _TOP or alias.name.startswith(_TOP + "."):
                    if alias.name != _TOP:  # the bare package: only the names used through it count
                        found.add(alias.name)
                    if alias.name == _TOP or alias.asname is None:
                        package_aliases[alias.asname or _TOP] = _TOP
        elif isinstance(node, ast.ImportFrom):
            source = _resolve_from(module, node) if module else (
                node.module if node.level == 0 else None)
            if not source or not (source == _TOP or source.startswith(_TOP + ".")):
                continue
            if source != _TOP:  # ``from attnlib import x``: x (a module, or the module it comes from)
                found.add(source)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if _module_file(sub) is not None:
                    found.add(sub)
                elif source == _TOP:
                    found.add(f"{_TOP}:{alias.name}")  # a name re-exported by attnlib/__init__
    return found, package_aliases


def _init_exports() -> dict[str, str]:
    """Name re-exported by ``attnlib/__init__.py`` -> the module it comes from."""
    tree = ast.parse((PACKAGE / "__init__.py").read_bytes())
    table: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            source = _resolve_from(_TOP, node)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                table[alias.asname or alias.name] = sub if _module_file(sub) else source
    return table


def _parse_cells(nb) -> list[ast.AST]:
    trees = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        lines = [ln for ln in cell.source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
        with contextlib.suppress(SyntaxError):
            trees.append(ast.parse("\n".join(lines)))
    return trees


def chapter_modules(chapter: str, nb=None) -> set[str]:
    """Names of the attnlib modules a chapter's code depends on.

    The chapter's imports (``import attnlib.x``, ``from attnlib import x``, and for
    ``import attnlib as al`` the modules of the names it uses, ``al.start_chapter`` ->
    ``attnlib._runtime``), every module those import in turn, every module of an imported
    subpackage. ``attnlib/__init__.py`` counts only when the chapter takes a name from the package
    face itself (it re-exports and computes nothing; a test holds it to that). :mod:`attnbook`,
    the machinery, never counts: it does not change a number.
    """
    nb = _read_chapter(chapter) if nb is None else nb
    exports = _init_exports()
    wanted: set[str] = set()
    for tree in _parse_cells(nb):
        found, aliases = _imports(tree, None)
        for item in found:
            if item.startswith(_TOP + ":"):
                name = item.split(":", 1)[1]
                wanted.add(exports.get(name, _TOP))
            else:
                wanted.add(item)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and aliases.get(node.value.id) == _TOP):
                sub = f"{_TOP}.{node.attr}"
                wanted.add(sub if _module_file(sub) else exports.get(node.attr, _TOP))
    seen: set[str] = set()
    todo = [m for w in wanted for m in _package_modules(w)]
    while todo:
        module = todo.pop()
        if module in seen or _module_file(module) is None:
            continue
        seen.add(module)
        if module == _TOP:
            continue  # the package's own imports count only for the names a chapter uses
        found, _ = _imports(ast.parse(_module_file(module).read_bytes()), module)
        for item in found:
            if item.startswith(_TOP + ":"):
                todo.extend(_package_modules(exports.get(item.split(":", 1)[1], _TOP)))
            else:
                todo.extend(_package_modules(item))
    return seen


def code_hashes(chapter: str, nb=None) -> dict[str, str]:
    """``{"attnlib/<file>.py": code hash}`` for every module the chapter depends on."""
    from .runs import module_hash

    out = {}
    for module in chapter_modules(chapter, nb):
        path = _module_file(module)
        out[path.relative_to(PACKAGE.parent).as_posix()] = module_hash(path)[:16]
    return dict(sorted(out.items()))


# --------------------------------------------------------------------------------------------
# cache keys and output slots
# --------------------------------------------------------------------------------------------
def _pins_hash() -> str:
    path = ROOT / "constraints.txt"
    return _sha(path.read_bytes() if path.exists() else b"")[:16]


def device_label(device: str = "auto") -> str:
    """The device a run with parameter ``device`` actually uses: ``cpu`` or ``cuda:<GPU name>``."""
    import torch

    from .runs import resolve_device

    dev = resolve_device(device)
    return f"cuda:{torch.cuda.get_device_name(dev)}" if dev.type == "cuda" else dev.type


def _canonical(params: dict) -> dict:
    return json.loads(json.dumps(params, sort_keys=True, default=str))


def results_hash(chapter: str) -> str:
    """Hash of the chapter's stored paper-scale tables, ``results/<chapter>/`` (or the store
    ``$ATTNLIB_RESULTS_DIR`` names): a quick page draws them beside its own, a full run loads them."""
    from .store import results_root

    folder = results_root() / chapter
    h = hashlib.sha256()
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def key_inputs(chapter: str, params: dict, nb=None) -> dict:
    """Everything an execution's outputs depend on (what :func:`cache_key` hashes)."""
    return {
        "chapter": _sha((CHAPTERS / f"{chapter}.md").read_bytes())[:16],
        "code": code_hashes(chapter, nb),
        "pins": _pins_hash(),
        "device": device_label(params.get("device", "auto")),
        "params": _canonical({k: v for k, v in params.items() if k not in EXECUTION_ONLY}),
        "results": results_hash(chapter),
    }


def _key_of(inputs: dict) -> str:
    return _sha(json.dumps(inputs, sort_keys=True))[:16]


def cache_key(chapter: str, params: dict, nb=None) -> str:
    """Hash of the chapter source, the code it imports, the parameters, the pins and the device."""
    return _key_of(key_inputs(chapter, params, nb))


def slot_name(chapter: str, params: dict, defaults: dict) -> str:
    """``<chapter>`` for the default parameters, else ``<chapter>@<name>=<value>,...``.

    Values that are not short plain words (dicts, lists, long strings) are named by a hash.
    :data:`EXECUTION_ONLY` parameters (``scheduler``) do not name a slot.
    """
    parts = []
    for name in sorted(params):
        value = params[name]
        if name in EXECUTION_ONLY:
            continue
        if name in defaults and value == defaults[name] and type(value) is type(defaults[name]):
            continue
        text = str(value)
        if isinstance(value, dict | list | tuple) or not re.fullmatch(r"[A-Za-z0-9._+-]{1,24}", text):
            text = "h" + _sha(json.dumps(value, sort_keys=True, default=str))[:8]
        parts.append(f"{name}={text}")
    return chapter if not parts else f"{chapter}@{','.join(parts)}"


def slot_paths(chapter: str, slot: str) -> tuple[Path, Path]:
    """Executed notebook and summary of ``slot``."""
    folder = EXECUTED if slot == chapter else EXECUTED / "runs" / slot
    return folder / f"{chapter}.ipynb", folder / f"{chapter}.summary.json"


# --------------------------------------------------------------------------------------------
# execution records (book/_cache/executions.json: slot -> record)
# --------------------------------------------------------------------------------------------
_WARNED: set[str] = set()


def _warn(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        print(f"warning: {message}", file=sys.stderr)


def _load_records(report: bool = True) -> dict:
    """The execution records; an unreadable file counts as empty and is reported in one line."""
    if not RECORDS.exists():
        return {}
    try:
        data = json.loads(RECORDS.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as err:
        if report:
            _warn(f"{_rel(RECORDS)} is unreadable ({type(err).__name__}: {str(err)[:80]}); "
                  "every chapter counts as not executed, the file is set aside at the next run")
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)}


def _update_records(slot: str, record: dict) -> None:
    """Set ``records[slot]`` under a short lock, writing the file atomically.

    An unreadable records file is moved aside (``executions.corrupt-<time>.json``), not lost.
    """
    with Lock("records", "an update of the execution records"):
        if RECORDS.exists() and not _records_readable():
            aside = RECORDS.with_name(f"executions.corrupt-{int(time.time())}.json")
            os.replace(RECORDS, aside)
            _warn(f"the unreadable records were moved to {_rel(aside)}")
        records = _load_records(report=False)
        records[slot] = record
        _atomic_write(RECORDS, json.dumps(records, indent=2, sort_keys=True) + "\n")


def _records_readable() -> bool:
    try:
        return isinstance(json.loads(RECORDS.read_text()), dict)
    except (OSError, ValueError):
        return False


def _output_problem(chapter: str, slot: str, record: dict) -> str | None:
    """Why the slot's files on disk are not the recorded execution, or ``None`` if they are."""
    notebook, summary = slot_paths(chapter, slot)
    if not notebook.exists():
        return "executed notebook missing"
    if not summary.exists():
        return "summary missing"
    try:
        meta = json.loads(notebook.read_text())["metadata"]["attnbook"]
    except (OSError, ValueError, KeyError, TypeError):
        return "executed notebook unreadable or incomplete"
    if meta.get("key") != record.get("key"):
        return "executed notebook is from another execution"
    want = record.get("summary_sha256")
    if want and _sha(summary.read_bytes()) != want:
        return "summary altered since the execution"
    return None


def stale_reasons(chapter: str, slot: str, key: str, inputs: dict, records: dict) -> list[str]:
    """Why ``slot`` needs execution (empty when its outputs are current)."""
    record = records.get(slot)
    if record is None:
        return ["never executed"]
    if record.get("key") != key:
        old = record.get("inputs")
        if not isinstance(old, dict):
            return ["executed by an older attnbook (no record of its inputs)"]
        reasons = []
        if old.get("chapter") != inputs["chapter"]:
            reasons.append(f"chapters/{chapter}.md changed")
        before, now = old.get("code", {}), inputs["code"]
        changed = sorted(m for m in set(before) | set(now) if before.get(m) != now.get(m))
        if changed:
            shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
            reasons.append(f"code changed: {shown}")
        if old.get("pins") != inputs["pins"]:
            reasons.append("constraints.txt changed")
        if old.get("device") != inputs["device"]:
            reasons.append(f"device changed ({old.get('device')} -> {inputs['device']})")
        if old.get("params") != inputs["params"]:
            reasons.append("parameters changed")
        if old.get("results") != inputs["results"]:
            reasons.append(f"stored results changed (results/{chapter}/)")
        return reasons or ["cache key changed"]
    problem = _output_problem(chapter, slot, record)
    return [problem] if problem else []


def is_current(chapter: str, key: str, records: dict | None = None, slot: str | None = None) -> bool:
    """True when the slot's notebook and summary on disk were made with this cache key."""
    records = _load_records() if records is None else records
    slot = slot or chapter
    record = records.get(slot)
    return record is not None and record.get("key") == key and _output_problem(chapter, slot, record) is None


# --------------------------------------------------------------------------------------------
# execution
# --------------------------------------------------------------------------------------------
class _Tail:
    """Print lines appended to ``path`` (the sweeps' progress) while a chapter executes."""

    def __init__(self, path: Path, prefix: str, log=print, every_s: float = 1.0):
        import threading

        self.path, self.prefix, self.log, self.every_s = path, prefix, log, every_s
        self.offset, self.done = 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _flush(self) -> None:
        with contextlib.suppress(OSError), self.path.open() as fh:
            fh.seek(self.offset)
            chunk = fh.read()
            complete, _, _ = chunk.rpartition("\n")
            if complete:
                self.offset += len(complete) + 1
                for line in complete.splitlines():
                    self.log(self.prefix + line)

    def _run(self) -> None:
        while not self.done.wait(self.every_s):
            self._flush()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        self._flush()


def _tag_parameter_cells(nb) -> None:
    """Hide the defaults cell entirely and collapse the injected-parameters cell."""
    for cell in nb.cells:
        tags = cell.metadata.setdefault("tags", [])
        if "parameters" in tags and "remove-cell" not in tags:
            tags.append("remove-cell")
        if "injected-parameters" in tags and "hide-input" not in tags:
            tags.append("hide-input")


def _report_failure(chapter: str, err) -> str:
    lines = [f"chapter {chapter} failed"]
    cell_index = getattr(err, "exec_count", None)
    source = getattr(err, "source", None)
    if cell_index is not None:
        lines.append(f"--- failing cell (execution count {cell_index}) ---")
    if source:
        lines.append(source)
    traceback = getattr(err, "traceback", None)
    if traceback:
        lines.append("--- traceback ---")
        lines.extend(re.sub(r"\x1b\[[0-9;]*m", "", t) for t in traceback)
    else:
        lines.append(str(err))
    return "\n".join(lines)


def _kernel_manager_class(socket_dir: str, kernel_log: Path):
    """A kernel manager talking to its kernel over Unix sockets in ``socket_dir``.

    IPC instead of TCP: no loopback network is needed, and ipykernel's warning about unencrypted
    TCP never arises. The kernel process's own messages go to ``kernel_log``, not the terminal.
    """
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class IpcKernelManager(AsyncKernelManager):
        started: list = []  # the managers of this run, to stop their kernels

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.started.append(self)

        async def start_kernel(self, **kwargs):
            self._log_fh = open(kernel_log, "ab")  # noqa: SIM115 (closed by the kernel's end)
            kwargs.setdefault("stdout", self._log_fh)
            kwargs.setdefault("stderr", self._log_fh)
            return await super().start_kernel(**kwargs)

        @default("transport")
        def _default_transport(self):
            return "ipc"

        @default("ip")
        def _default_ip(self):
            return os.path.join(socket_dir, "kernel")

    return IpcKernelManager


def _stop_kernels(manager_class) -> None:
    """Kill a kernel still running after an interruption (before its sockets are removed)."""
    for km in getattr(manager_class, "started", []):
        process = getattr(getattr(km, "provisioner", None), "process", None)
        if process is not None and process.poll() is None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait(timeout=10)
        with contextlib.suppress(OSError, AttributeError):
            km._log_fh.close()


def _saved_points(folder: Path) -> int:
    return _checkpoints.saved_points(folder)


def _prepare(chapter: str, params: dict | None):
    nb = _read_chapter(chapter)
    schema = parameter_schema(nb)
    defaults = {name: p.default for name, p in schema.items()}
    merged = validate_parameters(chapter, params or {}, defaults, nb=nb)
    slot = slot_name(chapter, merged, defaults)
    inputs = key_inputs(chapter, merged, nb)
    return nb, merged, slot, inputs, _key_of(inputs)


def execute_chapter(chapter: str, params: dict | None = None, force: bool = False,
                    log=print, wait: bool = True) -> dict:
    """Execute ``chapters/<chapter>.md`` with papermill into its output slot.

    Every parameter is checked before a kernel starts. Skips execution when the slot's cache key
    is unchanged (unless ``force``). The chapter runs in a temporary folder; its notebook,
    summary and record replace the previous ones only on success. Raises :class:`BuildError`
    (one line; ``details`` has the failing cell and its traceback) or :class:`Interrupted`;
    either way the previous outputs and the finished sweep points are kept.
    """
    nb, merged, slot, inputs, key = _prepare(chapter, params)
    if not force and is_current(chapter, key, _load_records(), slot):
        log(f"  {slot}: unchanged (cache key {key}), not executed")
        return _load_records()[slot] | {"executed": False, "slot": slot}
    _check_scheduler_answers(merged.get("scheduler"))
    with Lock(f"slot-{slot}", f"an execution of {slot}", wait=wait, log=log):
        if not force and is_current(chapter, key, _load_records(), slot):
            log(f"  {slot}: executed meanwhile by another process (cache key {key})")
            return _load_records()[slot] | {"executed": False, "slot": slot}
        return _execute(chapter, nb, merged, slot, inputs, key, log)


def _check_scheduler_answers(scheduler, timeout_s: float = 5.0) -> None:
    """A scheduler address must accept a connection before a kernel starts (ParameterError)."""
    import socket

    from .sweeps import check_scheduler

    if scheduler == "auto":  # a chapter's own choice of serial or local execution
        return
    spec = check_scheduler(scheduler)
    if spec is None or spec.startswith("local"):
        return
    host, _, port = spec.split("://", 1)[1].rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ParameterError(f"scheduler={spec!r}: no Dask scheduler answers there "
                             f"({type(err).__name__}: {err}); start one (`dask scheduler`) or "
                             "choose 'serial' or 'local'") from None


def _execute(chapter, nb, merged, slot, inputs, key, log) -> dict:
    import nbformat
    import papermill as pm
    import torch

    from attnlib import __version__

    from .runs import device_name, resolve_device

    notebook, summary = slot_paths(chapter, slot)
    work = CACHE / "work" / f"{slot}.{os.getpid()}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    logs = CACHE / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_file = logs / f"{slot}.log"
    sweeps = CACHE / "sweeps" / slot  # checkpoints <name>.<sweep key>.jsonl: keyed by code, not prose
    sweep_env = _checkpoints.begin_execution(sweeps, inputs)
    _atomic_write(sweeps / "params.json", json.dumps(_canonical(merged), sort_keys=True) + "\n")
    source, partial = work / f"{chapter}.input.ipynb", work / f"{chapter}.ipynb"
    nbformat.write(nb, source)
    progress = work / "progress.log"
    progress.write_text("")
    socket_dir = tempfile.mkdtemp(prefix="attnbook-")

    env_before = dict(os.environ)
    os.environ.update(sweep_env)
    os.environ["ATTNLIB_PROGRESS_FILE"] = str(progress)
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    log(f"  {slot}: executing with {json.dumps(merged, sort_keys=True, default=str)}")
    t0 = time.perf_counter()
    tail = _Tail(progress, prefix=f"  {slot}: ", log=log)
    manager_class = _kernel_manager_class(socket_dir, work / "kernel.log")
    failure: BuildError | None = None
    try:
        pm.execute_notebook(
            str(source), str(partial), parameters=merged, cwd=str(work),
            kernel_name="python3", progress_bar=sys.stderr.isatty(), log_output=False,
            execution_timeout=CELL_TIMEOUT[merged["profile"]], report_mode=False,
            kernel_manager_class=manager_class,
        )
    except pm.PapermillExecutionError as err:
        if err.ename == "KeyboardInterrupt":  # Ctrl-C reaches the kernel too (same process group)
            failure = Interrupted(f"chapter {slot} was interrupted after {time.perf_counter() - t0:.0f} s",
                                  _report_failure(slot, err))
        where = f"in cell {err.exec_count}" if getattr(err, "exec_count", None) else ""
        what = f"{err.ename}: {err.evalue}".strip().splitlines()[0][:300] if err.ename else "error"
        failure = failure or BuildError(f"chapter {slot} failed {where}: {what}".replace("  ", " "),
                                        _report_failure(slot, err))
    except KeyboardInterrupt:
        failure = Interrupted(f"chapter {slot} was interrupted after {time.perf_counter() - t0:.0f} s",
                              f"chapter {slot} interrupted (KeyboardInterrupt or SIGTERM)")
        # nbclient's kernel-liveness task then ends in a DeadKernelError nobody awaits; asyncio
        # would print its traceback at exit, after the one-line message (seen on a loaded machine)
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    except Exception as err:  # kernel death, timeout, no kernel reply, ...
        text = f"{type(err).__name__}: {err}".strip().splitlines()[0][:300]
        failure = BuildError(f"chapter {slot} failed: {text}", f"chapter {slot} failed: {text}")
    finally:
        tail.stop()
        _stop_kernels(manager_class)
        os.environ.clear()
        os.environ.update(env_before)
        shutil.rmtree(socket_dir, ignore_errors=True)
    wall = time.perf_counter() - t0
    if failure is None and not (work / summary.name).exists():
        failure = BuildError(f"chapter {slot} ran but wrote no {summary.name}")
    if failure is not None:
        return _fail(failure, slot, work, partial, log_file, notebook, sweeps, progress)

    executed = nbformat.read(partial, as_version=4)
    _tag_parameter_cells(executed)
    device = resolve_device(merged.get("device", "auto"))
    # a full run stores the tables it computed: its outputs are current with the store as it left it
    inputs = dict(inputs, results=results_hash(chapter))
    key = _key_of(inputs)
    record = {
        "key": key,
        "slot": slot,
        "chapter": chapter,
        "inputs": inputs,
        "params": _canonical(merged),
        "profile": merged["profile"],
        "device": device_name(device),
        "wall_s": round(wall, 1),
        "attnlib": __version__,
        "torch": torch.__version__,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "notebook": _rel(notebook),
        "summary": _rel(summary),
        "summary_sha256": _sha((work / summary.name).read_bytes()),
    }
    executed.metadata["attnbook"] = {k: v for k, v in record.items() if k != "inputs"}
    nbformat.write(executed, work / "final.ipynb")
    notebook.parent.mkdir(parents=True, exist_ok=True)
    # promote: each rename is atomic; the record (written last) vouches for the pair
    os.replace(work / summary.name, summary)
    os.replace(work / "final.ipynb", notebook)
    _update_records(slot, record)
    _checkpoints.end_execution(sweeps)
    _atomic_write(log_file, f"chapter {slot} executed in {wall:.1f} s (cache key {key})\n")
    shutil.rmtree(work, ignore_errors=True)
    log(f"  {slot}: executed in {wall:.1f} s")
    return record | {"executed": True}


def _fail(failure, slot, work, partial, log_file, notebook, sweep_dir, progress):
    """Keep the previous outputs, save the log and the partial notebook, raise one line."""
    text = [failure.details, "", "--- sweep progress ---"]
    with contextlib.suppress(OSError):
        text.append(progress.read_text())
    with contextlib.suppress(OSError):
        text += ["--- kernel messages ---", (work / "kernel.log").read_text(errors="replace")]
    _atomic_write(log_file, "\n".join(text) + "\n")
    if partial.exists():
        os.replace(partial, log_file.with_suffix(".partial.ipynb"))
    shutil.rmtree(work, ignore_errors=True)
    kept = (f"the last good output is kept ({_rel(notebook)})" if notebook.exists()
            else "there was no earlier output")
    points = _saved_points(sweep_dir)
    saved = f"{points} finished sweep point{'s' * (points != 1)} saved for the next run"
    failure.args = (f"{failure}; {kept}; {saved}; log: {_rel(log_file)}",)
    raise failure


# --------------------------------------------------------------------------------------------
# site
# --------------------------------------------------------------------------------------------
def _stored_notes(chapters: list[str], slots: dict[str, str]) -> list[str]:
    """Notes about stored results (``stored_results`` in the summaries) for the reproducibility page."""
    notes = []
    for chapter in chapters:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            summary = json.loads(slot_paths(chapter, slots.get(chapter, chapter))[1].read_text())
            for name, entry in sorted((summary.get("stored_results") or {}).items()):
                if isinstance(entry, dict) and entry.get("note"):
                    notes.append(f"- `{chapter}` / `{name}`: {entry['note']}")
    return notes


def execution_table(chapters: list[str], records: dict, slots: dict[str, str] | None = None) -> str:
    """Markdown table: chapter, profile, device, wall time, versions, date (+ stored-result notes).

    ``slots`` maps a chapter to the output slot shown (default: the book's own slot).
    """
    slots = slots or {}
    rows = [
        "| chapter | profile | device | wall time (s) | attnlib | torch | executed (UTC) |",
        "| --- | --- | --- | ---: | --- | --- | --- |",
    ]
    for chapter in chapters:
        r = records.get(slots.get(chapter, chapter), {})
        rows.append(
            f"| `{chapter}` | {r.get('profile', '?')} | {r.get('device', '?')} | "
            f"{r.get('wall_s', float('nan')):.1f} | {r.get('attnlib', '?')} | "
            f"{r.get('torch', '?')} | {r.get('date', '?')} |"
        )
    notes = _stored_notes(chapters, slots)
    if notes:
        rows += ["", "Results loaded from the store (`results/`):", "", *notes]
    return "\n".join(rows) + "\n"


def stage_site(chapters: list[str], slots: dict[str, str] | None = None,
               edition: str = "instructor") -> Path:
    """Assemble ``_build/src``: config, prose pages and the executed chapters as pages.

    Each chapter's page is the notebook of its slot in ``slots`` (default: the book's own slot).
    ``edition`` (:mod:`attnlib._edition`): ``"student"`` hides the solutions.
    """
    slots = slots or {}
    src = BUILD / "src" if edition == "instructor" else BUILD / edition / "src"
    if src.exists():
        shutil.rmtree(src)
    (src / "chapters").mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "book", src / "book",
        ignore=shutil.ignore_patterns("_build", "_cache", "runs", "*.ipynb", "*.summary.json"),
    )
    for chapter in chapters:
        notebook = slot_paths(chapter, slots.get(chapter, chapter))[0]
        if not notebook.exists():
            raise BuildError(f"{_rel(notebook)} is missing: execute it first (`attnbook run {chapter}`)")
        shutil.copy2(notebook, src / "chapters" / f"{chapter}.ipynb")
    _edition.stage(src, chapters, _load_records(report=False), slots, edition)
    _atomic_write(src / AUDIT, audit_markdown())
    return src


#: The audit of the result store, staged for the reproducibility page (relative to the staging tree).
AUDIT = Path("book") / "_generated" / "results-audit.md"


def audit_markdown(results_dir: str | Path | None = None) -> str:
    """The table of :func:`attnlib._store.audit` as markdown, for the reproducibility page."""
    from .store import audit, audit_table

    return audit_table(audit(results_dir))


def audit_command(results_dir: str | None = None, log=print) -> int:
    """``attnbook audit``: print the table; 1 when a record is malformed or unreadable, else 0."""
    from .store import audit, audit_table, results_root

    root = results_root(results_dir)
    rows = audit(root)
    log(f"stored results in {_rel(root)}: {len(rows)}")
    log(audit_table(rows).rstrip("\n"))
    bad = [r for r in rows if r["error"]]
    stale = [r for r in rows if not r["error"] and r["code"] != "unchanged"]
    if stale:
        log(f"{len(stale)} produced by code that has changed since (recompute with -p recompute=true)")
    if bad:
        for r in bad:
            print(f"error: {r['result']}: {r['error']}", file=sys.stderr)
        return 1
    return 0


def build_site(chapters: list[str], log=print, slots: dict[str, str] | None = None,
               edition: str = "instructor") -> Path:
    """Render the executed chapters strictly (``--all -W -n --keep-going``); return the HTML dir."""
    src = stage_site(chapters, slots, edition)
    html = _edition.html_dir(BUILD, edition)
    out_root = _edition.work_dir(BUILD, edition)
    cmd = [
        str(Path(sys.executable).parent / "jupyter-book"), "build", str(src), "--path-output", str(out_root),
        "--all", "-W", "-n", "--keep-going",
    ]
    log("  rendering the site: jupyter-book " + " ".join(cmd[1:]))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError("the site build failed (jupyter-book output above)",
                         "the site build failed:\n" + proc.stdout[-6000:] + proc.stderr[-6000:])
    staged = html.with_name("html.new")
    if staged.exists():
        shutil.rmtree(staged)
    shutil.copytree(out_root / "_build" / "html", staged)
    if html.exists():
        shutil.rmtree(html)
    os.replace(staged, html)
    log(f"  site built in {time.perf_counter() - t0:.1f} s")
    return html


def build(params: dict | None = None, force: bool = False, site: bool = True, log=print,
          wait: bool = True, edition: str = "instructor") -> dict:
    """Execute every chapter of the table of contents (cached), then build the site.

    ``edition="student"`` renders the exercises without their solutions into
    ``_build/student/html`` (:mod:`attnlib._edition`).

    One build per checkout at a time: a second one waits for the first (saying so), or with
    ``wait=False`` stops at once. Every chapter's parameters are checked before any executes.
    """
    chapters = toc_chapters()
    _edition.check_edition(edition)
    for chapter in chapters:  # refuse bad parameters before the first kernel starts
        nb = _read_chapter(chapter)
        validate_parameters(chapter, params or {}, default_parameters(nb), nb=nb)
    with Lock("build", "another attnbook build in this checkout", wait=wait, log=log):
        t0 = time.perf_counter()
        records = {}
        for i, chapter in enumerate(chapters, 1):
            log(f"[{i}/{len(chapters)}] {chapter}  (elapsed {time.perf_counter() - t0:.0f} s)")
            records[chapter] = execute_chapter(chapter, params, force=force, log=log)
        n_run = sum(r["executed"] for r in records.values())
        log(f"{n_run} of {len(chapters)} chapters executed, {len(chapters) - n_run} unchanged")
        slots = {chapter: r.get("slot", chapter) for chapter, r in records.items()}
        if any(slot != chapter for chapter, slot in slots.items()):
            log("non-default parameters: the outputs are in their own slots (book/chapters/runs/), "
                "and the site is built from them; the book's default slots are untouched")
        table = execution_table(chapters, _load_records(), slots)
        _atomic_write(TABLE, table)
        log("\n" + table)
        if site:
            html = build_site(chapters, log=log, slots=slots, edition=edition)
            log(f"open {html / 'index.html'}")
    return records


def list_slots(log=print) -> list[dict]:
    """Every output slot (the book's default ones and every other recorded run) with its state."""
    records = _load_records()
    rows = []
    toc = toc_chapters()
    slots = [(ch, ch, None) for ch in toc]
    for slot, record in sorted(records.items()):
        chapter = record.get("chapter") or slot.split("@", 1)[0]
        if slot != chapter:
            slots.append((chapter, slot, record.get("params")))
    sweeps = CACHE / "sweeps"
    for folder in sorted(sweeps.iterdir()) if sweeps.exists() else []:
        chapter = folder.name.split("@", 1)[0]
        if folder.name in records or folder.name == chapter:
            continue
        with contextlib.suppress(OSError, ValueError):  # a run that failed or was interrupted
            slots.append((chapter, folder.name, json.loads((folder / "params.json").read_text())))
    for chapter, slot, params in slots:
        key = None
        try:
            _nb, _merged, _slot, inputs, key = _prepare(chapter, params)
            reasons = stale_reasons(chapter, slot, key, inputs, records)
        except (ParameterError, BuildError, OSError, SyntaxError) as err:
            reasons = [f"cannot check: {str(err).splitlines()[0]}"]
        state = "current" if not reasons else "needs execution: " + "; ".join(reasons)
        points = _saved_points(CACHE / "sweeps" / slot) if reasons else 0
        if points:
            state += f" ({points} finished sweep points saved)"
        where = _rel(slot_paths(chapter, slot)[0])
        rows.append({"slot": slot, "state": state, "notebook": where})
        log(f"{slot:34s} {state}" + ("" if slot == chapter else f"  [{where}]"))
    return rows


def _busy(slot: str) -> bool:
    """True while another process holds the lock of ``slot`` (it is executing)."""
    try:
        with Lock(f"slot-{slot}", "", wait=False, log=lambda *_: None):
            return False
    except BuildError:
        return True


def clean(stale: bool = False, log=print) -> None:
    """Remove the executed chapters, caches and the site; with ``stale`` only what no run needs.

    ``stale=True`` removes a slot's sweep checkpoints that neither its last successful execution
    nor a later one used (:func:`attnbook.checkpoints.stale_paths`), and temporary folders of
    runs that have ended.
    """
    if not stale:
        with Lock("build", "an attnbook build in this checkout", wait=False, log=log):
            for path in (EXECUTED, CACHE, BUILD):
                if path.exists():
                    shutil.rmtree(path)
                    log(f"removed {_rel(path)}")
        return
    removed = 0
    for folder in sorted((CACHE / "sweeps").glob("*")) if (CACHE / "sweeps").exists() else []:
        if _busy(folder.name):
            log(f"kept {_rel(folder)}: {folder.name} is being executed")
            continue
        for old in _checkpoints.stale_paths(folder):
            shutil.rmtree(old) if old.is_dir() else old.unlink()
            removed += 1
            log(f"removed {_rel(old)}")
    for work in sorted((CACHE / "work").glob("*")) if (CACHE / "work").exists() else []:
        pid = work.name.rsplit(".", 1)[-1]
        alive = pid.isdigit() and Path(f"/proc/{pid}").exists()
        if not alive:
            shutil.rmtree(work, ignore_errors=True)
            removed += 1
            log(f"removed {_rel(work)}")
    for old in sorted(CACHE.glob("*.partial.ipynb")) + sorted(CACHE.glob("*.input.ipynb")) \
            + sorted(CACHE.glob("*.progress.log")):
        old.unlink()
        removed += 1
        log(f"removed {_rel(old)}")
    log(f"{removed} stale item{'s' * (removed != 1)} removed; outputs and current checkpoints kept")


def sync(log=print) -> list[Path]:
    """Write ``chapters/<id>.ipynb`` (no outputs) from each ``chapters/<id>.md``.

    Each notebook runs and reads in plain Jupyter or Colab (:func:`attnlib._colab.twin_notebook`:
    install cell, macros, MyST roles and blocks as Markdown).
    """
    import jupytext

    from . import colab as _colab

    written = []
    for md in sorted(CHAPTERS.glob("*.md")):
        target = md.with_suffix(".ipynb")
        nb = _colab.twin_notebook(ROOT, md.stem, jupytext.read(md))
        for i, cell in enumerate(nb.cells):
            cell.id = f"cell-{i:03d}"  # stable ids: re-syncing an unchanged chapter changes nothing
        jupytext.write(nb, target, fmt="ipynb")
        written.append(target)
        log(f"wrote {_rel(target)}")
    return written


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints the usage as well)
        self.exit(2, f"error: {message} (see `attnbook {self.prog.split()[-1]} --help`)\n")


def _sigterm(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 done, 1 a chapter or the site failed, 2 a usage error, 130 interrupted."""
    parser = _Parser(prog="attnbook", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p_build = sub.add_parser("build", help="execute changed chapters and build the site")
    p_build.add_argument("-p", "--param", action="append", metavar="NAME=VALUE")
    p_build.add_argument("--force", action="store_true", help="re-execute every chapter")
    p_build.add_argument("--no-site", action="store_true", help="execute only, skip the HTML")
    p_build.add_argument("--scheduler", metavar="WHERE",
                         help="where the chapters' sweeps run: serial (default), local, local:N or "
                              "tcp://host:port (Dask)")
    p_build.add_argument("--edition", choices=_edition.EDITIONS, default="instructor",
                         help="instructor (default): solutions folded under each exercise, in "
                              "_build/html; student: exercises without solutions, in _build/student/html")
    p_build.add_argument("--no-wait", action="store_true",
                         help="stop at once if another build of this checkout is running")
    p_run = sub.add_parser("run", help="execute one chapter")
    p_run.add_argument("chapter")
    p_run.add_argument("-p", "--param", action="append", metavar="NAME=VALUE")
    p_run.add_argument("--force", action="store_true")
    p_run.add_argument("--no-wait", action="store_true",
                       help="stop at once if the same slot is being executed")
    p_run.add_argument("-v", "--verbose", action="store_true",
                       help="on failure print the failing cell and its traceback too")
    p_run.add_argument("--scheduler", metavar="WHERE",
                       help="where the chapter's sweeps run: serial (default), local (a Dask "
                            "LocalCluster on this machine), local:N, or tcp://host:port")
    sub.add_parser("list", help="every output slot, whether it is current and why not")
    sub.add_parser("sync", help="write outputless chapters/*.ipynb from chapters/*.md")
    p_audit = sub.add_parser("audit", help="every stored result: commit, date, device, wall time, "
                                           "whether its code changed since")
    p_audit.add_argument("--results", metavar="DIR", help="the result store (default: results/)")
    p_clean = sub.add_parser("clean", help="remove executed chapters, caches and the site")
    p_clean.add_argument("--stale", action="store_true",
                         help="remove only old sweep checkpoints and leftovers of ended runs")
    _tables_cli.add_commands(sub)
    args = parser.parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _sigterm)
    try:
        if args.command == "build":
            params = _cli_params(toc_chapters(), args.param)
            if args.scheduler is not None:
                params["scheduler"] = args.scheduler
            build(params, force=args.force,
                  site=not args.no_site, wait=not args.no_wait, edition=args.edition)
        elif args.command == "run":
            params = _cli_params([args.chapter], args.param)
            if args.scheduler is not None:
                params["scheduler"] = args.scheduler
            execute_chapter(args.chapter, params, force=args.force, wait=not args.no_wait)
        elif args.command == "list":
            list_slots()
        elif args.command == "sync":
            sync()
        elif args.command == "audit":
            return audit_command(args.results)
        elif args.command == "clean":
            clean(stale=args.stale)
        elif args.command in _tables_cli.COMMANDS:
            return _tables_cli.run_command(args)
    except ParameterError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Interrupted as err:
        print(f"interrupted: {err}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("interrupted: nothing was replaced", file=sys.stderr)
        return 130
    except BuildError as err:
        if getattr(args, "verbose", False):
            print(err.details, file=sys.stderr)
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _cli_params(chapters: list[str], pairs: list[str] | None) -> dict:
    """Parse ``-p`` values by the parameter types of ``chapters`` (a usage error exits 2)."""
    schema: dict[str, Parameter] = {}
    for chapter in chapters:
        for name, p in parameter_schema(_read_chapter(chapter)).items():
            schema.setdefault(name, p)
    return parse_parameters(pairs, schema)


if __name__ == "__main__":
    sys.exit(main())
