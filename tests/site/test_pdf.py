"""What `make pdf` adds to the LaTeX build (book/_ext/sitefixes.py); the PDF itself needs TeX Live
and is not built by the tests."""

from __future__ import annotations

import importlib.util

import yaml

from attnbook import colab as _colab

from ..conftest import ROOT
from ..conftest import load_sitefixes as _sitefixes


def test_every_book_macro_is_defined_for_latex():
    sitefixes = _sitefixes()
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["config"]["mathjax3_config"]
    latex = sitefixes.latex_macros(config)
    macros = _colab.macros(ROOT)
    assert macros
    for name, body in macros.items():
        assert rf"\renewcommand{{\{name}}}{{{body}}}" in latex
    assert sitefixes.latex_macros({"tex": {"macros": {"f": ["#1^2", 1]}}}) == (
        r"\providecommand{\f}{}\renewcommand{\f}[1]{#1^2}")


def test_pdf_numbers_chapters_as_the_site_does():
    """Parts as \\part; only the numbered part's chapters numbered (from 1), the others not."""
    sitefixes = _sitefixes()
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    before = sitefixes.latex_structure(toc)
    numbered = [e["file"] for p in toc["parts"] if p.get("numbered") for e in p["chapters"]]
    others = [e["file"] for p in toc["parts"] if not p.get("numbered") for e in p["chapters"]]
    assert numbered and others
    assert all(r"\setcounter{secnumdepth}{2}" in before[f] for f in numbered)
    assert all(r"\setcounter{secnumdepth}{-1}\setcounter{chapter}{0}" in before[f] for f in others)
    firsts = {p["chapters"][0]["file"]: p["caption"] for p in toc["parts"]}
    for file, caption in firsts.items():
        assert rf"\part{{{caption}}}" in before[file]
    assert sum(r"\part{" in latex for latex in before.values()) == len(toc["parts"])


def test_html_tables_get_a_markdown_twin_for_latex(tmp_path):
    """A styled DataFrame shows in LaTeX as a table, not as ``<pandas...Styler at 0x...>``."""
    import json

    import pandas as pd

    spec = importlib.util.spec_from_file_location("stage_pdf", ROOT / "book" / "_ext" / "stage_pdf.py")
    stage_pdf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage_pdf)
    df = pd.DataFrame({"width N": [10, 30], "acc. (%)": [95.12, 94.2]}, index=["a", "b|c"])
    shown = stage_pdf.markdown_table(df.style.format(precision=1).to_html())
    assert shown.splitlines() == ["|   | width N | acc. (%) |", "|---|---|---|",
                                  "| a | 10 | 95.1 |", "| b\\|c | 30 | 94.2 |"]
    hidden = stage_pdf.markdown_table(df.style.format(precision=1).hide(axis="index").to_html())
    assert hidden.splitlines()[0] == "| width N | acc. (%) |"
    assert stage_pdf.markdown_table("<p>no table</p>") is None
    nb = {"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "display_data", "data": {"text/html": df.to_html(), "text/plain": "<Styler>"}},
        {"output_type": "display_data", "data": {
            "application/papermill.record/text/html": df.to_html(),
            "application/papermill.record/text/plain": "<Styler>"}}]}]}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    assert stage_pdf.add_markdown_tables(path) == 2
    outputs = json.loads(path.read_text())["cells"][0]["outputs"]
    assert "| a | 10 | 95.12 |" in outputs[0]["data"]["text/markdown"]
    assert "application/papermill.record/text/markdown" in outputs[1]["data"]
