"""Every stored paper-scale table still matches the code: a cheap slice of it is recomputed.

A table in ``results/`` was produced by the chapter's ``full`` profile at some commit. Here a few
of its points (the cheapest ones, or a nested part of one: the first head counts of a single
stream of draws) are computed again on the CPU with the chapter's own current code
(:func:`attnbook.slices.recompute_slice`, planned as ``attnbook store`` plans the table) and
compared with the stored rows, value by value (``attnbook slice CHAPTER TABLE`` does the same for
one table from the command line). A change that alters what a stored table means (a new
estimator, another seed convention, a changed equation) therefore fails here, and the table must
be recomputed; the audit (``attnbook audit``) only says whether the code's source changed.

Every stored table needs an entry in ``SLICES``: a new table without one fails the test. A table
whose cheapest slice takes minutes is marked ``heavy`` with its measured cost; those run with
``ATTNBOOK_SLICES=all`` (``make test`` skips them, saying so).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attnbook.slices import check_slice, compare_slice
from attnbook.tables import plan_tables

ROOT = Path(__file__).resolve().parents[2]

STORED = sorted(p.relative_to(ROOT / "results").with_suffix("").as_posix()
                for p in (ROOT / "results").glob("*/*.csv"))

#: Per stored table (``<chapter>/<name>``): which points to recompute (``idx``: their indices in
#: the table's list of points, negative from the end), how (``recompute_slice`` arguments) and how
#: to compare (``cmp``: ``compare_slice`` arguments); ``heavy``: the slice's measured cost, when it
#: is too long for every test run.
# how a solve went, not what it found: iterations, residuals, which start won, error estimates
SOLVER_DIAGNOSTICS = ("n_iter", "residual", "retried", "start", "quad_err_alpha",
                      "quad_err_from_previous_rule")
# chapter 3 stores its theory tables with this call (in the cells that use them)
STORE03 = ("ab.stored_or_compute(run, '{0}', lambda: theory_table('{0}'), "
           "dict(THEORY_KEYS['{0}'], seed=run.seed))")
THEORY03 = dict(idx=[14], defs=("theory_table",),  # omega = 0.3, the chapter's main slice
                cmp=dict(ignore=SOLVER_DIAGNOSTICS, rtol=1e-4, atol=1e-9))
# Training and sampling amplify floating-point rounding: recomputed later (on another CPU, with
# other vector kernels, say), Adam, SGD and HMC trajectories part after a few hundred steps. These
# tables are compared on their summaries, at a few times the spread measured between the stored
# run and a recomputation (in brackets); their trajectories and per-chain spreads are left out. A
# changed estimator or equation moves the summaries far more; a changed seed convention need not.
CHAOTIC = {
    # explained variance (4e-6), final loss and training curve (5% of values near 1e-6)
    "hard": dict(tol={"ev": (1e-3, 0.0), "final": (0.25, 1e-7), "curve": (0.25, 1e-6)}),
    # validation accuracies (5e-5), distances in weight space (0.3%), attention maps (1e-3)
    "histogram": dict(ignore=("history",),
                      tol={"val_acc": (0.0, 2e-3), "val_acc_retrained": (0.0, 2e-3),
                           "dist_init_to_solution": (0.02, 0.0), "dist_solution_to_retrained": (0.02, 0.0),
                           "maps": (0.0, 0.01)}),
    # sampled accuracy (0.3 points of ~1000 test sequences), correlations with the theory (5e-4),
    # median relative variance difference (0.016), sampled U (0.09 where it is 10), acceptance (0.02),
    # R-hat (8e-4), effective sample size (7%), adapted step size (1.6%); the theory's own columns
    # exactly
    "hmc": dict(ignore=("m_sampled", "v_sampled", "acc_chain_sd", "U_sampled_sd"),
                tol={"acc_sampled": (0.0, 1.5), "mean_corr": (0.0, 2e-3), "var_corr": (0.0, 5e-3),
                     "var_rel_diff": (0.0, 0.08), "U_sampled": (0.05, 0.1), "accept": (0.0, 0.08),
                     "rhat": (0.0, 5e-3), "ess": (0.3, 0.0), "step": (0.08, 0.0)}),
    # the first seed's network is trained in float32, and its weights differ in the last digits from
    # one CPU to another. Recomputed on the machine that stored the tables, the theory's
    # worst-conditioned solve (N = 10, T = 0.01) stopped at a U 2e-4 away, residual 2.8e-6 against
    # 2.1e-6. On the 2026-12-05 machine, where the code from before the package split (c82cbaa) and
    # the current code give the same digits, it stops 0.015 away in U (7e-5 of its largest entry,
    # 213), residual 1.4e-5; and the pruning run's head scores move by 9e-6, its random-order curve
    # by 1e-3 points (of 93), its network's U by 1e-5, the path alignments by 8e-5, the kernel-target
    # alignments by 6e-8. The accuracies, drops and every other point are equal. Tolerances: a few
    # times those spreads
    "glyphs": dict(tol={"U": (0.0, 0.05), "residual": (0.0, 5e-5), "scores": (0.0, 5e-5),
                        "curve_random": (0.0, 5e-3), "U_gd": (0.0, 5e-5), "align_gp": (0.0, 3e-4),
                        "align_fw": (0.0, 3e-4), "kta_gp": (0.0, 3e-7), "kta_fw": (0.0, 3e-7)}),
}
SLICES: dict[str, dict] = {
    "00-attention/neff": dict(idx=[0, -1], defs=("random_scores",)),
    "01-random-features/kernel-mc": dict(),  # one point, every head count: 86 CPU s
    "01-random-features/samples-to-risk": dict(idx=[0, 1]),
    "01-random-features/max-floor": dict(),
    # about 1.5 CPU minutes; its point function is checked by samples-to-risk and max-floor
    "01-random-features/key-key": dict(heavy="about 1.5 CPU minutes"),
    # a shrunk point's rows are a subset of the stored point's: matched row by row (``on``)
    "01-random-features/kernel-curves": dict(shrink={"models": ["RFA"]},
                                             cmp=dict(on=("model", "target", "n")),
                                             heavy="over 5 CPU minutes"),
    "01-random-features/heads": dict(shrink={"heads_list": [16, 32]}, cmp=dict(on=("heads", "target", "n")),
                                     heavy="over 5 CPU minutes"),
    "01-random-features/brfa": dict(shrink={"biases": [0.0]}, cmp=dict(on=("bias", "target", "n")),
                                    heavy="over 5 CPU minutes"),
    "01-random-features/crossing": dict(shrink={"biases": [0.0]}, cmp=dict(on=("bias", "target", "n")),
                                        heavy="about 3.5 CPU minutes"),
    "02-provable-mha/regimes": dict(idx=[0, 13]),
    "02-provable-mha/moments": dict(idx=[0, 7]),
    "02-provable-mha/limit": dict(pre="dB, kB, eta = CFG.body_d, 3, CFG.eta\n"
                                      "tau_B = math.log((1 - eta) / eta)"),
    "02-provable-mha/ablation": dict(),
    "02-provable-mha/hard": dict(cmp=CHAOTIC["hard"], heavy="over 4 CPU minutes (Adam training)"),
    "03-positional-semantic/theory-grid": dict(THEORY03, call=STORE03.format("theory-grid"),
                                               cmp=dict(THEORY03["cmp"], on=("omega", "alpha", "branch"))),
    "03-positional-semantic/alpha-c": dict(THEORY03, call=STORE03.format("alpha-c"),
                                           cmp=dict(THEORY03["cmp"], on=("omega", "table"))),
    "03-positional-semantic/alpha-l": dict(THEORY03, call=STORE03.format("alpha-l"),
                                           cmp=dict(THEORY03["cmp"], on=("omega", "table"))),
    "03-positional-semantic/gd-scaling": dict(defs=("sim_point",)),
    # alpha = 0.01, the first block of seeds, every omega: the cheapest point of the d = 1000 grid
    "03-positional-semantic/gd-phase": dict(defs=("sim_point",)),
    "03-positional-semantic/gd-omega03": dict(defs=("sim_point",)),
    "03-positional-semantic/histogram": dict(cmp=CHAOTIC["histogram"],
                                             heavy="about 6 CPU minutes (training)"),
    "04-attention-paths/hmc-theory": dict(cmp=dict(ignore=("iters",))),
    "04-attention-paths/two-path": dict(defs=("gp_accuracy",)),
    # both train the first seed's width-512 network first (6000 Adam steps)
    "04-attention-paths/glyphs-theory": dict(idx=[0, 10], defs=("theory_point",), cmp=CHAOTIC["glyphs"],
                                             heavy="about 6 CPU minutes (training)"),
    "04-attention-paths/glyphs-pruning": dict(defs=("theory_point",), cmp=CHAOTIC["glyphs"],
                                              heavy="about 8 CPU minutes (training)"),
    **{f"04-attention-paths/hmc-sampling-N{n}": dict(
        defs=("gp_accuracy", "sample_width"), cell="hmc-sampling-N{N}", cmp=CHAOTIC["hmc"],
        heavy=f"about {m} CPU minutes")
       for n, m in ((10, 2), (30, 2.5), (100, 4))},
}


@pytest.mark.parametrize("table", STORED)
def test_stored_table_matches_a_recomputed_slice(table, tmp_path):
    assert table in SLICES, (f"results/{table}.csv has no slice to recompute: add an entry to "
                             "SLICES in tests/book/test_stored_slices.py")
    spec = dict(SLICES[table])
    heavy = spec.pop("heavy", None)
    if heavy and os.environ.get("ATTNBOOK_SLICES") != "all":
        pytest.skip(f"{table}: its cheapest slice takes {heavy}; run with ATTNBOOK_SLICES=all")
    chapter, name = table.split("/")
    # a field the slice shrinks differs from the stored point's by design: check_slice ignores it
    n, diffs, _ = check_slice(chapter, name, spec.pop("idx", [0]), spec.pop("cmp", {}),
                              workdir=tmp_path, **spec)
    assert n > 0, f"{table}: no value of the recomputed slice is in the stored table"
    assert not diffs, f"{table}: {len(diffs)} of {n} recomputed values differ:\n" + "\n".join(diffs[:10])


def test_every_slice_names_a_table_a_full_run_stores():
    # a slice may wait for its table (chapter 3's d = 1000 GD tables are stored in parts, when
    # a machine has the hours), but it must name a table that a chapter's full profile stores
    for table, spec in SLICES.items():
        chapter, name = table.split("/")
        plan_tables(chapter, [] if "call" in spec else [spec.get("cell", name)], spec.get("defs", ()),
                       (spec["pre"],) if "pre" in spec else ())


def test_compare_slice_reports_every_changed_value_and_skips_wall_times():
    import pandas as pd

    stored = pd.DataFrame({"alpha": [0.5, 0.5, 1.0], "branch": ["p", "s", "p"],
                           "eps": [0.1, 0.2, 0.3], "elapsed_s": [1.0, 2.0, 3.0]})
    fresh = stored[stored.alpha == 0.5].assign(elapsed_s=[9.0, 9.0])
    chosen = [{"alpha": 0.5}]
    assert compare_slice(fresh, stored, chosen) == (4, [])  # branch and eps of two rows
    moved = fresh.assign(eps=[0.1, 0.2 * (1 + 1e-4)])
    n, diffs = compare_slice(moved, stored, chosen)
    assert n == 4 and len(diffs) == 1 and "eps" in diffs[0] and "0.2" in diffs[0]
    assert compare_slice(moved, stored, chosen, rtol=1e-3)[1] == []
    # a column's own tolerance
    assert compare_slice(moved, stored, chosen, tol={"eps": (1e-3, 0.0)})[1] == []
    assert compare_slice(moved, stored, chosen, rtol=1e-3, tol={"eps": (1e-5, 0.0)})[1]
    # a point the stored table does not hold, or holds with other rows, is a difference too
    assert compare_slice(fresh.assign(alpha=2.0), stored, [{"alpha": 2.0}])[1]
    assert compare_slice(fresh.iloc[:1], stored, chosen)[1]
