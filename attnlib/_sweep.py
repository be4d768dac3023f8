"""Resumable sweeps: every finished point is on disk before the next one starts."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from ._runtime import Run, _jsonable

__all__ = ["sweep"]


def _key(point: Mapping[str, Any]) -> str:
    return json.dumps(_jsonable(dict(point)), sort_keys=True)


def _read_done(path: Path) -> dict[str, list[dict]]:
    """Finished points in ``path``; a line cut short by an interruption is ignored."""
    done: dict[str, list[dict]] = {}
    if not path.exists():
        return done
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        done[_key(entry["point"])] = entry["rows"]
    return done


class _ProgressLines:
    """A minimal progress reporter that appends ``name: k/n points`` lines to a file."""

    def __init__(self, path: str, name: str, total: int, initial: int, every_s: float = 5.0):
        self.path, self.name, self.total, self.count = path, name, total, initial
        self.every_s, self.t0, self.last = every_s, time.perf_counter(), -float("inf")
        if initial:
            self._write(f"resuming after {initial} finished points")

    def _write(self, message: str) -> None:
        with open(self.path, "a") as fh:
            fh.write(f"sweep {self.name}: {message}\n")

    def update(self, n: int = 1) -> None:
        self.count += n
        now = time.perf_counter()
        if now - self.last >= self.every_s or self.count == self.total:
            self.last = now
            self._write(f"{self.count}/{self.total} points ({now - self.t0:.0f} s)")

    def close(self) -> None:
        pass


def sweep(
    fn: Callable[..., dict | list[dict]],
    points: Iterable[Mapping[str, Any]],
    name: str,
    run: Run | None = None,
    path: str | Path | None = None,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Evaluate ``fn(**point)`` for every point, checkpointing each result as it finishes.

    Parameters
    ----------
    fn : callable
        Returns a dict of measured values, or a list of such dicts (several rows per point).
    points : iterable of dict
        JSON-able parameters of each point (e.g. ``{"n": 200, "seed": 3}``).
    name : str
        Name of the checkpoint file ``<name>.jsonl`` in ``run.sweep_dir`` (or give ``path``).
    run : Run, optional
        The chapter's run context; its ``sweep_dir`` holds the checkpoints.
    path : path-like, optional
        Explicit checkpoint file, instead of ``run``.
    progress : bool, optional
        Show a tqdm bar; by default only in interactive sessions. In book builds
        (``ATTNLIB_PROGRESS_FILE`` set by ``attnbook``) progress lines go to that file instead,
        which the CLI prints, so that the executed notebook stays free of progress output.

    Returns
    -------
    pandas.DataFrame
        One row per returned dict: the point's columns, the measured values and ``elapsed_s``.

    Notes
    -----
    Points already in the checkpoint file are not recomputed, so an interrupted sweep resumes
    where it stopped. The file is keyed by the run's profile, seed and attnlib source (and, in
    book builds, by the chapter's execution-cache key), so stale results are never reused.
    """
    if path is None:
        if run is None:
            raise ValueError("sweep() needs either run= or path=")
        path = run.sweep_dir / f"{name}.jsonl"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    points = [dict(p) for p in points]
    done = _read_done(path)
    progress_file = os.environ.get("ATTNLIB_PROGRESS_FILE")
    if progress is None:
        progress = progress_file is None and hasattr(sys, "ps1")
    todo = [p for p in points if _key(p) not in done]
    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(points), initial=len(points) - len(todo), desc=name)
    elif progress_file and todo:
        bar = _ProgressLines(progress_file, name, total=len(points), initial=len(points) - len(todo))
    if todo and path.exists() and path.stat().st_size:
        with path.open("rb") as fh:  # a line cut short by a kill: end it, so the next one is whole
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                with path.open("a") as out:
                    out.write("\n")
    with path.open("a") as fh:
        for point in todo:
            t0 = time.perf_counter()
            out = fn(**point)
            rows = out if isinstance(out, list) else [out]
            elapsed = time.perf_counter() - t0
            rows = [dict(_jsonable(dict(r)), elapsed_s=elapsed) for r in rows]
            fh.write(json.dumps({"point": _jsonable(point), "rows": rows}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
            done[_key(point)] = rows
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    records = [{**p, **row} for p in points for row in done[_key(p)]]
    return pd.DataFrame.from_records(records)
