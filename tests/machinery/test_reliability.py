"""Re-runs never lose work: atomic outputs, parameters checked first, slots, locks, stored results.

Executions here use a tiny throwaway chapter in a temporary book tree (``$ATTNBOOK_ROOT`` for the
command-line subprocesses, the current book, :mod:`attnbook.layout`, in-process), never the book's chapters.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from attnbook import execute
from attnbook.cli import _cli_params, clean, main
from attnbook.deps import chapter_modules
from attnbook.execute import execute_chapter
from attnbook.layout import _read_chapter
from attnbook.params import COMMON, parameter_schema, toc_chapters
from attnbook.slots import _WARNED, _prepare, is_current, key_inputs, slot_paths
from attnlib import ParameterError

from ..conftest import ROOT, myst_chapter, point_book_at, tiny_book

TINY = myst_chapter("Tiny", """
profile = "quick"  # "quick" or "full"
device = "cpu"
seed = 0
n = 4              # sweep points
flag = False       # a boolean
""", """
import os
import time

import attnbook as ab

run = ab.start_chapter("99-tiny", profile=profile, device=device, seed=seed, quiet=True)
gate = os.environ.get("TINY_GATE")  # a test holds the execution here until it creates this file
while gate and not os.path.exists(gate):
    time.sleep(0.1)
assert os.environ.get("TINY_FAIL") != "1", "asked to fail"
if os.environ.get("TINY_STORE"):  # as a full run does: store a table in the result store
    store = os.path.join(os.environ["ATTNLIB_RESULTS_DIR"], "99-tiny")
    os.makedirs(store, exist_ok=True)
    with open(os.path.join(store, "t.csv"), "w") as fh:
        fh.write("x")


def point(i):  # the delay is how it runs, not what it computes: not a global the sweep key reads
    time.sleep(float(os.environ.get("TINY_DELAY", "0")))
    return {"sq": i * i}


res = ab.sweep(point, [{"i": i} for i in range(n)], os.environ.get("TINY_SWEEP", "squares"), run=run)
run.record(total=int(res.sq.sum()), flag=flag, is_bool=isinstance(flag, bool))
run.write_summary()
""")

QUIET = {"log": lambda *_: None}


def _make_root(root: Path) -> Path:
    return tiny_book(root, "99-tiny", TINY)


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A book tree with one tiny chapter, made the current book of :mod:`attnbook`."""
    root = _make_root(tmp_path / "root")
    point_book_at(root, monkeypatch)
    for var in ("TINY_DELAY", "TINY_FAIL", "TINY_SWEEP", "TINY_STORE"):
        monkeypatch.delenv(var, raising=False)
    return root


def _outputs(root: Path, slot: str = "99-tiny") -> dict[str, bytes]:
    notebook, summary = slot_paths("99-tiny", slot)
    return {p.name: p.read_bytes() for p in (notebook, summary) if p.exists()}


