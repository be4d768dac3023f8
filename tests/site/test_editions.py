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


def _solution_probes(chapter) -> list[str]:
    """From each solution of the chapter's source: its longest stretch of prose without maths or
    markup, as plain words (what must not reach a student, in any rendering)."""
    from attnbook import edition as _ed

    source = (current().root / "chapters" / f"{chapter}.md").read_text()
    probes = []
    for block in _ed._SOLUTION.finditer(source):
        body = block.group(0).split("\n", 1)[1].rsplit(block.group("fence"), 1)[0]  # inside the fences
        pieces = re.split(r"\$\$.*?\$\$|\$[^$]*\$|\{[^}]*\}`[^`]*`|`[^`]*`|\n\s*\n", body, flags=re.S)
        longest = max((_plain(p) for p in pieces), key=len)
        if len(longest.split()) >= 5:
            probes.append(" ".join(longest.split()[:8]))
    return probes


def _notebook_text(path) -> str:
    import json

    nb = json.loads(path.read_text())
    return _words(" ".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                           for c in nb["cells"] if c["cell_type"] == "markdown"))


def _plain(text: str) -> str:
    return " ".join(re.findall(r"[A-Za-z]{4,}", text))


@pytest.mark.parametrize("chapter", toc_chapters())
def test_student_downloads_and_launch_targets_hold_no_solution(html_dir, student_html, chapter):
    """The .ipynb download (_sources/) and the notebook the launch buttons open carry no solution
    text; the instructor's twin still has the solutions (folded), so the probes are real."""
    from attnbook import edition as _ed

    probes = _solution_probes(chapter)
    assert probes
    download = student_html / "_sources" / "chapters" / f"{chapter}.ipynb"
    assert download.exists(), "the student page's notebook download is missing"
    page = (student_html / "chapters" / f"{chapter}.html").read_text()
    launches = re.findall(r'href="(https://colab\.research\.google\.com/[^"]+)"', page)
    assert launches and all(url.endswith(f"{_ed.STUDENT_BOOK.as_posix()}/chapters/{chapter}.ipynb")
                            for url in launches), launches
    twin = current().root / _ed.STUDENT_BOOK / "chapters" / f"{chapter}.ipynb"
    instructor_twin = _plain(_notebook_text(current().root / "chapters" / f"{chapter}.ipynb"))
    for path, what in ((download, "download"), (twin, "twin")):
        text = _plain(_notebook_text(path))
        for probe in probes:
            assert probe not in text, f"{chapter}: solution text in the student {what}: {probe!r}"
    assert all(probe in instructor_twin for probe in probes)


def test_how_to_use_says_which_edition_it_is(html_dir, student_html):
    student = _words(BeautifulSoup((student_html / "book" / "how-to-use.html").read_text(),
                                   "html.parser").get_text(" "))
    teacher = _words(BeautifulSoup((html_dir / "book" / "how-to-use.html").read_text(),
                                   "html.parser").get_text(" "))
    assert "reading is the student edition" in student and "instructor edition:" not in student
    assert "reading is the instructor edition" in teacher and "reading is the student edition" not in teacher
