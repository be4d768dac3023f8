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

``sizes-into-chapters`` (2026-12-06). Each chapter writes its sizes once, in its own
``PROFILE_SIZES`` (issue 37's "one chapter kit"); the size tables the science modules held
(``PROFILES`` in ``random_qk.py`` and ``mha.py``, ``SIM_PROFILES``, ``MARKOV_PROFILES``,
``IMAGE_PROFILES``, ``GLYPH_PROFILES``) moved into the chapters with the same values. The
migration accepts a changed module only when its code at ``--from``, with those tables and their
names (assignments, imports, ``__all__`` entries) taken out, is the module's code now (compared as
the code hash compares it, docstrings aside)::

    python -m attnbook.migrate sizes-into-chapters --from <the commit before the move>
"""

from __future__ import annotations

import argparse
import ast
import datetime as _dt
import json
import subprocess
import sys
from pathlib import Path

from .deps import code_hashes
from .layout import current
from .runs import _strip_docstrings, code_hash, source_hash
from .store import RESULTS_DIR, _atomic_write, _seal, load_result

__all__ = ["MIGRATIONS", "machinery_split", "sizes_into_chapters"]

#: modules the store did not compare at the pre-move commit (its ``NOT_RESULT_CODE``): records
#: list them with whatever hash they had when the table was stored
OLD_NOT_RESULT_CODE = frozenset({
    "attnlib/__init__.py", "attnlib/book.py", "attnlib/_colab.py", "attnlib/_edition.py",
    "attnlib/_store.py", "attnlib/plotting.py", "attnlib/fmt.py", "attnlib/_sweep.py",
})
#: science files the machinery split changed, by imports only (checked by hand in its commit)
SPLIT_CHANGED = frozenset({"attnlib/__init__.py", "attnlib/glyphs.py"})


def _old_source(commit: str, rel: str, root: Path) -> bytes | None:
    """The file ``rel`` at ``commit`` (None if it did not exist there)."""
    proc = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=root, capture_output=True)
    return proc.stdout if proc.returncode == 0 else None


def _old_hash(commit: str, rel: str, root: Path) -> str | None:
    """Code hash of ``rel`` at ``commit`` (None if the file did not exist there)."""
    source = _old_source(commit, rel, root)
    return None if source is None else code_hash(source)


def _pending(results_dir: Path, name: str):
    """``(record path, record)`` of every stored table under ``results_dir`` that migration
    ``name`` has not rewritten yet (each record verified: seal and checksum)."""
    for meta in sorted(Path(results_dir).glob("*/*.provenance.json")):
        _, record = load_result(meta.with_name(meta.name.replace(".provenance.json", ".csv")))
        if not any(m.get("name") == name for m in record.get("migrations", [])):
            yield meta, record


def _rewrite(meta: Path, record: dict, code: dict, note: dict) -> None:
    """Reseal ``record`` with the module list ``code`` and the migration ``note`` (name, commit,
    what it removed, added and changed; the date and the code hash before are added here)."""
    today = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    note = {"name": note["name"], "date": today, **{k: v for k, v in note.items() if k != "name"},
            "code_hash_before": record.get("code_hash")}
    record = dict(record, code=code, code_hash=source_hash(),
                  migrations=[*record.get("migrations", []), note])
    _atomic_write(meta, (json.dumps(_seal(record), indent=2) + "\n").encode())


def machinery_split(commit: str, results_dir: Path = RESULTS_DIR, log=print) -> list[Path]:
    """Rewrite every record under ``results_dir`` to the science-only module list (see the module
    docstring). Refuses, naming the record, when a recorded hash does not match its file at
    ``commit`` (the table was already stale) or a science module changed other than by the move."""
    root = current().root
    rewritten = []
    for meta, record in _pending(results_dir, "machinery-split"):
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
        removed = {rel: d for rel, d in sorted(old.items()) if rel not in new}
        added = sorted(rel for rel in new if rel not in old)
        _rewrite(meta, record, new, {"name": "machinery-split", "from_commit": commit,
                                     "removed": removed, "added": added, "changed": changed})
        rewritten.append(meta)
        log(f"{meta.relative_to(Path(results_dir).parent)}: {len(removed)} removed, "
            f"{len(added)} added, {len(changed)} changed by the move")
    return rewritten


#: the size tables that moved from the science modules into the chapters' PROFILE_SIZES
SIZE_TABLES = frozenset({"PROFILES", "SIM_PROFILES", "MARKOV_PROFILES", "IMAGE_PROFILES", "GLYPH_PROFILES"})


class _DropNames(ast.NodeTransformer):
    """Take ``names`` out of a module: their assignments, imports and ``__all__`` entries."""

    def __init__(self, names):
        self.names = names

    def visit_Assign(self, node):
        if all(isinstance(t, ast.Name) and t.id in self.names for t in node.targets):
            return None
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets) and isinstance(
                node.value, ast.List | ast.Tuple):
            node.value.elts = [e for e in node.value.elts
                               if not (isinstance(e, ast.Constant) and e.value in self.names)]
        return node

    def visit_ImportFrom(self, node):
        node.names = [a for a in node.names if a.name not in self.names]
        return node if node.names else None


def without_size_tables(source: bytes) -> str:
    """The code of a module (as :func:`attnbook.runs.code_hash` reads it) without :data:`SIZE_TABLES`."""
    tree = _DropNames(SIZE_TABLES).visit(_strip_docstrings(ast.parse(source)))
    return ast.dump(tree)


def sizes_into_chapters(commit: str, results_dir: Path = RESULTS_DIR, log=print) -> list[Path]:
    """Rewrite the science hashes of every record whose modules changed only by losing their size
    tables (see the module docstring). Refuses, naming the record, when a recorded hash does not
    match its file at ``commit`` or a module changed in any other way."""
    root = current().root
    rewritten = []
    for meta, record in _pending(results_dir, "sizes-into-chapters"):
        old = dict(record.get("code") or {})
        changed = {}
        for rel, digest in old.items():
            then = _old_source(commit, rel, root)
            if then is None or code_hash(then)[: len(digest)] != digest:
                raise RuntimeError(f"{meta}: {rel} was already changed at {commit}; recompute the table")
            now = (root / rel).read_bytes()
            if code_hash(now)[: len(digest)] == digest:
                continue
            if without_size_tables(then) != without_size_tables(now):
                raise RuntimeError(f"{meta}: {rel} changed since {commit} beyond its size tables")
            changed[rel] = [digest, code_hash(now)[: len(digest)]]
        if not changed:
            continue
        _rewrite(meta, record, {**old, **{rel: new for rel, (_, new) in changed.items()}},
                 {"name": "sizes-into-chapters", "from_commit": commit, "removed": {}, "added": [],
                  "changed": changed})
        rewritten.append(meta)
        log(f"{meta.relative_to(Path(results_dir).parent)}: {len(changed)} module(s) lost only their "
            f"size tables: {', '.join(sorted(changed))}")
    return rewritten


MIGRATIONS = {"machinery-split": machinery_split, "sizes-into-chapters": sizes_into_chapters}


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
