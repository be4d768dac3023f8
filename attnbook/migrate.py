"""One-time migrations of the stored provenance records (``results/<chapter>/<name>.provenance.json``).

A record lists the code hash of every :mod:`attnlib` module its chapter computes with (``code``);
:func:`attnbook.store.code_changes` compares them with the files now. When the package layout
changes without changing a number, the records must follow, or every stored table reads as
"produced by older code". A migration rewrites the module lists, never a table, and only after
checking that each record was current before the change; it notes itself in the record
(``migrations``: name, date, the commit it started from, the entries removed and changed) and
reseals it. What makes a migration acceptable is not this code but the stored-slice test
(``tests/book/test_stored_slices.py``), which recomputes a slice of every migrated table with the
current code and compares it with the stored rows.

``machinery-split`` (2026-12-05). The book's machinery (``book.py``, ``_runtime.py``,
``_store.py``, ``_sweep.py``, ``_colab.py``, ``_edition.py``, ``_chapter_params.py``, ``_repo.py``,
``fmt.py``, ``plotting.py``) moved from ``attnlib/`` to the package :mod:`attnbook`; ``attnlib/``
keeps the science only, and a chapter's code now lists the science modules it imports (not
``attnlib/__init__.py``, which only re-exports, and not another chapter's model: chapter 4's
records listed ``attnlib/dotattn/*`` through the old parameter-check module). The move changed
two science files, each by imports only: ``attnlib/__init__.py`` (no machinery re-exports) and
``attnlib/glyphs.py`` (its cache folder defined in place instead of imported from ``_repo``).
Run from a clone with the pre-move commit in its history::

    python -m attnbook.migrate machinery-split --from c82cbaa
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import subprocess
import sys
from pathlib import Path

from .deps import code_hashes
from .layout import current
from .runs import code_hash, source_hash
from .store import RESULTS_DIR, _atomic_write, _seal, load_result

__all__ = ["MIGRATIONS", "machinery_split"]

#: modules the store did not compare at the pre-move commit (its ``NOT_RESULT_CODE``): records
#: list them with whatever hash they had when the table was stored
OLD_NOT_RESULT_CODE = frozenset({
    "attnlib/__init__.py", "attnlib/book.py", "attnlib/_colab.py", "attnlib/_edition.py",
    "attnlib/_store.py", "attnlib/plotting.py", "attnlib/fmt.py", "attnlib/_sweep.py",
})
#: science files the machinery split changed, by imports only (checked by hand in its commit)
SPLIT_CHANGED = frozenset({"attnlib/__init__.py", "attnlib/glyphs.py"})


def _old_hash(commit: str, rel: str, root: Path) -> str | None:
    """Code hash of ``rel`` at ``commit`` (None if the file did not exist there)."""
    proc = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=root, capture_output=True)
    return code_hash(proc.stdout) if proc.returncode == 0 else None


def machinery_split(commit: str, results_dir: Path = RESULTS_DIR, log=print) -> list[Path]:
    """Rewrite every record under ``results_dir`` to the science-only module list (see the module
    docstring). Refuses, naming the record, when a recorded hash does not match its file at
    ``commit`` (the table was already stale) or a science module changed other than by the move."""
    root = current().root
    rewritten = []
    for meta in sorted(Path(results_dir).glob("*/*.provenance.json")):
        table = meta.with_name(meta.name.replace(".provenance.json", ".csv"))
        _, record = load_result(table)  # verified: seal and checksum
        if any(m.get("name") == "machinery-split" for m in record.get("migrations", [])):
            continue
        old = dict(record.get("code") or {})
        for rel, digest in old.items():
            if rel in OLD_NOT_RESULT_CODE:
                continue
            then = _old_hash(commit, rel, root)
            if then is None or then[: len(digest)] != digest:
                raise RuntimeError(f"{meta}: {rel} was already changed at {commit}; recompute the table")
        new = code_hashes(record["chapter"])
        changed = {}
        for rel, digest in new.items():
            before = (_old_hash(commit, rel, root) or "")[:16]
            if before != digest:
                if rel not in SPLIT_CHANGED:
                    raise RuntimeError(f"{meta}: {rel} changed since {commit} beyond the move")
                changed[rel] = [before, digest]
        note = {
            "name": "machinery-split",
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
            "from_commit": commit,
            "removed": {rel: d for rel, d in sorted(old.items()) if rel not in new},
            "added": sorted(rel for rel in new if rel not in old),
            "changed": changed,
            "code_hash_before": record.get("code_hash"),
        }
        record = dict(record, code=new, code_hash=source_hash(),
                      migrations=[*record.get("migrations", []), note])
        _atomic_write(meta, (json.dumps(_seal(record), indent=2) + "\n").encode())
        rewritten.append(meta)
        log(f"{meta.relative_to(Path(results_dir).parent)}: {len(note['removed'])} removed, "
            f"{len(note['added'])} added, {len(changed)} changed by the move")
    return rewritten


MIGRATIONS = {"machinery-split": machinery_split}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnbook.migrate", description=__doc__.split("\n")[0])
    parser.add_argument("name", choices=sorted(MIGRATIONS))
    parser.add_argument("--from", dest="commit", required=True, help="the commit the records were current at")
    parser.add_argument("--results", default=str(RESULTS_DIR))
    args = parser.parse_args(argv)
    try:
        MIGRATIONS[args.name](args.commit, Path(args.results))
    except RuntimeError as err:
        print(f"attnbook.migrate: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
