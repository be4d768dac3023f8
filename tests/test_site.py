"""The built site (`_build/html`): pages, figures, theorem boxes, no errors, local MathJax."""

from __future__ import annotations

import re

import pytest
from bs4 import BeautifulSoup

from attnlib.book import toc_chapters

pytestmark = pytest.mark.book

PROSE_PAGES = ["book/intro", "book/how-to-use", "book/notation", "book/reproducibility",
               "book/bibliography"]


def _soup(html_dir, page):
    path = html_dir / f"{page}.html"
    assert path.exists(), f"page {page} was not built"
    return BeautifulSoup(path.read_text(), "html.parser")


def all_pages():
    return PROSE_PAGES + [f"chapters/{c}" for c in toc_chapters()]


#: Pages with mathematics, which must load the local MathJax.
MATH_PAGES = {"book/notation"} | {f"chapters/{c}" for c in toc_chapters()}


@pytest.mark.parametrize("page", all_pages())
def test_page_present_with_local_mathjax_and_no_errors(html_dir, page):
    soup = _soup(html_dir, page)
    scripts = [s.get("src", "") for s in soup.find_all("script")]
    if page in MATH_PAGES:
        assert any(s.split("?")[0].endswith("mathjax/tex-mml-chtml.js") for s in scripts)
    assert not any("cdn.jsdelivr" in s or "mathjax@" in s for s in scripts)
    main = soup.find("main") or soup
    text = main.get_text()
    assert "Traceback (most recent call last)" not in text
    assert not main.select(".output.error, .output.traceback, .ansi-red-fg, .output.stderr")
    assert "papermill-error-cell" not in str(main)
    # no path of the build machine (a printed Path, the checkout, a temporary folder)
    from .conftest import ROOT

    html = str(main)
    for leak in ("PosixPath(", str(ROOT), "/tmp/"):
        assert leak not in html, f"{page} shows {leak!r}"


@pytest.mark.parametrize("chapter", toc_chapters())
def test_chapter_has_numbered_figures_and_exercises(html_dir, chapter):
    soup = _soup(html_dir, f"chapters/{chapter}")
    figures = soup.select("figure")
    captions = [f.select_one(".caption-number") for f in figures]
    assert len(figures) >= 2 and all(c is not None for c in captions)
    for fig in figures:
        if fig.find("table") is not None:  # a glued table with a numbered caption
            assert fig.find("td") is not None, "empty table in a figure"
            continue
        img = fig.find("img")
        assert img is not None and img.get("src"), "figure without an image"
    exercises = soup.select("div.exercise")
    solutions = soup.select("div.solution")
    minimum = 2 if chapter.startswith("00") else 3
    assert len(exercises) >= minimum and len(solutions) >= minimum
    assert all("dropdown" in s.get("class", []) for s in solutions)
    # parameters: defaults removed, injected values present but collapsed
    assert soup.select(".tag_injected-parameters.tag_hide-input")
    assert not soup.select(".tag_parameters")


def test_chapter0_has_theorem_boxes_and_citations(html_dir):
    soup = _soup(html_dir, "chapters/00-attention")
    kinds = {c for div in soup.select("div.proof") for c in div.get("class", [])}
    assert {"definition", "proposition"} <= kinds
    assert soup.select("a[href*='bibliography']")


def test_no_raw_unrendered_markup(html_dir):
    for page in all_pages():
        text = (_soup(html_dir, page).find("main") or "").get_text()
        assert "{glue:" not in text and "{numref}" not in text and "{eq}" not in text, page
        assert not re.search(r"```\{", text), page


def test_reproducibility_page_lists_every_chapter(html_dir):
    text = _soup(html_dir, "book/reproducibility").get_text()
    for chapter in toc_chapters():
        assert chapter in text
    assert "quick" in text


def test_launch_and_download_buttons_point_to_notebooks(html_dir):
    for chapter in toc_chapters():
        html = (html_dir / "chapters" / f"{chapter}.html").read_text()
        assert f"blob/main/chapters/{chapter}.ipynb" in html  # Colab opens the committed notebook
        assert f"_sources/chapters/{chapter}.ipynb" in html  # download of the executed notebook
        assert (html_dir / "_sources" / "chapters" / f"{chapter}.ipynb").exists()
