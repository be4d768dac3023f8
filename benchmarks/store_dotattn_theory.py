"""Chapter 3's theory tables at `full` size, stored in results/ without the chapter's GD runs.

A `full` run of chapter 3 would also run its gradient-descent grids at d = 1000 (tens of CPU hours);
the theory tables alone take minutes. This script executes the chapter's own code -- its
parameter and set-up cells, then the cell that defines the theory tables (``THEORY_KEYS``,
``theory_cached``) without the calls that use them -- and asks for the tables named on the command
line. Each is stored by the chapter's own ``cached`` (``attnlib.stored_or_compute``) under
``results/03-positional-semantic/<name>.csv`` with its provenance, as soon as it is finished and
with exactly the key that the chapter's `full` run looks for (a later `full` run loads it). The
sweeps of the tables run on ``--scheduler`` (default: two local Dask workers) and checkpoint every
finished piece, so an interrupted run resumes.

    .venv/bin/python benchmarks/store_dotattn_theory.py alpha-c alpha-l theory-grid
    .venv/bin/python benchmarks/store_dotattn_theory.py --list
    # a toy check that stores nothing in results/:
    ATTNLIB_RESULTS_DIR=/tmp/store .venv/bin/python benchmarks/store_dotattn_theory.py alpha-c \\
        --sizes '{"ac_omegas": [0.3], "refine_nodes": [10]}'
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = ROOT / "chapters" / "03-positional-semantic.md"
MARK = "def theory_cached("


def _cpu_tree() -> float:
    """CPU seconds (user + system) of this process and its live descendants (Dask workers)."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def chapter_namespace(profile: str, scheduler: str, sizes: dict) -> dict:
    """The chapter's parameter and set-up cells and its theory-table definitions, executed."""
    import jupytext

    cells = [c for c in jupytext.read(CHAPTER).cells if c.cell_type == "code"]
    first = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
    hits = [i for i, c in enumerate(cells) if MARK in c.source]
    if len(hits) != 1:
        raise SystemExit(f"{CHAPTER.name}: {len(hits)} cells define theory_cached (need exactly one)")
    ns: dict = {}
    exec(compile(cells[first].source, "chapter 3 [parameters]", "exec"), ns)
    ns.update(profile=profile, scheduler=scheduler, sizes=sizes)
    exec(compile(cells[first + 1].source, "chapter 3 [set-up]", "exec"), ns)
    src = cells[hits[0]].source
    tree = ast.parse(src)
    # the definitions only: top-level calls (the chapter's own use of the tables) are left out
    body = [st for st in tree.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call))]
    exec(compile(ast.Module(body=body, type_ignores=[]), "chapter 3 [theory tables]", "exec"), ns)
    return ns


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tables", nargs="*", help="table names (see --list)")
    parser.add_argument("--list", action="store_true", help="list the theory tables and exit")
    parser.add_argument("--profile", default="full", choices=("quick", "full"))
    parser.add_argument("--scheduler", default="local:2",
                        help="where the sweeps run: serial, local, local:<n> or tcp://host:port")
    parser.add_argument("--sizes", default="{}", help="replace entries of the profile's sizes (JSON)")
    args = parser.parse_args(argv)
    sizes = json.loads(args.sizes)
    ns = chapter_namespace(args.profile, args.scheduler, sizes)
    known = list(ns["THEORY_KEYS"])
    if args.list or not args.tables:
        print("theory tables of chapter 3:", ", ".join(known))
        return 0
    unknown = [t for t in args.tables if t not in known]
    if unknown:
        raise SystemExit(f"unknown table(s) {unknown}; known: {known}")
    for name in args.tables:
        c0, t0 = _cpu_tree(), time.perf_counter()
        df = ns["theory_cached"](name)
        prov = df.attrs.get("provenance", {})
        print(f"{name}: {len(df)} rows, {_cpu_tree() - c0:.1f} CPU s (this process and live workers), "
              f"{time.perf_counter() - t0:.1f} s wall; "
              f"{'loaded from' if prov.get('stored') else 'stored in'} results/ "
              f"({ns['run'].profile} profile)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
