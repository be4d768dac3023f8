"""``attnbook``: execute the chapters with papermill and build the site with Jupyter Book.

Commands::

    attnbook build [-p name=value ...]      execute changed chapters, then build the HTML
                  [--edition student]      (student: exercises without solutions, _build/student/html)
                  [--scheduler local]      every chapter's sweeps on Dask (as for run)
    attnbook run CHAPTER [-p name=value]    execute one chapter (e.g. -p profile=full -p seed=1)
                 [--scheduler local]       its sweeps on Dask: local, local:N or tcp://host:port
    attnbook list                           every output slot, whether it is current and why not
    attnbook audit [--results DIR]          every stored result in results/: commit, date, device,
                                            wall time, code changed since; exit 1 if one is unreadable
    attnbook sync                           rewrite the outputless chapters/*.ipynb from chapters/*.md
    attnbook clean [--stale] [--slot NAME]  remove executed chapters, caches and the built site
                                            (--stale: only checkpoints and leftovers no run needs;
                                            --slot: one slot's outputs, record and checkpoints)
    attnbook store CHAPTER TABLE ...        compute and store single tables of a chapter's full
                   [--defs FN] [--points K] profile with its own code (attnbook.tables_cli)
    attnbook slice CHAPTER TABLE [--idx I]  recompute a few points of a stored table with the current
                                            code and compare them; exit 1 if a value differs

Parameters are checked before a kernel starts, against the chapter's parameters cell (types from
the defaults, as papermill reads them) and the checks the chapter declares (see
:func:`attnbook.params.chapter_checks`). A run with the default parameters writes the book's slot
``book/chapters/<id>.ipynb`` and ``<id>.summary.json``; any other run writes its own slot
``book/chapters/runs/<id>@<name>=<value>,.../``. A chapter executes into a temporary folder and
its outputs replace the previous ones only when it succeeds, so a failed or interrupted run keeps
the last good output (and the sweep points it finished, from which the next run resumes).

A slot is re-executed only when its cache key changes: a hash of the chapter source, the code of
the attnlib modules it imports (syntax trees without docstrings, so comments and formatting do
not count), the parameters, the pinned dependencies (``constraints.txt``), the device used and
the chapter's stored paper-scale tables (``results/<id>/``, which a quick page draws).
The site is rendered from a staging tree ``_build/src`` in which each chapter's page is its
executed notebook, so a page ``chapters/<id>`` has the committed, outputless
``chapters/<id>.ipynb`` as its launch target. ``$ATTNBOOK_ROOT`` moves the whole tree (chapters,
outputs, caches) elsewhere, e.g. for tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from attnlib._validation import ParameterError

from . import checkpoints as _checkpoints
from . import edition as _edition
from . import tables_cli as _tables_cli
from .execute import _saved_points, execute_chapter
from .layout import BuildError, Interrupted, Lock, _atomic_write, _read_chapter, _rel, current
from .params import (
    Parameter,
    default_parameters,
    parameter_schema,
    parse_parameters,
    toc_chapters,
    validate_parameters,
)
from .site import audit_command, build_site, execution_table
from .slots import _load_records, _prepare, _update_records, slot_paths, stale_reasons


def build(params: dict | None = None, force: bool = False, site: bool = True, log=print,
          wait: bool = True, edition: str = "instructor") -> dict:
    """Execute every chapter of the table of contents (cached), then build the site.

    ``edition="student"`` renders the exercises without their solutions into
    ``_build/student/html`` (:mod:`attnbook.edition`).

    One build per checkout at a time: a second one waits for the first (saying so), or with
    ``wait=False`` stops at once. Every chapter's parameters are checked before any executes.
    """
    chapters = toc_chapters()
    _edition.check_edition(edition)
    for chapter in chapters:  # refuse bad parameters before the first kernel starts
        nb = _read_chapter(chapter)
        validate_parameters(chapter, params or {}, default_parameters(nb), nb=nb)
    with Lock("build", "another attnbook build in this checkout", wait=wait, log=log):
        t0 = time.perf_counter()
        records = {}
        for i, chapter in enumerate(chapters, 1):
            log(f"[{i}/{len(chapters)}] {chapter}  (elapsed {time.perf_counter() - t0:.0f} s)")
            records[chapter] = execute_chapter(chapter, params, force=force, log=log)
        n_run = sum(r["executed"] for r in records.values())
        log(f"{n_run} of {len(chapters)} chapters executed, {len(chapters) - n_run} unchanged")
        slots = {chapter: r.get("slot", chapter) for chapter, r in records.items()}
        if any(slot != chapter for chapter, slot in slots.items()):
            log("non-default parameters: the outputs are in their own slots (book/chapters/runs/), "
                "and the site is built from them; the book's default slots are untouched")
        table = execution_table(chapters, _load_records(), slots)
        _atomic_write(current().table, table)
        log("\n" + table)
        if site:
            html = build_site(chapters, log=log, slots=slots, edition=edition)
            log(f"open {html / 'index.html'}")
    return records


def list_slots(log=print) -> list[dict]:
    """Every output slot (the book's default ones and every other recorded run) with its state;
    a slot being executed now says so."""
    records = _load_records()
    rows = []
    toc = toc_chapters()
    slots = [(ch, ch, None) for ch in toc]
    for slot, record in sorted(records.items()):
        chapter = record.get("chapter") or slot.split("@", 1)[0]
        if slot != chapter:
            slots.append((chapter, slot, record.get("params")))
    cache = current().cache
    sweeps = cache / "sweeps"
    for folder in sorted(sweeps.iterdir()) if sweeps.exists() else []:
        chapter = folder.name.split("@", 1)[0]
        if folder.name in records or folder.name == chapter:
            continue
        with contextlib.suppress(OSError, ValueError):  # a run that failed or was interrupted
            slots.append((chapter, folder.name, json.loads((folder / "params.json").read_text())))
    for chapter, slot, params in slots:
        key = None
        try:
            _nb, _merged, _slot, inputs, key = _prepare(chapter, params)
            reasons = stale_reasons(chapter, slot, key, inputs, records)
        except (ParameterError, BuildError, OSError, SyntaxError) as err:
            reasons = [f"cannot check: {str(err).splitlines()[0]}"]
        state = "current" if not reasons else "needs execution: " + "; ".join(reasons)
        if _busy(slot):
            state = "executing now; " + state
        points = _saved_points(cache / "sweeps" / slot) if reasons else 0
        if points:
            state += f" ({points} finished sweep points saved)"
        where = _rel(slot_paths(chapter, slot)[0])
        rows.append({"slot": slot, "state": state, "notebook": where})
        log(f"{slot:34s} {state}" + ("" if slot == chapter else f"  [{where}]"))
    return rows


def _busy(slot: str) -> bool:
    """True while another process holds the lock of ``slot`` (it is executing)."""
    try:
        with Lock(f"slot-{slot}", "", wait=False, log=lambda *_: None):
            return False
    except BuildError:
        return True


def _executing() -> list[str]:
    """The slots being executed now (their lock is held by another process)."""
    locks = current().cache / "locks"
    names = sorted(p.stem[len("slot-"):] for p in locks.glob("slot-*.lock")) if locks.exists() else []
    return [slot for slot in names if _busy(slot)]


def clean_slot(slot: str, log=print) -> None:
    """``attnbook clean --slot NAME``: remove one slot's executed notebook, summary, execution
    record, sweep checkpoints and logs, nothing else. Refused in one line while the slot executes
    or when no such slot exists (``attnbook list`` names them)."""
    chapter = slot.split("@", 1)[0]
    cache = current().cache
    notebook, summary = slot_paths(chapter, slot)
    parts = [notebook, summary, cache / "sweeps" / slot, *sorted((cache / "logs").glob(f"{slot}.*"))]
    if slot != chapter:
        parts.append(notebook.parent)
    if slot not in _load_records(report=False) and not any(p.exists() for p in parts):
        raise ParameterError(f"--slot {slot!r}: no such output slot here (`attnbook list` names them)")
    with Lock(f"slot-{slot}", f"an execution of {slot}", wait=False, log=log):
        for path in parts:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif path.exists():
                path.unlink()
            else:
                continue
            log(f"removed {_rel(path)}")
        _update_records(slot, None)
    log(f"{slot}: its outputs, record and checkpoints are removed; the next run executes it afresh")


def clean(stale: bool = False, log=print) -> None:
    """Remove the executed chapters, caches and the site; with ``stale`` only what no run needs.

    ``stale=True`` removes a slot's sweep checkpoints that neither its last successful execution
    nor a later one used (:func:`attnbook.checkpoints.stale_paths`), and temporary folders of
    runs that have ended.
    """
    cache = current().cache
    if not stale:
        running = _executing()
        if running:
            raise BuildError(f"{', '.join(running)} {'is' if len(running) == 1 else 'are'} being executed; "
                             "clean removes outputs and checkpoints a run needs: try again when it has "
                             "finished (`attnbook clean --stale` is safe meanwhile)")
        with Lock("build", "an attnbook build in this checkout", wait=False, log=log):
            for path in (current().executed, cache, current().build):
                if path.exists():
                    shutil.rmtree(path)
                    log(f"removed {_rel(path)}")
        return
    removed = 0
    for folder in sorted((cache / "sweeps").glob("*")) if (cache / "sweeps").exists() else []:
        if _busy(folder.name):
            log(f"kept {_rel(folder)}: {folder.name} is being executed")
            continue
        for old in _checkpoints.stale_paths(folder):
            shutil.rmtree(old) if old.is_dir() else old.unlink()
            removed += 1
            log(f"removed {_rel(old)}")
    for work in sorted((cache / "work").glob("*")) if (cache / "work").exists() else []:
        pid = work.name.rsplit(".", 1)[-1]
        alive = pid.isdigit() and Path(f"/proc/{pid}").exists()
        if not alive:
            shutil.rmtree(work, ignore_errors=True)
            removed += 1
            log(f"removed {_rel(work)}")
    for sockets in sorted(Path(tempfile.gettempdir()).glob("attnbook-*-*")):  # kernels of ended runs
        pid = sockets.name.split("-")[1]
        if sockets.is_dir() and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(sockets, ignore_errors=True)
            removed += 1
            log(f"removed {sockets}")
    for tmp in sorted(cache.rglob(".*.tmp")) if cache.exists() else []:  # a write cut short (a full disk)
        pid = tmp.name.rsplit(".", 2)[-2]
        if not (pid.isdigit() and Path(f"/proc/{pid}").exists()):
            tmp.unlink(missing_ok=True)
            removed += 1
            log(f"removed {_rel(tmp)}")
    for old in sorted(cache.glob("*.partial.ipynb")) + sorted(cache.glob("*.input.ipynb")) \
            + sorted(cache.glob("*.progress.log")):
        old.unlink()
        removed += 1
        log(f"removed {_rel(old)}")
    log(f"{removed} stale item{'s' * (removed != 1)} removed; outputs and current checkpoints kept")


def sync(log=print) -> list[Path]:
    """Write ``chapters/<id>.ipynb`` (no outputs) from each ``chapters/<id>.md``, and its student
    twin ``book/student/chapters/<id>.ipynb`` (no solutions; what the student site launches).

    Each notebook runs and reads in plain Jupyter or Colab (:func:`attnbook.colab.twin_notebook`:
    install cell, macros, MyST roles and blocks as Markdown).
    """
    import jupytext

    from . import colab as _colab
    from . import edition as _edition

    written = []
    students = current().root / _edition.STUDENT_BOOK / "chapters"
    students.mkdir(parents=True, exist_ok=True)
    for md in sorted(current().chapters.glob("*.md")):
        source = jupytext.read(md)
        for target, nb in ((md.with_suffix(".ipynb"), source),
                           (students / f"{md.stem}.ipynb", _edition.student_notebook(source))):
            nb = _colab.twin_notebook(current().root, md.stem, nb)
            for i, cell in enumerate(nb.cells):
                cell.id = f"cell-{i:03d}"  # stable ids: re-syncing an unchanged chapter changes nothing
            jupytext.write(nb, target, fmt="ipynb")
            written.append(target)
            log(f"wrote {_rel(target)}")
    return written


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints the usage as well)
        words = self.prog.split()  # "attnbook" or "attnbook <command>"
        self.exit(2, f"error: {message} (see `{' '.join(['attnbook', *words[1:]])} --help`)\n")


def _sigterm(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 done, 1 a chapter or the site failed, 2 a usage error, 130 interrupted."""
    parser = _Parser(prog="attnbook", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p_build = sub.add_parser("build", help="execute changed chapters and build the site")
    p_build.add_argument("-p", "--param", action="append", metavar="NAME=VALUE")
    p_build.add_argument("--force", action="store_true", help="re-execute every chapter")
    p_build.add_argument("--no-site", action="store_true", help="execute only, skip the HTML")
    p_build.add_argument("--scheduler", metavar="WHERE",
                         help="where the chapters' sweeps run: serial (default), local, local:N or "
                              "tcp://host:port (Dask)")
    p_build.add_argument("--edition", choices=_edition.EDITIONS, default="instructor",
                         help="instructor (default): solutions folded under each exercise, in "
                              "_build/html; student: exercises without solutions, in _build/student/html")
    p_build.add_argument("--no-wait", action="store_true",
                         help="stop at once if another build of this checkout is running")
    p_build.add_argument("-v", "--verbose", action="store_true",
                         help="on failure print the failing cell's traceback or jupyter-book's output too")
    p_run = sub.add_parser("run", help="execute one chapter")
    p_run.add_argument("chapter")
    p_run.add_argument("-p", "--param", action="append", metavar="NAME=VALUE")
    p_run.add_argument("--force", action="store_true")
    p_run.add_argument("--no-wait", action="store_true",
                       help="stop at once if the same slot is being executed")
    p_run.add_argument("-v", "--verbose", action="store_true",
                       help="on failure print the failing cell and its traceback too")
    p_run.add_argument("--scheduler", metavar="WHERE",
                       help="where the chapter's sweeps run: serial (default), local (a Dask "
                            "LocalCluster on this machine), local:N, or tcp://host:port")
    sub.add_parser("list", help="every output slot, whether it is current and why not")
    sub.add_parser("sync", help="write outputless chapters/*.ipynb from chapters/*.md")
    p_audit = sub.add_parser("audit", help="every stored result: commit, date, device, wall time, "
                                           "whether its code changed since")
    p_audit.add_argument("--results", metavar="DIR", help="the result store (default: results/)")
    p_clean = sub.add_parser("clean", help="remove executed chapters, caches and the site")
    p_clean.add_argument("--slot", metavar="NAME",
                         help="only this slot's outputs, record and checkpoints (names: attnbook list)")
    p_clean.add_argument("--stale", action="store_true",
                         help="remove only old sweep checkpoints and leftovers of ended runs")
    _tables_cli.add_commands(sub)
    args = parser.parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _sigterm)
    try:
        if args.command == "build":
            params = _cli_params(toc_chapters(), args.param)
            if args.scheduler is not None:
                params["scheduler"] = args.scheduler
            build(params, force=args.force,
                  site=not args.no_site, wait=not args.no_wait, edition=args.edition)
        elif args.command == "run":
            params = _cli_params([args.chapter], args.param)
            if args.scheduler is not None:
                params["scheduler"] = args.scheduler
            execute_chapter(args.chapter, params, force=args.force, wait=not args.no_wait)
        elif args.command == "list":
            list_slots()
        elif args.command == "sync":
            sync()
        elif args.command == "audit":
            return audit_command(args.results)
        elif args.command == "clean":
            if args.slot is not None:
                clean_slot(args.slot)
            else:
                clean(stale=args.stale)
        elif args.command in _tables_cli.COMMANDS:
            return _tables_cli.run_command(args)
    except ParameterError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk, a folder without write permission: one line, not a traceback
        where = f" ({_rel(Path(err.filename))})" if getattr(err, "filename", None) else ""
        print(f"error: {err.strerror or err}{where}; the last good output is kept "
              "(free space or fix the permission and run again)", file=sys.stderr)
        return 1
    except Interrupted as err:
        print(f"interrupted: {err}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("interrupted: nothing was replaced", file=sys.stderr)
        return 130
    except BuildError as err:
        if getattr(args, "verbose", False):
            print(err.details, file=sys.stderr)
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _cli_params(chapters: list[str], pairs: list[str] | None) -> dict:
    """Parse ``-p`` values by the parameter types of ``chapters`` (a usage error exits 2)."""
    schema: dict[str, Parameter] = {}
    for chapter in chapters:
        for name, p in parameter_schema(_read_chapter(chapter)).items():
            schema.setdefault(name, p)
    return parse_parameters(pairs, schema)


if __name__ == "__main__":
    sys.exit(main())
