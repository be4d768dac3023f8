"""Stage the book for ``make pdf`` in ``_build/pdf/src`` (apart from the site's ``_build/src``).

The staging is the site's (:func:`attnbook.site.stage_site`: configuration, prose pages and the
executed chapters), and the staged ``_config.yml`` gets the LaTeX settings, which the HTML site
never reads:

* XeLaTeX, for the Unicode in the text and outputs (×, ω, α, superscript digits, −);
* Sphinx's own LaTeX classes instead of Jupyter Book's ``jupyterBook`` class, which loads
  ``bbm.sty`` (on Debian only in ``texlive-fonts-extra``, 1.4 GB) and whose extension would also
  run in every HTML build;
* the figures taken as SVG (myst-nb's LaTeX priorities skip SVG; ``sitefixes`` converts them
  to PDF with ``rsvg-convert``, Debian's ``librsvg2-bin``);
* tables: LaTeX cannot show the HTML of a styled DataFrame (the page's tables), and myst-nb would
  print its ``text/plain`` instead (``<pandas.io.formats.style.Styler at 0x...>``); each HTML
  table output of the staged notebooks gets a Markdown twin (``text/markdown``, rendered as a
  real table; the cells keep the page's formatting);
* the output named ``book.pdf``.

The book's macros reach LaTeX through ``sitefixes.latex_macros`` (one definition, MathJax's).
Run from the repository root: ``.venv/bin/python book/_ext/stage_pdf.py`` prints the folder.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import yaml

from attnbook import layout
from attnbook.params import toc_chapters
from attnbook.site import stage_site

LATEX = {"latex_engine": "xelatex", "use_jupyterbook_latex": False,
         "latex_documents": {"targetname": "book.tex"}}


def markdown_table(html: str) -> str | None:
    """The first ``<table>`` of ``html`` as a Markdown pipe table (header: the last row of its
    ``<thead>``, else its first row); ``None`` when there is no table."""
    from bs4 import BeautifulSoup

    table = BeautifulSoup(html, "html.parser").find("table")
    if table is None:
        return None

    def cells(tr):
        return [" ".join(c.get_text(" ").split()).replace("|", "\\|") or " "
                for c in tr.find_all(["th", "td"])]

    head_rows = table.thead.find_all("tr") if table.thead else []
    body_rows = [tr for tr in table.find_all("tr") if tr not in head_rows]
    if not head_rows and body_rows:
        head_rows, body_rows = body_rows[:1], body_rows[1:]
    head = cells(head_rows[-1]) if head_rows else []  # the column names (a MultiIndex: its last level)
    body = [cells(tr) for tr in body_rows]
    width = max([len(head), *map(len, body)])
    if width == 0:
        return None
    head = [" "] * (width - len(head)) + head  # an index column has no header cell
    body = [[" "] * (width - len(row)) + row for row in body]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * width]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def add_markdown_tables(notebook: Path) -> int:
    """Give every HTML table output of ``notebook`` (displayed or glued) a Markdown twin."""
    nb = json.loads(notebook.read_text())
    added = 0
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            for prefix in ("", "application/papermill.record/"):
                html = data.get(prefix + "text/html")
                if html is None or prefix + "text/markdown" in data:
                    continue
                table = markdown_table("".join(html) if isinstance(html, list) else html)
                if table:
                    data[prefix + "text/markdown"] = table
                    added += 1
    notebook.write_text(json.dumps(nb, ensure_ascii=False))
    return added


def stage():
    here = layout.current()
    layout.use(dataclasses.replace(here, build=here.root / "_build" / "pdf"))
    src = stage_site(toc_chapters())
    config = src / "_config.yml"
    settings = yaml.safe_load(config.read_text())
    settings["latex"] = LATEX
    config_ = settings.setdefault("sphinx", {}).setdefault("config", {})
    # the figures are SVG: the LaTeX builder takes them (sitefixes converts them to PDF)
    config_["nb_mime_priority_overrides"] = [*config_.get("nb_mime_priority_overrides", []),
                                             ["latex", "image/svg+xml", 5]]
    config_["nb_render_markdown_format"] = "myst"  # pipe tables (commonmark has none)
    config.write_text(yaml.safe_dump(settings, allow_unicode=True, sort_keys=False))
    for notebook in sorted((src / "chapters").glob("*.ipynb")):
        add_markdown_tables(notebook)
    return src


if __name__ == "__main__":
    print(stage())
