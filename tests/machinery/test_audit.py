"""`attnbook audit`: every stored result listed with its provenance; a bad record fails it.

The committed store (``results/``) must audit clean (staleness is reported, not an error); a
corrupted copy of a store must make the command exit 1 naming each bad file.
"""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

import attnbook as ab
from attnbook import store as _store
from attnbook.cli import main


def _store_one(root, chapter="03-positional-semantic", name="table"):
    """A result stored as a chapter's full run stores it (record with per-module code hashes)."""
    run = ab.start_chapter(chapter, profile="full", device="cpu", quiet=True)
    df = pd.DataFrame({"alpha": [0.5, 1.0], "eps_g": [0.25, 0.125]})
    _store.save_result(df, root / chapter / f"{name}.csv", _store.provenance(run, {"n": 2}, 1.5))
    return root / chapter / f"{name}.csv"


def test_committed_results_audit_clean(capsys):
    assert main(["audit"]) == 0
    out = capsys.readouterr().out
    rows = _store.audit(_store.RESULTS_DIR)
    stored = sorted(_store.RESULTS_DIR.rglob("*.csv")) if _store.RESULTS_DIR.exists() else []
    assert len(rows) == len(stored)
    for row in rows:
        assert row["error"] is None, row
        assert f"`{row['result']}`" in out and row["rows"] > 0
        assert row["code"] == "unchanged" or row["code"].startswith("changed: attnlib/")
    if not stored:
        assert "No paper-scale result is stored" in out


def test_provenance_records_the_modules_the_chapter_uses(tmp_path):
    csv = _store_one(tmp_path)
    record = json.loads(csv.with_suffix(".provenance.json").read_text())
    assert any(m.startswith("attnlib/dotattn/") for m in record["code"])
    # only science is recorded: nothing of attnbook, and not another chapter's model
    assert all(m.startswith("attnlib/") for m in record["code"])
    assert not any(m.startswith(("attnlib/paths/", "attnlib/mha")) for m in record["code"])
    assert _store.code_changes(record) == []
    [row] = _store.audit(tmp_path)
    assert row["result"] == "03-positional-semantic/table" and row["rows"] == 2
    assert row["code"] == "unchanged" and row["wall_s"] == 1.5 and row["error"] is None


def test_changed_code_is_reported_not_an_error(tmp_path, capsys):
    csv = _store_one(tmp_path)
    meta = csv.with_suffix(".provenance.json")
    record = json.loads(meta.read_text())
    record["code"]["attnlib/dotattn/theory.py"] = "0" * 16  # produced by another version of it
    meta.write_text(json.dumps(_store._seal(record), indent=2))
    assert main(["audit", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "changed: attnlib/dotattn/theory.py" in out and "1 produced by code that has changed" in out


def test_a_module_the_record_lists_but_that_is_gone_is_a_change(tmp_path):
    # every attnlib file is result code: a listed module that no longer exists makes the table stale
    csv = _store_one(tmp_path)
    record = json.loads(csv.with_suffix(".provenance.json").read_text())
    record["code"]["attnlib/book.py"] = "0" * 16
    assert _store.code_changes(record) == ["attnlib/book.py (removed)"]
    del record["code"]["attnlib/book.py"]
    record["code"]["attnlib/dotattn/theory.py"] = "0" * 16  # a model module: stale
    assert _store.code_changes(record) == ["attnlib/dotattn/theory.py"]


def test_package_init_only_re_exports():
    # attnlib/__init__.py counts for a chapter only through the names it takes from the package
    # face (attnbook.deps.chapter_modules): that holds only while it computes nothing, so it may
    # hold a docstring, imports, __version__ and __all__
    import ast
    from pathlib import Path

    import attnlib

    init = Path(attnlib.__file__)
    body = ast.parse(init.read_text()).body
    names = set()
    for node in body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        assert isinstance(node, ast.Assign) and len(node.targets) == 1, ast.unparse(node)
        target = node.targets[0]
        assert isinstance(target, ast.Name) and target.id in ("__version__", "__all__"), ast.unparse(node)
        assert isinstance(node.value, ast.Constant | ast.List), ast.unparse(node)
        names.add(target.id)
    assert names == {"__version__", "__all__"}


@pytest.mark.parametrize("damage", ["edited-table", "truncated-record", "missing-field", "orphan-record"])
def test_corrupted_copy_fails_the_audit_naming_the_file(tmp_path, capsys, damage):
    store = tmp_path / "results"
    if _store.RESULTS_DIR.exists() and any(_store.RESULTS_DIR.rglob("*.csv")):
        shutil.copytree(_store.RESULTS_DIR, store)  # a copy of the committed results
    csv = _store_one(store, name="zz-damaged")
    meta = csv.with_suffix(".provenance.json")
    if damage == "edited-table":
        csv.write_text(csv.read_text().replace("0.125", "0.126"))
        reason = "does not match the checksum"
    elif damage == "truncated-record":
        meta.write_text(meta.read_text()[:40])
        reason = "missing or unreadable"
    elif damage == "missing-field":
        record = json.loads(meta.read_text())
        del record["device_name"]
        meta.write_text(json.dumps(_store._seal(record)))
        reason = "lacks ['device_name']"
    else:
        csv.unlink()
        reason = "is missing"
    assert main(["audit", "--results", str(store)]) == 1
    captured = capsys.readouterr()
    errors = captured.err.strip().splitlines()
    assert len(errors) == 1 and "zz-damaged" in errors[0] and reason in errors[0], errors
    assert "**unreadable**" in captured.out
    # every other (intact) result is still listed as readable
    rows = _store.audit(store)
    assert [r["result"] for r in rows if r["error"]] == ["03-positional-semantic/zz-damaged"]


@pytest.mark.book
def test_reproducibility_page_shows_the_audit_and_the_cost_table(html_dir):
    from bs4 import BeautifulSoup

    text = BeautifulSoup((html_dir / "book" / "reproducibility.html").read_text(), "html.parser").get_text()
    rows = _store.audit(_store.RESULTS_DIR)
    if rows:
        assert all(row["result"] in text for row in rows)
    else:
        assert "No paper-scale result is stored" in text
    assert "estimated CPU time (1 core)" in text and "kernel-curves" in text and "gd-phase" in text
