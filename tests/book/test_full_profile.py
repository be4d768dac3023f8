"""The `full` profile's code paths, executed end to end at toy size on the CPU.

The paper-scale run needs a GPU; what only `full` does (one alpha per batch, storing every table
in the result store with provenance, loading it back on the next run) must still work before it
is spent on one. The chapter's ``sizes`` parameter shrinks every size of the profile.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from attnbook import layout
from attnbook.execute import execute_chapter
from attnbook.slots import slot_paths
from attnlib import ParameterError

TOY_CH3 = {
    "hist": {"n_sequences": 400, "epochs": 1, "retrain_epochs": 1, "batch": 64},
    "theory_alphas": [1.0, 1.5, 2.0],
    "sim": {"d": 16, "n_seeds": 2, "steps": 40, "n_test": 200},
    "sim_alphas": [1.0, 2.0],
    "scaling_ds": [8, 12], "scaling_seeds": 2,
    "pd_d": 16, "pd_alphas": [0.5, 1.5], "pd_omegas": [0.3, 0.35], "pd_steps": 40,
    "pd_seeds": 2, "pd_n_test": 200, "altA_omegas": [0.2, 0.4],
    "generic_d": 16, "generic_seeds": 4, "generic_steps": 40,
    "rank2_alphas": [1.0, 2.0], "rank2_omegas": [0.2, 0.4], "slice_omegas": [0.3, 0.35],
    "ac_omegas": [0.3], "ac_bracket_tol": 0.05, "refine_nodes": [], "refine_nodes_l": [],
    "sl_sigmas": [0.5, 0.7], "sl_lams": [0.01, 0.1], "sl_theory_alphas": [0.5, 1.5],
    "sl_zero_start": [[0.7, 0.01]], "sl_fd_ds": [16, 24],
    "seed_block": 1,  # the GD tables' seeds in blocks of one: two blocks of draws per table
}

#: chapter 3's theory tables (`attnbook store 03-positional-semantic alpha-c alpha-l theory-grid
#: --defs theory_table` stores them on their own)
THEORY_TABLES = ("alpha-c", "alpha-l", "theory-grid")


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """Executed notebooks, execution records and the result store all under tmp_path."""
    book = layout.Book(layout.current().root, executed=tmp_path / "executed", cache=tmp_path / "cache")
    monkeypatch.setattr(layout, "BOOK", book)
    monkeypatch.setenv("ATTNLIB_RESULTS_DIR", str(tmp_path / "results"))
    return tmp_path


def test_chapter3_full_profile_runs_stores_and_reloads(sandbox):
    params = {"profile": "full", "device": "cpu", "sizes": TOY_CH3}
    record = execute_chapter("03-positional-semantic", params, force=True, log=lambda *_: None)
    # a non-default run has its own output slot: the book's default one is never touched
    summary_path = slot_paths("03-positional-semantic", record["slot"])[1]
    assert record["slot"] != "03-positional-semantic" and summary_path.exists()
    first = json.loads(summary_path.read_text())
    assert first["profile"] == "full"
    loaded = first["results_loaded_from_store"]
    assert loaded and not any(loaded.values())  # first run computes every table
    store = sandbox / "results" / "03-positional-semantic"
    for name in loaded:
        df = pd.read_csv(store / f"{name}.csv")
        assert len(df) > 0, name
        record = json.loads((store / f"{name}.provenance.json").read_text())
        assert record["profile"] == "full", name
        # each table is keyed by what it is computed from, never by the whole profile's sizes
        assert "sizes" not in record["params"], name
        if name in THEORY_TABLES:
            assert record["params"]["omegas"] == TOY_CH3["ac_omegas"]
        elif name == "histogram":  # the trained layer: keyed by its HistogramConfig at toy size
            config = record["params"]["config"]
            assert {k: config[k] for k in TOY_CH3["hist"]} == TOY_CH3["hist"]
        else:  # a GD table: its configuration(s) at the toy dimension
            configs = record["params"].get("configs") or {"": record["params"]["config"]}
            assert {c["d"] for c in configs.values()} <= {16, 8}, name
    assert set(THEORY_TABLES) <= set(loaded)
    # one batch per alpha in the full profile: every simulated alpha is in the table
    gd = pd.read_csv(store / "gd-phase.csv")
    assert sorted(gd.alpha.unique()) == TOY_CH3["pd_alphas"]
    assert gd.seed.nunique() == TOY_CH3["pd_seeds"]
    # seeds in blocks, block-major (the first points are the whole grid with fewer seeds), each
    # block with its own draws: seed s of the table is block s's only seed, on data of its own
    assert list(gd.drop_duplicates("alphas").block) == [0] * len(TOY_CH3["pd_alphas"])
    assert (gd.seed == gd.block).all()
    per_seed = gd[(gd.init == "semantic")].pivot_table(index=["alpha", "omega"], columns="seed",
                                                       values="eps_g_lin")
    assert (per_seed[0] != per_seed[1]).all()

    # a second run with the same parameters loads every table instead of recomputing it
    execute_chapter("03-positional-semantic", params, force=True, log=lambda *_: None)
    second = json.loads(summary_path.read_text())
    assert all(second["results_loaded_from_store"].values())
    assert second["alpha_c"] == first["alpha_c"]


def test_unknown_size_entry_is_refused_before_any_work(sandbox):
    params = {"profile": "full", "device": "cpu", "sizes": {"pd_dd": 16}}
    with pytest.raises(ParameterError, match=r"sizes: unknown entries \['pd_dd'\]"):
        execute_chapter("03-positional-semantic", params, force=True, log=lambda *_: None)


TOY_CH4 = {
    "markov": {"D": 20, "n_vis": 8, "P": 20, "n_test": 100},
    "draws": 2, "widths": [10, 30], "sample_widths": [10],
    "hmc_chains": 2, "hmc_warmup": 10, "hmc_samples": 10, "hmc_leapfrog": 5,
    "images": {"width": 32, "qk_dim": 8, "gd_steps": 20, "gd_batch": 16, "gd_warmup": 2,
               "n_pool": 400, "P": 40, "n_val": 60, "n_test": 60},
    "image_widths": [10, 100], "image_T": [0.1, 0.5], "image_seeds": 2,
    "image_random_orders": 5, "image_prune_test": 100,
}


def test_chapter4_full_profile_runs_stores_and_reloads(sandbox):
    params = {"profile": "full", "device": "cpu", "sizes": TOY_CH4}
    record = execute_chapter("04-attention-paths", params, force=True, log=lambda *_: None)
    summary_path = slot_paths("04-attention-paths", record["slot"])[1]
    first = json.loads(summary_path.read_text())
    assert first["profile"] == "full"
    stored = first["stored_results"]  # table -> {"stored": loaded from the store, ...}
    assert set(stored) == {"hmc-theory", "hmc-sampling-N10", "two-path", "glyphs-theory",
                           "glyphs-pruning"}
    assert not any(entry["stored"] for entry in stored.values())  # the first run computes each
    store = sandbox / "results" / "04-attention-paths"
    for name in stored:
        assert len(pd.read_csv(store / f"{name}.csv")) > 0, name
        params_stored = json.loads((store / f"{name}.provenance.json").read_text())["params"]
        assert "sizes" not in params_stored, name
    theory = pd.read_csv(store / "hmc-theory.csv")
    assert sorted(theory[theory.kind == "theory"].N.unique()) == TOY_CH4["widths"]
    pruning = pd.read_csv(store / "glyphs-pruning.csv")
    assert len(pruning) == TOY_CH4["image_seeds"]
    # a second run with the same parameters loads every table instead of recomputing it
    execute_chapter("04-attention-paths", params, force=True, log=lambda *_: None)
    second = json.loads(summary_path.read_text())
    assert all(entry["stored"] for entry in second["stored_results"].values())
    assert second["images_gd_acc"] == first["images_gd_acc"]


def test_chapter4_unknown_or_bad_size_entry_is_refused_before_any_work(sandbox):
    params = {"profile": "full", "device": "cpu", "sizes": {"image_width": [10]}}
    with pytest.raises(ParameterError, match=r"sizes: unknown entries \['image_width'\]"):
        execute_chapter("04-attention-paths", params, force=True, log=lambda *_: None)
    params["sizes"] = {"images": {"gd_steps": 10, "gd_warmup": 600}}
    with pytest.raises(ParameterError, match=r"sizes\['images'\]"):
        execute_chapter("04-attention-paths", params, force=True, log=lambda *_: None)
