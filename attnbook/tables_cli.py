"""The command-line verbs ``attnbook store`` and ``attnbook slice``.

::

    attnbook store CHAPTER TABLE [TABLE ...]   compute and store single tables of the chapter's full
                   [--scheduler local:1]       profile with its own code (attnbook.tables)
                   [--defs FN ...] [--points K] [--wall-s S]
    attnbook slice CHAPTER TABLE [--idx I ...] recompute a few points of a stored table with the
                   [--defs FN ...] [--cell PATTERN] [--call STATEMENT] [--pre STATEMENTS]
                   [--shrink FIELD=JSON ...]   chapter's current code and compare them with the
                   [--on COL ...] [--ignore COL ...] [--rtol R] [--atol A] [--tol COL=RTOL,ATOL ...]
                                               stored rows (attnbook.slices)

Self-contained, so that any ``attnbook`` parser can carry the verbs: :func:`add_commands` adds
them to its subparsers and :func:`run_command` runs one, returning the exit status: 0 done; 1 a
failure (a stored table unreadable or not resumable, points of a sweep failed, a recomputed value
differs from the stored one); 2 a usage error (an unknown chapter or table, a name a table's code
needs and no cell named binds, a bad option value). Errors are one line on stderr.
"""

from __future__ import annotations

import json
import sys
import tempfile

#: the verbs this module adds
COMMANDS = ("store", "slice")


def add_commands(subparsers) -> None:
    """Add ``store`` and ``slice`` to ``subparsers`` (of ``argparse``'s ``add_subparsers``)."""
    st = subparsers.add_parser(
        "store", help="compute and store single tables of a chapter's full profile",
        description="Compute and store tables of CHAPTER's full profile in results/<chapter>/ (or "
                    "$ATTNLIB_RESULTS_DIR) with the chapter's own code, without running the rest "
                    "of the chapter; a table already stored is loaded. Everything is checked "
                    "before any of the chapter's code runs.")
    st.set_defaults(table_command="store")
    st.add_argument("chapter", metavar="CHAPTER", help="e.g. 01-random-features")
    st.add_argument("names", nargs="+", metavar="TABLE",
                    help="tables, in order (a name with a field, hmc-sampling-N{N}, stands for "
                         "every table its cell stores)")
    st.add_argument("--scheduler", default="local:1", metavar="WHERE",
                    help="where the sweeps run: serial, local, local:N (default local:1) or "
                         "tcp://host:port")
    st.add_argument("--defs", nargs="*", default=[], metavar="FN",
                    help="functions from other cells the tables need")
    st.add_argument("--points", type=int, default=None,
                    help="store only the first POINTS points of each table (a partial table)")
    st.add_argument("--wall-s", type=float, default=None,
                    help="with --points: wall time of the stopped run whose checkpoint holds them")

    sl = subparsers.add_parser(
        "slice", help="recompute a few points of a stored table and compare them",
        description="Recompute a few points of the stored table results/<chapter>/<table>.csv "
                    "with the chapter's current code (nothing is stored) and compare them with "
                    "the stored rows, value by value (wall times aside). Exit 1 if one differs.")
    sl.set_defaults(table_command="slice")
    sl.add_argument("chapter", metavar="CHAPTER")
    sl.add_argument("name", metavar="TABLE")
    sl.add_argument("--idx", type=int, nargs="+", default=[0], metavar="I",
                    help="indices of the points to recompute in the table's list of points "
                         "(negative from the end; default 0)")
    sl.add_argument("--defs", nargs="*", default=[], metavar="FN",
                    help="functions from other cells the table needs")
    sl.add_argument("--cell", help="the format string that names the table in its cell "
                                   "(hmc-sampling-N{N})")
    sl.add_argument("--call", metavar="STATEMENT",
                    help="a statement that computes the table, run after the set-up and --defs cells")
    sl.add_argument("--pre", metavar="STATEMENTS", help="statements run before the table's code")
    sl.add_argument("--shrink", action="append", default=[], metavar="FIELD=JSON",
                    help="replace a field of the chosen points (a shorter list of a nested parameter)")
    sl.add_argument("--on", nargs="*", default=[], metavar="COL",
                    help="more columns that identify a row")
    sl.add_argument("--ignore", nargs="*", default=[], metavar="COL", help="columns not compared")
    sl.add_argument("--rtol", type=float, default=1e-6)
    sl.add_argument("--atol", type=float, default=1e-9)
    sl.add_argument("--tol", action="append", default=[], metavar="COL=RTOL,ATOL",
                    help="a column's own tolerances")


def run_command(args) -> int:
    """Run the verb ``args`` holds (parsed by a parser :func:`add_commands` extended)."""
    from attnlib import ParameterError

    from .store import StoredResultError
    from .sweeps import SweepError
    from .tables import ResumeError

    try:
        if args.table_command == "store":
            from .tables import store_tables

            store_tables(args.chapter, args.names, args.scheduler, tuple(args.defs), args.points,
                         args.wall_s)
            return 0
        return _slice(args)
    except ParameterError as err:  # attnbook.tables.TableError among them
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (ResumeError, StoredResultError, SweepError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def _pairs(values: list[str], option: str, parse) -> dict:
    """``NAME=VALUE`` options as a dict, each value read by ``parse``; a usage error otherwise."""
    from .tables import TableError

    out = {}
    for item in values:
        key, eq, value = item.partition("=")
        try:
            if not (key and eq):
                raise ValueError("not NAME=VALUE")
            out[key] = parse(value)
        except ValueError as err:
            raise TableError(f"{option} {item!r}: {err}") from None
    return out


def _tolerances(text: str) -> tuple[float, float]:
    rtol, comma, atol = text.partition(",")
    if not comma:
        raise ValueError("needs RTOL,ATOL")
    return float(rtol), float(atol)


def _slice(args) -> int:
    from .slices import check_slice

    spec = dict(defs=tuple(args.defs), cell=args.cell, call=args.call, pre=args.pre,
                shrink=_pairs(args.shrink, "--shrink", json.loads) or None)
    cmp = dict(on=tuple(args.on), ignore=tuple(args.ignore), rtol=args.rtol, atol=args.atol,
               tol=_pairs(args.tol, "--tol", _tolerances))
    table = f"{args.chapter}/{args.name}"
    with tempfile.TemporaryDirectory(prefix="slice-") as workdir:
        n, diffs, chosen = check_slice(args.chapter, args.name, args.idx, cmp, workdir, **spec)
    print(f"{table}: {len(chosen)} points recomputed, {n} values compared, {len(diffs)} differ",
          flush=True)
    for line in diffs[:20]:
        print(f"  {line}")
    if len(diffs) > 20:
        print(f"  ... and {len(diffs) - 20} more")
    if not n:
        print(f"error: {table}: no value of the recomputed slice is in the stored table", file=sys.stderr)
        return 1
    if diffs:
        print(f"error: {table}: {len(diffs)} of {n} recomputed values differ from the stored table "
              "(a changed chapter or model: recompute the table with attnbook store)", file=sys.stderr)
        return 1
    return 0
