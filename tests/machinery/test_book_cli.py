"""The attnbook pipeline: parameters, cache keys, failure reporting, the cached rebuild."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attnbook import layout
from attnbook.cli import build
from attnbook.execute import execute_chapter
from attnbook.layout import BuildError, _read_chapter
from attnbook.params import default_parameters, parse_parameters, toc_chapters, validate_parameters
from attnbook.slots import cache_key
from attnlib._validation import ParameterError

from ..conftest import ROOT, myst_chapter


def test_parse_parameters():
    assert parse_parameters(["profile=full", "seed=3", "lam=1e-2", "name=abc"]) == {
        "profile": "full", "seed": 3, "lam": 0.01, "name": "abc"}
    with pytest.raises(ParameterError, match="name=value"):
        parse_parameters(["seed"])


def test_validate_parameters_rejects_unknown_names_and_values():
    defaults = {"profile": "quick", "device": "auto", "seed": 0}
    assert validate_parameters("c", {"seed": 2}, defaults)["seed"] == 2
    with pytest.raises(ParameterError, match="sed is not a parameter of chapter c; .*seed"):
        validate_parameters("c", {"sed": 2}, defaults)
    with pytest.raises(ParameterError, match="profile='fast'"):
        validate_parameters("c", {"profile": "fast"}, defaults)


def test_scheduler_auto_only_where_it_is_the_chapters_default():
    auto = {"profile": "quick", "device": "auto", "seed": 0, "scheduler": "auto"}
    serial = dict(auto, scheduler="serial")
    assert validate_parameters("c", {}, auto)["scheduler"] == "auto"
    assert validate_parameters("c", {"scheduler": "local:2"}, auto)["scheduler"] == "local:2"
    with pytest.raises(ParameterError, match="scheduler='auto' is not one of"):
        validate_parameters("c", {"scheduler": "auto"}, serial)


def test_bad_profile_exits_at_once_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "attnbook", "run", "00-attention",
                           "-p", "profile=fast"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "profile='fast'" in lines[0] and "'quick', 'full'" in lines[0]
    assert "executing with" not in proc.stdout  # refused before a kernel was started


def test_cache_key_covers_parameters_and_source():
    params = {"profile": "quick", "device": "auto", "seed": 0}
    key = cache_key("00-attention", params)
    assert key == cache_key("00-attention", dict(params))
    assert key != cache_key("00-attention", {**params, "seed": 1})


def test_every_toc_chapter_has_a_source_and_a_parameters_cell():
    chapters = toc_chapters()
    assert chapters[0] == "00-attention"
    for chapter in chapters:
        defaults = default_parameters(_read_chapter(chapter))
        assert {"profile", "device", "seed"} <= set(defaults)
        assert defaults["profile"] == "quick" and defaults["device"] == "auto"


def test_a_book_is_its_folders(tmp_path, monkeypatch):
    """layout.Book names a book tree's folders; one may be moved, and what lies in it follows."""
    book = layout.Book(tmp_path)
    assert book.chapters == tmp_path / "chapters" and book.build == tmp_path / "_build"
    assert book.records == tmp_path / "book" / "_cache" / "executions.json"
    assert book.table == tmp_path / "book" / "chapters" / "execution-table.md"
    moved = layout.Book(tmp_path, cache=tmp_path / "c")
    assert moved.records == tmp_path / "c" / "executions.json" and moved.executed == book.executed
    monkeypatch.setattr(layout, "BOOK", None)
    monkeypatch.setenv("ATTNBOOK_ROOT", str(tmp_path))
    assert layout.current() == layout.Book(tmp_path.resolve())
    assert layout.use(tmp_path / "x") == layout.current() == layout.Book(tmp_path / "x")


def test_failing_chapter_stops_with_cell_and_traceback(tmp_path, monkeypatch):
    chapters, executed, cache = tmp_path / "chapters", tmp_path / "executed", tmp_path / "cache"
    chapters.mkdir()
    (chapters / "99-broken.md").write_text(myst_chapter(
        "Broken", 'profile = "quick"\ndevice = "auto"\nseed = 0', "value = 1 / 0"))
    monkeypatch.setattr(layout, "BOOK", layout.Book(ROOT, chapters=chapters, executed=executed, cache=cache))
    with pytest.raises(BuildError) as err:
        execute_chapter("99-broken", log=lambda *_: None)
    msg = str(err.value)
    assert "\n" not in msg and "99-broken failed in cell" in msg and "ZeroDivisionError" in msg
    assert "there was no earlier output" in msg and "log: " in msg
    details = err.value.details  # the failing cell and its traceback, also in the log file
    assert "value = 1 / 0" in details and "ZeroDivisionError" in details
    assert "value = 1 / 0" in (cache / "logs" / "99-broken.log").read_text()
    assert not (executed / "99-broken.ipynb").exists()  # the error notebook is never published


@pytest.mark.book
def test_second_build_executes_nothing():
    """After `make book`, building again with nothing changed re-executes no chapter."""
    lines = []
    records = build(site=False, log=lines.append)
    assert not any(r["executed"] for r in records.values())
    assert any("0 of" in line and "chapters executed" in line for line in lines)


@pytest.mark.parametrize("chapter", toc_chapters())
def test_colab_notebook_twin_is_in_sync(chapter):
    """chapters/<id>.ipynb (what launch buttons open) has the cells of chapters/<id>.md, as
    `attnbook sync` writes them for plain Jupyter (install cell first, MyST rewritten)."""
    import jupytext
    import nbformat

    from attnbook import colab as _colab

    twin = ROOT / "chapters" / f"{chapter}.ipynb"
    assert twin.exists(), f"run `attnbook sync` to write {twin.name}"
    source = jupytext.read(ROOT / "chapters" / f"{chapter}.md")
    expected = _colab.twin_notebook(ROOT, chapter, source)
    committed = nbformat.read(twin, as_version=4)
    assert [c.source for c in committed.cells] == [c.source for c in expected.cells], \
        f"chapters/{chapter}.ipynb is out of date: run `attnbook sync`"
    code = [c.source for c in source.cells if c.cell_type == "code"]
    assert [c.source for c in committed.cells if c.cell_type == "code"][-len(code):] == code
    assert all(not c.get("outputs") for c in committed.cells if c.cell_type == "code")
    # the student twin (what the student site launches): the same, without the solutions
    from attnbook import edition as _edition

    student = nbformat.read(ROOT / _edition.STUDENT_BOOK / "chapters" / f"{chapter}.ipynb", as_version=4)
    expected = _colab.twin_notebook(ROOT, chapter, _edition.student_notebook(source))
    assert [c.source for c in student.cells] == [c.source for c in expected.cells], \
        f"{_edition.STUDENT_BOOK}/chapters/{chapter}.ipynb is out of date: run `attnbook sync`"
    assert "<summary>Solution</summary>" in "".join(c.source for c in committed.cells)
    assert "<summary>Solution</summary>" not in "".join(c.source for c in student.cells)
