"""Result store: small result tables with a verified provenance record beside each.

Paper-scale (``full`` profile) results live in ``results/<chapter>/<name>.csv`` with
``<name>.provenance.json`` next to them; a ``full`` build loads them unless asked to recompute.
The record holds the table's SHA-256 and the hash of the attnlib code that produced it, and is
sealed by a hash of its own contents: a table or record edited by hand is refused with a message
naming the file; a table produced by older code is loaded with a visible note
(``df.attrs["note"]``, for the figure caption, and the chapter summary's ``stored_results``, for
the reproducibility page).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ._runtime import Run, _jsonable, device_name, git_commit, source_hash

__all__ = [
    "RESULTS_DIR",
    "StoredResultError",
    "provenance",
    "save_result",
    "load_result",
    "stored_or_compute",
    "result_note",
]

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"


class StoredResultError(RuntimeError):
    """A stored result fails verification (edited, truncated, or without a provenance record)."""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _seal(record: Mapping[str, Any]) -> dict:
    """``record`` plus ``record_sha256``, a hash of all its other entries."""
    body = {k: v for k, v in record.items() if k != "record_sha256"}
    return dict(body, record_sha256=_sha(json.dumps(body, sort_keys=True).encode()))


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def provenance(run: Run, params: Mapping[str, Any], wall_s: float) -> dict:
    """Who computed a result, where and how: versions, commit, code hash, device, parameters."""
    from . import __version__

    return {
        "chapter": run.chapter,
        "profile": run.profile,
        "seed": run.seed,
        "params": _jsonable(dict(params)),
        "attnlib_version": __version__,
        "git_commit": git_commit(),
        "code_hash": source_hash(),
        "torch_version": torch.__version__,
        "device": run.device.type,
        "device_name": device_name(run.device),
        "wall_s": round(float(wall_s), 3),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
    }


def save_result(df: pd.DataFrame, path: str | Path, record: Mapping[str, Any]) -> Path:
    """Write ``df`` as CSV and the sealed ``record`` (with the CSV's SHA-256) beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = df.to_csv(index=False).encode()
    _atomic_write(path, data)
    sealed = _seal(dict(record, sha256=_sha(data)))
    _atomic_write(path.with_suffix(".provenance.json"), (json.dumps(sealed, indent=2) + "\n").encode())
    return path


def _show(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(RESULTS_DIR.parent))
    except ValueError:
        return str(path)


def load_result(path: str | Path) -> tuple[pd.DataFrame, dict]:
    """Read a stored result and its provenance record, verifying both.

    Raises :class:`StoredResultError` naming the file when the record is missing, unreadable or
    edited, or the table does not match the checksum recorded when it was stored.
    """
    path = Path(path)
    meta = path.with_suffix(".provenance.json")
    fix = "restore it from git, or recompute it (parameter recompute=True)"
    try:
        record = json.loads(meta.read_text())
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as err:
        raise StoredResultError(f"{_show(meta)} is missing or unreadable ({err}); {fix}") from None
    if record.get("record_sha256") != _seal(record)["record_sha256"]:
        raise StoredResultError(f"{_show(meta)} was edited after it was written (its seal does not "
                                f"match); {fix}")
    data = path.read_bytes()
    if record.get("sha256") != _sha(data):
        raise StoredResultError(f"{_show(path)} does not match the checksum in its provenance record "
                                f"(edited or truncated since it was stored); {fix}")
    return pd.read_csv(io.BytesIO(data)), record


def result_note(record: Mapping[str, Any], stale: bool) -> str:
    """Caption text for a stored result: where and when it ran, and whether its code is older."""
    where = f"{record.get('device_name', '?')}, {record.get('date', '?')}"
    note = f"Paper-scale run loaded from results/ ({where})."
    if stale:
        note += (" It was produced by older code (attnlib code "
                 f"{str(record.get('code_hash', '?'))[:8]}, now {source_hash()[:8]}); "
                 "run with recompute=True to refresh it.")
    return note


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
    parameters equal ``params`` is verified (:func:`load_result`) and loaded instead of recomputed
    (unless ``recompute``); otherwise ``compute()`` runs and, for the ``full`` profile, its result
    is stored with provenance. ``df.attrs["provenance"]`` is the record (``"stored"``: loaded;
    ``"stale"``: produced by other attnlib code); ``df.attrs["note"]`` is the caption note of a
    loaded table ("" when computed), also entered in the summary under ``stored_results``.
    The store is ``results_dir``, else ``$ATTNLIB_RESULTS_DIR``, else the repository's ``results/``.
    """
    if results_dir is None:
        results_dir = os.environ.get("ATTNLIB_RESULTS_DIR") or RESULTS_DIR
    root = Path(results_dir)
    path = root / run.chapter / f"{name}.csv"
    wanted = _jsonable(dict(params))
    # the summary's "stored_results" (full profile only): each table loaded or stored, its note
    stored_entries = run.records.setdefault("stored_results", {}) if run.profile == "full" else {}
    if run.profile == "full" and not recompute and path.exists():
        df, record = load_result(path)
        if record.get("params") == wanted:
            stale = record.get("code_hash") != source_hash()
            note = result_note(record, stale)
            df.attrs["provenance"] = dict(record, stored=True, stale=stale)
            df.attrs["note"] = note
            stored_entries[name] = {"stored": True, "stale": stale, "note": note}
            if stale:
                print(f"note: {name}: {note}")
            return df
        print(f"note: {_show(path)} holds a run with other parameters; computing {name} afresh")
    t0 = time.perf_counter()
    df = compute()
    record = provenance(run, params, time.perf_counter() - t0)
    if run.profile == "full":
        save_result(df, path, record)
    df.attrs["provenance"] = dict(record, stored=False, stale=False)
    df.attrs["note"] = ""
    stored_entries[name] = {"stored": False, "stale": False, "note": ""}
    return df