def _cli(root: Path, *args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    env = {**os.environ, "ATTNBOOK_ROOT": str(root), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "attnbook", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


# ---- failures keep the last good output --------------------------------------------------------
def test_failed_run_keeps_previous_outputs(tiny, monkeypatch, capsys):
    assert main(["run", "99-tiny"]) == 0
    before = _outputs(tiny)
    assert set(before) == {"99-tiny.ipynb", "99-tiny.summary.json"}
    capsys.readouterr()
    monkeypatch.setenv("TINY_FAIL", "1")
    assert main(["run", "99-tiny", "--force"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line: what failed, the log, what is kept
    assert "99-tiny failed in cell" in err[0] and "AssertionError: asked to fail" in err[0]
    assert "the last good output is kept" in err[0] and "4 finished sweep points saved" in err[0]
    assert _outputs(tiny) == before
    assert "asked to fail" in (tiny / "book" / "_cache" / "logs" / "99-tiny.log").read_text()
    assert not list((tiny / "book" / "_cache" / "work").iterdir())  # no partial left behind
    monkeypatch.delenv("TINY_FAIL")
    assert is_current("99-tiny", _prepare("99-tiny", {})[4])  # still the good run


def test_interrupted_run_keeps_outputs_and_finished_sweep_points(tiny, monkeypatch):
    execute_chapter("99-tiny", **QUIET)
    before = _outputs(tiny)
    proc = _cli(tiny, "run", "99-tiny", "--force", "-p", "n=40",
                env={"TINY_DELAY": "0.5", "TINY_SWEEP": "slow"})
    slot = "99-tiny@n=40"
    checkpoints = tiny / "book" / "_cache" / "sweeps" / slot
    deadline = time.time() + 240
    while time.time() < deadline:
        done = sum(len(p.read_text().splitlines()) for p in checkpoints.glob("slow.*.jsonl"))
        if done >= 2 or proc.poll() is not None:
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)  # what Ctrl-C does (SIGINT) takes the same path
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith("interrupted: chapter 99-tiny@n=40 was interrupted")
    assert "Traceback" not in err and "there was no earlier output" in lines[-1]
    saved = sum(len(p.read_text().splitlines()) for p in checkpoints.glob("slow.*.jsonl"))
    assert saved >= 2 and f"{saved} finished sweep points saved" in lines[-1]
    assert _outputs(tiny) == before  # the default slot was never touched
    # the next run resumes from the finished points
    monkeypatch.setenv("TINY_SWEEP", "slow")
    lines_seen = []
    execute_chapter("99-tiny", {"n": 40}, log=lines_seen.append)
    assert any(f"resuming after {saved} finished points" in line for line in lines_seen)


def test_sweep_resumes_after_a_line_cut_short(tmp_path):
    import attnbook as ab

    path = tmp_path / "s.jsonl"
    ab.sweep(lambda i: {"sq": i * i}, [{"i": i} for i in range(3)], "s", path=path)
    text = path.read_text()
    path.write_text(text[: -len(text.splitlines()[-1]) // 2 - 1])  # killed mid-write of point 2
    calls = []

    def fn(i):
        calls.append(i)
        return {"sq": i * i}

    df = ab.sweep(fn, [{"i": i} for i in range(4)], "s", path=path)
    assert calls == [2, 3] and df.sq.tolist() == [0, 1, 4, 9]
    again = ab.sweep(fn, [{"i": i} for i in range(4)], "s", path=path)
    assert calls == [2, 3] and again.sq.tolist() == [0, 1, 4, 9]  # nothing lost, nothing redone


# ---- records and outputs on disk -------------------------------------------------------------
def test_corrupt_records_are_reported_not_crashed(tiny, capsys):
    execute_chapter("99-tiny", **QUIET)
    records = tiny / "book" / "_cache" / "executions.json"
    records.write_text(records.read_text()[:40])  # truncated mid-write
    assert main(["list"]) == 0
    captured = capsys.readouterr()
    warnings = captured.err.strip().splitlines()
    assert len(warnings) == 1 and "executions.json is unreadable" in warnings[0]
    assert "Traceback" not in captured.err and "needs execution: never executed" in captured.out
    _WARNED.clear()
    execute_chapter("99-tiny", **QUIET)  # re-executes, sets the bad file aside
    assert json.loads(records.read_text())["99-tiny"]["key"]
    assert list(records.parent.glob("executions.corrupt-*.json"))


def test_truncated_notebook_is_not_current_and_list_says_why(tiny, capsys):
    execute_chapter("99-tiny", **QUIET)
    notebook, _ = slot_paths("99-tiny", "99-tiny")
    notebook.write_bytes(notebook.read_bytes()[:200])
    main(["list"])
    assert "executed notebook unreadable or incomplete" in capsys.readouterr().out
    source = tiny / "chapters" / "99-tiny.md"
    source.write_text(source.read_text() + "\nOne more sentence.\n")
    main(["list"])
    assert "needs execution: chapters/99-tiny.md changed" in capsys.readouterr().out


def test_non_default_run_has_its_own_slot(tiny, capsys):
    execute_chapter("99-tiny", **QUIET)
    before = _outputs(tiny)
    record = execute_chapter("99-tiny", {"seed": 1, "flag": True}, **QUIET)
    assert record["slot"] == "99-tiny@flag=True,seed=1"
    assert _outputs(tiny) == before
    summary = json.loads(_outputs(tiny, record["slot"])["99-tiny.summary.json"])
    assert summary["seed"] == 1 and summary["flag"] is True
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "99-tiny " in out and "99-tiny@flag=True,seed=1" in out and out.count("current") == 2


def test_clean_stale_prunes_old_checkpoints_only(tiny):
    execute_chapter("99-tiny", **QUIET)
    sweeps = tiny / "book" / "_cache" / "sweeps" / "99-tiny"
    current = sorted(p.name for p in sweeps.glob("*.jsonl"))
    assert len(current) == 1 and current[0].startswith("squares.")
    (sweeps / "0123456789abcdef").mkdir()  # the former layout: a folder per chapter cache key
    (sweeps / "0123456789abcdef" / "old.jsonl").write_text("{}\n")
    (sweeps / "squares.fedcba9876543210.jsonl").write_text("{}\n")  # an older point function's
    clean(stale=True, **QUIET)
    assert sorted(p.name for p in sweeps.iterdir()) == sorted([*current, "params.json", "used.json"])
    assert is_current("99-tiny", _prepare("99-tiny", {})[4])


# ---- what the cache key covers ------------------------------------------------------------------
def test_module_hash_ignores_comments_docstrings_and_formatting(tmp_path):
    from attnbook.runs import module_hash

    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text('"""Doc."""\n\ndef f(x):\n    """Square."""\n    return x * x  # note\n')
    b.write_text("def f( x ):\n\n    return x*x\n")
    c.write_text("def f(x):\n    return x * x + 1\n")
    assert module_hash(a) == module_hash(b) != module_hash(c)


def test_cache_key_follows_the_modules_a_chapter_imports(tiny):
    source = tiny / "chapters" / "99-tiny.md"
    modules = chapter_modules("99-tiny")
    # ab.start_chapter and ab.sweep are machinery: the science the chapter uses is attnlib itself
    assert modules == set()
    source.write_text(source.read_text().replace("import attnbook as ab", "import attnbook as ab\n"
                                                 "from attnlib import attention as at"))
    assert "attnlib.attention" in chapter_modules("99-tiny")
    inputs = key_inputs("99-tiny", {"profile": "quick", "device": "cpu", "seed": 0})
    assert inputs["device"] == "cpu" and "attnlib/attention.py" in inputs["code"]


def test_cache_key_follows_the_chapters_stored_results(tiny, tmp_path, monkeypatch, capsys):
    """A quick page draws the stored paper-scale tables: a table stored, changed or removed in
    results/<chapter>/ makes the slot stale, and `list` says so. A run that stores tables itself
    (a full run) is current with the store it leaves."""
    store = tmp_path / "results"
    monkeypatch.setenv("ATTNLIB_RESULTS_DIR", str(store))
    execute_chapter("99-tiny", **QUIET)
    assert is_current("99-tiny", _prepare("99-tiny", {})[4])
    (store / "99-tiny").mkdir(parents=True)
    (store / "99-tiny" / "t.csv").write_text("x\n1\n")
    assert not is_current("99-tiny", _prepare("99-tiny", {})[4])
    main(["list"])
    assert "stored results changed (results/99-tiny/)" in capsys.readouterr().out
    (store / "99-tiny" / "t.csv").unlink()
    assert is_current("99-tiny", _prepare("99-tiny", {})[4])
    monkeypatch.setenv("TINY_STORE", "1")
    execute_chapter("99-tiny", {"seed": 2}, **QUIET)
    assert (store / "99-tiny" / "t.csv").exists()
    assert is_current("99-tiny", _prepare("99-tiny", {"seed": 2})[4], slot="99-tiny@seed=2")


# ---- locks -------------------------------------------------------------------------------------
def test_two_concurrent_builds_do_not_interleave(tiny, tmp_path):
    import threading

    gate = tmp_path / "gate"
    env = {"TINY_GATE": str(gate), "PYTHONUNBUFFERED": "1"}
    first = _cli(tiny, "build", "--no-site", env=env)
    lock = tiny / "book" / "_cache" / "locks" / "build.lock"
    deadline = time.time() + 180
    while time.time() < deadline and not (lock.exists() and lock.read_text().strip()):
        time.sleep(0.2)
    second = _cli(tiny, "build", "--no-site", env=env)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(second.stdout), daemon=True)
    reader.start()
    while time.time() < deadline and not any("waiting:" in line for line in seen):
        time.sleep(0.2)
    gate.touch()  # only now may the first build's chapter finish
    out1, err1 = first.communicate(timeout=300)
    second.wait(timeout=300)
    reader.join(timeout=30)
    out2 = "".join(seen)
    assert first.returncode == 0 and second.returncode == 0, err1 + second.stderr.read()
    assert "waiting: another attnbook build in this checkout is already running" in out2
    assert "99-tiny: executed in" in out1 and "1 of 1 chapters executed" in out1
    assert "0 of 1 chapters executed" in out2 and "99-tiny: executed in" not in out2


# ---- parameters are checked before a kernel starts ---------------------------------------------
def _bad_values(schema: dict) -> list[tuple[str, str]]:
    bad = [("bogus", "1"), ("profile", "fast"), ("seed", "-1"), ("seed", "2**64"), ("seed", "1.5"),
           ("device", "tpu")]
    for name, p in schema.items():
        if name in COMMON:
            continue
        if isinstance(p.default, bool):
            bad.append((name, "maybe"))
        elif isinstance(p.default, int | float):
            bad.append((name, "abc"))
        elif isinstance(p.default, dict | list):
            bad += [(name, "[1,2"), (name, "'text'")]
    return bad


def _cases():
    for chapter in toc_chapters():
        schema = parameter_schema(_read_chapter(chapter))
        for name, raw in _bad_values(schema):
            yield chapter, f"{name}={raw}"
    yield "03-positional-semantic", "sizes={'pd_dd': 16}"
    yield "03-positional-semantic", "sizes={'sim': {'d': 0}}"
    yield "03-positional-semantic", "sizes={'pd_alphas': ['a']}"
    yield "03-positional-semantic", "sizes={'sl_zero_start': [0.7]}"
    yield "04-attention-paths", "sizes={'image_width': [10]}"
    yield "04-attention-paths", "sizes={'images': {'patch': 5}}"
    yield "04-attention-paths", "sizes={'markov': {'P': 1}}"
    yield "04-attention-paths", "sizes={'markov': 3}"
    yield "no-such-chapter", "seed=1"


@pytest.mark.parametrize(("chapter", "pair"), list(_cases()))
def test_every_parameter_is_refused_before_a_kernel_starts(chapter, pair, monkeypatch, capsys):
    def no_kernel(*args, **kwargs):
        raise AssertionError("a kernel was started")

    monkeypatch.setattr(execute, "_execute", no_kernel)
    assert main(["run", chapter, "-p", pair]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err


def test_recompute_false_is_false():
    parsed = _cli_params(["03-positional-semantic"], ["recompute=false", "sizes={'pd_d': 16}"])
    assert parsed == {"recompute": False, "sizes": {"pd_d": 16}}
    assert _cli_params(["03-positional-semantic"], ["recompute=True"]) == {"recompute": True}


def test_usage_errors_exit_2_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "attnbook", "run"], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_chapter3_sizes_check_knows_every_entry_of_the_chapter():
    """The check reads PROFILE_SIZES from the chapter itself: every entry there is accepted."""
    from attnbook import chapter_params as cp

    schema = cp.sizes_schema(cp._chapter_source("03-positional-semantic"))
    assert {"hist", "sim", "pd_d", "pd_alphas", "batch_by_alpha"} <= set(schema)
    assert schema["hist"] == ("config", "HistogramConfig") and schema["pd_d"] == ("int", None)


def test_profile_sizes_replaces_entries_and_config_fields_and_refuses_unknown_ones():
    import attnbook as ab
    from attnlib import paths as ap

    profiles = {"quick": dict(draws=3, markov=ap.MarkovTaskConfig())}
    sizes = ab.profile_sizes(profiles, "quick", {"draws": 1, "markov": {"P": 20}})
    assert sizes["draws"] == 1 and sizes["markov"].P == 20
    assert sizes["markov"].D == ap.MarkovTaskConfig().D  # the other fields stay
    assert profiles["quick"]["draws"] == 3  # the chapter's table is not changed
    with pytest.raises(ab.ParameterError, match=r"sizes: unknown entries \['drows'\]"):
        ab.profile_sizes(profiles, "quick", {"drows": 1})


def test_a_profile_written_as_one_config_takes_its_fields_as_sizes(tmp_path, monkeypatch):
    """Chapters 1 and 2 write each profile as one config: `sizes` replaces its fields, checked
    against the profile that runs (its own literal), before a kernel starts."""
    import attnbook as ab
    from attnbook import chapter_params as cp
    from attnlib import random_qk as rq

    profiles = {"quick": rq.RandomQKConfig(), "full": rq.RandomQKConfig(d=12, N=8, N_list=(2, 8))}
    cfg = ab.profile_sizes(profiles, "full", {"seeds": 2})
    assert cfg.seeds == 2 and cfg.d == 12 and profiles["full"].seeds != 2
    with pytest.raises(ParameterError, match=r"sizes: unknown entries \['sedes'\]"):
        ab.profile_sizes(profiles, "quick", {"sedes": 2})
    text = myst_chapter("Tiny", "profile = 'quick'\nsizes = {}",
                        "import attnlib.random_qk as rq\n"
                        "PROFILE_SIZES = {'quick': rq.RandomQKConfig(),\n"
                        "                 'full': rq.RandomQKConfig(d=12, N=8, N_list=(2, 8))}")
    point_book_at(tiny_book(tmp_path, "97-tiny", text), monkeypatch)
    cp.check_chapter_sizes("97-tiny", {"sizes": {"seeds": 2}})
    cp.check_chapter_sizes("97-tiny", {"profile": "full", "sizes": {"N": 2}})  # 2 is in full's N_list
    with pytest.raises(ParameterError, match="N"):  # ... not in quick's
        cp.check_chapter_sizes("97-tiny", {"sizes": {"N": 8, "N_list": (2, 4)}})
    with pytest.raises(ParameterError, match=r"unknown entries \['sedes'\]"):
        cp.check_chapter_sizes("97-tiny", {"sizes": {"sedes": 2}})
    with pytest.raises(ParameterError, match="memory"):
        cp.check_chapter_sizes("97-tiny", {"sizes": {"n_test": 10**15}})


def test_chapter_sizes_are_read_from_the_chapter_outside_the_notebook():
    from attnbook import chapter_params as cp

    full = cp.chapter_sizes("03-positional-semantic", "full")
    assert full["sim"].d == 1000 and full["sim"].n_seeds == 24  # the paper's GD sizes
    assert cp.chapter_sizes("03-positional-semantic")["sim"].d < 1000
    with pytest.raises(ParameterError, match="no 'huge' entry"):
        cp.chapter_sizes("03-positional-semantic", "huge")


def test_chapter4_sizes_check_reads_the_configs_the_chapter_writes():
    from attnbook import chapter_params as cp

    schema = cp.sizes_schema(cp._chapter_source("04-attention-paths"))
    assert schema["images"] == ("config", "ImageTaskConfig")
    assert schema["markov"] == ("config", "MarkovTaskConfig")
    assert schema["draws"] == ("int", None) and schema["image_T"] == ("numbers", None)
    ch4 = "04-attention-paths"
    cp.check_chapter_sizes(ch4, {"sizes": {"images": {"gd_steps": 50, "gd_warmup": 5}, "draws": 2}})
    # checked against the profile that runs: 500 steps are fewer than the full profile's warm-up
    cp.check_chapter_sizes(ch4, {"sizes": {"images": {"gd_steps": 500}}})
    with pytest.raises(ParameterError, match=r"sizes\['images'\]: gd_warmup"):
        cp.check_chapter_sizes(ch4, {"profile": "full", "sizes": {"images": {"gd_steps": 500}}})


# ---- stored results ----------------------------------------------------------------------------
def test_tampered_stored_result_is_refused(tmp_path):
    import attnbook as ab
    from attnbook.store import StoredResultError

    run = ab.start_chapter("99-tiny", profile="full", device="cpu", quiet=True)
    calls = []

    def compute():
        calls.append(1)
        return pd.DataFrame({"x": [1.0, 2.0], "y": [0.5, 0.25]})

    ab.stored_or_compute(run, "table", compute, {"n": 2}, results_dir=tmp_path)
    again = ab.stored_or_compute(run, "table", compute, {"n": 2}, results_dir=tmp_path)
    assert len(calls) == 1 and again.attrs["provenance"]["stored"] and again.attrs["note"]
    csv = tmp_path / "99-tiny" / "table.csv"
    csv.write_text(csv.read_text().replace("0.25", "0.35"))  # a number edited by hand
    with pytest.raises(StoredResultError, match="table.csv"):
        ab.stored_or_compute(run, "table", compute, {"n": 2}, results_dir=tmp_path)
    record = tmp_path / "99-tiny" / "table.provenance.json"
    csv.write_text(csv.read_text().replace("0.35", "0.25"))
    edited = json.loads(record.read_text())
    edited["params"]["n"] = 3  # an edited provenance record
    record.write_text(json.dumps(edited))
    with pytest.raises(StoredResultError, match="table.provenance.json"):
        ab.stored_or_compute(run, "table", compute, {"n": 2}, results_dir=tmp_path)


def test_stale_stored_result_is_loaded_with_a_note(tmp_path):
    import attnbook as ab
    from attnbook import store as _store

    run = ab.start_chapter("99-tiny", profile="full", device="cpu", quiet=True)
    df = pd.DataFrame({"x": [1.0]})
    ab.stored_or_compute(run, "t", lambda: df, {"n": 1}, results_dir=tmp_path)
    record_path = tmp_path / "99-tiny" / "t.provenance.json"
    record = json.loads(record_path.read_text())
    record["code_hash"] = "0" * 64  # produced by other code
    record_path.write_text(json.dumps(_store._seal(record), indent=2))
    loaded = ab.stored_or_compute(run, "t", lambda: df, {"n": 1}, results_dir=tmp_path)
    note = loaded.attrs["note"]
    assert loaded.attrs["provenance"]["stored"] and loaded.attrs["provenance"]["stale"]
    assert "older code" in note and "recompute" in note
    assert run.records["stored_results"]["t"]["note"] == note


def test_kernel_runs_without_the_tcp_warning(tiny, capfd):
    execute_chapter("99-tiny", **QUIET)
    captured = capfd.readouterr()
    assert "without encryption" not in captured.out + captured.err

