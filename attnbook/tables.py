"""Single tables of a chapter's ``full`` profile, computed and stored with the chapter's own code.

``attnbook store CHAPTER TABLE ...`` (:func:`store_tables`) computes tables of a chapter's ``full``
profile and stores them in the result store (``results/<chapter>/<table>.csv``, or
``$ATTNLIB_RESULTS_DIR``) without running the whole chapter: it executes the chapter's own code
(its parameter and set-up cells, then, for each table named in order, the statements of the cell
that computes it, up to the call that stores it), so the stored table has exactly the key the
chapter's ``full`` run looks for. A table already stored is loaded instead; name it first when a
later table's cell needs the names its cell binds (:func:`plan_tables` checks this before anything
runs, and names the cell that binds a missing name; a function from a cell that stores nothing
goes in ``defs``, ``--defs`` on the command line). A name with a field (``hmc-sampling-N{N}``)
stands for every table its cell stores.

``points=K`` (``--points K``) stores the first K points only (a partial table, its record says
so); a later ``store`` of a table whose stored copy is partial takes that copy's points over into
the sweep's checkpoint and computes only the rest, so a table too long for one machine is
finished in parts, each a committed file. The CPU seconds a table took (this process and its Dask
workers) are written to ``benchmarks/results/full_runs.json`` (:data:`MEASURED`), which the cost
report of ``benchmarks/full_cost.py`` reads (not for a trial store in another
``$ATTNLIB_RESULTS_DIR``). :mod:`attnbook.slices` recomputes a slice of a stored
table with the same planning; :mod:`attnbook.tables_cli` holds the two command-line verbs.

A table that cannot be planned or stored as asked raises :class:`TableError` (a usage error, one
line) before any of the chapter's code runs; a partial table produced by code that has changed
since raises :class:`ResumeError`.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import re
import time
from pathlib import Path

import numpy as np

from attnlib import ParameterError

__all__ = ["MEASURED", "ResumeError", "TableError", "bound_names", "call_of", "free_names",
           "plain_value", "plan_tables", "record_measured", "store_tables"]

#: the repository (``$ATTNBOOK_ROOT`` moves it, as for the rest of the command line)
ROOT = Path(os.environ.get("ATTNBOOK_ROOT") or Path(__file__).resolve().parent.parent).resolve()
CHAPTERS = ROOT / "chapters"
#: CPU seconds of the ``full`` tables actually computed (read by ``benchmarks/full_cost.py``)
MEASURED = ROOT / "benchmarks" / "results" / "full_runs.json"


class TableError(ParameterError):
    """A table cannot be planned or stored as asked (raised before any of the chapter's code runs)."""


class ResumeError(RuntimeError):
    """A stored partial table cannot be resumed (produced by code that has changed since)."""


def record_measured(chapter: str, table: str, cpu_s: float, wall_s: float | None, how: str,
                    partial: str | None = None, replaces: tuple = (), untimed: str | None = None) -> None:
    """Record the measured cost of ``table`` in :data:`MEASURED` (``benchmarks/results/full_runs.json``,
    which the cost report of ``benchmarks/full_cost.py`` reads); ``replaces``: entries of the
    chapter that this one supersedes (the per-width parts of a table now measured as a whole);
    ``untimed``: what of the table an earlier run computed (the cost is then a lower bound)."""
    measured = json.loads(MEASURED.read_text()) if MEASURED.exists() else {}
    for old in replaces:
        measured.get(chapter, {}).pop(old, None)
    measured.setdefault(chapter, {})[table] = {
        "cpu_s": round(cpu_s, 1), "wall_s": None if wall_s is None else round(wall_s, 1), "how": how,
        **({"partial": partial} if partial else {}), **({"untimed": untimed} if untimed else {}),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, shared with other jobs"}
    MEASURED.parent.mkdir(parents=True, exist_ok=True)
    MEASURED.write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")


def _cpu_tree() -> float:
    """CPU seconds (user + system) of this process and its live descendants (Dask workers)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def call_of(name: str):
    """The call that stores table ``name`` in a chapter's code (``ab.stored_sweep``,
    ``ab.stored_or_compute``, or chapter 3's ``cached``, which wraps the latter)."""
    return re.compile(r'(stored_(sweep|or_compute)|\bcached)\(\s*(#[^\n]*\n\s*)?(run,\s*)?f?"'
                      + re.escape(name) + '"')


def bound_names(tree) -> set[str] | None:
    """Every name a piece of code binds (assignments, imports, defs, arguments, loop and
    comprehension targets, at any depth); ``None`` when it star-imports (its names are unknown)."""
    import ast

    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name == "*":
                    return None
                out.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
    return out


def free_names(tree) -> set[str]:
    """Names a piece of code reads but never binds itself (it needs them from outside)."""
    import ast
    import builtins

    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used - (bound_names(tree) or set()) - set(dir(builtins))


def _definer(cells: list[str], name: str) -> str:
    """Where in a chapter ``name`` is bound at top level: for the error message."""
    import ast

    for i, src in enumerate(cells):
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for st in tree.body:
            if name in (bound_names(ast.Module(body=[st], type_ignores=[])) or set()):
                first = (ast.get_source_segment(src, st) or "").splitlines()[0][:70]
                return f"code cell {i}: `{first}`"
    return "no cell of the chapter"


def plan_tables(chapter: str, names: list[str], defs: tuple = (), extra: tuple = ()):
    """The code ``store`` runs for tables ``names`` of ``chapter``, checked before any of it runs.

    Returns ``(setup, segments)``: the parameter and set-up cells and the cells defining ``defs``
    (source text, in order), and per table the statements of its cell up to the call that stores
    it. A function defined in a named table's own cell, before the call that stores the table, is
    left to that table's statements (its entry in ``setup`` is empty): run whole as a set-up cell,
    the cell would compute the table before its cost is measured. ``extra``: more set-up
    statements (source text), run after the ``defs`` cells. Raises
    :class:`TableError` when a table has no unique storing cell, or when its statements use a
    name that neither the set-up cells nor the tables named before it bind (that error would
    otherwise surface only after the earlier tables had been computed).
    """
    import ast

    import jupytext

    path = CHAPTERS / f"{chapter}.md"
    if not path.exists():
        raise TableError(f"no chapter {chapter!r} (chapters/{chapter}.md)")
    code_cells = [c for c in jupytext.read(path).cells if c.cell_type == "code"]
    cells = [c.source for c in code_cells]
    first = next(i for i, c in enumerate(code_cells) if "parameters" in c.metadata.get("tags", []))
    targets = {}
    for name in names:
        hits = [i for i, src in enumerate(cells) if call_of(name).search(src)]
        if len(hits) != 1:
            raise TableError(f"{chapter}: {len(hits)} cells store a table {name!r} (need exactly one)")
        targets[name] = hits[0]
    def storing_statement(name: str, i: int) -> tuple[ast.Module, int]:
        tree = ast.parse(cells[i])
        return tree, next(k for k, st in enumerate(tree.body)
                          if call_of(name).search(ast.get_source_segment(cells[i], st) or ""))

    setup = [cells[first], cells[first + 1]]
    for fn in defs:
        hits = [i for i, src in enumerate(cells) if re.search(rf"^def {re.escape(fn)}\(", src, re.M)]
        if len(hits) != 1:
            raise TableError(f"{chapter}: {len(hits)} cells define {fn!r} (need exactly one)")
        in_segment = False
        for name, i in targets.items():
            if i == hits[0]:
                tree, upto = storing_statement(name, i)
                in_segment |= any(isinstance(st, ast.FunctionDef) and st.name == fn
                                  for st in tree.body[:upto])
        setup.append("" if in_segment else cells[hits[0]])
    setup.extend(extra)
    known: set[str] | None = {"profile", "scheduler"}  # set by store itself
    for src in setup:
        b = bound_names(ast.parse(src))
        known = None if (b is None or known is None) else known | b
    segments = {}
    for name, i in targets.items():
        tree, upto = storing_statement(name, i)
        segments[name] = ast.Module(body=tree.body[: upto + 1], type_ignores=[])
        if known is None:  # a set-up cell star-imports: its names are unknown, nothing to check
            continue
        missing = sorted(free_names(segments[name]) - known)
        if missing:
            where = "; ".join(f"{m} is bound in {_definer(cells, m)}" for m in missing)
            raise TableError(
                f"{chapter}/{name}: its cell uses {', '.join(missing)}, which neither the parameter, "
                f"set-up and --defs cells nor the tables named before it define ({where}). Name the "
                "table whose cell binds it first, or the function with --defs.")
        known |= bound_names(segments[name]) or set()
    return setup, segments


def routed_stored_sweep(ab):
    """``ab.stored_sweep`` as the chapter's namespace ``ab`` would run it through its own ``sweep``
    and ``stored_or_compute`` (looked up at each call): the store and slice tools wrap those two
    to cut a table to chosen points or to count and seed its checkpoint, and a table made by
    ``ab.stored_sweep`` must meet the same wrappers."""
    from .store import sweep_table_key

    def stored_sweep(run, name, fn, points, *, params=None, scheduler=None, recompute=False):
        return ab.stored_or_compute(
            run, name, lambda: ab.sweep(fn, points, name=name, run=run, scheduler=scheduler),
            params=sweep_table_key(run, points, params), recompute=recompute)

    return stored_sweep


def _first_points(ab, k: int, names) -> dict:
    """Make the sweeps of tables ``names``, and their store keys, hold only the first ``k`` points.

    Patches ``ab.sweep`` and ``ab.stored_or_compute`` in this process (``store --points``); the
    returned dict receives the number of points the chapter asked for (``"of"``). Other tables
    that the cells compute on the way (chapter 4's ``glyphs-theory`` before ``glyphs-pruning``)
    keep all their points and their own key.
    """
    sweep, stored = ab.sweep, ab.stored_or_compute
    asked: dict = {}
    inside: list[str] = []  # the named table being computed, if any

    def sweep_k(fn, points, *args, **kw):
        if not inside:
            return sweep(fn, points, *args, **kw)
        points = list(points)
        asked["of"] = len(points)
        return sweep(fn, points[:k], *args, **kw)

    def stored_k(run, name, compute, params, **kw):
        if name not in names:
            return stored(run, name, compute, params, **kw)
        # a table keyed by its points keeps the first k; one keyed by what it is computed from
        # (chapter 3's: alphas, omegas, configuration) says how many of its points it holds
        key = (dict(params, points=list(params["points"])[:k]) if "points" in params
               else dict(params, first_points=k))

        def compute_k():
            inside.append(name)
            try:
                return compute()
            finally:
                inside.pop()

        return stored(run, name, compute_k, key, **kw)

    ab.sweep, ab.stored_or_compute = sweep_k, stored_k
    return asked


def plain_value(value):
    """A point's or a stored cell's value as compared (:func:`_seed_checkpoint`,
    :func:`attnbook.slices.compare_slice`): integral
    floats as ints (a CSV column with a missing cell reads its integers back as floats)."""
    if isinstance(value, dict):
        return {k: plain_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_value(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _seed_checkpoint(path: Path, points: list[dict], table: Path) -> int:
    """Write the points of the stored partial ``table`` into the sweep checkpoint ``path``.

    A table stored by ``store --points`` is its sweep's output: one row (or several) per point,
    the point's fields followed by what the point returned. Each point of ``points`` that is
    not yet in the checkpoint and whose fields match stored rows gets those rows as its result,
    so the sweep computes only the others. Returns the number of points the sweep will not
    compute: those written and those its checkpoint already held (a stopped run's). A table that
    older code produced is refused: its points would be mixed with the current code's.
    """
    from .store import code_changes, load_result
    from .sweeps import append_checkpoint, point_key, read_checkpoint

    df, record = load_result(table)
    changed = code_changes(record)
    if changed:
        raise ResumeError(f"{table}: stored by code that has changed since ({', '.join(changed)}); "
                         "its points cannot be resumed: move it aside and compute the table again")
    done = read_checkpoint(path)
    stored: dict[tuple, dict[str, list[dict]]] = {}  # point fields -> point key -> rows
    entries, already = [], 0
    for point in points:
        if point_key(point) in done:
            already += 1
            continue
        fields = tuple(point)
        if not set(fields) <= set(df.columns):
            continue
        if fields not in stored:
            by_point: dict[str, list[dict]] = {}
            for rec in df.to_dict("records"):
                rec = {c: (None if isinstance(v, float) and math.isnan(v) else v) for c, v in rec.items()}
                at = point_key(plain_value({f: rec[f] for f in fields}))
                by_point.setdefault(at, []).append({c: v for c, v in rec.items() if c not in fields})
            stored[fields] = by_point
        rows = stored[fields].get(point_key(plain_value(point)))
        if rows:
            entries.append((point, rows))
    return append_checkpoint(path, entries) + already


def _checkpoint_of(fn, args: tuple, kw: dict) -> tuple[str | None, Path | None]:
    """The name and checkpoint file of a call ``ab.sweep(fn, points, *args, **kw)`` (its
    arguments after ``fn`` and ``points``); no file when it names neither a run nor a path."""
    import inspect

    from .sweeps import checkpoint_path, sweep

    bound = inspect.signature(sweep).bind_partial(None, None, *args, **kw).arguments
    name, run, path = bound.get("name"), bound.get("run"), bound.get("path")
    return name, (None if path is None and run is None else checkpoint_path(name, run, path, fn))


def _count_checkpointed(ab) -> dict[str, int]:
    """Patch ``ab.sweep`` in this process to count, per sweep, the points its checkpoint already
    holds when it starts (a stopped run's, or a run's whose table was then moved aside): the sweep
    takes them from there, so their time is not in this run's measurement."""
    from .sweeps import point_key, read_checkpoint

    sweep = ab.sweep
    found: dict[str, int] = {}

    def sweep_counted(fn, points, *args, **kw):
        points = [dict(p) for p in points]
        name, path = _checkpoint_of(fn, args, kw)
        if path is not None:
            done = read_checkpoint(path)
            found[name] = found.get(name, 0) + sum(point_key(p) in done for p in points)
        return sweep(fn, points, *args, **kw)

    ab.sweep = sweep_counted
    return found


def _resume_from_stored(ab, tables: dict[str, Path]) -> dict:
    """Make each sweep named like a stored partial table start from that table's points.

    Patches ``ab.sweep`` in this process (``store`` of a table whose stored copy is partial): the
    points it already holds are written into the sweep's checkpoint first (:func:`_seed_checkpoint`),
    so a table computed in parts, on machines that keep nothing but ``results/``, is finished
    without recomputing them. The returned dict receives, per table, the points taken over.
    """
    sweep = ab.sweep
    seeded: dict[str, int] = {}

    def sweep_resumed(fn, points, *args, **kw):
        points = [dict(p) for p in points]
        name, path = _checkpoint_of(fn, args, kw)
        if name in tables and path is not None:
            seeded[name] = _seed_checkpoint(path, points, tables[name])
        return sweep(fn, points, *args, **kw)

    ab.sweep = sweep_resumed
    return seeded


def _reseal(path: Path, **changes) -> None:
    """Rewrite a stored table's record with ``changes`` (``None`` drops a field), sealed again."""
    from .store import load_result, save_result

    df, record = load_result(path)
    record = {k: v for k, v in dict(record, **changes).items() if v is not None}
    save_result(df, path, {key: v for key, v in record.items() if key not in ("sha256", "json_columns")})


def _mark_partial(path: Path, k: int, of: int, wall_s: float | None) -> str:
    """Reseal a table stored by ``store --points`` with what it holds, and the run's wall time."""
    note = f"the first {k} of the full profile's {of} points"
    _reseal(path, partial=note, **({"wall_s": round(wall_s, 3)} if wall_s else {}))
    return note


def _table_files(chapter: str, name: str) -> list[Path]:
    """The CSV files of stored table ``name``. A name with a ``{field}`` (``hmc-sampling-N{N}``:
    one cell stores a table per width) stands for every stored table it matches."""
    from .store import results_root

    folder = results_root() / chapter
    if "{" not in name:
        return [folder / f"{name}.csv"]
    pattern = re.compile(re.sub(r"\\\{[^}]*\\\}", "[^-/]+", re.escape(name)) + r"\.csv")
    return sorted(p for p in folder.glob("*.csv") if pattern.fullmatch(p.name))


def _measured_name(name: str) -> str:
    """The cost table's name of table ``name``: ``hmc-sampling`` for ``hmc-sampling-N{N}``."""
    return re.sub(r"-?[A-Za-z_]*\{.*$", "", name)


def store_tables(chapter: str, names: list[str], scheduler: str, defs: tuple = (),
                 points: int | None = None, wall_s: float | None = None) -> None:
    """Compute and store tables ``names`` of ``chapter``'s full profile with the chapter's own code.

    ``defs``: names of functions defined in other cells that the tables' cells use; the whole cell
    that defines each is executed first (unless it is a named table's own cell). A name with a
    ``{field}`` stores every table its cell stores (:func:`_table_files`), measured as one.
    Everything is checked (:func:`plan_tables`) before any of the chapter's code runs.
    ``points``: store only the first ``points`` points of each table (its record says so,
    ``partial``; a ``full`` run, whose key holds every point, recomputes it).
    Points already in the sweep's checkpoint, of a run that was stopped, are taken from it; then
    ``wall_s`` gives the wall time of that run, for the record.
    """
    if points is not None and points < 1:
        raise TableError(f"--points {points}: must be at least 1")
    if points is not None and any("{" in name for name in names):
        raise TableError(f"--points: not for tables named by a pattern ({', '.join(names)})")
    from .store import RESULTS_DIR, results_root
    from .sweeps import check_scheduler

    check_scheduler(scheduler)  # a ParameterError (one line) before anything runs
    results = results_root() / chapter
    # a trial store ($ATTNLIB_RESULTS_DIR elsewhere) enters no cost in full_runs.json
    trial = results_root().resolve() != RESULTS_DIR.resolve()
    setup, segments = plan_tables(chapter, names, defs)
    ns: dict = {}
    exec(compile(setup[0], f"{chapter}[parameters]", "exec"), ns)
    ns.update(profile="full", scheduler=scheduler)
    exec(compile(setup[1], f"{chapter}[set-up]", "exec"), ns)
    ns["ab"].stored_sweep = routed_stored_sweep(ns["ab"])
    checkpointed = _count_checkpointed(ns["ab"])
    asked = _first_points(ns["ab"], points, segments) if points else {}
    partial = {}  # stored partial tables: resumed from, then stored again with the points added
    earlier = {}  # their records: the wall time they took already
    for name in segments:
        path = results / f"{name}.csv"
        if path.exists():
            record = json.loads(path.with_suffix(".provenance.json").read_text())
            if record.get("partial"):
                partial[name], earlier[name] = path, record
    seeded = _resume_from_stored(ns["ab"], partial) if partial else {}
    for fn, src in zip(defs, setup[2:], strict=True):
        exec(compile(src, f"{chapter}[def {fn}]", "exec"), ns)
    for name, code in segments.items():
        stored = results / f"{name}.csv"
        # a stored whole table is loaded (a later table's cell may need its names); a partial one
        # is computed again from its points (its key holds fewer points) and the rest
        was = {p: p.stat().st_mtime_ns for p in _table_files(chapter, name) if p.exists()}
        n0 = sum(checkpointed.values())
        c0, t0 = _cpu_tree(), time.perf_counter()
        exec(compile(code, f"{chapter}[{name}]", "exec"), ns)
        cpu, wall = _cpu_tree() - c0, time.perf_counter() - t0
        written = [p.stem for p in _table_files(chapter, name)
                   if p.exists() and was.get(p) != p.stat().st_mtime_ns]
        before = not written
        print(f"{chapter}/{name}: {cpu:.1f} CPU s, {wall:.1f} s wall; "
              f"{'loaded' if before else 'stored: ' + ', '.join(written)}", flush=True)
        how = f"attnbook store, scheduler={scheduler}" + (f", --points {points}" if points else "")
        reused = sum(checkpointed.values()) - n0
        untimed = None
        if reused and name not in partial and not before:
            untimed = f"{reused} points taken from the sweep checkpoint of an earlier run, not timed"
            print(f"{chapter}/{name}: {untimed}", flush=True)
        if name in partial:  # the run's time adds to that of the run that stored the partial table
            taken = seeded.get(name, 0)
            print(f"{chapter}/{name}: {taken} points taken over from the stored partial table "
                  "or the sweep's checkpoint", flush=True)
            before_s = earlier[name].get("wall_s") or 0.0
            wall_s = (wall_s or 0.0) + before_s + wall
            _reseal(stored, wall_s=round(wall_s, 3),
                    resumed=f"{taken} points from earlier runs (the partial table of "
                            f"{earlier[name].get('date')}: {earlier[name]['partial']}, {before_s:.0f} s "
                            "wall; or the sweep's checkpoint), the rest in this run")
            last = json.loads(MEASURED.read_text()).get(chapter, {}).get(name) if MEASURED.exists() else None
            if last:
                cpu, wall = cpu + last["cpu_s"], wall + (last.get("wall_s") or 0.0)
                how = f"{last['how']}; resumed by {how}"
        if not before and points:
            note = _mark_partial(stored, points, asked.get("of", points), wall_s)
            print(f"{chapter}/{name}: {note}", flush=True)
        if not before and trial:
            print(f"{chapter}/{name}: stored in {results}, not results/: its cost is not recorded",
                  flush=True)
        elif not before:
            if "{" in name:
                how += f" (one run for {', '.join(written)})"
            record_measured(chapter, _measured_name(name), cpu, wall, how,
                            partial=None if not points else f"{points} of {asked.get('of')} points",
                            replaces=tuple(written) if "{" in name else (), untimed=untimed)


