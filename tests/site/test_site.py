"""The built site (`_build/html`): pages, figures, theorem boxes, no errors, local MathJax."""

from __future__ import annotations

import re

import pytest
from bs4 import BeautifulSoup

from attnbook.params import toc_chapters

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
    from ..conftest import ROOT

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


# --------------------------------------------------------------------------------------------
# raw dumps: what a reader sees must be prose, formatted tables and figures, never a repr
# --------------------------------------------------------------------------------------------
#: A float in exponent notation with a zero-padded exponent (``1.5e-05``, ``0.0e+00``): the
#: look of ``repr``/``%e`` output, never of a number formatted for a reader.
_PADDED_EXPONENT = re.compile(r"\d[eE][+-]0\d")
#: A printed dict of more than 80 characters.
_DICT_DUMP = re.compile(r"\{'[^{}]{80,}")
#: A line of a plain-text table: a label, then columns separated by two or more spaces,
#: ending in a number (a pandas Series/DataFrame repr, an aligned key/value print).
_TABLE_LINE = re.compile(r"^\s*\S.*?\S\s{2,}[-+]?\d[\d.eE+-]*\s*$")


def _reader_text(soup) -> tuple[str, list[str]]:
    """The text of a page's main column without code sources, and the plain-text outputs."""
    main = soup.find("main") or soup
    main = BeautifulSoup(str(main), "html.parser")  # a copy we may cut
    for source in main.select(".cell_input, div.highlight-ipython3, div.highlight-python"):
        source.decompose()
    outputs = [pre.get_text() for pre in main.select(".cell_output pre, .output pre")]
    return main.get_text(" "), outputs


def _raw_dumps(soup) -> list[str]:
    text, outputs = _reader_text(soup)
    found = []
    if "dtype:" in text or re.search(r"Name: .{1,80}, dtype", text):
        found.append("a pandas Series repr ('dtype:')")
    for m in _PADDED_EXPONENT.finditer(text):
        found.append(f"a repr-style float {text[max(0, m.start() - 30):m.end() + 10]!r}")
    for m in _DICT_DUMP.finditer(text):
        found.append(f"a printed dict {m.group(0)[:60]!r}...")
    for out in outputs:
        lines = [line for line in out.splitlines() if line.strip()]
        table = [line for line in lines if _TABLE_LINE.match(line)]
        if len(lines) >= 3 and len(table) >= 0.6 * len(lines):
            found.append(f"a plain-text table printed as output: {lines[0][:60]!r}...")
    return found


@pytest.mark.parametrize("page", all_pages())
def test_no_raw_repr_on_any_page(html_dir, page):
    """No Series/DataFrame/dict repr, no printed plain-text table and no ``e+00``-style float."""
    found = _raw_dumps(_soup(html_dir, page))
    assert not found, f"{page}: " + "; ".join(found[:6])


def test_raw_repr_detector_catches_what_was_found():
    """The detector flags the dumps that were found on the pages (and passes formatted text)."""
    def page(body):
        return BeautifulSoup(f"<main>{body}</main>", "html.parser")

    series = ("<div class='cell_output'><pre>degree k\n1    0.667911\n2    0.061942\n"
              "Name: max |log10(simulation / theory)|, dtype: float64</pre></div>")
    keyvalue = ("<div class='cell_output'><pre>ablation_success_m2          1.000000\n"
                "pipeline_rel_error_m2           0.576499\nbody_half_thickness        0.105365</pre></div>")
    assert _raw_dumps(page(series))
    assert _raw_dumps(page(keyvalue))
    assert _raw_dumps(page("<p>the error is 0.0e+00 here</p>"))
    assert _raw_dumps(page("<p>" + repr({f"key_{i}": i / 7 for i in range(8)}) + "</p>"))
    assert not _raw_dumps(page("<p>agreement within 3.2 % (max |ours - SDPA| = 5.6e-16)</p>"))
    assert not _raw_dumps(page("<table><tr><td>0.667</td></tr></table>"))


@pytest.mark.parametrize("chapter", toc_chapters())
def test_figure_images_have_their_caption_as_alt_text(html_dir, chapter):
    soup = _soup(html_dir, f"chapters/{chapter}")
    for fig in soup.select("figure"):
        caption = " ".join(fig.select_one("figcaption").get_text(" ").split())
        for img in fig.find_all("img"):
            alt = img.get("alt", "")
            assert not re.search(r"\.(svg|png|jpe?g)$", alt), f"{chapter}: alt text is a file name: {alt}"
            words = re.findall(r"[A-Za-z]{4,}", alt)  # prose words, not formulas
            assert len(words) >= 3 and all(w in caption for w in words[:5]), f"{chapter}: alt {alt[:60]!r}"


def test_how_to_use_states_the_measured_run_times(html_dir):
    """How-to-use's run times are the execution records of this build, not a typed-in promise."""
    import json

    from attnbook.layout import current

    text = " ".join(_soup(html_dir, "book/how-to-use").get_text(" ").split())
    assert "The executions shown in this build took" in text
    records = json.loads((current().build / "src" / "book" / "_generated" / "runtimes.json").read_text())
    for chapter in toc_chapters():
        assert f"chapter {int(chapter[:2])}, " in text and chapter in records
    assert "within about three minutes" not in text
