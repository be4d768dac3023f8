"""The wall between the science and the machinery, read from the code.

``attnlib`` computes (every file is result code); ``attnbook`` runs, stores and publishes and
never changes a number. ``attnbook`` imports ``attnlib``, never the reverse; neither package has an
import circle; no file of ``attnbook`` grows past about 600 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("attnlib", "attnbook")
#: what only the book's machinery may use: building, executing, storing, plotting
MACHINERY_IMPORTS = ("attnbook", "papermill", "jupyter_book", "myst_nb", "nbformat", "nbclient",
                     "jupytext", "dask", "distributed", "seaborn", "sphinx", "argparse")
MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(package: str) -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((ROOT / package).rglob("*.py"))}


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Modules of ``known`` that ``module`` imports anywhere in its file (deferred imports too)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            subs = [f"{source}.{a.name}" for a in node.names]
            # ``from . import x`` reads module x, not the package face; a name that is not a
            # module is read from ``source`` itself
            names = subs + ([source] if any(s not in known for s in subs) else [])
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def _all_imports(node_names: tuple[str, ...]) -> dict[str, set[str]]:
    files = {m: p for package in node_names for m, p in _modules(package).items()}
    return {m: _imports(m, p, set(files)) for m, p in files.items()}


def test_attnlib_never_imports_the_machinery():
    offenders = []
    for module, path in _modules("attnlib").items():
        for node in ast.walk(ast.parse(path.read_bytes())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            offenders += [f"{module}: {n}" for n in names if n.split(".")[0] in MACHINERY_IMPORTS]
    assert offenders == []


def test_attnlib_holds_no_machinery_module():
    names = {p.stem for p in (ROOT / "attnlib").rglob("*.py")}
    machinery = {"book", "_runtime", "_store", "_sweep", "_colab", "_edition", "_chapter_params",
                 "_repo", "fmt", "plotting", "store", "sweeps", "runs", "colab", "edition", "cli"}
    assert names & machinery == set()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle(package):
    graph = _all_imports((package,))
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_machinery_file_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "attnbook").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
