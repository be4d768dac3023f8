"""The stored paper-scale table shown beside a quick run (attnbook.store.stored_full)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import attnbook as ab
from attnbook import store as _store
from attnbook.store import StoredResultError


def _store_full_table(tmp_path, values):
    full = ab.start_chapter("99-tiny", profile="full", device="cpu", quiet=True)
    df = pd.DataFrame({"x": [0.0, 1.0], "y": values})
    ab.stored_or_compute(full, "table", lambda: df, {"n": 2}, results_dir=tmp_path)
    return tmp_path / "99-tiny" / "table.csv"


def test_quick_run_gets_the_stored_full_table_with_its_provenance(tmp_path):
    _store_full_table(tmp_path, [0.5, 0.25])
    quick = ab.start_chapter("99-tiny", profile="quick", device="cpu", quiet=True)
    df = ab.stored_full(quick, "table", results_dir=tmp_path)
    assert df is not None and df["y"].tolist() == [0.5, 0.25]
    record = df.attrs["provenance"]
    assert record["profile"] == "full" and record["params"] == {"n": 2} and not record["stale"]
    phrase = df.attrs["phrase"]
    assert phrase == ab.stored_phrase(df)
    assert "full profile" in phrase and record["device_name"] in phrase and record["date"] in phrase
    assert "older code" not in phrase


def test_no_stored_table_is_said_in_a_nonempty_phrase(tmp_path):
    quick = ab.start_chapter("99-tiny", profile="quick", device="cpu", quiet=True)
    assert ab.stored_full(quick, "absent", results_dir=tmp_path) is None
    assert ab.stored_phrase(None).strip()  # myst-nb cannot glue an empty string
    # a full run shows its own table: nothing to put beside it
    _store_full_table(tmp_path, [0.5, 0.25])
    full = ab.start_chapter("99-tiny", profile="full", device="cpu", quiet=True)
    assert ab.stored_full(full, "table", results_dir=tmp_path) is None


def test_stored_full_refuses_an_edited_table_and_flags_older_code(tmp_path):
    csv = _store_full_table(tmp_path, [0.5, 0.25])
    quick = ab.start_chapter("99-tiny", profile="quick", device="cpu", quiet=True)
    record_path = csv.with_suffix(".provenance.json")
    record = json.loads(record_path.read_text())
    record["code_hash"] = "0" * 64  # produced by other code
    record.pop("code", None)
    record_path.write_text(json.dumps(_store._seal(record), indent=2))
    df = ab.stored_full(quick, "table", results_dir=tmp_path)
    assert df.attrs["provenance"]["stale"] and "older code" in df.attrs["phrase"]
    csv.write_text(csv.read_text().replace("0.25", "0.35"))
    with pytest.raises(_store.StoredResultError, match="table.csv"):
        ab.stored_full(quick, "table", results_dir=tmp_path)


def test_list_and_dict_cells_round_trip_through_the_store(tmp_path):
    """Tables with a list or dict per cell (a matrix per width, per-seed curves) are stored as
    JSON text and read back as the same lists and dicts; plain columns keep their types."""
    full = ab.start_chapter("99-tiny", profile="full", device="cpu", quiet=True)
    df = pd.DataFrame({"N": [10, 30], "U": [[1.0, -0.5], [0.25, 2.0]],
                       "curve": [{"a": [1, 2]}, None], "name": ["x", "y,z"]})
    ab.stored_or_compute(full, "nested", lambda: df, {"n": 2}, results_dir=tmp_path)
    record = json.loads((tmp_path / "99-tiny" / "nested.provenance.json").read_text())
    assert record["json_columns"] == ["U", "curve"]
    back, _ = _store.load_result(tmp_path / "99-tiny" / "nested.csv")
    assert back["U"].tolist() == [[1.0, -0.5], [0.25, 2.0]]
    assert back["curve"].tolist() == [{"a": [1, 2]}, None]
    assert back["N"].tolist() == [10, 30] and back["name"].tolist() == ["x", "y,z"]
    again = ab.stored_or_compute(full, "nested", lambda: pytest.fail("recomputed"), {"n": 2},
                                 results_dir=tmp_path)
    assert again["U"].tolist() == back["U"].tolist()
    # a table without nested cells gets no json_columns entry
    _store_full_table(tmp_path, [0.5, 0.25])
    plain = json.loads((tmp_path / "99-tiny" / "table.provenance.json").read_text())
    assert "json_columns" not in plain


def test_stored_sweep_stores_a_full_sweep_and_loads_it_again(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLIB_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("ATTNLIB_SWEEP_DIR", str(tmp_path / "sweeps"))
    full = ab.start_chapter("99-tiny", profile="full", device="cpu", quiet=True)
    points = [{"i": i, "device": "cpu"} for i in range(3)]
    first = ab.stored_sweep(full, "sq", lambda i, device: {"sq": i * i}, points)
    assert first.sq.tolist() == [0, 1, 4] and not first.attrs["provenance"]["stored"]
    again = ab.stored_sweep(full, "sq", lambda i, device: pytest.fail("recomputed"), points)
    assert again.sq.tolist() == [0, 1, 4] and again.attrs["provenance"]["stored"]
    # the key leaves the device out: the same table on any device
    assert again.attrs["provenance"]["params"] == {"points": [{"i": i} for i in range(3)], "seed": 0}


def test_source_phrase_says_where_a_figure_comes_from(tmp_path):
    quick = ab.start_chapter("99-tiny", profile="quick", device="cpu", quiet=True)
    full = ab.start_chapter("99-tiny", profile="full", device="cpu", quiet=True)
    table = pd.DataFrame({"a": [1]})
    assert ab.source_phrase(quick, table) == f"Computed in this run; {ab.stored_phrase(None)}."
    assert ab.source_phrase(full, table).startswith("Paper-scale run (full profile)")
    stored = pd.DataFrame({"a": [1]})
    stored.attrs["provenance"] = {"profile": "full", "device_name": "cpu", "date": "2026-12-05"}
    assert ab.source_phrase(quick, table, stored, "8 seeds") == (
        "Open circles: the paper-scale run stored in results/ (full profile, cpu, 2026-12-05), 8 seeds.")


@pytest.mark.parametrize("gone", ["provenance", "table"])
def test_a_stored_table_missing_half_of_itself_is_refused(tmp_path, gone):
    # deleting the record (or the table) must not quietly turn into "nothing is stored"
    full = ab.start_chapter("99-tiny", profile="full", device="cpu", quiet=True)
    ab.stored_or_compute(full, "table", lambda: pd.DataFrame({"a": [1, 2]}), {"n": 2}, results_dir=tmp_path)
    csv = tmp_path / "99-tiny" / "table.csv"
    (csv.with_suffix(".provenance.json") if gone == "provenance" else csv).unlink()
    quick = ab.start_chapter("99-tiny", profile="quick", device="cpu", quiet=True)
    with pytest.raises(StoredResultError, match="table.(provenance.json|csv) is missing") as err:
        ab.stored_full(quick, "table", results_dir=tmp_path)
    assert "\n" not in str(err.value) and "recompute=True" in str(err.value)


def test_publish_glues_for_the_text_and_records_for_the_summary(monkeypatch):
    glued = {}
    import myst_nb

    monkeypatch.setattr(myst_nb, "glue",
                        lambda name, value, display=True: glued.update({name: (value, display)}))
    monkeypatch.setattr("attnbook.runs._in_ipython", lambda: True)  # as in a chapter's kernel
    run = ab.start_chapter("99-tiny", profile="quick", device="cpu", quiet=True)
    run.publish({"ch9-a": 1.5, "ch9-b": 2, "ch9-c": np.float64(0.25)}, a_value=np.float64(1.5),
                by_width={"10": 0.5})
    # a recorded number is glued under its summary key too (one name per number); dicts are not
    assert glued == {"ch9-a": (1.5, False), "ch9-b": (2, False), "ch9-c": (0.25, False),
                     "a_value": (1.5, False)}
    assert type(glued["ch9-c"][0]) is float and type(glued["a_value"][0]) is float
    assert run.records == {"a_value": 1.5, "by_width": {"10": 0.5}}
    run.record(a_value=1.5)  # the same value again: nothing new
    with pytest.raises(ValueError, match="recorded twice"):
        run.record(a_value=2.5)


def test_a_stored_sweep_meets_the_table_tools_wrappers():
    # attnbook store / slice cut a table to chosen points by wrapping the chapter's ab.sweep and
    # ab.stored_or_compute: a table made by ab.stored_sweep must go through both
    from types import SimpleNamespace

    from attnbook.tables import routed_stored_sweep

    seen = {}
    ns = SimpleNamespace(sweep=lambda fn, points, **kw: seen.setdefault("swept", pd.DataFrame(points)),
                         stored_or_compute=lambda run, name, compute, params, recompute=False:
                         seen.setdefault("stored", (compute(), params))[0])
    run = ab.start_chapter("99-tiny", profile="quick", device="cpu", quiet=True)
    df = routed_stored_sweep(ns)(run, "t", lambda i: {"v": i}, [{"i": 1, "device": "cpu"}])
    assert df is seen["swept"] and seen["stored"][1] == {"points": [{"i": 1}], "seed": 0}
