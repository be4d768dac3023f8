"""`attnbook store` (:mod:`attnbook.tables`): single tables of a chapter's ``full`` profile.

``store`` runs a chapter's own code for single tables of its ``full`` profile, which can take
hours. A table whose statements use a name bound only in another cell must be refused before
any of the chapter's code runs, with a message that says which cell binds it; otherwise the
tables named before it are computed first and the run then dies on a ``NameError``. Partial
tables (``--points``) are marked so and finished later from their stored points. The command
line (``attnbook store``, ``attnbook slice``) refuses a bad table in one line, exit status 2.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnbook import tables as tb
from attnbook.tables import ResumeError, TableError

ROOT = Path(__file__).resolve().parents[2]

CH3 = "03-positional-semantic"


def test_bound_and_free_names():
    tree = ast.parse(
        "import numpy as np\nfrom math import log\n"
        "def f(a, *, b=1):\n    return a + b + c\n"
        "ys = [x * k for x in range(3)]\nfor i in ys:\n    total = i\n"
        "try:\n    pass\nexcept ValueError as err:\n    print(err)\n")
    assert tb.bound_names(tree) == {"np", "log", "f", "a", "b", "ys", "x", "i", "total", "err"}
    assert tb.free_names(tree) == {"c", "k"}  # builtins (range, print, ValueError) are not free
    assert tb.bound_names(ast.parse("from os.path import *")) is None


def test_table_needing_another_cell_is_refused_before_any_code_runs(monkeypatch):
    ran = []
    monkeypatch.setattr(tb, "exec", lambda *a, **k: ran.append(a), raising=False)
    with pytest.raises(TableError, match=r"gd-scaling: its cell uses SIM, sim_point") as err:
        tb.store_tables(CH3, ["gd-scaling"], "serial")
    assert "SIM = SIZES" in str(err.value)  # it says where the missing names are bound
    assert ran == []


def test_the_simulation_cell_named_with_defs_lets_gd_scaling_be_stored_alone():
    setup, segments = tb.plan_tables(CH3, ["gd-scaling"], defs=("sim_point",))
    assert list(segments) == ["gd-scaling"]
    assert "def sim_point(" in setup[2] and "cached(" not in setup[2]  # defines, computes nothing


def test_every_table_of_chapter_3_in_document_order_passes():
    tables = ["gd-omega03", "gd-scaling", "gd-phase", "gd-sigma-lambda", "gd-generic"]
    with pytest.raises(TableError, match="gd-omega03: its cell uses SIM, block_point, seed_blocks"):
        tb.plan_tables(CH3, tables)
    assert list(tb.plan_tables(CH3, tables, defs=("sim_point",))[1]) == tables


def test_a_missing_definition_named_with_defs_passes():
    with pytest.raises(TableError, match="random_scores"):
        tb.plan_tables("00-attention", ["neff"])
    setup, _ = tb.plan_tables("00-attention", ["neff"], defs=("random_scores",))
    assert "def random_scores(" in setup[2]


def test_a_function_in_a_named_tables_own_cell_is_left_to_that_table():
    # chapter 4 defines gp_accuracy in hmc-theory's cell and sample_width in the sampling cell:
    # run whole as set-up, those cells would compute the tables before their cost is measured
    ch4, defs = "04-attention-paths", ("gp_accuracy", "sample_width")
    setup, segments = tb.plan_tables(ch4, ["hmc-theory", "two-path", "hmc-sampling-N{N}"], defs)
    assert setup[2:] == ["", ""] and list(segments) == ["hmc-theory", "two-path", "hmc-sampling-N{N}"]
    assert "gp_accuracy" in tb.bound_names(segments["hmc-theory"])
    # alone, two-path needs hmc-theory's cell for gp_accuracy, which then runs as set-up
    setup, _ = tb.plan_tables(ch4, ["two-path"], ("gp_accuracy",))
    assert "def gp_accuracy(" in setup[2]
    # named after the table that uses it, the function is refused before anything runs
    with pytest.raises(TableError, match="two-path: its cell uses gp_accuracy"):
        tb.plan_tables(ch4, ["two-path", "hmc-theory"], ("gp_accuracy",))


def test_a_table_name_with_a_field_stands_for_every_table_its_cell_stores(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLIB_RESULTS_DIR", str(tmp_path / "results"))  # the store store_tables uses
    folder = tmp_path / "results" / "04-attention-paths"
    folder.mkdir(parents=True)
    for stem in ("hmc-sampling-N10", "hmc-sampling-N100", "hmc-theory", "hmc-sampling-N10-old"):
        (folder / f"{stem}.csv").write_text("x\n")
    assert [p.stem for p in tb._table_files("04-attention-paths", "hmc-sampling-N{N}")] == [
        "hmc-sampling-N10", "hmc-sampling-N100"]  # a field's value holds no hyphen
    assert tb._table_files("04-attention-paths", "two-path") == [folder / "two-path.csv"]
    assert tb._measured_name("hmc-sampling-N{N}") == "hmc-sampling"
    assert tb._measured_name("two-path") == "two-path"
    with pytest.raises(TableError, match="--points: not for tables named by a pattern"):
        tb.store_tables("04-attention-paths", ["hmc-sampling-N{N}"], "serial", points=1)


def test_points_option_stores_the_first_points_and_says_so(tmp_path):
    """``store --points k``: the sweep runs, and the store key holds, only the first k points; the
    stored record names the table partial, stays verifiable, and carries the given wall time."""
    from types import SimpleNamespace

    import pandas as pd

    from attnbook.store import load_result, save_result

    calls = {}
    ab = SimpleNamespace(
        sweep=lambda fn, points, *a, **kw: calls.update(swept=points),
        stored_or_compute=lambda run, name, compute, params, **kw: (
            calls.update(params=params), compute())[1])
    asked = tb._first_points(ab, 2, ["t", "u"])
    pts = [dict(seed=s) for s in range(5)]
    ab.stored_or_compute(None, "t", lambda: ab.sweep(None, pts), params=dict(points=pts, seed=0))
    assert calls["swept"] == pts[:2] and calls["params"]["points"] == pts[:2] and asked["of"] == 5
    # a table keyed by what it is computed from (chapter 3's) is keyed by the points it holds too
    ab.stored_or_compute(None, "u", lambda: ab.sweep(None, pts), params=dict(alphas=[1.0], seed=0))
    assert calls["swept"] == pts[:2] and calls["params"]["first_points"] == 2
    # a table the cell computes on the way (not named) keeps every point and its own key
    ab.stored_or_compute(None, "v", lambda: ab.sweep(None, pts), params=dict(points=pts, seed=0))
    assert calls["swept"] == pts and calls["params"]["points"] == pts
    ab.sweep(None, pts)  # and a sweep outside a named table is not cut either
    assert calls["swept"] == pts

    path = tmp_path / "t.csv"
    save_result(pd.DataFrame({"seed": [0, 1], "risk": [0.5, 0.25]}), path, dict(wall_s=1.0, date="x"))
    assert tb._mark_partial(path, 2, 5, 1234.5) == "the first 2 of the full profile's 5 points"
    df, record = load_result(path)  # verified: seal and checksum rewritten
    assert record["partial"].startswith("the first 2") and record["wall_s"] == 1234.5
    assert list(df["risk"]) == [0.5, 0.25]
    with pytest.raises(TableError, match="at least 1"):
        tb.store_tables("01-random-features", ["brfa"], "serial", points=0)


def test_a_partial_table_is_finished_from_its_stored_points(tmp_path):
    """A table stored in part (``store --points``) is finished later on a machine that kept
    nothing but ``results/``: its points are written into the sweep's checkpoint, only the other
    points are computed, and the table equals that of one uninterrupted run. A partial table that
    older code produced is refused, not mixed with the current code's points."""
    import pandas as pd

    from attnbook.runs import source_hash
    from attnbook.store import load_result, save_result
    from attnbook.sweeps import sweep

    calls = []

    def point(d, lambdas, seed):
        calls.append(seed)
        return [dict(n=n, risk=1.0 / (n + seed + d + lambdas[1]), tag=None if n == 2 else "a")
                for n in (1, 2)]

    pts = [dict(d=3, lambdas=[0.0, 1e-3], seed=s) for s in range(4)]
    whole = sweep(point, pts, "t", path=tmp_path / "whole.jsonl")
    table = tmp_path / "results" / "t.csv"
    save_result(sweep(point, pts[:2], "t", path=tmp_path / "first.jsonl"), table,
                dict(code_hash=source_hash(), partial="the first 2 of the full profile's 4 points"))
    calls.clear()
    checkpoint = tmp_path / "resumed" / "t.jsonl"
    assert tb._seed_checkpoint(checkpoint, pts, table) == 2
    assert tb._seed_checkpoint(checkpoint, pts, table) == 2  # already in the checkpoint: not again
    assert sum(1 for _ in checkpoint.open()) == 2
    resumed = sweep(point, pts, "t", path=checkpoint)
    assert calls == [2, 3]
    # the stored points come back through the CSV: equal to the last digit or two
    pd.testing.assert_frame_equal(resumed.drop(columns="elapsed_s"), whole.drop(columns="elapsed_s"),
                                  check_exact=False, rtol=1e-14)
    assert resumed.elapsed_s.notna().all()  # the stored points keep the time they took

    _, record = load_result(table)
    save_result(load_result(table)[0], table, dict(record, code_hash="0" * 64, code={}))
    with pytest.raises(ResumeError, match="changed since"):
        tb._seed_checkpoint(tmp_path / "other.jsonl", pts, table)


