"""Numbers in scientific notation the way a reader writes them: ``1.9 × 10⁻⁷``, never ``1.9e-07``.

One formatter for the whole book. Chapters use :func:`num` and :func:`span` for numbers in
generated sentences (``from attnbook.fmt import num, span``: a true minus sign, thousands with a
thin space, a range that collapses to one number when both ends print alike) and :func:`fmt_sci`
in printed output and glued strings; the site extension ``book/_ext/sitefixes.py`` uses
:func:`sci_segments` to rewrite numbers glued with an exponent format (``{glue:text}`key:.1e```),
which Python prints as ``1.6e-03``, into ``1.6 × 10`` with a superscript ``−3``.

``digits`` is the number of digits after the decimal point of the mantissa, as in Python's format
specification: ``fmt_sci(x, 1)`` shows what ``f"{x:.1e}"`` shows, typeset.
"""

from __future__ import annotations

import math
import numbers
import re

__all__ = ["fmt_sci", "num", "span", "sci_parts", "sci_range", "sci_segments", "sci_text"]

_MINUS = "\u2212"
_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
#: A number in exponent notation standing alone (not part of a name such as ``x1e5``).
_EXPONENT = re.compile(r"(?<![\w.])([-+]?\d+(?:\.\d+)?)[eE]([-+]?\d+)(?!\w|\.\d)")
#: a hyphen used as the sign of a number: "-0.25", "(-3", "= -1" (not "3-5" or "N-1")
_HYPHEN_MINUS = re.compile(r"(?<![\w.)\]])-(?=\d)")
_STYLES = ("text", "latex")


def _check(x, digits: int, style: str) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"fmt_sci: x must be a real number, got {type(x).__name__} {x!r}")
    if isinstance(digits, bool) or not isinstance(digits, numbers.Integral) or not 0 <= digits <= 15:
        raise ValueError(f"fmt_sci: digits must be an integer from 0 to 15, got {digits!r}")
    if style not in _STYLES:
        raise ValueError(f"fmt_sci: style must be one of {_STYLES}, got {style!r}")
    return float(x)


def sci_parts(x, digits: int = 1) -> tuple[str, int]:
    """``(mantissa, exponent)`` of ``x`` rounded to ``digits`` decimals of the mantissa:
    ``sci_parts(1.94e-7, 1) == ("1.9", -7)``; ``sci_parts(9.96e-5, 1) == ("1.0", -4)``."""
    value = _check(x, digits, "text")
    if not math.isfinite(value):
        raise ValueError(f"sci_parts: {value} has no mantissa and exponent")
    mantissa, exponent = f"{value:.{digits}e}".split("e")
    return mantissa, int(exponent)


def _join(mantissa: str, exponent: int, style: str) -> str:
    if style == "latex":
        return mantissa if exponent == 0 else rf"{mantissa} \times 10^{{{exponent}}}"
    mantissa = mantissa.replace("-", _MINUS)
    if exponent == 0:
        return mantissa
    return f"{mantissa} × 10" + str(exponent).translate(_SUPERSCRIPT)


def fmt_sci(x, digits: int = 1, style: str = "text") -> str:
    """``x`` in scientific notation with ``digits`` decimals of the mantissa.

    ``style="text"`` (pages, printed output, glued strings): ``"1.9 × 10⁻⁷"``, with a true minus
    sign and superscript digits; ``style="latex"`` (inside ``$...$`` or a glued math string):
    ``"1.9 \\times 10^{-7}"``. An exponent of zero is left out (``fmt_sci(0.0) == "0.0"``);
    infinities and NaN are written ``∞``, ``−∞`` and ``NaN`` (``\\infty``, ``\\mathrm{NaN}``).
    """
    value = _check(x, digits, style)
    if math.isnan(value):
        return r"\mathrm{NaN}" if style == "latex" else "NaN"
    if math.isinf(value):
        sign = ("-" if style == "latex" else _MINUS) if value < 0 else ""
        return sign + (r"\infty" if style == "latex" else "∞")
    return _join(*sci_parts(value, digits), style)


