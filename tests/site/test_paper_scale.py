"""The ``{paper-scale}`` directive (book/_ext/paperscale.py) in a real Sphinx + myst-nb build of a
one-page notebook: shown with its glued numbers when the marker is glued, one standard sentence in
its place when not, a build error when the marker is glued but a number of the body is not."""

from __future__ import annotations

import io

import nbformat
import pytest

from ..conftest import ROOT

BLOCK = ("```{paper-scale} ch9-full\n"
         "At paper scale the ratio is {glue:text}`ch9-full-ratio:.2f` at $d$ = {glue:text}`ch9-full-d`.\n"
         "```\n")


def _glue_output(key: str, value) -> dict:
    return nbformat.v4.new_output(
        "display_data", data={"application/papermill.record/text/plain": repr(value)},
        metadata={"scrapbook": {"name": key, "mime_prefix": "application/papermill.record/"}})


def _build(tmp_path, glued: dict, profile: str = "quick"):
    from sphinx.application import Sphinx

    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'book' / '_ext')!r})\n"
        "extensions = ['myst_nb', 'paperscale']\nnb_execution_mode = 'off'\n"
        "exclude_patterns = ['_build']\n")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["papermill"] = {"parameters": {"profile": profile}}
    code = nbformat.v4.new_code_cell("run.publish(...)")
    code.outputs = [_glue_output(k, v) for k, v in glued.items()]
    nb.cells = [nbformat.v4.new_markdown_cell("# A chapter\n\n" + BLOCK), code]
    nbformat.write(nb, src / "index.ipynb")
    out = tmp_path / "html"
    warnings = io.StringIO()
    app = Sphinx(str(src), str(src), str(out), str(tmp_path / "doctrees"), "html",
                 status=None, warning=warnings, freshenv=True)
    app.build()
    return warnings.getvalue(), (out / "index.html").read_text()


def test_the_body_is_shown_with_its_glued_numbers(tmp_path):
    warnings, html = _build(tmp_path, {"ch9-full": True, "ch9-full-ratio": 0.4567, "ch9-full-d": 1000})
    assert "ERROR" not in warnings
    assert "At paper scale the ratio is" in html and "0.46" in html and "1000" in html
    assert "paper-scale (full) run" not in html


@pytest.mark.parametrize(("profile", "sentence"), [("quick", "No paper-scale (full) run of this experiment"),
                                                   ("full", "This page shows the paper-scale (full) run")])
def test_without_the_marker_one_sentence_stands_in(tmp_path, profile, sentence):
    warnings, html = _build(tmp_path, {}, profile)  # nothing stored: the chapter glued no marker
    assert "ERROR" not in warnings
    assert sentence in html and "At paper scale the ratio" not in html


def test_a_marker_without_the_numbers_of_its_body_fails_the_build(tmp_path):
    warnings, html = _build(tmp_path, {"ch9-full": True, "ch9-full-ratio": 0.5})
    # an error of the page: the book's strict build (-W) stops on it
    assert "ERROR" in warnings and "not ['ch9-full-d']" in warnings
    assert "At paper scale the ratio" not in html  # never a paragraph with a hole in it