def test_points_a_sweep_takes_from_an_earlier_checkpoint_are_counted_not_timed(tmp_path):
    """A table whose sweep finds points in its checkpoint (a stopped run's, or one whose table was
    moved aside) takes them from there: ``store`` counts them (the cost table then shows the
    measured time as a lower bound, tests/machinery/test_full_cost.py)."""
    from types import SimpleNamespace

    from attnbook.sweeps import sweep

    pts = [dict(seed=s) for s in range(4)]
    sweep(lambda seed: [dict(r=seed)], pts[:3], "t", path=tmp_path / "t.jsonl")  # the earlier run
    ab = SimpleNamespace(sweep=sweep)
    found = tb._count_checkpointed(ab)
    ab.sweep(lambda seed: [dict(r=seed)], pts, "t", path=tmp_path / "t.jsonl")
    ab.sweep(lambda seed: [dict(r=seed)], pts, "u", path=tmp_path / "u.jsonl")
    assert found == {"t": 3, "u": 0}



def _attnbook(*args, tmp_path, **env):
    """``python -m attnbook ARGS`` with a result store and sweep folders in ``tmp_path``."""
    env = {**os.environ, "ATTNLIB_RESULTS_DIR": str(tmp_path / "results"),
           "ATTNLIB_SWEEP_DIR": str(tmp_path / "sweeps"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), **env}
    return subprocess.run([sys.executable, "-m", "attnbook", *args], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300)


