"""The student edition: every exercise of the book, none of the solutions.

Rendered from the executed chapters already in book/chapters (nothing is re-executed), next to
the default (instructor) site in _build/html that the other site tests read.
"""

from __future__ import annotations

import re

import pytest
from bs4 import BeautifulSoup

from attnbook import edition as _edition
from attnbook.layout import current
from attnbook.params import toc_chapters
from attnbook.site import build_site

pytestmark = pytest.mark.book


@pytest.fixture(scope="module")
def student_html(html_dir):
    return build_site(toc_chapters(), log=lambda *a: None, edition="student")


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@pytest.mark.parametrize("chapter", toc_chapters())
def test_student_edition_has_every_exercise_and_no_solution(html_dir, student_html, chapter):
    teacher = BeautifulSoup((html_dir / "chapters" / f"{chapter}.html").read_text(), "html.parser")
    student = BeautifulSoup((student_html / "chapters" / f"{chapter}.html").read_text(), "html.parser")
    exercises = [ex.get("id") for ex in teacher.select("div.exercise")]
    assert exercises and all(exercises)
    assert [ex.get("id") for ex in student.select("div.exercise")] == exercises
    for ex in teacher.select("div.exercise"):  # the statements are the same
        body = _words(ex.select_one("section").get_text(" "))
        assert body[:120] in _words(student.get_text(" "))
    solutions = teacher.select("div.solution")
    assert len(solutions) >= len(exercises) // 2
    assert not student.select("div.solution")
    student_text = _words((student.find("main") or student).get_text(" "))
    for sol in solutions:
        body = sol.select_one("section") or sol
        text = _words(body.get_text(" "))
        probe = text[:160]
        assert len(probe) > 40, f"solution too short to probe: {probe!r}"
        assert probe not in student_text, f"{chapter}: solution text in the student edition: {probe[:60]!r}"


def test_editions_have_their_own_folders(student_html, html_dir):
    assert student_html == _edition.html_dir(current().build, "student") != html_dir
    title = BeautifulSoup((student_html / "book" / "intro.html").read_text(), "html.parser").title.get_text()
    assert "student edition" in title
    with pytest.raises(Exception, match="edition"):
        _edition.check_edition("teacher")
