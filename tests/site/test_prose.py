"""Sentences the chapters write from their numbers read right on the rendered pages: no range
whose ends are equal, no empty clause, no number glued to its "=", no ASCII hyphen for a minus
in a glued number, no quantity rounded to a zero it is not."""

from __future__ import annotations

import re

import pytest
from bs4 import BeautifulSoup

from attnbook.params import toc_chapters

pytestmark = pytest.mark.book

NUMBER = r"[−-]?\d[\d,]*(?:\.\d+)?"
#: (what reads wrong, pattern on the text of the page's main column)
PROSE_FAULTS = [
    ("a range whose ends are equal",
     re.compile(rf"\bbetween ({NUMBER}) and \1(?![\d.])|\bfrom ({NUMBER}) to \2(?![\d.])")),
    ("an empty clause", re.compile(r"[;,]\s*[;,.]|\(\s*\)|:\s*[;,.]")),
    ("a symbol glued to its value", re.compile(r"\b[A-Za-z] =\d|\b[A-Za-z]= \d")),
    ("a quantity rounded to zero",
     re.compile(r"(?<![\d.])[−-]?0\.0+ (?:points|%|per ?cent)|\bonly 0(?:\.0+)?%|a fraction [−-]?0\.0+\b")),
]


def _main_text(html_dir, chapter) -> tuple[BeautifulSoup, str]:
    """The page's main column and its running text: each formula stands as one symbol (§), code
    and scripts are left out, and the text is joined without separators (as a reader sees it)."""
    soup = BeautifulSoup((html_dir / "chapters" / f"{chapter}.html").read_text(), "html.parser")
    main = soup.find("main") or soup
    for tag in main.select("script, style, pre, .cell_input, table"):
        tag.decompose()
    for tag in main.select("span.math, div.math, mjx-container, .MathJax"):
        tag.replace_with("§")
    for tag in main.select("code"):  # inline code reads as one word
        tag.replace_with("C")
    return main, " ".join(main.get_text("").split())


@pytest.mark.parametrize("chapter", toc_chapters())
def test_generated_prose_reads_right(html_dir, chapter):
    main, text = _main_text(html_dir, chapter)
    faults = [f"{what}: …{text[max(0, m.start() - 50):m.end() + 30]}…"
              for what, pattern in PROSE_FAULTS for m in pattern.finditer(text)]
    # a glued negative number is written with a true minus sign
    for span in main.select("span.pasted-text"):
        if re.search(r"(?:^|[\s(=,;:])-\d", span.get_text()):
            faults.append(f"a hyphen for a minus in a glued value: {span.get_text()[:80]!r}")
    assert not faults, f"{chapter}:\n" + "\n".join(faults)