def test_store_and_slice_are_attnbook_commands(tmp_path):
    for verb, option in (("store", "--points"), ("slice", "--idx")):
        out = _attnbook(verb, "--help", tmp_path=tmp_path)
        assert out.returncode == 0 and f"attnbook {verb}" in out.stdout and option in out.stdout


@pytest.mark.parametrize("args, message", [
    (("store", "01-random-features", "no-such-table"),
     "error: 01-random-features: 0 cells store a table 'no-such-table' (need exactly one)"),
    (("store", "no-such-chapter", "brfa"), "error: no chapter 'no-such-chapter'"),
    (("store", "01-random-features", "brfa", "--points", "0"), "error: --points 0: must be at least 1"),
    (("slice", "01-random-features", "no-such-table"),
     "error: 01-random-features/no-such-table: no stored table"),
    (("slice", "00-attention", "neff", "--tol", "neff=1"), "error: --tol 'neff=1': needs RTOL,ATOL"),
])
def test_a_bad_table_is_refused_in_one_line_with_exit_2(tmp_path, args, message):
    out = _attnbook(*args, tmp_path=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(message) and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "results").exists()  # nothing stored


def test_slice_command_reports_the_differences_and_exits_1(monkeypatch, capsys):
    import argparse

    from attnbook import slices, tables_cli
    from attnbook.cli import main

    seen = {}

    def fake(chapter, name, idx, cmp, workdir, **spec):
        seen.update(idx=idx, cmp=cmp, spec=spec)
        return 6, (["{'alpha': 0.5} eps: stored 0.2, now 0.3"] if name == "t" else []), [{"alpha": 0.5}]

    monkeypatch.setattr(slices, "check_slice", fake)
    assert main(["slice", "ch", "t", "--idx", "0", "-1", "--shrink", "heads=[16, 32]",
                 "--tol", "eps=1e-3,0", "--on", "n"]) == 1
    out = capsys.readouterr()
    assert "ch/t: 1 points recomputed, 6 values compared, 1 differ" in out.out and "eps: stored" in out.out
    assert out.err == ("error: ch/t: 1 of 6 recomputed values differ from the stored table (a changed "
                       "chapter or model: recompute the table with attnbook store)\n")
    assert seen["idx"] == [0, -1] and seen["spec"]["shrink"] == {"heads": [16, 32]}
    assert seen["cmp"]["tol"] == {"eps": (1e-3, 0.0)} and seen["cmp"]["on"] == ("n",)
    # the verbs need no particular parser: any subparsers carry them
    parser = argparse.ArgumentParser()
    tables_cli.add_commands(parser.add_subparsers(dest="verb"))
    assert tables_cli.run_command(parser.parse_args(["slice", "ch", "u"])) == 0
    assert "ch/u: 1 points recomputed, 6 values compared, 0 differ" in capsys.readouterr().out


