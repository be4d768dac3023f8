"""What `make pdf` adds to the LaTeX build (book/_ext/sitefixes.py); the PDF itself needs TeX Live
and is not built by the tests."""

from __future__ import annotations

import importlib.util

import yaml

from attnlib import _colab

from .conftest import ROOT


def _sitefixes():
    spec = importlib.util.spec_from_file_location("sitefixes", ROOT / "book" / "_ext" / "sitefixes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
