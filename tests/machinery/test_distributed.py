"""Sweeps on Dask: the same table as the serial run, and no finished point lost.

One embedded 2-worker ``LocalCluster`` (``scheduler="local:2"``) serves the whole module; the
interrupted driver is a separate process that reaches it by its ``tcp://`` address. The point
functions live at module level so that the workers import them by reference.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

import attnbook as ab
from attnbook import sweeps as _sweep

from ..conftest import ROOT, myst_chapter, point_book_at, tiny_book

pytest.importorskip("distributed")

LOCAL = "local:2"
# (read before any cluster starts: starting one used to set it in this process's environment too)
_TRIM_AT_START = os.environ.get("MALLOC_TRIM_THRESHOLD_", "unset")


def two_rows(i: int) -> list[dict]:
    """Two rows per point, as chapters' sweeps over seeds return them."""
    return [{"branch": "a", "value": i * i}, {"branch": "b", "value": -0.5 * i}]


def slow_square(i: int, delay: float = 0.0) -> dict:
    time.sleep(delay)
    return {"sq": i * i, "pid": os.getpid()}


def counted_square(i: int, calls: str, delay: float = 0.0) -> dict:
    """``i**2``; every call appends ``i`` to the file ``calls`` (one line per call)."""
    with open(calls, "a") as fh:
        fh.write(f"{i}\n")
    time.sleep(delay)
    return {"sq": i * i}


def flaky(i: int, marker_dir: str) -> dict:
    """Fails on the first call for i = 1 (a transient error), and always for i = 3."""
    if i == 3:
        raise ValueError("point 3 always fails")
    marker = Path(marker_dir) / f"tried-{i}"
    if i == 1 and not marker.exists():
        marker.write_text("")
        raise RuntimeError("transient failure")
    return {"sq": i * i}


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


@pytest.fixture(scope="module")
def client():
    client = _sweep._client(LOCAL)
    client.wait_for_workers(2, timeout=120)
    yield client
    _sweep._close_clients()


def _worker_pids(client) -> dict[str, int]:
    return client.run(os.getpid)


def test_scheduler_values_are_checked_before_anything_runs(tmp_path):
    for bad in ("loca", "local:0", "tcp://host", "http://host:8786", 3):
        with pytest.raises(ab.ParameterError, match="scheduler="):
            ab.sweep(slow_square, [{"i": 1}], "x", path=tmp_path / "x.jsonl", scheduler=bad)
    assert not (tmp_path / "x.jsonl").exists() or not _lines(tmp_path / "x.jsonl")
    assert _sweep.check_scheduler("serial") is None
    assert _sweep.check_scheduler("tcp://10.0.0.1:8786") == "tcp://10.0.0.1:8786"


def test_local_cluster_returns_the_serial_table(client, tmp_path):
    points = [{"i": i} for i in range(6)]
    serial = ab.sweep(two_rows, points, "s", path=tmp_path / "serial.jsonl")
    dask = ab.sweep(two_rows, points, "s", path=tmp_path / "dask.jsonl", scheduler=LOCAL)
    pd.testing.assert_frame_equal(serial.drop(columns="elapsed_s"), dask.drop(columns="elapsed_s"))
    assert len(dask) == 12 and len(_lines(tmp_path / "dask.jsonl")) == 6
    # the embedded cluster is started once and reused by later sweeps of the same process
    assert _sweep._client(LOCAL) is client


def worker_malloc_env(i: int) -> dict:
    return {"trim": os.environ.get("MALLOC_TRIM_THRESHOLD_", "unset"), "pid": os.getpid()}


def test_local_workers_keep_glibcs_adaptive_allocator(client, tmp_path):
    # Dask's default MALLOC_TRIM_THRESHOLD_ turns off glibc's adaptive mmap threshold, which
    # made the torch point functions about twice as slow on the workers: it must be unset there
    df = ab.sweep(worker_malloc_env, [{"i": i} for i in range(4)], "env", path=tmp_path / "e.jsonl",
                  scheduler=LOCAL)
    assert set(df.trim) == {_TRIM_AT_START}
    assert os.getpid() not in set(df.pid)


def test_killing_a_worker_mid_sweep_loses_no_point(client, tmp_path):
    path = tmp_path / "kill.jsonl"
    pids = _worker_pids(client)
    assert len(pids) == 2
    victim = sorted(pids.values())[0]
    killed = threading.Event()

    def kill_after_two_points():
        deadline = time.time() + 120
        while time.time() < deadline and len(_lines(path)) < 2:
            time.sleep(0.05)
        os.kill(victim, signal.SIGKILL)
        killed.set()

    killer = threading.Thread(target=kill_after_two_points, daemon=True)
    killer.start()
    points = [{"i": i, "delay": 0.4} for i in range(12)]
    df = ab.sweep(slow_square, points, "kill", path=path, scheduler=LOCAL)
    killer.join(timeout=10)
    assert killed.is_set()
    assert df.sq.tolist() == [i * i for i in range(12)]
    saved = [entry["point"]["i"] for entry in _lines(path)]
    assert sorted(saved) == list(range(12))  # every point once: none lost, none written twice
    client.wait_for_workers(2, timeout=120)  # the nanny restarts the killed worker
    assert victim not in _worker_pids(client).values()  # the kill did take a worker down


