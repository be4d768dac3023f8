"""Fault injection, second pass: a clean during a run, a missing audit folder, usage errors,
comments in the pins, impossible schedulers, deleted provenance. Each failure is one line with
the right exit status, and the last good output survives."""

from __future__ import annotations

import time

import pytest

import attnbook as ab
from attnbook import slots
from attnbook.cli import main

from .test_reliability import _cli, _outputs, tiny  # noqa: F401  (the tiny book fixture)


def _wait_for(predicate, timeout=180.0):
    deadline = time.time() + timeout
    while time.time() < deadline and not predicate():
        time.sleep(0.2)
    assert predicate(), "timed out"


def test_clean_refuses_while_a_slot_executes_and_list_says_so(tiny, tmp_path, capsys):  # noqa: F811
    assert main(["run", "99-tiny"]) == 0
    before = _outputs(tiny)
    gate = tmp_path / "gate"
    running = _cli(tiny, "run", "99-tiny", "--force", env={"TINY_GATE": str(gate)})
    lock = tiny / "book" / "_cache" / "locks" / "slot-99-tiny.lock"
    _wait_for(lambda: lock.exists() and lock.read_text().strip())
    capsys.readouterr()
    assert main(["list"]) == 0
    assert "99-tiny" in capsys.readouterr().out.split("executing now")[0]
    assert main(["clean"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "99-tiny is being executed" in err
    assert _outputs(tiny) == before  # nothing of the running slot was removed
    gate.touch()
    out, err = running.communicate(timeout=300)
    assert running.returncode == 0, err
    assert main(["clean"]) == 0  # once the run is over, clean goes ahead
    assert _outputs(tiny) == {}


def test_audit_of_a_missing_folder_fails_in_one_line(tmp_path, capsys):
    assert main(["audit", "--results", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nowhere is not a folder" in err


@pytest.mark.parametrize(("args", "hint"), [(["--bogus"], "`attnbook --help`"),
                                            (["run"], "`attnbook run --help`"),
                                            (["run", "99-tiny", "--bogus"], "`attnbook --help`")])
def test_usage_errors_name_the_right_help(args, hint, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert hint in err[-1] and "attnbook attnbook" not in err[-1]


def test_comments_and_blank_lines_in_the_pins_change_no_cache_key(tiny):  # noqa: F811
    pins = tiny / "constraints.txt"
    pins.write_text("numpy==2.0.0\ntorch==2.13.0\n")
    key = slots._pins_hash()
    pins.write_text("# the exact pins\n\nnumpy==2.0.0   # arrays\n  torch==2.13.0\n\n")
    assert slots._pins_hash() == key
    pins.write_text("numpy==2.0.1\ntorch==2.13.0\n")
    assert slots._pins_hash() != key


@pytest.mark.parametrize("scheduler", ["local:99999999999", "local:0"])
def test_a_local_cluster_is_bounded_by_the_cores(scheduler):
    from attnbook.sweeps import check_scheduler

    with pytest.raises(ab.ParameterError, match="takes 1 to .* workers on this machine"):
        check_scheduler(scheduler)


def test_executed_notebooks_hold_no_machine_paths(tiny):  # noqa: F811
    import json

    assert main(["run", "99-tiny"]) == 0
    notebook = slots.slot_paths("99-tiny", "99-tiny")[0]
    text = notebook.read_text()
    assert str(tiny) not in text and "_cache/work" not in text
    pm = json.loads(text)["metadata"]["papermill"]
    assert pm["input_path"] == "chapters/99-tiny.md" and pm["output_path"] == "book/chapters/99-tiny.ipynb"


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (root only; skipped where the machine does not allow mounting one)."""
    import subprocess

    where = tmp_path / "disk"
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({proc.stderr.strip() or 'mount failed'})")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.mark.parametrize("free_kib", [0, 24])
def test_a_full_disk_is_one_line_and_keeps_the_last_good_output(tiny, small_disk, monkeypatch, capsys,  # noqa: F811
                                                                 free_kib):
    import dataclasses

    from attnbook import layout

    assert main(["run", "99-tiny"]) == 0
    before = _outputs(tiny)
    # the cache (work folder, logs, checkpoints, records) on a disk with free_kib KiB left
    monkeypatch.setattr(layout, "BOOK", dataclasses.replace(layout.current(), cache=small_disk / "cache"))
    filler = small_disk / "filler"
    with open(filler, "wb") as fh:
        try:
            fh.write(b"\0" * (256 * 1024 - free_kib * 1024))
        except OSError:
            pass
    capsys.readouterr()
    assert main(["run", "99-tiny", "--force"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "No space left on device" in err, err
    assert _outputs(tiny) == before  # nothing published
    leftovers = [p for p in (small_disk / "cache").rglob("*.tmp")] if (small_disk / "cache").exists() else []
    assert leftovers == []


def test_clean_stale_removes_temporary_files_of_ended_writes(tiny, capsys):  # noqa: F811
    assert main(["run", "99-tiny"]) == 0
    cache = tiny / "book" / "_cache"
    dead = cache / "sweeps" / "99-tiny" / ".squares.abc.jsonl.999999999.tmp"  # no such process
    dead.write_bytes(b"")
    live = cache / f".executions.json.{__import__('os').getpid()}.tmp"  # this process: still writing
    live.write_bytes(b"")
    assert main(["clean", "--stale"]) == 0
    assert not dead.exists() and live.exists()
    assert _outputs(tiny)  # the outputs stay


def test_the_scripted_probe_passes():
    """tests/probe_reliability.py: an edited checkpoint line, a deleted provenance record, clean
    during a run and an impossible size, on a copy of chapter 0 (about 30 s)."""
    import subprocess
    import sys
    from pathlib import Path

    probe = Path(__file__).resolve().parents[1] / "probe_reliability.py"
    proc = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") == 4


@pytest.mark.parametrize(("sizes", "message"), [
    ({"hist": {"n_sequences": 10**13}}, r"needs at least .* TB of memory; this machine has"),
    ({"seed_block": "x"}, r"sizes\['seed_block'\]='x' must be an integer"),
])
def test_impossible_or_mistyped_sizes_are_refused_before_a_kernel(sizes, message):
    from attnbook import chapter_params as cp

    with pytest.raises(ab.ParameterError, match=message):
        cp.check_chapter_sizes("03-positional-semantic", {"sizes": sizes})


def test_clean_slot_drops_one_slot_only(tiny, capsys):  # noqa: F811
    assert main(["run", "99-tiny"]) == 0
    assert main(["run", "99-tiny", "-p", "seed=2"]) == 0
    book_slot = _outputs(tiny)
    sweeps = tiny / "book" / "_cache" / "sweeps"
    assert (sweeps / "99-tiny@seed=2").exists()
    assert main(["clean", "--slot", "99-tiny@seed=2"]) == 0
    assert not (sweeps / "99-tiny@seed=2").exists() and _outputs(tiny, "99-tiny@seed=2") == {}
    assert "99-tiny@seed=2" not in slots._load_records()
    assert _outputs(tiny) == book_slot and (sweeps / "99-tiny").exists()  # the book's slot untouched
    capsys.readouterr()
    assert main(["clean", "--slot", "99-tiny@seed=9"]) == 2
    assert "no such output slot" in capsys.readouterr().err


def test_a_dead_scheduler_is_refused_even_when_the_slot_is_current(tmp_path, monkeypatch, capsys):
    from ..conftest import myst_chapter, point_book_at, tiny_book

    params = 'profile = "quick"\ndevice = "cpu"\nseed = 0\nscheduler = "serial"'
    code = ('import attnbook as ab\n'
            'run = ab.start_chapter("96-sched", profile=profile, device=device, seed=seed, quiet=True)\n'
            'run.write_summary()')
    point_book_at(tiny_book(tmp_path / "root", "96-sched", myst_chapter("Sched", params, code)), monkeypatch)
    assert main(["run", "96-sched"]) == 0
    capsys.readouterr()
    assert main(["run", "96-sched", "--scheduler", "tcp://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "127.0.0.1:1" in err


def test_clean_stale_removes_kernel_folders_of_ended_runs(tiny):  # noqa: F811
    import tempfile
    from pathlib import Path

    assert main(["run", "99-tiny"]) == 0
    assert not list(Path(tempfile.gettempdir()).glob(f"attnbook-{__import__('os').getpid()}-*"))  # removed
    dead = Path(tempfile.mkdtemp(prefix="attnbook-999999999-"))  # a killed run's sockets
    (dead / "kernel.json").write_text("{}")
    assert main(["clean", "--stale"]) == 0
    assert not dead.exists()


@pytest.mark.parametrize("phase", ["summary", "notebook", "record"])
def test_a_kill_at_each_phase_of_promotion_publishes_nothing_wrong(tiny, monkeypatch, capsys, phase):  # noqa: F811
    """The kernel has finished; the process dies while it promotes the outputs (two renames, then
    the record that vouches for the pair). Whatever is on disk afterwards, the slot is current only
    if its files are the ones its record vouches for, and the next run repairs it."""
    import os as _os

    from attnbook import execute

    assert main(["run", "99-tiny"]) == 0
    real_replace, real_update = _os.replace, execute._update_records

    def replace(src, dst):
        if phase == "summary" and str(dst).endswith(".summary.json") and "book/chapters" in str(dst):
            raise KeyboardInterrupt
        real_replace(src, dst)
        if phase == "notebook" and str(dst).endswith("99-tiny.ipynb") and "book/chapters" in str(dst):
            raise KeyboardInterrupt

    def update(slot, record):
        if phase == "record":
            raise KeyboardInterrupt
        real_update(slot, record)

    monkeypatch.setattr(execute.os, "replace", replace)
    monkeypatch.setattr(execute, "_update_records", update)
    assert main(["run", "99-tiny", "--force"]) == 130  # the book's slot, whose outputs exist
    monkeypatch.setattr(execute.os, "replace", real_replace)
    monkeypatch.setattr(execute, "_update_records", real_update)
    key, records = slots._prepare("99-tiny", {})[4], slots._load_records()
    current = slots.is_current("99-tiny", key, records, "99-tiny")
    if current:  # current: its files are exactly the ones its record vouches for
        assert slots._output_problem("99-tiny", "99-tiny", records["99-tiny"]) is None
    else:  # otherwise list says why, and the next run repairs it
        assert slots.stale_reasons("99-tiny", "99-tiny", key, slots._prepare("99-tiny", {})[3], records)
    assert current == (phase == "summary")  # the old pair survives only if the kill came first
    capsys.readouterr()
    assert main(["run", "99-tiny"]) == (0)
    assert slots.is_current("99-tiny", key, slots._load_records(), "99-tiny")


def test_a_full_run_says_how_long_its_unstored_tables_take(tmp_path, monkeypatch):
    import json as _json

    from attnbook import execute, layout

    monkeypatch.setattr(layout, "BOOK", layout.Book(tmp_path))
    report = tmp_path / "benchmarks" / "results" / "full_cost.json"
    report.parent.mkdir(parents=True)
    report.write_text(_json.dumps({"rows": [
        {"chapter": "07", "table": "grid (25 x 25)", "cpu_s": 7200},
        {"chapter": "07", "table": "small", "cpu_s": 10},
        {"chapter": "07", "table": "done", "cpu_s": 36000}]}))
    (tmp_path / "results" / "07-x").mkdir(parents=True)
    (tmp_path / "results" / "07-x" / "done.csv").write_text("a\n1\n")
    said = []
    execute._warn_cost("07-x", said.append)
    assert len(said) == 1 and "computes grid, small" in said[0] and "about 2 CPU h" in said[0]
    execute._warn_cost("08-y", said.append)  # no rows: nothing said
    assert len(said) == 1
