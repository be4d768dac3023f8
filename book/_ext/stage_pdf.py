"""Stage the book for ``make pdf`` in ``_build/pdf/src`` (apart from the site's ``_build/src``).

The staging is the site's (:func:`attnlib.book.stage_site`: configuration, prose pages and the
executed chapters), and the staged ``_config.yml`` gets the LaTeX settings, which the HTML site
never reads:

* XeLaTeX, for the Unicode in the text and outputs (×, ω, α, superscript digits, −);
* Sphinx's own LaTeX classes instead of Jupyter Book's ``jupyterBook`` class, which loads
  ``bbm.sty`` (on Debian only in ``texlive-fonts-extra``, 1.4 GB) and whose extension would also
  run in every HTML build;
* the figures taken as SVG (myst-nb's LaTeX priorities skip SVG; ``sitefixes`` converts them
  to PDF with ``rsvg-convert``, Debian's ``librsvg2-bin``);
* the output named ``book.pdf``.

The book's macros reach LaTeX through ``sitefixes.latex_macros`` (one definition, MathJax's).
Run from the repository root: ``.venv/bin/python book/_ext/stage_pdf.py`` prints the folder.
"""

from __future__ import annotations

import yaml

from attnlib import book

LATEX = {"latex_engine": "xelatex", "use_jupyterbook_latex": False,
         "latex_documents": {"targetname": "book.tex"}}


def stage():
    book.BUILD = book.ROOT / "_build" / "pdf"
    src = book.stage_site(book.toc_chapters())
    config = src / "_config.yml"
    settings = yaml.safe_load(config.read_text())
    settings["latex"] = LATEX
    config_ = settings.setdefault("sphinx", {}).setdefault("config", {})
    # the figures are SVG: the LaTeX builder takes them (sitefixes converts them to PDF)
    config_["nb_mime_priority_overrides"] = [*config_.get("nb_mime_priority_overrides", []),
                                             ["latex", "image/svg+xml", 5]]
    config.write_text(yaml.safe_dump(settings, allow_unicode=True, sort_keys=False))
    return src


if __name__ == "__main__":
    print(stage())
