"""A chapter's parameters: the table of contents, the parameters cell and the checks.

:func:`toc_chapters` lists the chapters in the book's order. A chapter's parameters are read from
its cell tagged ``parameters`` without running it (:func:`parameter_schema`: names, defaults, and
types from the defaults, as papermill reads them); :func:`parse_parameters` reads ``-p
name=value`` by those types; :func:`validate_parameters` merges the values over the defaults and
checks every one (the common ``profile``/``seed``/``device``, the types, and the checks the chapter
declares, :func:`chapter_checks`) before a kernel starts.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlib._validation import ParameterError

from .deps import chapter_modules
from .layout import BuildError, _read_chapter, current

#: Parameters every chapter has; their checks live in :mod:`attnbook.runs`.
COMMON = ("profile", "device", "seed")
#: Parameters that choose how a chapter executes, not what it computes: they are checked, passed
#: to the chapter, and left out of the output slot's name and the cache key (a run on a Dask
#: cluster fills the same slot, and resumes the same sweep checkpoints, as a serial run).
EXECUTION_ONLY = ("scheduler",)



# --------------------------------------------------------------------------------------------
# chapters and their parameters
# --------------------------------------------------------------------------------------------
def toc_chapters(root: Path | None = None) -> list[str]:
    """Chapter ids (``chapters/<id>``) in the order of ``_toc.yml``."""
    import yaml

    toc = yaml.safe_load(((root or current().root) / "_toc.yml").read_text())
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
    chapter imports, ``CHAPTER_CHECKS = {"<chapter id>": function}``. A chapter with a ``sizes``
    parameter also gets :func:`attnbook.chapter_params.check_chapter_sizes`. A check receives every
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
    for module in sorted(chapter_modules(chapter, nb)):  # a model module may declare one too
        declared = getattr(importlib.import_module(module), "CHAPTER_CHECKS", None) or {}
        if chapter in declared and declared[chapter] not in checks:
            checks.append(declared[chapter])
    if "sizes" in parameter_schema(nb):  # the same rule for every chapter with sizes
        from .chapter_params import check_chapter_sizes

        checks.append(functools.partial(check_chapter_sizes, chapter))
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
