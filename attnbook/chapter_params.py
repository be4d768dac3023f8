"""The checks of a chapter's ``sizes`` parameter that ``attnbook`` runs before a kernel starts.

``attnbook`` checks every parameter against the chapter's parameters cell (names, and types from
the defaults). Every chapter writes its sizes once, as a ``PROFILE_SIZES`` literal with a
``quick`` and a ``full`` entry (each a ``dict(...)`` of sizes, or one config such as
``rq.RandomQKConfig(...)``), and has a ``sizes`` parameter that replaces entries of it; it gets one
more check, the same for every chapter (:func:`check_chapter_sizes`): each entry must replace one
of the literal's entries (or config fields), with a value of the kind written there (or one the
config accepts), and fit in this machine's memory. Nothing here knows a particular chapter: the
rules are read from the chapter source itself, so that the chapter stays the one place where its
sizes are written. A chapter can still declare a check of its own,
``# attnbook: check attnlib.<module>:<function>`` in its parameters cell
(:func:`attnbook.params.chapter_checks`).
"""

from __future__ import annotations

import ast
import math
import os
from dataclasses import asdict, is_dataclass, replace

from attnlib._validation import ParameterError, check_bool, check_float, check_int

__all__ = ["profile_sizes", "chapter_sizes", "sizes_schema", "check_sizes", "check_chapter_sizes",
           "check_memory"]


def profile_sizes(profile_sizes: dict, profile: str, sizes: dict):
    """The sizes a chapter runs with: its ``PROFILE_SIZES[profile]`` with the entries of the
    ``sizes`` parameter replaced (a dict replaces fields of a dataclass config). A profile written
    as one config (``{"quick": rq.RandomQKConfig(), ...}``) comes back as that config with the
    ``sizes`` entries as its fields. Raises :class:`~attnlib.ParameterError` on an entry the
    profile does not have, and on a value the config refuses."""
    if is_dataclass(profile_sizes[profile]):
        return _replace_fields(profile_sizes[profile], sizes, "sizes")
    out = dict(profile_sizes[profile])
    unknown = sorted(set(sizes) - set(out))
    if unknown:
        raise ParameterError(f"sizes: unknown entries {unknown}; known: {sorted(out)}")
    for key, value in sizes.items():
        out[key] = replace(out[key], **value) if isinstance(value, dict) else value
    return out


def _replace_fields(config, fields: dict, name: str):
    """``dataclasses.replace(config, **fields)``, its refusals as one-line ParameterErrors."""
    if not isinstance(fields, dict):
        raise ParameterError(f"{name}={fields!r} must be a dict of {type(config).__name__} fields")
    unknown = sorted(set(fields) - set(asdict(config)))
    if unknown:
        raise ParameterError(f"{name}: unknown entries {unknown}; known: {sorted(asdict(config))}")
    try:
        return replace(config, **fields)
    except (TypeError, ValueError) as err:
        raise ParameterError(f"{name}: {str(err).splitlines()[0]}") from None


def _chapter_source(chapter: str) -> str:
    from .layout import current

    return (current().chapters / f"{chapter}.md").read_text()


