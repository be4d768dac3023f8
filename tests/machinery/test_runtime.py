"""Shared machinery: validation, seeding, devices, sweeps, result store, summaries."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch

import attnbook as ab
import attnlib as al
from attnbook.runs import source_hash


# ---- validation -------------------------------------------------------------------------------
def test_unknown_profile_names_parameter_and_allowed_values():
    with pytest.raises(ab.ParameterError) as err:
        ab.start_chapter("00-attention", profile="fast", quiet=True)
    msg = str(err.value)
    assert "\n" not in msg
    assert "profile='fast'" in msg and "'quick'" in msg and "'full'" in msg


@pytest.mark.parametrize("seed", [-1, 1.5, "0", True])
def test_bad_seed(seed):
    with pytest.raises(ab.ParameterError, match="seed="):
        ab.start_chapter("00-attention", seed=seed, quiet=True)


def test_unknown_device():
    with pytest.raises(ab.ParameterError, match="device='tpu'.*'auto', 'cpu', 'cuda'"):
        ab.resolve_device("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_gpu_is_refused():
    with pytest.raises(ab.ParameterError, match="device='cuda'.*no CUDA GPU"):
        ab.start_chapter("00-attention", device="cuda", quiet=True)


def test_auto_device_matches_availability():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert ab.resolve_device("auto").type == expected


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (lambda: al.check_int("d", -3), r"d=-3 must be an integer >= 1"),
        (lambda: al.check_int("d", 2.0), r"d=2.0 must be an integer"),
        (lambda: al.check_int("d", 200, maximum=100), r"<= 100"),
        (lambda: al.check_float("lam", -1.0, minimum=0.0), r"lam=-1.0 must be >= 0.0"),
        (lambda: al.check_float("lam", 0.0, minimum=0.0, strict=True), r"must be > 0.0"),
        (lambda: al.check_float("omega", 1.5, 0.0, 1.0), r"must be >= 0.0 and <= 1.0"),
        (lambda: al.check_float("x", math.nan), r"finite number"),
        (lambda: al.check_choice("kind", "x", ["a", "b"]), r"kind='x' is not allowed"),
    ],
)
def test_checks_raise_one_line_errors(call, pattern):
    with pytest.raises(ab.ParameterError, match=pattern) as err:
        call()
    assert "\n" not in str(err.value)


def test_checks_return_valid_values():
    assert al.check_int("n", 5) == 5
    assert al.check_float("lam", 0.5, minimum=0.0) == 0.5
    assert al.check_choice("p", "quick", ab.PROFILES) == "quick"


# ---- seeding ----------------------------------------------------------------------------------
def _draws():
    import random

    return random.random(), np.random.rand(), torch.rand(3).tolist()  # noqa: NPY002


def test_same_seed_gives_same_numbers():
    ab.seed_everything(7)
    first = _draws()
    ab.seed_everything(7)
    assert _draws() == first
    ab.seed_everything(8)
    assert _draws() != first


def test_run_generators_are_reproducible_and_distinct(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = ab.start_chapter("t", seed=3, quiet=True)
    a = torch.randn(4, generator=run.generator(1))
    assert torch.equal(a, torch.randn(4, generator=run.generator(1)))
    assert not torch.equal(a, torch.randn(4, generator=run.generator(2)))


def test_one_seed_rule_numbers_the_streams_of_seed_0_and_keeps_seeds_apart(tmp_path, monkeypatch):
    from attnbook.runs import SEED_MAX, SEED_STRIDE

    monkeypatch.chdir(tmp_path)
    zero = ab.start_chapter("t", seed=0, quiet=True)
    assert [zero.seed_for(s) for s in range(3)] == [0, 1, 2]  # stored tables use seed 0's streams
    streams = {ab.start_chapter("t", seed=k, quiet=True).seed_for(s) for k in range(3) for s in (0, 7, 3500)}
    assert len(streams) == 9  # no two (seed, stream) pairs share a seed
    top = ab.start_chapter("t", seed=SEED_MAX, quiet=True).seed_for(SEED_STRIDE - 1)
    torch.Generator().manual_seed(top)  # the largest seed still fits a generator
    with pytest.raises(ab.ParameterError, match="stream"):
        zero.seed_for(SEED_STRIDE)
    assert torch.equal(torch.randn(3, generator=zero.generator(5)),
                       torch.randn(3, generator=torch.Generator().manual_seed(zero.seed_for(5))))


def test_source_hash_is_stable():
    assert source_hash() == source_hash()
    assert len(source_hash()) == 64


# ---- sweeps -----------------------------------------------------------------------------------
def test_sweep_returns_tidy_frame(tmp_path):
    df = ab.sweep(lambda n, seed: {"sq": n * n + seed}, [{"n": n, "seed": 0} for n in range(4)],
                  name="s", path=tmp_path / "s.jsonl")
    assert list(df["sq"]) == [0, 1, 4, 9]
    assert {"n", "seed", "sq", "elapsed_s"} <= set(df.columns)


def test_sweep_several_rows_per_point(tmp_path):
    df = ab.sweep(lambda n: [{"k": k, "v": n * k} for k in range(3)], [{"n": 1}, {"n": 2}],
                  name="s", path=tmp_path / "s.jsonl")
    assert len(df) == 6 and df["v"].tolist() == [0, 1, 2, 0, 2, 4]


def test_sweep_killed_halfway_resumes_without_losing_points(tmp_path):
    """A process killed (os._exit) in the middle of point 3 keeps points 0-2; the rerun does 3-5."""
    path = tmp_path / "sweep.jsonl"
    log = tmp_path / "calls.log"
    script = textwrap.dedent(
        f"""
        import os, attnbook as ab
        def fn(i):
            with open({str(log)!r}, "a") as fh:
                fh.write(f"{{i}}\\n")
            if i == 3 and os.environ.get("KILL"):
                os._exit(9)  # killed mid-point: nothing of point 3 is written
            return {{"value": i * 10}}
        df = ab.sweep(fn, [{{"i": i}} for i in range(6)], name="x", path={str(path)!r})
        print(df["value"].tolist())
        """
    )
    killed = subprocess.run([sys.executable, "-c", script], env={"KILL": "1", "PATH": ""},
                            capture_output=True, text=True)
    assert killed.returncode == 9
    assert len(path.read_text().splitlines()) == 3
    # a line cut short by the kill must not break the resume either
    with path.open("a") as fh:
        fh.write('{"point": {"i": 3}, "rows": [{"val')
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == str([0, 10, 20, 30, 40, 50])
    calls = [int(x) for x in log.read_text().split()]
    assert calls == [0, 1, 2, 3, 3, 4, 5]  # points 0-2 were not recomputed


def test_sweep_needs_a_place_to_write():
    with pytest.raises(ValueError, match="run= or path="):
        ab.sweep(lambda: {}, [{}], name="x")


# ---- result store and summaries ---------------------------------------------------------------
@pytest.fixture
def full_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return ab.start_chapter("09-test", profile="full", device="cpu", seed=2, quiet=True)


def test_stored_or_compute_records_provenance_and_reloads(full_run, tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return pd.DataFrame({"n": [1, 2], "err": [0.5, 0.25]})

    params = {"d": 10, "ns": [1, 2]}
    first = ab.stored_or_compute(full_run, "curve", compute, params, results_dir=tmp_path / "r")
    record = json.loads((tmp_path / "r" / "09-test" / "curve.provenance.json").read_text())
    for key in ("attnlib_version", "git_commit", "device", "device_name", "torch_version",
                "wall_s", "params", "date", "seed"):
        assert key in record
    assert record["params"] == params and record["torch_version"] == torch.__version__
    assert first.attrs["provenance"]["stored"] is False
    again = ab.stored_or_compute(full_run, "curve", compute, params, results_dir=tmp_path / "r")
    assert len(calls) == 1 and again.attrs["provenance"]["stored"] is True
    pd.testing.assert_frame_equal(first, again)
    # other parameters, or an explicit request, recompute
    ab.stored_or_compute(full_run, "curve", compute, {"d": 11}, results_dir=tmp_path / "r")
    ab.stored_or_compute(full_run, "curve", compute, {"d": 11}, recompute=True,
                         results_dir=tmp_path / "r")
    assert len(calls) == 3


def test_quick_profile_never_reads_or_writes_results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = ab.start_chapter("09-test", profile="quick", quiet=True)
    df = ab.stored_or_compute(run, "c", lambda: pd.DataFrame({"a": [1]}), {}, results_dir=tmp_path)
    assert df.attrs["provenance"]["stored"] is False
    assert not (tmp_path / "09-test").exists()


def test_write_summary(full_run, tmp_path):
    full_run.record(x=np.float64(1.5), v=torch.tensor([1.0, 2.0]), d={1: 2.0}, ok=True)
    assert full_run.write_summary(tmp_path) is None  # a chapter's last line shows no path
    path = tmp_path / "09-test.summary.json"
    summary = json.loads(path.read_text())
    assert path.name == "09-test.summary.json"
    assert summary["x"] == 1.5 and summary["v"] == [1.0, 2.0] and summary["d"] == {"1": 2.0}
    for key in ("profile", "device", "seed", "wall_s"):
        assert key in summary
    assert summary["profile"] == "full" and summary["seed"] == 2


def test_summary_rejects_nan(full_run):
    with pytest.raises(ValueError, match="not finite"):
        full_run.record(bad=float("nan"))


def test_sweep_reports_progress_to_the_build_log(tmp_path, monkeypatch):
    log = tmp_path / "progress.log"
    monkeypatch.setenv("ATTNLIB_PROGRESS_FILE", str(log))
    ab.sweep(lambda i: {"v": i}, [{"i": i} for i in range(3)], name="demo", path=tmp_path / "s.jsonl")
    lines = log.read_text().splitlines()
    assert lines[-1].startswith("sweep demo: 3/3 points")
    ab.sweep(lambda i: {"v": i}, [{"i": i} for i in range(4)], name="demo", path=tmp_path / "s.jsonl")
    assert "resuming after 3 finished points" in log.read_text()
