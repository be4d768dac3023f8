"""Shared fixtures: paths of the executed book and the built site."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXECUTED = ROOT / "book" / "chapters"
HTML = ROOT / "_build" / "html"


#: The test files that take longest (about 230, 170, 135, 115 and 95 s on a 2-core CI machine),
#: collected first: pytest-xdist hands out whole files in collection order (``--dist loadfile``),
#: and a long file handed out last keeps one worker busy while the other has nothing left.
LONGEST_FIRST = ("test_reliability.py", "test_full_profile.py", "test_browser.py",
                 "test_colab.py", "test_dotattn.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"{path.relative_to(ROOT)} is missing: build the book first (`make book`)")
    return path


@pytest.fixture(scope="session")
def html_dir() -> Path:
    return _need(HTML / "index.html").parent


@pytest.fixture(scope="session")
def summaries() -> dict[str, dict]:
    from attnbook.params import toc_chapters

    return {
        ch: json.loads(_need(EXECUTED / f"{ch}.summary.json").read_text()) for ch in toc_chapters()
    }


def myst_chapter(title: str, parameters: str, *cells: str) -> str:
    """Text of a minimal MyST-notebook chapter (for the CLI tests): a ``parameters`` cell holding
    ``parameters``, then one code cell per entry of ``cells``."""
    header = ("---\njupytext:\n  text_representation: {extension: .md, format_name: myst}\n"
              "kernelspec: {display_name: Python 3, language: python, name: python3}\n---\n")
    blocks = [f"```{{code-cell}} python\n:tags: [parameters]\n{parameters.strip()}\n```"]
    blocks += [f"```{{code-cell}} python\n{cell.strip()}\n```" for cell in cells]
    return header + f"# {title}\n\n" + "\n\n".join(blocks) + "\n"


def tiny_book(root: Path, chapter: str, text: str) -> Path:
    """A book folder at ``root`` whose table of contents holds the one chapter ``chapter``."""
    (root / "chapters").mkdir(parents=True)
    (root / "chapters" / f"{chapter}.md").write_text(text)
    (root / "_toc.yml").write_text(f"format: jb-book\nroot: intro\nchapters:\n- file: chapters/{chapter}\n")
    return root


def point_book_at(root: Path, monkeypatch) -> None:
    """Make ``attnbook`` work on the book folder ``root`` (its chapters, outputs, cache, site)."""
    from attnbook import layout

    monkeypatch.setattr(layout, "BOOK", layout.Book(root))


def load_sitefixes():
    """The site extension ``book/_ext/sitefixes.py`` as a module (it is not a package)."""
    return load_extension("sitefixes")


def load_extension(name: str):
    """The local Sphinx extension ``book/_ext/<name>.py`` as a module (it is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "book" / "_ext" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
