"""Facts of a chapter computed at build time (a local Sphinx extension).

The directive ``chapter-facts`` (no arguments, no content) in a chapter's front-matter box
becomes one line: the estimated reading time and the wall time of the execution shown on the
page::

    ```{chapter-facts}
    ```

* Reading time: the words of the prose (code cells and their outputs excluded) at 200 words per
  minute, plus half a minute per display equation and per figure, rounded up to 5 minutes.
* Run time: read from ``book/_generated/runtimes.json``, which ``attnbook`` stages from the
  execution records (the same records as the reproducibility page's table), so the number on the
  page and the one in the table are one number from one source.

The directive ``run-times`` (e.g. on How to use this book) becomes one sentence with the run
time of every chapter's execution shown in this build, from the same file.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.util.docutils import SphinxDirective

RUNTIMES = Path("book") / "_generated" / "runtimes.json"
WORDS_PER_MINUTE = 200
_WORD = re.compile(r"[A-Za-z0-9][\w'’-]*")


class Placeholder(SphinxDirective):
    """A placeholder paragraph (class and flag: the directive's name), filled in once the whole
    page has been read (:func:`_fill`, :func:`_run_times`)."""

    has_content = False

    def run(self):
        para = nodes.paragraph(classes=[self.name])
        para[self.name] = True
        return [para]


def _placeholders(doctree, name: str) -> list:
    return [p for p in doctree.findall(nodes.paragraph) if p.get(name)]


def _runtimes(app) -> dict:
    """The staged run times of every chapter (``{}`` when none were staged)."""
    path = Path(app.srcdir) / RUNTIMES
    if not path.exists():
        return {}
    app.env.note_dependency(str(path))
    return json.loads(path.read_text())


def _run_times(app, doctree):
    placeholders = _placeholders(doctree, "run-times")
    if not placeholders:
        return
    records = _runtimes(app)
    for para in placeholders:
        if not records:
            para += nodes.Text("No execution of the chapters was recorded for this build.")
            continue
        parts = [f"chapter {int(ch[:2])}, {_duration(r['wall_s'])} ({r.get('profile', '?')})"
                 for ch, r in sorted(records.items()) if ch[:2].isdigit() and "wall_s" in r]
        devices = sorted({r.get("device", "?") for r in records.values()})
        slowest = max(r["wall_s"] for r in records.values() if "wall_s" in r)
        para += nodes.Text(
            f"The executions shown in this build took {'; '.join(parts)}, on {', '.join(devices)}: "
            f"the slowest {_duration(slowest)} (from the execution records, as on the "
            "Reproducibility page).")


def _in_code(node) -> bool:
    parent = node.parent
    while parent is not None:
        if isinstance(parent, nodes.literal_block | nodes.math_block | nodes.raw | nodes.comment):
            return True
        if isinstance(parent, nodes.container) and "cell" in parent.get("classes", []):
            return True
        parent = parent.parent
    return False


def reading_minutes(doctree) -> int:
    """Estimated reading time (minutes, a multiple of 5) of the prose of ``doctree``."""
    words = sum(len(_WORD.findall(t.astext())) for t in doctree.findall(nodes.Text) if not _in_code(t))
    equations = sum(1 for _ in doctree.findall(nodes.math_block))
    figures = sum(1 for _ in doctree.findall(nodes.figure))
    figures += sum(1 for n in doctree.findall(nodes.container)
                   if any(c.startswith("glue") for c in n.get("classes", [])))
    minutes = words / WORDS_PER_MINUTE + 0.5 * (equations + figures)
    return max(5, 5 * math.ceil(minutes / 5))


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min"


def _fill(app, doctree):
    placeholders = _placeholders(doctree, "chapter-facts")
    if not placeholders:
        return
    docname = app.env.docname
    record = _runtimes(app).get(docname.rsplit("/", 1)[-1]) or {}
    minutes = reading_minutes(doctree)
    for para in placeholders:
        para += nodes.strong("Time. ", "Time. ")
        para += nodes.Text(f"About {minutes} minutes to read. ")
        if record:
            para += nodes.Text(
                f"Executing it with the {record.get('profile', '?')} profile took "
                f"{_duration(record['wall_s'])} on {record.get('device', '?')}, on "
                f"{record.get('date', '?')} UTC (see "
            )
        else:
            para += nodes.Text("The run time of this page's execution was not recorded (see ")
        xref = addnodes.pending_xref("", refdomain="std", reftype="doc",
                                     reftarget="/book/reproducibility", refexplicit=True,
                                     refdoc=docname)
        xref += nodes.inline("Reproducibility", "Reproducibility")
        para += xref
        para += nodes.Text(").")


def setup(app):
    app.add_directive("chapter-facts", Placeholder)
    app.add_directive("run-times", Placeholder)
    app.connect("doctree-read", _fill)
    app.connect("doctree-read", _run_times)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
