"""Claims as records: each headline claim of a chapter with its control and its held-out check.

A chapter states its headline results in words (the intro, the Summary, a theorem's numerical
check). :func:`claim` makes each of them a record in the chapter's ``summary.json``
(``claims``): the measured value, the criterion the sentence asserts (``("<", 0.15)``: "below
0.15"), the control it was compared against and the control's value, and the same quantity
measured on seeds or sizes that the figure does not use (``heldout``), with both sets of seeds or
sizes written out so that their disjointness can be read and is checked. The value is glued
under the claim's name, so the text quotes exactly what is recorded.

A claim whose figure value fails its own criterion, or whose held-out value contradicts it, or
whose held-out seeds overlap the figure's, is recorded as contradicted and reported where it is
made; :func:`check_claims` applies the rule to every summary of the book's pages when the site is
built, which stops until the sentence is rewritten (a summary edited by hand or written by older
code cannot slip through). A run at other sizes or seeds still completes and shows where the
claim fails; a malformed claim raises :class:`ClaimError` at once. :func:`claims_markdown`
renders the book's *Claims and evidence* page: one row per claim.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["ClaimError", "claim", "check_claim", "check_claims", "check_form", "claims_markdown",
           "contradiction", "holds", "unchecked"]

_OPS = {"<": "below", "<=": "at most", ">": "above", ">=": "at least", "between": "between"}


class ClaimError(RuntimeError):
    """A claim contradicted by its own value or by its held-out check, or made without one."""


def holds(criterion: Sequence[Any], value: Any) -> bool:
    """Whether ``value`` satisfies ``criterion``: ``(op, x)`` with op one of ``<``, ``<=``, ``>``,
    ``>=``, or ``("between", lo, hi)`` (inclusive). A value that is not a finite number fails."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return False
    if not math.isfinite(v):
        return False
    op, *bounds = criterion
    if op == "between":
        lo, hi = bounds
        return float(lo) <= v <= float(hi)
    (x,) = bounds
    return {"<": v < x, "<=": v <= x, ">": v > x, ">=": v >= x}[op]


def _criterion_words(criterion: Sequence[Any]) -> str:
    op, *bounds = criterion
    if op == "between":
        return f"between {bounds[0]:g} and {bounds[1]:g}"
    return f"{_OPS[op]} {bounds[0]:g}"


def _as_set(values: Any) -> set:
    if values is None:
        return set()
    if isinstance(values, str | int | float):
        return {values}
    return {v if isinstance(v, str | int | float) else repr(v) for v in values}


def check_form(name: str, record: Mapping[str, Any]) -> None:
    """Raise :class:`ClaimError` when ``record`` lacks a field or its criterion is malformed."""
    for field in ("statement", "criterion", "value", "control", "heldout", "heldout_on", "figure_on"):
        if field not in record:
            raise ClaimError(f"claim {name}: no {field!r}")
    criterion = record["criterion"]
    if (not isinstance(criterion, list | tuple) or not criterion or criterion[0] not in _OPS
            or len(criterion) != (3 if criterion[0] == "between" else 2)):
        raise ClaimError(f"claim {name}: criterion {criterion!r} is not (op, x) or ('between', lo, hi)")


def contradiction(name: str, record: Mapping[str, Any]) -> str | None:
    """Why the evidence contradicts a well-formed claim (one line), or ``None``: its figure value
    fails its criterion, its held-out seeds or sizes overlap the figure's, or its held-out value
    fails the criterion."""
    criterion = record["criterion"]
    if not holds(criterion, record["value"]):
        return (f"claim {name}: the figure's value {record['value']!r} is not "
                f"{_criterion_words(criterion)}; rewrite the claim")
    if record["heldout"] is None:  # not checked on held-out data in this run: listed as such
        return None
    overlap = _as_set(record["figure_on"]) & _as_set(record["heldout_on"])
    if overlap:
        return f"claim {name}: the held-out check reuses the figure's {sorted(overlap)}"
    if not holds(criterion, record["heldout"]):
        return (f"claim {name}: the held-out value {record['heldout']!r} "
                f"({record.get('heldout_what', 'held out')}) is not {_criterion_words(criterion)}: "
                "the held-out run contradicts the claim; rewrite it")
    return None


def check_claim(name: str, record: Mapping[str, Any]) -> None:
    """Raise :class:`ClaimError` (one line naming the claim) unless ``record`` is a well-formed
    claim that its evidence supports (:func:`check_form`, :func:`contradiction`)."""
    check_form(name, record)
    reason = contradiction(name, record)
    if reason:
        raise ClaimError(reason)