def _kind(node: ast.AST) -> tuple[str, str | None]:
    """What a value written in ``PROFILE_SIZES`` is: config / bool / int / float / ints / numbers /
    tuples (of numbers)."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return ("config", name) if name.endswith("Config") else ("numbers", None)
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None:
            return "none", None
        if isinstance(value, bool):
            return "bool", None
        if isinstance(value, int):
            return "int", None
        if isinstance(value, float):
            return "float", None
        return "any", None
    if isinstance(node, ast.List | ast.Tuple) and node.elts and all(
            isinstance(e, ast.List | ast.Tuple) for e in node.elts):
        return "tuples", None  # a list of tuples of numbers, e.g. [(0.7, 0.01)]
    if isinstance(node, ast.List | ast.Tuple):
        ints = all(isinstance(e, ast.Constant) and type(e.value) is int for e in node.elts)
        return ("ints" if ints and node.elts else "numbers"), None
    if isinstance(node, ast.ListComp):
        return "numbers", None
    return "any", None


def _merge_kinds(seen: tuple[str, str | None] | None, new: tuple[str, str | None]):
    """The kind of an entry written in several profiles: the most specific one, optional (``int?``)
    when one profile writes ``None`` (e.g. ``seed_block=None`` in one profile, ``2`` in another)."""
    if seen is None:
        return new
    optional = "none" in (seen[0], new[0]) or seen[0].endswith("?") or new[0].endswith("?")
    kinds = [k for k in (seen, new) if k[0] not in ("none", "any")]
    kind, config = kinds[0] if kinds else (seen if seen[0] != "none" else new)
    kind = kind.rstrip("?")
    return (kind + "?" if optional and kind not in ("none", "any") else kind), config


def _sizes_literal(source: str, variable: str = "PROFILE_SIZES") -> ast.Dict:
    """The literal ``variable = {"quick": ..., "full": ...}`` in one of a chapter's code cells."""
    for block in source.split("```"):
        if variable not in block:
            continue
        code = block.split("\n", 1)[1] if block.startswith("{code-cell}") else block
        try:
            tree = ast.parse("\n".join(ln for ln in code.splitlines() if not ln.startswith(":tags:")))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == variable
                                                     for t in node.targets)
                    and isinstance(node.value, ast.Dict)):
                return node.value
    raise ParameterError(f"the chapter defines no {variable} literal to check 'sizes' against")


def sizes_schema(source: str, variable: str = "PROFILE_SIZES") -> dict[str, tuple[str, str | None]]:
    """``{entry: (kind, config class name)}`` of the sizes dict ``variable`` in a chapter source.

    ``variable`` is a literal ``{"quick": dict(key=value, ...), "full": dict(...)}`` in one of the
    chapter's code cells; an entry's kind is read from how its value is written.
    """
    schema: dict[str, tuple[str, str | None]] = {}
    for profile in _sizes_literal(source, variable).values:
        if isinstance(profile, ast.Call):
            for kw in profile.keywords:
                if kw.arg is not None:
                    schema[kw.arg] = _merge_kinds(schema.get(kw.arg), _kind(kw.value))
    return {k: ("any", None) if v[0] == "none" else v for k, v in schema.items()}


def chapter_sizes(chapter: str, profile: str = "quick"):
    """``PROFILE_SIZES[profile]`` of a chapter, evaluated outside the notebook (for benchmarks and
    tests): the literal is read from the chapter source and evaluated with only the chapter's own
    imports of ``attnlib``, NumPy and ``math`` in scope."""
    source = _chapter_source(chapter)
    literal = _sizes_literal(source)
    namespace: dict = {}
    for block in source.split("```{code-cell}")[1:]:
        code = "\n".join(ln for ln in block.split("```", 1)[0].splitlines()[1:] if not ln.startswith(":"))
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for node in tree.body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if names and all(n.split(".")[0] in ("attnlib", "numpy", "math", "dataclasses") for n in names):
                exec(compile(ast.Module([node], []), chapter, "exec"), namespace)  # noqa: S102
    profiles = eval(compile(ast.Expression(literal), chapter, "eval"), namespace)  # noqa: S307
    if profile not in profiles:
        raise ParameterError(f"{chapter}: no {profile!r} entry in PROFILE_SIZES; known: {sorted(profiles)}")
    return profiles[profile]


#: Arrays a config's sizes imply, by config class: tuples of its integer fields whose product is
#: the length of one array the experiment holds in memory (8 bytes an entry). Any integer size is
#: at least a vector of that length, so every config gets that floor too.
ARRAYS = {"HistogramConfig": [("n_sequences", "length"), ("n_sequences", "length", "dim")]}


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**40


def _bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:,.0f} {unit}"
    return f"{n:,.0f} bytes"


