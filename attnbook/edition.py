"""Editions of the site and the facts staged beside the chapters (used by :mod:`attnbook.site`).

Two editions render the same executed chapters:

* ``instructor`` (the default): exercises with their solutions folded under each one, in
  ``_build/html``;
* ``student``: the exercise statements only, in ``_build/student/html``. No solution text
  reaches a student by any route: the staged chapter notebooks lose their ``{solution}`` blocks
  (so the page, its ``.ipynb`` download under ``_sources/`` and the search index hold none, and
  sphinx-exercise's ``hide_solutions`` is on as well); the launch buttons open the student twins
  ``book/student/chapters/<id>.ipynb`` (written by ``attnbook sync`` with :func:`strip_solutions`,
  the instructor twins ``chapters/<id>.ipynb`` fold the solutions instead); and the Sphinx tag
  ``student`` is set, so that a page can say which edition it is (``{only} student`` blocks).

Besides the chapters, the staging tree receives ``book/_generated/runtimes.json``: for each
chapter the wall time, profile, device and date of the execution shown on its page, read from
the execution records (the same records as the reproducibility table). The ``chapter-facts``
directive of ``book/_ext/chapterinfo.py`` prints them in each chapter's front matter, so a run
time on a page is never typed in.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

EDITIONS = ("instructor", "student")
#: Where the staged facts live, relative to the staging tree (read by book/_ext/chapterinfo.py).
RUNTIMES = Path("book") / "_generated" / "runtimes.json"
#: The student twins, relative to the repository: the student site's ``path_to_book``
#: (launch buttons open ``<path_to_book>/chapters/<id>.ipynb``).
STUDENT_BOOK = Path("book") / "student"
#: a ``{solution}`` block, fenced with backticks or colons, up to its own closing fence
_SOLUTION = re.compile(r"^(?P<fence>`{3,}|:{3,})\{solution\}[^\n]*\n.*?^(?P=fence)[ \t]*(?:\n|\Z)",
                       re.M | re.S)


def strip_solutions(text: str) -> str:
    """Markdown without its ``{solution}`` blocks (and without the blank lines they leave)."""
    return re.sub(r"\n{3,}", "\n\n", _SOLUTION.sub("", text))


def student_notebook(nb):
    """A copy of the notebook ``nb`` whose Markdown cells hold no solution."""
    import copy

    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:  # a plain dict or an nbformat NotebookNode
        if cell["cell_type"] == "markdown":
            source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            cell["source"] = strip_solutions(source)
    return nb


def check_edition(edition: str) -> str:
    from attnlib._validation import check_choice

    return check_choice("edition", edition, EDITIONS)


def html_dir(build: Path, edition: str) -> Path:
    """The output folder of an edition: ``_build/html`` or ``_build/<edition>/html``."""
    check_edition(edition)
    return build / "html" if edition == "instructor" else build / edition / "html"


def work_dir(build: Path, edition: str) -> Path:
    """Jupyter Book's own output root (``--path-output``) for an edition."""
    return build / "jb" if edition == "instructor" else build / edition / "jb"


def runtimes(chapters: list[str], records: dict, slots: dict[str, str] | None = None) -> dict:
    """``{chapter: {wall_s, profile, device, date}}`` of the slot each page shows."""
    slots = slots or {}
    out = {}
    for chapter in chapters:
        record = records.get(slots.get(chapter, chapter)) or {}
        if "wall_s" in record:
            out[chapter] = {key: record.get(key) for key in ("wall_s", "profile", "device", "date")}
    return out


def stage(src: Path, chapters: list[str], records: dict, slots: dict[str, str] | None,
          edition: str) -> None:
    """Write the staged facts into ``src`` and switch the solutions off for the student edition."""
    import yaml

    check_edition(edition)
    target = src / RUNTIMES
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(runtimes(chapters, records, slots), indent=1, sort_keys=True))
    config_path = src / "_config.yml"
    config = yaml.safe_load(config_path.read_text())
    sphinx_config = config.setdefault("sphinx", {}).setdefault("config", {})
    sphinx_config["hide_solutions"] = edition == "student"
    if edition == "student":
        config["title"] = f"{config.get('title', '')} (student edition)".strip()
        config.setdefault("repository", {})["path_to_book"] = STUDENT_BOOK.as_posix()
        for chapter in chapters:
            path = src / "chapters" / f"{chapter}.ipynb"
            path.write_text(json.dumps(student_notebook(json.loads(path.read_text())), indent=1))
    config_path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
