"""Result store: small result tables with a verified provenance record beside each.

Paper-scale (``full`` profile) results live in ``results/<chapter>/<name>.csv`` with
``<name>.provenance.json`` next to them; a ``full`` build loads them unless asked to recompute.
The record holds the table's SHA-256 and the hashes of the attnlib code that produced it (the
science modules the chapter imports, ``code``; and the whole package, ``code_hash``), and is
sealed by a hash of its own contents: a table or record edited by hand is refused with a message
naming the file; a table produced by older code is loaded with a visible note
(``df.attrs["note"]``, for the figure caption, and the chapter summary's ``stored_results``, for
the reproducibility page). :func:`audit` lists every stored result.
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from attnlib._validation import ParameterError

from .layout import _atomic_write, _sha
from .runs import Run, _jsonable, device_name, git_commit, module_hash, source_hash

__all__ = [
    "RESULTS_DIR",
    "StoredResultError",
    "audit",
    "audit_table",
    "code_changes",
    "json_columns",
    "provenance",
    "save_result",
    "load_result",
    "stored_or_compute",
    "stored_full",
    "stored_phrase",
    "stored_sweep",
    "sweep_table_key",
    "source_phrase",
    "result_note",
]

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"
#: What every provenance record must hold for the audit to read it.
REQUIRED = ("chapter", "profile", "params", "git_commit", "code_hash", "device", "device_name",
            "wall_s", "date", "sha256", "record_sha256")


class StoredResultError(RuntimeError):
    """A stored result fails verification (edited, truncated, or without a provenance record)."""


def results_root(results_dir: str | Path | None = None) -> Path:
    """The result store: ``results_dir``, else ``$ATTNLIB_RESULTS_DIR``, else the repository's
    ``results/``."""
    return Path(results_dir or os.environ.get("ATTNLIB_RESULTS_DIR") or RESULTS_DIR)


def _seal(record: Mapping[str, Any]) -> dict:
    """``record`` plus ``record_sha256``, a hash of all its other entries."""
    body = {k: v for k, v in record.items() if k != "record_sha256"}
    return dict(body, record_sha256=_sha(json.dumps(body, sort_keys=True).encode()))


def _chapter_code(chapter: str) -> dict[str, str]:
    """``{"attnlib/<module>.py": code hash}`` of the modules chapter ``chapter`` uses to compute its
    results ({} if unknown). Every module of :mod:`attnlib` is result code; nothing of
    :mod:`attnbook` is listed."""
    from .deps import code_hashes

    try:
        return code_hashes(chapter)
    except (ParameterError, OSError, SyntaxError, RuntimeError, ValueError, ImportError):
        # outside a clone (a wheel install, Colab) there is no chapter source to read
        return {}


def code_changes(record: Mapping[str, Any]) -> list[str]:
    """The attnlib modules changed since ``record``'s result was produced (empty: unchanged).

    Compares the recorded per-module hashes (``code``: the modules the chapter used, hashed by
    :func:`~attnbook.runs.module_hash`) with the files now; a record without them is compared
    by the hash of the whole package (``code_hash``).
    """
    code = record.get("code")
    if isinstance(code, dict) and code:
        root = Path(__file__).resolve().parent.parent
        changed = []
        for rel, digest in sorted(code.items()):
            path = root / rel
            if not path.exists():
                changed.append(f"{rel} (removed)")
            elif module_hash(path)[: len(str(digest))] != digest:
                changed.append(rel)
        return changed
    return [] if record.get("code_hash") == source_hash() else ["attnlib (whole-package hash)"]


def provenance(run: Run, params: Mapping[str, Any], wall_s: float) -> dict:
    """Who computed a result, where and how: versions, commit, code hashes, device, parameters."""
    from attnlib import __version__

    return {
        "chapter": run.chapter,
        "profile": run.profile,
        "seed": run.seed,
        "params": _jsonable(dict(params)),
        "attnlib_version": __version__,
        "git_commit": git_commit(),
        "code_hash": source_hash(),
        "code": _chapter_code(run.chapter),
        "torch_version": torch.__version__,
        "device": run.device.type,
        "device_name": device_name(run.device),
        "wall_s": round(float(wall_s), 3),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
    }


def _nested(value: Any) -> bool:
    return isinstance(value, list | tuple | dict | torch.Tensor) or (
        hasattr(value, "ndim") and getattr(value, "ndim", 0) > 0)


def json_columns(df: pd.DataFrame) -> list[str]:
    """The columns of ``df`` that hold lists, arrays or dicts (stored as JSON text, one per cell)."""
    return [str(c) for c in df.columns if df[c].dtype == object and df[c].map(_nested).any()]


def _encode(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    out = df.copy()
    for c in columns:
        out[c] = [None if v is None or (not _nested(v) and pd.isna(v)) else
                  json.dumps(_jsonable(v), separators=(",", ":")) for v in df[c]]
    return out


def _decode(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    for c in columns:
        if c in df.columns:
            df[c] = [json.loads(v) if isinstance(v, str) else None for v in df[c]]
    return df


def save_result(df: pd.DataFrame, path: str | Path, record: Mapping[str, Any]) -> Path:
    """Write ``df`` as CSV and the sealed ``record`` (with the CSV's SHA-256) beside it.

    Cells that hold lists, arrays or dicts (e.g. a matrix per row) are written as JSON text; the
    record names those columns (``json_columns``) and :func:`load_result` decodes them back to
    lists and dicts.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nested = json_columns(df)
    data = _encode(df, nested).to_csv(index=False).encode()
    _atomic_write(path, data)
    record = dict(record, json_columns=nested) if nested else dict(record)
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
    columns = record.get("json_columns") or []
    if not isinstance(columns, list):
        raise StoredResultError(f"{_show(meta)}: json_columns must be a list of column names")
    try:
        df = _decode(pd.read_csv(io.BytesIO(data)), [str(c) for c in columns])
    except ValueError as err:  # json.JSONDecodeError is a ValueError
        raise StoredResultError(f"{_show(path)}: a JSON cell of columns {columns} cannot be read "
                                f"({err}); {fix}") from None
    return df, record


def result_note(record: Mapping[str, Any], stale: bool) -> str:
    """Caption text for a stored result: where and when it ran, and whether its code is older."""
    where = f"{record.get('device_name', '?')}, {record.get('date', '?')}"
    note = f"Paper-scale run loaded from results/ ({where})."
    if stale:
        changed = code_changes(record)
        what = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        note += (f" It was produced by older code ({what or 'attnlib'} changed since); "
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
    root = results_root(results_dir)
    path = root / run.chapter / f"{name}.csv"
    wanted = _jsonable(dict(params))
    # the summary's "stored_results" (full profile only): each table loaded or stored, its note
    stored_entries = run.records.setdefault("stored_results", {}) if run.profile == "full" else {}
    if run.profile == "full" and not recompute and path.exists():
        df, record = load_result(path)
        if record.get("params") == wanted:
            stale = bool(code_changes(record))
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


def stored_full(run: Run, name: str, results_dir: str | Path | None = None) -> pd.DataFrame | None:
    """The stored paper-scale table ``<name>`` of ``run``'s chapter, to show beside a quick run.

    A ``quick`` build computes its tables live; where the ``full`` profile's table
    ``results/<chapter>/<name>.csv`` is stored, the chapter draws it on the same axes and states
    how well the two agree. Looked up in ``results_dir``, else ``$ATTNLIB_RESULTS_DIR``, else the
    repository (:func:`~attnbook.repo.committed_file`: the checkout, or downloaded once where the
    notebook's install cell set ``$ATTNLIB_REPO_RAW``). Returns ``None`` when nothing is stored;
    a table without its provenance record, or a record without its table, is refused like an
    edited one (:class:`StoredResultError`, one line naming the file). Returns ``None``
    for a ``full`` run (whose own table is the paper-scale one). The table is verified
    (:func:`load_result`: an edited one raises :class:`StoredResultError`); ``df.attrs`` holds
    ``provenance`` (with ``stale``: produced by attnlib code that has changed since) and
    ``phrase``, :func:`stored_phrase` of it.
    """
    if run.profile == "full":
        return None
    root = results_dir or os.environ.get("ATTNLIB_RESULTS_DIR")

    def locate(rel: str) -> Path | None:
        if root:
            return Path(root) / rel if (Path(root) / rel).exists() else None
        from .repo import committed_file

        try:
            return committed_file(f"results/{rel}")
        except (FileNotFoundError, ValueError):
            return None

    path = locate(f"{run.chapter}/{name}.csv")
    if path is None and locate(f"{run.chapter}/{name}.provenance.json") is None:
        return None
    if path is None:  # a record without its table: refused as a damaged store is
        raise StoredResultError(f"results/{run.chapter}/{name}.csv is missing but its provenance record is "
                                "there; restore it from git, or recompute it (parameter recompute=True)")
    df, record = load_result(path)  # a table without its record is refused here
    df.attrs["provenance"] = dict(record, stored=True, stale=bool(code_changes(record)))
    df.attrs["phrase"] = stored_phrase(df)
    return df


def stored_phrase(df: pd.DataFrame | None) -> str:
    """Caption phrase for a stored paper-scale table from :func:`stored_full` (never empty).

    ``"the paper-scale run stored in results/ (full profile, <device>, <date>)"``, with
    ``"; produced by older code"`` when the code has changed since; for ``None``:
    ``"no paper-scale (full) run of it is stored"``.
    """
    if df is None:
        return "no paper-scale (full) run of it is stored"
    rec = df.attrs.get("provenance", {})
    older = "; produced by older code" if rec.get("stale") else ""
    return (f"the paper-scale run stored in results/ ({rec.get('profile', '?')} profile, "
            f"{rec.get('device_name', '?')}, {rec.get('date', '?')}{older})")


def source_phrase(run: Run, table: pd.DataFrame, stored: pd.DataFrame | None = None, what: str = "") -> str:
    """Caption sentence saying where a figure's data come from (never empty).

    ``stored`` is the paper-scale table drawn beside this run's ``table`` (:func:`stored_full`):
    "Open circles: <its :func:`stored_phrase`>, <what>."; without one, a ``full`` run names its own
    table (the store's note when it was loaded, e.g. flagged as produced by older code) and a
    ``quick`` run says it computed the figure and that no paper-scale run of it is stored.
    """
    if stored is not None:
        return f"Open circles: {stored_phrase(stored)}" + (f", {what}." if what else ".")
    if run.profile == "full":
        return table.attrs.get("note") or "Paper-scale run (full profile), computed in this run."
    return f"Computed in this run; {stored_phrase(None)}."


def sweep_table_key(run: Run, points: list[Mapping[str, Any]],
                    params: Mapping[str, Any] | None = None) -> dict:
    """The key :func:`stored_sweep` stores a sweep's table under: ``params`` when given, else the
    points (without a ``device`` entry: a table is the same on any device) and the run's seed."""
    if params is not None:
        return dict(params)
    return dict(points=[{k: v for k, v in p.items() if k != "device"} for p in points], seed=run.seed)


def stored_sweep(run: Run, name: str, fn: Callable[..., Any], points: list[Mapping[str, Any]], *,
                 params: Mapping[str, Any] | None = None, scheduler: Any = None,
                 recompute: bool = False) -> pd.DataFrame:
    """A sweep whose table may be stored at paper scale: :func:`attnbook.sweep` of ``fn`` over
    ``points`` (checkpointed as ``name``), through :func:`stored_or_compute` (a ``full`` run stores
    it in ``results/`` and loads it when stored with the same key, :func:`sweep_table_key`)."""
    from .sweeps import sweep

    return stored_or_compute(run, name, lambda: sweep(fn, points, name=name, run=run, scheduler=scheduler),
                             params=sweep_table_key(run, points, params), recompute=recompute)


def audit(results_dir: str | Path | None = None) -> list[dict]:
    """Every stored result under ``results_dir`` (default: the store), verified, one dict each.

    Each row: ``result`` (``<chapter>/<name>``), ``rows``, ``profile``, ``commit``, ``date``,
    ``device``, ``wall_s``, ``code`` (``"unchanged"`` or the modules changed since) and
    ``error`` (``None``, or why the table or its record cannot be trusted: missing, unreadable,
    edited, lacking a field). Staleness is reported, never an error.
    """
    root = results_root(results_dir)
    if not root.exists():
        return []
    stems = {p.with_name(p.name[: -len(".provenance.json")]) for p in root.rglob("*.provenance.json")}
    stems |= {p.with_suffix("") for p in root.rglob("*.csv")}
    rows = []
    for stem in sorted(stems):
        csv = stem.with_name(stem.name + ".csv")
        row: dict[str, Any] = {"result": stem.relative_to(root).as_posix(), "rows": None,
                               "profile": "?", "commit": "?", "date": "?", "device": "?",
                               "wall_s": None, "code": "?", "error": None}
        try:
            if not csv.exists():
                raise StoredResultError(f"{_show(csv)} is missing (only its provenance record is stored)")
            df, record = load_result(csv)
            missing = [k for k in REQUIRED if k not in record]
            if missing:
                raise StoredResultError(f"{_show(csv.with_suffix('.provenance.json'))} lacks {missing}")
            changed = code_changes(record)
            row.update(rows=len(df), profile=record["profile"], commit=str(record["git_commit"])[:12],
                       date=record["date"], device=record["device_name"], wall_s=record["wall_s"],
                       code="unchanged" if not changed else "changed: " + ", ".join(changed))
        except (StoredResultError, OSError, ValueError, pd.errors.ParserError) as err:
            row["error"] = str(err).splitlines()[0] if str(err) else type(err).__name__
        rows.append(row)
    return rows


def audit_table(rows: list[dict]) -> str:
    """Markdown table of :func:`audit` rows (the reproducibility page and ``attnbook audit``)."""
    if not rows:
        return "No paper-scale result is stored in `results/` yet.\n"
    out = ["| result | rows | profile | commit | date | device | wall time (s) | code since |",
           "| --- | ---: | --- | --- | --- | --- | ---: | --- |"]
    for r in rows:
        wall = f"{r['wall_s']:.1f}" if isinstance(r["wall_s"], int | float) else "?"
        code = f"**unreadable**: {r['error']}" if r["error"] else r["code"]
        out.append(f"| `{r['result']}` | {r['rows'] if r['rows'] is not None else '?'} | {r['profile']} | "
                   f"`{r['commit']}` | {r['date']} | {r['device']} | {wall} | {code} |")
    return "\n".join(out) + "\n"
