"""A slice of a stored table recomputed with the chapter's current code, and compared.

A table in the result store (``results/<chapter>/<name>.csv``) was produced by the chapter's
``full`` profile at some commit. :func:`recompute_slice` computes a few of its points again (the
cheapest ones, or a nested part of one) with the chapter's own current code, planned as
``attnbook store`` plans the table (:func:`attnbook.tables.plan_tables`), without loading or
writing the table; :func:`compare_slice` compares them with the stored rows, value by value;
:func:`check_slice` does both. ``tests/book/test_stored_slices.py`` runs it for every stored table, and
``attnbook slice CHAPTER TABLE`` for one (:mod:`attnbook.tables_cli`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .tables import TableError, plain_value, plan_tables, routed_stored_sweep

__all__ = ["check_slice", "compare_slice", "recompute_slice"]


def recompute_slice(chapter: str, name: str, pick, defs: tuple = (), shrink: dict | None = None,
                    pre: str | None = None, call: str | None = None, cell: str | None = None,
                    workdir: Path | None = None):
    """Recompute a few points of the stored table ``name`` with the chapter's current code.

    Runs what ``store`` runs for the table (:func:`~attnbook.tables.plan_tables`), in this
    process, but its sweep evaluates only the points ``pick(points)`` returns (their indices in the
    table's list of points), with the fields in ``shrink`` replaced (a shorter list of a nested
    parameter, such as the head counts of one stream of draws, whose rows are a subset of the full
    point's), into a fresh checkpoint under ``workdir``. Nothing is loaded from or written to
    ``results/``: the table's own ``stored_or_compute`` computes, and another table its code needs
    is read from ``results/`` (or left empty).

    A table whose cell does not name it literally is found by ``cell``, the format string that
    names it there (``"hmc-sampling-N{N}"``), or computed by ``call``, a statement run after the
    set-up and ``defs`` cells. ``pre``: statements run before the table's code (the assignments of
    a cell whose other work the table does not need).

    Returns ``(fresh, stored, chosen)``: the table the chapter's code makes of the chosen points,
    the stored table (verified, :func:`attnbook.store.load_result`) and the chosen points. A table
    that is not stored, or a slice that computes none of its points, raises
    :class:`~attnbook.tables.TableError`.
    """
    import ast
    import tempfile

    import pandas as pd

    from .store import load_result, results_root

    results = results_root() / chapter
    if not (results / f"{name}.csv").exists():
        raise TableError(f"{chapter}/{name}: no stored table ({results / name}.csv)")
    stored, _ = load_result(results / f"{name}.csv")
    setup, segments = plan_tables(chapter, [] if call else [cell or name], defs, (pre,) if pre else ())
    code = ast.parse(call) if call else segments[cell or name]
    workdir = Path(workdir or tempfile.mkdtemp(prefix="slice-"))
    ns: dict = {}
    exec(compile(setup[0], f"{chapter}[parameters]", "exec"), ns)
    ns.update(profile="full", scheduler=None)
    exec(compile(setup[1], f"{chapter}[set-up]", "exec"), ns)
    ab = ns["ab"]
    sweep, stored_or_compute, stored_sweep = ab.sweep, ab.stored_or_compute, ab.stored_sweep
    chosen: list[dict] = []
    fresh: list[pd.DataFrame] = []

    def sweep_slice(fn, points, *args, **kw):
        points = [dict(p) for p in points]
        idx = list(pick(points))
        if not idx:
            raise TableError(f"{chapter}/{name}: the slice picks none of its {len(points)} points")
        picked = [dict(points[i], **(shrink or {})) for i in idx]
        chosen.extend(picked)
        kw = dict(kw, path=workdir / f"{name}.jsonl", scheduler=None, progress=False)
        return sweep(fn, picked, *args, **kw)

    def compute_only(run, table, compute, params, **kw):
        if table != name:
            other = results / f"{table}.csv"
            df = load_result(other)[0] if other.exists() else pd.DataFrame()
        elif fresh:  # computed already (by a set-up cell that the call repeats)
            df = fresh[-1]
        else:
            ab.sweep = sweep_slice
            try:
                df = compute()
            finally:
                ab.sweep = sweep
            fresh.append(df)
        df.attrs.update(provenance={"stored": table != name, "stale": False}, note="")
        return df

    ab.stored_or_compute, ab.stored_sweep = compute_only, routed_stored_sweep(ab)
    try:
        for fn, src in zip((*defs, *(["pre"] if pre else [])), setup[2:], strict=True):
            exec(compile(src, f"{chapter}[{fn}]", "exec"), ns)
        exec(compile(code, f"{chapter}[{name}]", "exec"), ns)
    finally:
        ab.stored_or_compute, ab.stored_sweep = stored_or_compute, stored_sweep
    if not chosen or not fresh:
        raise TableError(f"{chapter}/{name}: its code computed no table of the chosen points")
    return fresh[-1], stored, chosen


def _close(a, b, rtol: float, atol: float) -> bool:
    """Stored and recomputed cells equal: numbers (and lists of them) within tolerance, else equal."""
    if isinstance(a, str) or isinstance(b, str):
        return str(a) == str(b)
    if a is None or b is None:
        return (a is None or a != a) and (b is None or b != b)  # None and NaN both mean "none"
    try:
        x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    except (TypeError, ValueError):
        return plain_value(a) == plain_value(b)
    return x.shape == y.shape and bool(np.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True))


def _is_time(column: str) -> bool:
    """A column of wall times, which differ from run to run."""
    return column == "seconds" or column.endswith("_s")


def compare_slice(fresh, stored, chosen: list[dict], on: tuple = (), ignore: tuple = (),
                  rtol: float = 1e-6, atol: float = 1e-9,
                  tol: dict | None = None) -> tuple[int, list[str]]:
    """Compare recomputed rows with the stored rows of the same points.

    Rows are matched on the chosen points' fields that both tables hold, plus ``on``; the rows
    of one key are compared in order, every shared column except ``ignore`` and the wall times
    (``seconds`` and columns ending in ``_s``, such as each point's ``elapsed_s``), within
    ``rtol``, ``atol``, or the ``(rtol, atol)`` that ``tol`` gives a column. Returns
    ``(cells compared, differences)``, each difference naming the key, the column and both values;
    :class:`~attnbook.tables.TableError` when no column identifies the rows.
    """
    keys = sorted({f for p in chosen for f in p if f in fresh.columns and f in stored.columns
                   and f not in ignore} | set(on))
    if not keys:
        raise TableError("no column identifies the recomputed rows in the stored table")
    cols = [c for c in fresh.columns if c in stored.columns and c not in keys and c not in ignore
            and not _is_time(c)]

    from .sweeps import point_key

    def groups(df) -> dict[str, tuple[dict, list[dict]]]:
        out: dict = {}
        for rec in df.to_dict("records"):
            at = {k: plain_value(rec[k]) for k in keys}
            out.setdefault(point_key(at), (at, []))[1].append(rec)
        return out

    have = groups(stored)
    n, diffs = 0, []
    for key, (at, rows) in groups(fresh).items():
        old = have.get(key, (at, []))[1]
        if len(old) != len(rows):
            diffs.append(f"{at}: {len(rows)} rows recomputed, {len(old)} stored")
            continue
        for new_row, old_row in zip(rows, old, strict=True):
            for c in cols:
                n += 1
                if not _close(new_row[c], old_row[c], *(tol or {}).get(c, (rtol, atol))):
                    diffs.append(f"{at} {c}: stored {old_row[c]!r}, now {new_row[c]!r}")
    return n, diffs


def check_slice(chapter: str, name: str, idx=(0,), cmp: dict | None = None,
                workdir: Path | None = None, **spec) -> tuple[int, list[str], list[dict]]:
    """Recompute the points ``idx`` of the stored table ``name`` and compare them with its rows.

    ``idx``: the points' indices in the table's list of points (negative from the end, taken
    modulo the number of points); ``spec``: the other arguments of :func:`recompute_slice`
    (``defs``, ``shrink``, ``pre``, ``call``, ``cell``); ``cmp``: those of :func:`compare_slice`
    (``on``, ``ignore``, ``rtol``, ``atol``, ``tol``). A field that the slice shrinks differs from
    the stored point's by design: it identifies no row and is not compared. Returns ``(values
    compared, differences, the chosen points)``.
    """
    cmp = dict(cmp or {})
    cmp["ignore"] = (*cmp.get("ignore", ()), *(spec.get("shrink") or {}))
    idx = list(idx)
    fresh, stored, chosen = recompute_slice(
        chapter, name, lambda points: [i % len(points) for i in idx], workdir=workdir, **spec)
    n, diffs = compare_slice(fresh, stored, chosen, **cmp)
    return n, diffs, chosen
