"""Shared fixtures: paths of the executed book and the built site."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXECUTED = ROOT / "book" / "chapters"
HTML = ROOT / "_build" / "html"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"{path.relative_to(ROOT)} is missing: build the book first (`make book`)")
    return path


@pytest.fixture(scope="session")
def html_dir() -> Path:
    return _need(HTML / "index.html").parent


@pytest.fixture(scope="session")
def summaries() -> dict[str, dict]:
    from attnlib.book import toc_chapters

    return {
        ch: json.loads(_need(EXECUTED / f"{ch}.summary.json").read_text()) for ch in toc_chapters()
    }