def test_store_then_finish_a_partial_table_then_check_its_slice(tmp_path):
    """The whole path on chapter 0's cheapest table, in a trial store ($ATTNLIB_RESULTS_DIR): two
    points stored (a partial table), a third added by a later store that takes the two over from
    the stored table (a fresh sweep folder: nothing but the store survives), then a slice of it
    recomputed and compared. Nothing reaches results/ or full_runs.json."""
    from attnbook.store import load_result

    measured = tb.MEASURED.read_bytes() if tb.MEASURED.exists() else None
    store = ("store", "00-attention", "neff", "--defs", "random_scores", "--scheduler", "serial")
    for k, run in ((2, "first"), (3, "second")):
        out = _attnbook(*store, "--points", str(k), tmp_path=tmp_path, ATTNLIB_SWEEP_DIR=str(tmp_path / run))
        assert out.returncode == 0, out.stderr
        assert "stored: neff" in out.stdout and "its cost is not recorded" in out.stdout
    assert "2 points taken over from the stored partial table" in out.stdout
    df, record = load_result(tmp_path / "results" / "00-attention" / "neff.csv")
    assert record["partial"] == "the first 3 of the full profile's 49 points" and len(df) == 3
    assert record["resumed"].startswith("2 points from earlier runs")
    out = _attnbook("slice", "00-attention", "neff", "--defs", "random_scores", "--idx", "0", "2",
                    tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "00-attention/neff: 2 points recomputed, 4 values compared, 0 differ" in out.stdout
    assert (tb.MEASURED.read_bytes() if tb.MEASURED.exists() else None) == measured