def sci_range(lo, hi, digits: int = 1, style: str = "text", sep: str = " to ") -> str:
    """Two numbers over one power of ten, that of the larger in magnitude: ``sci_range(5.6e-4,
    7.6e-4) == "5.6 to 7.6 × 10⁻⁴"`` (``style="latex"``: ``"5.6\\text{ to }7.6 \\times 10^{-4}"``).
    When both round to the same mantissa the range is that one number."""
    a, b = _check(lo, digits, style), _check(hi, digits, style)
    if not (math.isfinite(a) and math.isfinite(b)):
        raise ValueError(f"sci_range: both ends must be finite, got {lo!r} and {hi!r}")
    exponent = sci_parts(max(abs(a), abs(b)), digits)[1]
    first, second = (f"{v / 10.0 ** exponent:.{digits}f}" for v in (a, b))
    if first == second:
        return _join(first, exponent, style)
    if style == "latex":
        return _join(rf"{first}\text{{{sep}}}{second}", exponent, style)
    first, second = first.replace("-", _MINUS), second.replace("-", _MINUS)
    return _join(f"{first}{sep}{second}", exponent, style)


def sci_segments(text: str) -> list[tuple[str, str]]:
    """``text`` cut into ``("text", ...)`` and ``("sup", ...)`` pieces, every number written in
    exponent notation (``1.6e-03``) becoming ``1.6 × 10`` followed by the superscript ``−3``.

    The mantissa keeps the digits it was written with; ``0.0e+00`` becomes ``0.0``; a negative
    number's hyphen becomes a true minus sign. Text without either comes back as one
    ``("text", text)`` piece. The site extension builds its nodes from these pieces (a
    superscript node for ``"sup"``).
    """
    out: list[tuple[str, str]] = []
    last = 0
    for m in _EXPONENT.finditer(text):
        mantissa, exponent = m.group(1).replace("-", _MINUS), int(m.group(2))
        before = text[last:m.start()] + mantissa
        if exponent:
            out.append(("text", before + " × 10"))
            out.append(("sup", str(exponent).replace("-", _MINUS)))
        else:
            out.append(("text", before))
        last = m.end()
    out.append(("text", text[last:]))
    merged: list[tuple[str, str]] = []
    for kind, piece in out:
        if merged and kind == "text" == merged[-1][0]:
            merged[-1] = ("text", merged[-1][1] + piece)
        elif piece or kind == "sup":
            merged.append((kind, piece))
    # a negative number written by Python (``-0.25``) gets a true minus sign (not in "3-5", "N-1")
    return [(kind, _HYPHEN_MINUS.sub(_MINUS, piece) if kind == "text" else piece)
            for kind, piece in merged] or [("text", "")]


def sci_text(text: str, style: str = "text") -> str:
    """``text`` with every number in exponent notation typeset as :func:`fmt_sci` writes it
    (mantissa digits kept): ``sci_text("residual 1.6e-03") == "residual 1.6 × 10⁻³"``."""
    if style not in _STYLES:
        raise ValueError(f"sci_text: style must be one of {_STYLES}, got {style!r}")
    return _EXPONENT.sub(lambda m: _join(m.group(1), int(m.group(2)), style), text)


def num(x, spec: str = ".2f") -> str:
    """``x`` formatted by the format ``spec`` for prose: a true minus sign (``−0.31``, not
    ``-0.31``) and thousands grouped with a thin space (``12 500``) for a ``,`` in ``spec``;
    ``e``-formats are typeset by :func:`fmt_sci`."""
    if spec.endswith("e"):
        digits = int(spec.strip(".e") or 1)
        return fmt_sci(x, digits)
    text = format(x, spec).replace(",", "\u2009")
    return text.replace("-", _MINUS)


def span(lo, hi, spec: str = ".2f", sep: str = " to ") -> str:
    """``"lo to hi"`` in the format ``spec`` (:func:`num`), or one number when both ends print
    the same (never "between 1.00 and 1.00")."""
    a, b = num(lo, spec), num(hi, spec)
    return a if a == b else f"{a}{sep}{b}"
