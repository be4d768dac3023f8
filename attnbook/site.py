"""The site: the execution table, the staging tree, the audit of the result store, the build.

:func:`stage_site` assembles ``_build/src`` (or ``_build/<edition>/src``): the configuration, the
prose pages, each chapter's executed notebook of the slot shown, the facts of the edition
(:mod:`attnbook.edition`) and the audit of the stored results (:func:`audit_markdown`).
:func:`build_site` renders it strictly with Jupyter Book and replaces the HTML only when that
succeeds. :func:`execution_table` is the table of runs the reproducibility page shows, and
:func:`audit_command` is ``attnbook audit``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import edition as _edition
from .claims import ClaimError, check_claims, claims_markdown
from .layout import BuildError, _atomic_write, _rel, current
from .slots import _load_records, slot_paths


def _stored_notes(chapters: list[str], slots: dict[str, str]) -> list[str]:
    """Notes about stored results (``stored_results`` in the summaries) for the reproducibility page."""
    notes = []
    for chapter in chapters:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            summary = json.loads(slot_paths(chapter, slots.get(chapter, chapter))[1].read_text())
            for name, entry in sorted((summary.get("stored_results") or {}).items()):
                if isinstance(entry, dict) and entry.get("note"):
                    notes.append(f"- `{chapter}` / `{name}`: {entry['note']}")
    return notes


def execution_table(chapters: list[str], records: dict, slots: dict[str, str] | None = None) -> str:
    """Markdown table: chapter, profile, device, wall time, versions, date (+ stored-result notes).

    ``slots`` maps a chapter to the output slot shown (default: the book's own slot).
    """
    slots = slots or {}
    rows = [
        "| chapter | profile | device | wall time (s) | attnlib | torch | executed (UTC) |",
        "| --- | --- | --- | ---: | --- | --- | --- |",
    ]
    for chapter in chapters:
        r = records.get(slots.get(chapter, chapter), {})
        rows.append(
            f"| `{chapter}` | {r.get('profile', '?')} | {r.get('device', '?')} | "
            f"{r.get('wall_s', float('nan')):.1f} | {r.get('attnlib', '?')} | "
            f"{r.get('torch', '?')} | {r.get('date', '?')} |"
        )
    notes = _stored_notes(chapters, slots)
    if notes:
        rows += ["", "Results loaded from the store (`results/`):", "", *notes]
    return "\n".join(rows) + "\n"


def stage_site(chapters: list[str], slots: dict[str, str] | None = None,
               edition: str = "instructor") -> Path:
    """Assemble ``_build/src``: config, prose pages and the executed chapters as pages.

    Each chapter's page is the notebook of its slot in ``slots`` (default: the book's own slot).
    ``edition`` (:mod:`attnbook.edition`): ``"student"`` hides the solutions.
    """
    slots = slots or {}
    root, build = current().root, current().build
    src = build / "src" if edition == "instructor" else build / edition / "src"
    if src.exists():
        shutil.rmtree(src)
    (src / "chapters").mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(root / name, src / name)
    shutil.copytree(
        root / "book", src / "book",
        ignore=shutil.ignore_patterns("_build", "_cache", "runs", "*.ipynb", "*.summary.json"),
    )
    for chapter in chapters:
        notebook = slot_paths(chapter, slots.get(chapter, chapter))[0]
        if not notebook.exists():
            raise BuildError(f"{_rel(notebook)} is missing: execute it first (`attnbook run {chapter}`)")
        shutil.copy2(notebook, src / "chapters" / f"{chapter}.ipynb")
    _edition.stage(src, chapters, _load_records(report=False), slots, edition)
    _atomic_write(src / AUDIT, audit_markdown())
    _atomic_write(src / CLAIMS, claims_page(chapters, slots))
    return src


#: The audit of the result store, staged for the reproducibility page (relative to the staging tree).
AUDIT = Path("book") / "_generated" / "results-audit.md"
#: The table of every chapter's claims, staged for the Claims and evidence page.
CLAIMS = Path("book") / "_generated" / "claims.md"


def claims_page(chapters: list[str], slots: dict[str, str] | None = None) -> str:
    """The Claims and evidence table from the chapters' summaries (:mod:`attnbook.claims`).

    Every claim is checked again here: one whose figure value fails its criterion, whose held-out
    value contradicts it or whose held-out seeds overlap the figure's stops the build
    (:class:`BuildError`, one line naming the chapter and the claim)."""
    slots = slots or {}
    summaries, titles = {}, {}
    for chapter in chapters:
        notebook, summary = slot_paths(chapter, slots.get(chapter, chapter))
        with contextlib.suppress(OSError, ValueError):
            summaries[chapter] = json.loads(summary.read_text())
        with contextlib.suppress(OSError, ValueError, KeyError):
            cells = json.loads(notebook.read_text())["cells"]
            heads = [line[2:].strip() for c in cells if c["cell_type"] == "markdown"
                     for line in "".join(c["source"]).splitlines() if line.startswith("# ")]
            titles[chapter] = heads[0]
    try:
        check_claims(summaries)
    except ClaimError as err:
        raise BuildError(f"a claim is contradicted: {err}") from None
    return claims_markdown(summaries, titles)


def audit_markdown(results_dir: str | Path | None = None) -> str:
    """The table of :func:`attnbook.store.audit` as markdown, for the reproducibility page."""
    from .store import audit, audit_table

    return audit_table(audit(results_dir))


def audit_command(results_dir: str | None = None, log=print) -> int:
    """``attnbook audit``: print the table; 1 when a record is malformed or unreadable, or the
    folder given does not exist, else 0."""
    from .store import audit, audit_table, results_root

    root = results_root(results_dir)
    if results_dir is not None and not Path(results_dir).is_dir():
        print(f"error: {results_dir} is not a folder of stored results", file=sys.stderr)
        return 1
    rows = audit(root)
    log(f"stored results in {_rel(root)}: {len(rows)}")
    log(audit_table(rows).rstrip("\n"))
    bad = [r for r in rows if r["error"]]
    stale = [r for r in rows if not r["error"] and r["code"] != "unchanged"]
    if stale:
        log(f"{len(stale)} produced by code that has changed since (recompute with -p recompute=true)")
    if bad:
        for r in bad:
            print(f"error: {r['result']}: {r['error']}", file=sys.stderr)
        return 1
    return 0


def build_site(chapters: list[str], log=print, slots: dict[str, str] | None = None,
               edition: str = "instructor") -> Path:
    """Render the executed chapters strictly (``--all -W -n --keep-going``); return the HTML dir."""
    src = stage_site(chapters, slots, edition)
    html = _edition.html_dir(current().build, edition)
    out_root = _edition.work_dir(current().build, edition)
    cmd = [
        str(Path(sys.executable).parent / "jupyter-book"), "build", str(src), "--path-output", str(out_root),
        "--all", "-W", "-n", "--keep-going",
    ]
    log("  rendering the site: jupyter-book " + " ".join(cmd[1:]))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        output = proc.stdout + proc.stderr
        problems = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in output.splitlines()
                    if "WARNING" in line or "ERROR" in line]
        first = f": {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "") \
            if problems else ""
        raise BuildError(f"the site build failed{first}; `attnbook build -v` prints jupyter-book's output",
                         "the site build failed:\n" + proc.stdout[-6000:] + proc.stderr[-6000:])
    staged = html.with_name("html.new")
    if staged.exists():
        shutil.rmtree(staged)
    shutil.copytree(out_root / "_build" / "html", staged)
    if html.exists():
        shutil.rmtree(html)
    os.replace(staged, html)
    log(f"  site built in {time.perf_counter() - t0:.1f} s")
    return html
