"""The book's one number formatter (attnbook.fmt) and the site extension that uses it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnbook.fmt import fmt_sci, sci_parts, sci_range, sci_segments, sci_text

from ..conftest import load_sitefixes as _sitefixes


@pytest.mark.parametrize(("x", "digits", "text", "latex"), [
    (1.94e-7, 1, "1.9 × 10⁻⁷", r"1.9 \times 10^{-7}"),
    (3.036509e-20, 2, "3.04 × 10⁻²⁰", r"3.04 \times 10^{-20}"),
    (-2.5e12, 0, "−2 × 10¹²", r"-2 \times 10^{12}"),   # round half to even, as Python's format
    (9.96e-5, 1, "1.0 × 10⁻⁴", r"1.0 \times 10^{-4}"),  # the carry moves the exponent
    (0.0, 1, "0.0", "0.0"),
    (4.2, 2, "4.20", "4.20"),
    (np.float32(1e-3), 1, "1.0 × 10⁻³", r"1.0 \times 10^{-3}"),
    (7, 1, "7.0", "7.0"),
])
def test_fmt_sci_text_and_latex(x, digits, text, latex):
    assert fmt_sci(x, digits) == text
    assert fmt_sci(x, digits, style="latex") == latex
    # the value shown is the value Python's own exponent format shows
    mantissa, exponent = sci_parts(x, digits)
    assert float(f"{mantissa}e{exponent}") == float(f"{float(x):.{digits}e}")


def test_fmt_sci_non_finite():
    assert fmt_sci(math.inf) == "∞" and fmt_sci(-math.inf) == "−∞" and fmt_sci(math.nan) == "NaN"
    assert fmt_sci(-math.inf, style="latex") == r"-\infty"
    with pytest.raises(ValueError, match="no mantissa"):
        sci_parts(math.nan)


@pytest.mark.parametrize(("args", "error", "match"), [
    (("1e-3",), TypeError, "real number"),
    ((True,), TypeError, "real number"),
    ((1.0, -1), ValueError, "digits"),
    ((1.0, 1.5), ValueError, "digits"),
    ((1.0, 1, "html"), ValueError, "style"),
])
def test_fmt_sci_refuses_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        fmt_sci(*args)


def test_sci_text_rewrites_every_exponent_number_and_nothing_else():
    s = "residual 1.6e-03, gap 0.0e+00 and 2E5; keys x1e5, v1.2e3b and 10 stay."
    assert sci_text(s) == "residual 1.6 × 10⁻³, gap 0.0 and 2 × 10⁵; keys x1e5, v1.2e3b and 10 stay."
    assert sci_text("max 5.6e-16.") == "max 5.6 × 10⁻¹⁶."
    assert sci_text("a -1.0e-02 b", style="latex") == r"a -1.0 \times 10^{-2} b"
    assert sci_text("no numbers here") == "no numbers here"


def test_sci_segments():
    assert sci_segments("1.6e-03") == [("text", "1.6 × 10"), ("sup", "−3")]
    assert sci_segments("0.0e+00") == [("text", "0.0")]
    assert sci_segments("up to an error of 1.2e-05 here") == [
        ("text", "up to an error of 1.2 × 10"), ("sup", "−5"), ("text", " here")]
    assert sci_segments("5.6 to 7.6") == [("text", "5.6 to 7.6")]
    assert sci_segments("") == [("text", "")]
    # a glued negative number gets a true minus; ranges, names and dates keep their hyphens
    assert sci_segments("-0.25") == [("text", "−0.25")]
    assert sci_segments("from -0.36 to 0.83 (-2), 3-5, N-1, 2026-12-04") == [
        ("text", "from −0.36 to 0.83 (−2), 3-5, N-1, 2026-12-04")]


def test_site_extension_typesets_glued_numbers_with_the_formatter():
    from docutils import nodes

    sitefixes = _sitefixes()
    para = nodes.paragraph()
    whole = nodes.inline("", "1.6e-03", classes=["pasted-text"])
    inside = nodes.inline("", "up to an error of 2.0e-05", classes=["pasted-text"])
    plain = nodes.inline("", "exactly", classes=["pasted-text"])
    other = nodes.inline("", "3.0e-04", classes=["not-glued"])
    para.extend([whole, nodes.Text(" and "), inside, plain, other])
    doc = nodes.document(None, None)
    doc += para
    sitefixes._glued_exponents(None, doc, "page")
    assert whole.astext() == "1.6 × 10−3"
    assert [type(c).__name__ for c in whole.children] == ["Text", "superscript"]
    assert inside.astext() == "up to an error of 2.0 × 10−5"
    assert plain.astext() == "exactly" and other.astext() == "3.0e-04"
    assert "glued-prose" not in whole["classes"] + inside["classes"] + plain["classes"]


def test_a_glued_sentence_is_marked_as_prose():
    from docutils import nodes

    sitefixes = _sitefixes()
    para = nodes.paragraph()
    sentence = nodes.inline("", "All 8 of its training seeds are stored, against 3 here.",
                            classes=["pasted-text"])
    number = nodes.inline("", "0.21", classes=["pasted-text"])
    para.extend([sentence, number])
    doc = nodes.document(None, None)
    doc += para
    sitefixes._glued_exponents(None, doc, "page")
    assert "glued-prose" in sentence["classes"] and "glued-prose" not in number["classes"]


def test_sci_range_shares_one_power_of_ten():
    assert sci_range(5.63e-4, 7.61e-4) == "5.6 to 7.6 × 10⁻⁴"
    assert sci_range(4e-5, 7.6e-4, 2) == "0.40 to 7.60 × 10⁻⁴"  # the larger end sets the power
    assert sci_range(-2e-3, 3e-3, sep="–") == "−2.0–3.0 × 10⁻³"
    assert sci_range(5.61e-4, 5.64e-4) == "5.6 × 10⁻⁴"
    assert sci_range(1.5, 2.5) == "1.5 to 2.5"
    assert sci_range(5.6e-4, 7.6e-4, style="latex") == r"5.6\text{ to }7.6 \times 10^{-4}"
    with pytest.raises(ValueError, match="finite"):
        sci_range(1.0, math.inf)


def test_num_and_span_for_generated_prose():
    from attnbook.fmt import num, span

    assert num(-0.314) == "\u22120.31" and num(12500, ",.0f") == "12\u2009500"
    assert num(3e-5, ".1e") == fmt_sci(3e-5, 1)
    assert span(1.0, 1.001) == "1.00" and span(0.2, 0.83) == "0.20 to 0.83"
    assert span(-1, 2, ".0f", sep="–") == "\u22121–2"