def check_memory(name: str, value) -> None:
    """Refuse, in one line with the estimate, sizes whose arrays cannot fit in this machine's
    memory (a floor: 8 bytes an entry of the largest array they imply, before any computation)."""
    if is_dataclass(value):
        fields = {k: v for k, v in asdict(value).items() if isinstance(v, int) and not isinstance(v, bool)}
        shapes = [(k,) for k in fields] + [s for s in ARRAYS.get(type(value).__name__, [])
                                           if all(k in fields for k in s)]
        need, shape = max(((8 * math.prod(fields[k] for k in s), s) for s in shapes), default=(0, ()))
        what = " x ".join(f"{k} = {fields[k]:,}" for k in shape)
    elif isinstance(value, int) and not isinstance(value, bool):
        need, what = 8 * value, f"{value:,} entries"
    else:
        return
    have = _memory_bytes()
    if need > have:
        raise ParameterError(f"{name}: an array of {what} needs at least {_bytes(need)} of memory; this "
                             f"machine has {_bytes(have)}")


def check_sizes(sizes, schema: dict[str, tuple[str, str | None]], configs,
                bases: dict | None = None) -> None:
    """Check a ``sizes`` override dict against :func:`sizes_schema` (one-line ParameterError); an
    entry written as a config is checked against that profile's config (``bases``, the configs of
    :func:`chapter_sizes`; else the class's defaults)."""
    if not isinstance(sizes, dict):
        raise ParameterError(f"sizes={sizes!r} must be a dict such as {{'pd_d': 16}}")
    unknown = sorted(set(sizes) - set(schema))
    if unknown:
        raise ParameterError(f"sizes: unknown entries {unknown}; known: {sorted(schema)}")
    for key, value in sizes.items():
        (kind, config), name = schema[key], f"sizes[{key!r}]"
        if kind.endswith("?"):  # an entry some profile sets to None
            if value is None:
                continue
            kind = kind[:-1]
        if kind == "config":
            base = (bases or {}).get(key) or getattr(configs, config)()
            if not isinstance(value, dict):
                raise ParameterError(f"{name}={value!r} must be a dict of {type(base).__name__} fields")
            try:
                config_value = replace(base, **value)
            except TypeError as err:
                raise ParameterError(f"{name}: {err}") from None
            except ValueError as err:
                raise ParameterError(f"{name}: {str(err).splitlines()[0]}") from None
            check_memory(name, config_value)
        elif kind == "bool":
            check_bool(name, value)
        elif kind == "int":
            check_int(name, value, minimum=1)
            check_memory(name, value)
        elif kind == "float":
            check_float(name, value, minimum=0.0, strict=True)
        elif kind == "tuples":
            if not isinstance(value, list | tuple):
                raise ParameterError(f"{name}={value!r} must be a list of tuples of numbers")
            for v in value:
                if not (isinstance(v, list | tuple) and v and all(
                        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
                        for x in v)):
                    raise ParameterError(f"{name} entry {v!r} must be a tuple of finite numbers")
        elif kind in ("ints", "numbers"):
            if not isinstance(value, list | tuple):
                raise ParameterError(f"{name}={value!r} must be a list")
            for v in value:
                if kind == "ints":
                    check_int(name, v, minimum=1)
                elif not (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                          and v >= 0):
                    raise ParameterError(f"{name} entry {v!r} must be a finite number >= 0")


class _Configs:
    """The config classes a chapter can name, looked up in the attnlib modules it imports."""

    def __init__(self, modules):
        self.modules = modules

    def __getattr__(self, name):
        for module in self.modules:
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(name)


def check_chapter_sizes(chapter: str, params: dict) -> None:
    """Any chapter with a ``sizes`` parameter: each entry replaces one of the chapter's
    ``PROFILE_SIZES`` literal and is checked against how it is written there (a config's fields,
    a number, a list...), and against this machine's memory (:func:`check_memory`). The configs
    are found in the attnlib modules the chapter imports."""
    import importlib

    from .deps import chapter_modules

    sizes = params.get("sizes", {})
    if sizes == {}:
        return
    configs = _Configs([importlib.import_module(m) for m in sorted(chapter_modules(chapter))])
    written = chapter_sizes(chapter, params.get("profile", "quick"))  # the profile that runs
    if is_dataclass(written):  # the profile is one config: `sizes` holds its fields
        check_memory("sizes", _replace_fields(written, sizes, "sizes"))
        return
    bases = {key: value for key, value in written.items() if is_dataclass(value)}
    check_sizes(sizes, sizes_schema(_chapter_source(chapter)), configs, bases)