def claim(run, name: str, value: float, *, statement: str, criterion: Sequence[Any],
          control: str, control_value: float | None, heldout: float | None, heldout_on: Iterable[Any],
          figure_on: Iterable[Any], heldout_what: str, figure: str | None = None,
          glue: bool = True) -> float:
    """Record the headline claim ``name`` of ``run``'s chapter, check it, and glue its value.

    Parameters
    ----------
    run : attnbook.Run
        The chapter's run context (the claim goes to its summary under ``claims``).
    name : str
        The glue key the text quotes the value by (e.g. ``"ch3-alpha-c"``).
    value : float
        The measured value the figure and the text show.
    statement : str
        The claim in one sentence, as the text makes it.
    criterion : (op, x) or ("between", lo, hi)
        What the statement asserts of the value, e.g. ``("<", 0.15)``.
    control, control_value : str, float or None
        What the value is compared against (random starts, the GP, a shuffled target...) and the
        control's value on the same data.
    heldout : float or None
        The same quantity on seeds or sizes the figure does not use (None: no held-out run in
        this profile, e.g. a ``full`` page whose held-out data is the quick one; the claims page
        then says it was not checked, and the book's tests require one for the book's build).
    heldout_on, figure_on : iterables
        Those seeds or sizes, and the figure's (recorded; they must not overlap).
    heldout_what : str
        In words, what the held-out check is ("seeds 3-5", "the stored d = 1000 run").
    figure : str, optional
        Label of the figure that shows the claim (``fig-ch3-...``), linked from the claims page.

    A claim that its own value, its held-out value or overlapping seeds contradict is recorded
    with the reason (``contradicted``) and reported in one line on stderr; the build of the book's
    site then stops on it (:func:`check_claims`), while a run at other sizes or seeds (a toy
    check, a ``full`` run) still completes and shows where the claim fails. A record missing a
    field raises :class:`ClaimError` at once.
    """
    from .runs import _jsonable

    record = {
        "statement": statement, "criterion": list(criterion), "value": value,
        "control": control, "control_value": control_value, "heldout": heldout,
        "heldout_what": heldout_what, "heldout_on": list(heldout_on), "figure_on": list(figure_on),
        "figure": figure,
    }
    record = _jsonable(record)
    check_form(name, record)  # a malformed claim is a mistake in the chapter: raised at once
    reason = contradiction(name, record)
    if reason:  # a finding: recorded, reported, and the book's site build stops on it
        record["contradicted"] = reason
        print(f"attnbook: {reason}", file=sys.stderr)
    run.records.setdefault("claims", {})[name] = record
    if glue:
        from myst_nb import glue as _glue

        _glue(name, value, display=False)
    return value


def unchecked(summaries: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """``chapter/claim`` of every claim recorded without a held-out value."""
    return [f"{chapter}/{name}" for chapter, summary in summaries.items()
            for name, r in sorted((summary.get("claims") or {}).items()) if r.get("heldout") is None]


def check_claims(summaries: Mapping[str, Mapping[str, Any]]) -> int:
    """Check every claim of every chapter summary (chapter id -> summary); raise
    :class:`ClaimError` naming the chapter and the claim at the first that fails. Returns the
    number of claims checked."""
    n = 0
    for chapter, summary in summaries.items():
        for name, record in sorted((summary.get("claims") or {}).items()):
            try:
                check_claim(name, record)
            except ClaimError as err:
                raise ClaimError(f"{chapter}: {err}") from None
            n += 1
    return n


def _num(value: Any) -> str:
    if value is None:
        return "–"
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if v != 0 and (abs(v) >= 1e4 or abs(v) < 1e-3):
        return f"{v:.2e}".replace("-", "−")
    return f"{v:.3g}".replace("-", "−")


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def claims_markdown(summaries: Mapping[str, Mapping[str, Any]],
                    titles: Mapping[str, str] | None = None) -> str:
    """The *Claims and evidence* table: per chapter (headed by its title from ``titles``, else its
    id), one row per claim (statement, value and criterion, control, held-out result and what it
    was measured on; the figure is linked after the claim, so that four columns fit a phone)."""
    rows = []
    for chapter, summary in summaries.items():
        claims = summary.get("claims") or {}
        if not claims:
            continue
        rows += [f"## {(titles or {}).get(chapter, chapter)}", "",
                 "| claim (figure) | value | control | held out |",
                 "| --- | --- | --- | --- |"]
        for _, r in sorted(claims.items()):
            figure = f" ({{numref}}`{r['figure']}`)" if r.get("figure") else ""
            held = (f"{_num(r['heldout'])} ({_cell(r.get('heldout_what', ''))})"
                    if r["heldout"] is not None else "not checked in this build")
            rows.append(
                f"| {_cell(r['statement'])}{figure} | {_num(r['value'])} "
                f"({_criterion_words(r['criterion'])}) | {_cell(r['control'])}: "
                f"{_num(r.get('control_value'))} | {held} |")
        rows.append("")
    if not rows:
        return "No chapter has recorded a claim yet.\n"
    return "\n".join(rows) + "\n"
