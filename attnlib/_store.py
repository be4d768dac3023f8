"""Result store: small result tables with a provenance record beside each.

Paper-scale (``full`` profile) results live in ``results/<chapter>/<name>.csv`` with
``<name>.provenance.json`` next to them; a ``full`` build loads them unless asked to recompute.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ._runtime import Run, _jsonable, device_name, git_commit

__all__ = ["RESULTS_DIR", "provenance", "save_result", "load_result", "stored_or_compute"]

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"


def provenance(run: Run, params: Mapping[str, Any], wall_s: float) -> dict:
    """Who computed a result, where and how: versions, commit, device, parameters, wall time."""
    from . import __version__

    return {
        "chapter": run.chapter,
        "profile": run.profile,
        "seed": run.seed,
        "params": _jsonable(dict(params)),
        "attnlib_version": __version__,
        "git_commit": git_commit(),
        "torch_version": torch.__version__,
        "device": run.device.type,
        "device_name": device_name(run.device),
        "wall_s": round(float(wall_s), 3),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
    }


def save_result(df: pd.DataFrame, path: str | Path, record: Mapping[str, Any]) -> Path:
    """Write ``df`` as CSV and ``record`` as ``<stem>.provenance.json`` beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False)
    path.with_suffix(".provenance.json").write_text(json.dumps(dict(record), indent=2) + "\n")
    return path


def load_result(path: str | Path) -> tuple[pd.DataFrame, dict]:
    """Read a stored result and its provenance record."""
    path = Path(path)
    record = json.loads(path.with_suffix(".provenance.json").read_text())
    return pd.read_csv(path), record


def stored_or_compute(
    run: Run,
    name: str,
    compute: Callable[[], pd.DataFrame],
    params: Mapping[str, Any],
    recompute: bool = False,
    results_dir: str | Path | None = None,
) -> pd.DataFrame:
    """Return a result table, loading the stored paper-scale run when there is one.

    With ``run.profile == "full"`` a stored ``results/<chapter>/<name>.csv`` whose recorded
    parameters equal ``params`` is loaded instead of recomputed (unless ``recompute``); otherwise
    ``compute()`` runs and, for the ``full`` profile, its result is stored with provenance.
    The provenance record is attached as ``df.attrs["provenance"]`` (``"stored": True`` if loaded).
    The store is ``results_dir``, else ``$ATTNLIB_RESULTS_DIR``, else the repository's ``results/``.
    """
    if results_dir is None:
        results_dir = os.environ.get("ATTNLIB_RESULTS_DIR") or RESULTS_DIR
    root = Path(results_dir)
    path = root / run.chapter / f"{name}.csv"
    wanted = _jsonable(dict(params))
    if run.profile == "full" and not recompute and path.exists():
        df, record = load_result(path)
        if record.get("params") == wanted:
            df.attrs["provenance"] = dict(record, stored=True)
            return df
    t0 = time.perf_counter()
    df = compute()
    record = provenance(run, params, time.perf_counter() - t0)
    if run.profile == "full":
        save_result(df, path, record)
    df.attrs["provenance"] = dict(record, stored=False)
    return df
