"""`benchmarks/full_cost.py`: the cost probes' arithmetic and the cost report's measured column.

The tables themselves are stored by ``attnbook store`` (tests/machinery/test_tables.py), which writes the
CPU seconds each took to ``benchmarks/results/full_runs.json``; the report reads them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("full_cost", ROOT / "benchmarks" / "full_cost.py")
fc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fc)


def test_points_an_earlier_checkpoint_gave_make_the_measured_time_a_lower_bound():
    """A table whose sweep took points from an earlier run's checkpoint (``store`` counts them,
    tests/machinery/test_tables.py) shows its measured time as a lower bound, not as the table's cost."""
    row = dict(chapter="04", table="two-path (theory)")
    timed = {"cpu_s": 13.8, "how": "store"}
    assert fc.measured_cells(row, {"04-attention-paths": {"two-path": timed}}) == fc._fmt_s(13.8)
    untimed = dict(timed, untimed="3 points taken from the sweep checkpoint of an earlier run, not timed")
    assert fc.measured_cells(row, {"04-attention-paths": {"two-path": untimed}}) == (
        f"at least {fc._fmt_s(13.8)} (3 points taken from the sweep checkpoint of an earlier run, not timed)")


def test_the_report_reads_the_measurements_attnbook_store_writes():
    from attnbook import tables

    assert fc.MEASURED == tables.MEASURED == ROOT / "benchmarks" / "results" / "full_runs.json"
    assert not hasattr(fc, "store_tables") and not hasattr(fc, "plan_tables")


def test_ch3_gd_cost_sums_steps_and_test_set_over_alphas():
    """The GD estimate: steps x per-step cost (a power of alpha through the alpha = 1 and 2 probes)
    plus the test set, per alpha, times the seeds."""
    probe = {"per_seed_step_s": {"x": {"1.0": 0.01, "2.0": 0.04}}, "test_s_per_seed": 3.0}
    # cost per step grows like alpha^2 here: alphas 1 and 2 cost 1 and 4 units of 0.01 s
    assert fc.ch3_gd_cost(probe, "x", [1.0, 2.0], seeds=3, steps=100) == pytest.approx(
        3 * (100 * 0.01 * (1 + 4) + 2 * 3.0))
