"""What a chapter's code depends on: the attnlib modules it imports, and what those import.

:func:`chapter_modules` reads a chapter's code cells (without running them) and follows the
imports through :mod:`attnlib` (:data:`PACKAGE`), so a chapter's cache key and the provenance of
its stored tables (:func:`code_hashes`) change exactly when code that can change its numbers
changes. :mod:`attnbook`, the machinery, never counts.
"""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path

import attnlib

from .layout import _read_chapter

#: the science package whose modules a chapter's cache key and stored results depend on
PACKAGE = Path(attnlib.__file__).resolve().parent
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
    ``import attnlib as al`` the modules of the names it uses, ``al.check_int`` ->
    ``attnlib._validation``), every module those import in turn, every module of an imported
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