def test_failed_points_are_retried_then_reported_by_name(client, tmp_path):
    path = tmp_path / "flaky.jsonl"
    fn = functools.partial(flaky, marker_dir=str(tmp_path))
    points = [{"i": i} for i in range(6)]
    with pytest.raises(_sweep.SweepError, match=r'1 of 6 points failed.*\{"i": 3\}.*point 3 always fails'):
        ab.sweep(fn, points, "flaky", path=path, scheduler=LOCAL, retries=2)
    saved = sorted(entry["point"]["i"] for entry in _lines(path))
    assert saved == [0, 1, 2, 4, 5]  # the transient failure of point 1 was retried
    # running again computes only the failed point
    calls = tmp_path / "calls.txt"
    df = ab.sweep(functools.partial(counted_square, calls=str(calls)), points, "flaky", path=path,
                  scheduler=LOCAL)
    assert calls.read_text().split() == ["3"]
    assert df.sq.tolist() == [i * i for i in range(6)]


DRIVER = """\
import functools, sys
import attnbook as ab
from tests.machinery.test_distributed import counted_square
fn = functools.partial(counted_square, calls=sys.argv[3], delay=0.5)
ab.sweep(fn, [{"i": i} for i in range(20)], "resume", path=sys.argv[2], scheduler=sys.argv[1])
"""


def test_interrupted_driver_resumes_from_the_checkpoint(client, tmp_path):
    path, calls1, calls2 = tmp_path / "resume.jsonl", tmp_path / "calls1.txt", tmp_path / "calls2.txt"
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(script), client.scheduler.address, str(path), str(calls1)],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and len(_lines(path)) < 3 and proc.poll() is None:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
        # the harshest interruption: the driver is killed mid-sweep (a Ctrl-C can be absorbed by
        # the client's event loop, and the driver would then finish normally)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL  # it stopped before the end
    first = {entry["point"]["i"] for entry in _lines(path)}
    assert 3 <= len(first) < 20
    time.sleep(1.0)  # let tasks the scheduler cancelled stop writing to calls1

    fn = functools.partial(counted_square, calls=str(calls2), delay=0.0)
    df = ab.sweep(fn, [{"i": i} for i in range(20)], "resume", path=path, scheduler=LOCAL)
    again = [int(i) for i in calls2.read_text().split()]
    assert not first & set(again)  # points finished before the interruption are not recomputed
    assert sorted(again) == sorted(set(range(20)) - first)
    assert df.sq.tolist() == [i * i for i in range(20)]
    assert sorted(entry["point"]["i"] for entry in _lines(path)) == list(range(20))


# ---- the chapter parameter and `attnbook run --scheduler` --------------------------------------
CHAPTER = myst_chapter("Tiny, on Dask", """
profile = "quick"
device = "cpu"
seed = 0
scheduler = "serial"
""", """
import os

import attnbook as ab

run = ab.start_chapter("99-dask", profile=profile, device=device, seed=seed, quiet=True)


def point(i):  # defined in the notebook: sent to the workers by value
    return {"sq": i * i, "pid": os.getpid()}


res = ab.sweep(point, [{"i": i} for i in range(6)], "squares", run=run, scheduler=scheduler)
run.record(total=int(res.sq.sum()), in_kernel=int((res.pid == os.getpid()).sum()))
run.write_summary()
""")


@pytest.fixture
def dask_book(tmp_path, monkeypatch):
    root = tmp_path / "root"
    tiny_book(root, "99-dask", CHAPTER)
    point_book_at(root, monkeypatch)
    return root


def test_chapter_sweeps_run_on_the_scheduler_given_on_the_command_line(client, dask_book, capsys):
    from attnbook.cli import main
    from attnbook.slots import slot_paths

    assert main(["run", "99-dask", "--scheduler", "tcp://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no Dask scheduler answers there" in err[0]
    assert main(["run", "99-dask", "-p", "scheduler=nowhere"]) == 2
    assert "scheduler='nowhere' is not one of" in capsys.readouterr().err
    # "auto" is a chapter's own choice (chapter 3's default); a chapter without it refuses it
    assert main(["run", "99-dask", "--scheduler", "auto"]) == 2
    assert "scheduler='auto' is not one of" in capsys.readouterr().err

    assert main(["run", "99-dask", "--scheduler", client.scheduler.address]) == 0
    summary = json.loads(slot_paths("99-dask", "99-dask")[1].read_text())
    assert summary["total"] == sum(i * i for i in range(6))
    assert summary["in_kernel"] == 0  # every point ran on a worker, none in the chapter's kernel
    # the scheduler names no slot and is not in the cache key: a serial run finds the slot current
    capsys.readouterr()
    assert main(["run", "99-dask"]) == 0
    assert "unchanged" in capsys.readouterr().out
