"""Sweep checkpoints: keyed by what can change a number (not the prose), every line checked.

The executions use a tiny throwaway chapter in a temporary book tree, through the same path as
``attnbook run`` (:func:`attnbook.cli.main`); the line-format tests use ``sweep(path=...)``.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import attnbook as ab
from attnbook import checkpoints as ck
from attnbook import cli, deps, layout, slots
from attnbook.sweeps import point_key, read_checkpoint

from ..conftest import myst_chapter, point_book_at, tiny_book

CHAPTER = myst_chapter("Checkpoints", """
profile = "quick"
device = "cpu"
seed = 0
""", """
import os

import attnbook as ab

run = ab.start_chapter("98-ckpt", profile=profile, device=device, seed=seed, quiet=True)
SCALE = 2


def point(i):
    with open(os.environ["CKPT_CALLS"], "a") as fh:  # one line per computed point
        fh.write(f"{i}\\n")
    return {"v": SCALE * i}


res = ab.sweep(point, [{"i": i} for i in range(3)], "pts", run=run)
run.record(total=int(res.v.sum()))
run.write_summary()
""")


@pytest.fixture
def chapter(tmp_path, monkeypatch):
    root = tiny_book(tmp_path / "root", "98-ckpt", CHAPTER)
    point_book_at(root, monkeypatch)
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("CKPT_CALLS", str(calls))
    source = root / "chapters" / "98-ckpt.md"

    def execute(old: str | None = None, new: str | None = None) -> tuple[list[int], int]:
        """Edit the chapter (``old`` -> ``new``), run it; the points computed and the total."""
        if old is not None:
            assert old in source.read_text()
            source.write_text(source.read_text().replace(old, new))
        calls.write_text("")
        assert cli.main(["run", "98-ckpt"]) == 0
        total = json.loads(slots.slot_paths("98-ckpt", "98-ckpt")[1].read_text())["total"]
        return [int(i) for i in calls.read_text().split()], total

    execute.folder = root / "book" / "_cache" / "sweeps" / "98-ckpt"
    return execute


def test_prose_edits_resume_every_point_and_code_edits_recompute(chapter, capsys):
    assert chapter() == ([0, 1, 2], 6)
    files = sorted(p.name for p in chapter.folder.glob("pts.*.jsonl"))
    assert len(files) == 1  # book/_cache/sweeps/<slot>/<name>.<sweep key>.jsonl, no key folder
    # (a) prose: the page re-executes, every point comes from the checkpoint
    assert chapter("# Checkpoints", "# Checkpoints\n\nA new sentence, with a typo.") == ([], 6)
    assert "executed in" in capsys.readouterr().out
    assert sorted(p.name for p in chapter.folder.glob("pts.*.jsonl")) == files
    # (b) the point function: computed again, into a checkpoint of its own
    assert chapter('return {"v": SCALE * i}', 'return {"v": SCALE * i + 1}') == ([0, 1, 2], 9)
    # (c) a global the point function reads
    assert chapter("SCALE = 2", "SCALE = 3") == ([0, 1, 2], 12)
    assert len(list(chapter.folder.glob("pts.*.jsonl"))) == 3
    # clean --stale keeps the checkpoint the last run used and removes the two older ones
    cli.clean(stale=True, log=lambda *_: None)
    kept = list(chapter.folder.glob("pts.*.jsonl"))
    used = json.loads((chapter.folder / "used.json").read_text())
    assert len(kept) == 1 and [kept[0].name] == [f"{stem}.jsonl" for stem in used["done"]]
    assert chapter("# Checkpoints", "# Checkpoints\n\nAnother sentence.") == ([], 12)


def test_failed_run_counts_the_points_it_can_resume(chapter, monkeypatch, capsys):
    chapter()
    source = layout.current().chapters / "98-ckpt.md"
    source.write_text(source.read_text().replace("run.write_summary()", "assert False, 'stop'"))
    capsys.readouterr()
    assert cli.main(["run", "98-ckpt"]) == 1
    assert "3 finished sweep points saved" in capsys.readouterr().err


def test_the_key_follows_only_the_chapters_own_code_hashes(tmp_path, monkeypatch):
    """(d) In a book run the key takes the attnlib code hashes of the chapter (its
    ``code_hashes``, passed by ``attnbook``): a module the chapter does not use leaves it alone."""
    from attnbook import runs

    root = tiny_book(tmp_path / "root", "98-ckpt", CHAPTER.replace(
        "import attnbook as ab", "import attnbook as ab\nfrom attnlib import attention"))
    point_book_at(root, monkeypatch)
    params = {"profile": "quick", "device": "cpu", "seed": 0}
    assert "attnlib/mha.py" not in deps.code_hashes("98-ckpt")
    run = ab.start_chapter("98-ckpt", device="cpu", quiet=True)

    def point(i):
        return {"v": i}

    def key() -> str:
        env = ck.begin_execution(tmp_path / "slot", slots.key_inputs("98-ckpt", params))
        monkeypatch.setenv(ck.ENV_INPUTS, env[ck.ENV_INPUTS])
        return ck.sweep_key(point, run)

    before = key()
    real = runs.module_hash

    def other_code(changed: str):
        return lambda path: "0" * 64 if Path(path).name == changed else real(path)

    monkeypatch.setattr(runs, "module_hash", other_code("mha.py"))  # another chapter's science
    assert key() == before
    monkeypatch.setattr(runs, "module_hash", other_code("attention.py"))  # this chapter's
    assert key() != before
    monkeypatch.delenv(ck.ENV_INPUTS)
    assert ck.sweep_key(point, run) != before  # outside a book: the whole package's source hash


# ---- what the key reads --------------------------------------------------------------------------
@dataclass
class Config:
    n: int = 3


CFG = Config()
TABLE = torch.arange(4.0)


def _reads_globals(i):
    return {"v": i * CFG.n + float(TABLE.sum())}


def test_the_key_reads_the_globals_values_not_their_identity(monkeypatch):
    base = ck.sweep_key(_reads_globals)
    assert ck.sweep_key(_reads_globals) == base
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "CFG", Config())  # equal value
    assert ck.sweep_key(_reads_globals) == base
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "CFG", Config(n=4))
    assert ck.sweep_key(_reads_globals) != base
    monkeypatch.undo()
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "TABLE", torch.arange(4.0) + 1)
    assert ck.sweep_key(_reads_globals) != base
    assert ck.sweep_key(functools.partial(_reads_globals)) != ck.sweep_key(
        functools.partial(_reads_globals, i=1))


def test_a_run_counts_by_its_parameters_not_its_start_time():
    one = ab.start_chapter("98-ckpt", device="cpu", quiet=True)
    two = ab.start_chapter("98-ckpt", device="cpu", quiet=True)
    one.record(x=1)
    assert one.started != two.started
    assert ck.describe(one.generator) == ck.describe(two.generator)
    assert ck.sweep_key(_reads_globals, one) == ck.sweep_key(_reads_globals, two)
    other = ab.start_chapter("98-ckpt", device="cpu", seed=1, quiet=True)
    assert ck.sweep_key(_reads_globals, other) != ck.sweep_key(_reads_globals, one)


# ---- the line format -----------------------------------------------------------------------------
def _counted(calls: list):
    def fn(i):
        calls.append(i)
        return {"sq": i * i, "x": 0.125 * i}
    return fn


def _sweep(path: Path, calls: list, n: int = 3):
    return ab.sweep(_counted(calls), [{"i": i} for i in range(n)], "s", path=path)


def test_a_line_is_key_point_rows_and_checksum(tmp_path):
    path = tmp_path / "s.jsonl"
    _sweep(path, [])
    entry = json.loads(path.read_text().splitlines()[1])
    assert set(entry) == {"key", "point", "rows", "sha256"}
    assert entry["key"] == point_key({"i": 1}) and entry["point"] == {"i": 1}
    assert ck.checkpoint_line(entry["point"], entry["rows"]) == path.read_text().splitlines(True)[1]
    assert set(read_checkpoint(path)) == {point_key({"i": i}) for i in range(3)}


def _corrupt(path: Path, line: int, new: bytes) -> bytes:
    lines = path.read_bytes().split(b"\n")
    old, lines[line] = lines[line], new
    path.write_bytes(b"\n".join(lines))
    return old


@pytest.mark.parametrize("bad", [
    "digit", "point", b'{"foo": 1}', b"null", b"[1, 2]", b"\xff\xfe not utf-8 \x80", b"not json {",
    "old format", "extra field", "NaN"])
def test_a_bad_line_is_set_aside_named_and_recomputed(tmp_path, capsys, bad):
    path = tmp_path / "s.jsonl"
    first = _sweep(path, [])
    text = path.read_bytes().split(b"\n")[1]
    entry = json.loads(text)
    if bad == "digit":  # one changed digit of a result
        assert b'"x": 0.125' in text
        bad = text.replace(b'"x": 0.125', b'"x": 0.135')
    elif bad == "point":
        bad = text.replace(b'"point": {"i": 1}', b'"point": {"i": 2}')
    elif bad == "old format":
        bad = json.dumps({"point": entry["point"], "rows": entry["rows"]}).encode()
    elif bad == "extra field":
        bad = json.dumps(dict(entry, note="hand-made")).encode()
    elif bad == "NaN":
        bad = text.replace(b'"x": 0.125', b'"x": NaN')
    _corrupt(path, 1, bad)
    capsys.readouterr()
    calls = []
    again = _sweep(path, calls)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning")]  # not progress bars
    assert len(err) == 1 and str(path) in err[0] and "1 line failed the check" in err[0], err
    assert calls == [1]  # recomputed, never used
    assert again.drop(columns="elapsed_s").equals(first.drop(columns="elapsed_s"))
    assert (tmp_path / "s.jsonl.rejected").read_bytes() == bad + b"\n"
    assert len(path.read_text().splitlines()) == 3  # rewritten without it, the point appended
    assert _sweep(path, calls) is not None and calls == [1]  # and quiet from now on
    assert capsys.readouterr().err == ""


def test_a_line_cut_short_is_dropped_quietly(tmp_path, capsys):
    path = tmp_path / "s.jsonl"
    _sweep(path, [])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 20])  # killed while writing point 2
    calls = []
    df = _sweep(path, calls, n=4)
    assert calls == [2, 3] and df.sq.tolist() == [0, 1, 4, 9]
    assert capsys.readouterr().err == "" and not (tmp_path / "s.jsonl.rejected").exists()
    assert len(path.read_text().splitlines()) == 4


def test_several_bad_lines_are_counted_in_one_warning(tmp_path, capsys):
    path = tmp_path / "s.jsonl"
    _sweep(path, [], n=4)
    _corrupt(path, 0, b"null")
    _corrupt(path, 2, b"[1, 2]")
    capsys.readouterr()
    calls = []
    _sweep(path, calls, n=4)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "2 lines failed the check" in err[0] and calls == [0, 2]
