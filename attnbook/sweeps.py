"""Resumable sweeps: every finished point is on disk as soon as it is finished.

Points run serially in this process (the default), or on Dask (``distributed``): an embedded
``LocalCluster`` on this machine (``scheduler="local"``) or any running scheduler by address
(``scheduler="tcp://host:8786"``, e.g. a SLURM cluster started with ``dask-jobqueue``). Either way
the driver (the process that calls :func:`sweep`) alone writes the checkpoint; workers only
compute points.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from attnlib._validation import ParameterError

from . import checkpoints as _ckpt
from .runs import Run, _jsonable

__all__ = ["sweep", "SweepError", "check_scheduler", "SCHEDULERS", "point_key", "read_checkpoint",
           "checkpoint_path", "sweep_key", "append_checkpoint"]

#: The scheduler names :func:`sweep` accepts besides a scheduler address (``tcp://host:port``).
SCHEDULERS = ("serial", "local", "local:<n workers>")
_ADDRESS = re.compile(r"(tcp|tls|ucx|ws|wss)://[^\s/]+:\d{1,5}")


class SweepError(RuntimeError):
    """Points of a distributed sweep failed after their retries; every other point was saved.

    ``failed`` maps each failed point (as JSON) to its error text.
    """

    def __init__(self, message: str, failed: dict[str, str]):
        super().__init__(message)
        self.failed = failed


def check_scheduler(scheduler: Any) -> str | None:
    """Check a ``scheduler`` value and return it normalised (``None`` for serial execution).

    Accepted: ``None`` or ``"serial"`` (in-process, the default), ``"local"`` (an embedded
    ``distributed.LocalCluster``, one single-threaded worker process per CPU core), ``"local:<n>"``
    (``n`` workers, at most one per CPU core) and a scheduler address such as ``"tcp://host:8786"``. Raises
    :class:`~attnlib.ParameterError` with one line otherwise.
    """
    if scheduler is None or scheduler == "serial":
        return None
    if not isinstance(scheduler, str):
        raise ParameterError(f"scheduler={scheduler!r} must be a string: 'serial', 'local', "
                             "'local:<n workers>' or a scheduler address like 'tcp://host:8786'")
    text = scheduler.strip()
    m = re.fullmatch(r"local(?::(\d+))?", text)
    if m:
        cores = os.cpu_count() or 1
        if m.group(1) is not None and not 1 <= int(m.group(1)) <= cores:
            raise ParameterError(f"scheduler={scheduler!r}: a local cluster takes 1 to {cores} workers "
                                 f"on this machine ({cores} CPU cores)")
        return text
    if _ADDRESS.fullmatch(text):
        return text
    raise ParameterError(f"scheduler={scheduler!r} is not one of 'serial', 'local', 'local:<n workers>' "
                         "or a scheduler address like 'tcp://host:8786'")


_key = _ckpt.point_key
#: finished points of a checkpoint; lines failing their check are set aside (:mod:`.checkpoints`)
_read_done = _ckpt.read_checkpoint


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


def _checkpoint_path(name: str, run: Run | None = None, path: str | Path | None = None,
                     fn: Callable | None = None) -> Path:
    """The checkpoint file of sweep ``name``: ``path``, else ``<name>.<sweep key>.jsonl`` in
    ``run.sweep_dir`` (the key of ``fn``, see :func:`attnbook.checkpoints.sweep_key`)."""
    return _ckpt.checkpoint_path(name, run, path, fn)


def sweep(
    fn: Callable[..., dict | list[dict]],
    points: Iterable[Mapping[str, Any]],
    name: str,
    run: Run | None = None,
    path: str | Path | None = None,
    progress: bool | None = None,
    scheduler: Any = None,
    retries: int = 2,
) -> pd.DataFrame:
    """Evaluate ``fn(**point)`` for every point, checkpointing each result as it finishes.

    Parameters
    ----------
    fn : callable
        Returns a dict of measured values, or a list of such dicts (several rows per point).
    points : iterable of dict
        JSON-able parameters of each point (e.g. ``{"n": 200, "seed": 3}``).
    name : str
        Names the checkpoint file ``<name>.<sweep key>.jsonl`` in ``run.sweep_dir`` (or give
        ``path``).
    run : Run, optional
        The chapter's run context; its ``sweep_dir`` holds the checkpoints.
    path : path-like, optional
        Explicit checkpoint file, instead of ``run``: exactly this file, whatever ``fn`` is.
    progress : bool, optional
        Show a tqdm bar; by default only in interactive sessions. In book builds
        (``ATTNLIB_PROGRESS_FILE`` set by ``attnbook``) progress lines go to that file instead,
        which the CLI prints, so that the executed notebook stays free of progress output.
    scheduler : str or distributed.Client, optional
        Where the points run: ``None``/``"serial"`` in this process, one after the other (the
        default); ``"local"`` on an embedded ``distributed.LocalCluster`` (one single-threaded
        worker process per CPU core; ``"local:4"`` for four), started at the first such sweep and
        reused by later ones in the same process; an address such as ``"tcp://host:8786"`` of a
        running Dask scheduler; or a ``distributed.Client``. See :func:`check_scheduler`.
    retries : int
        On Dask, how many times a failed point is re-run (``Client.submit(retries=)``) before it
        counts as failed. A point whose worker dies is re-assigned by the scheduler anyway.

    Returns
    -------
    pandas.DataFrame
        One row per returned dict: the point's columns, the measured values and ``elapsed_s``.

    Notes
    -----
    Points already in the checkpoint file are not recomputed, so an interrupted sweep resumes
    where it stopped. The file is keyed by what can change a point's numbers and by nothing else
    (:func:`attnbook.checkpoints.sweep_key`): the point function's code (bytecode, constants,
    names, nested code; an attnlib function by its module's code hash; a ``functools.partial``
    by its function and arguments), the values of the globals it reads and, recursively, of the
    functions it calls from the same notebook (canonical JSON, tensors and arrays by their bytes,
    dataclass configs field by field, modules by name, other objects by their ``repr`` without
    memory addresses), the code hashes of the attnlib modules the chapter uses (in a book build
    the chapter's ``code_hashes``; elsewhere the whole package's ``source_hash``), the pinned
    dependencies, the device and the Python version. The chapter's prose is not in it: editing a
    sentence, a caption or a plot colour re-executes a page whose sweeps find every point in their
    checkpoints, while editing the point function or a global it reads computes them again.

    Each checkpoint line is ``{"key", "point", "rows", "sha256"}`` (the point's canonical key, the
    point, its rows, and the SHA-256 of the canonical JSON of those three). A line that is not
    UTF-8 or not JSON, has another shape, or fails its checksum is never used: it is appended to
    ``<checkpoint>.rejected``, the checkpoint is rewritten without it (atomically), one warning line
    names the file, and its point is computed again. A last line cut short by a kill is dropped.

    On Dask, every unfinished point is submitted at once and each result is appended to the
    checkpoint as it arrives (``distributed.as_completed``), so a lost worker or an interrupted
    driver loses no finished point. Points that still fail after ``retries`` are reported by
    name in one :class:`SweepError`, raised after every other point has been saved. ``fn`` must
    be picklable: a module-level function of an importable module (such as ``attnlib``'s point
    functions) travels by reference and the workers import it (on a remote cluster they need the
    same attnlib installed); a function defined in a notebook or script is sent by value
    (cloudpickle), together with the globals it uses. A point should draw its randomness from
    its own parameters (a seed in the point), not from a global generator, so that its result
    does not depend on which worker runs it or in what order.
    """
    path = _checkpoint_path(name, run, path, fn)
    on_dask = _wants_dask(scheduler)  # checks the value before anything runs
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
    if todo:
        _ckpt.drop_cut_line(path)  # a line cut short by a kill: the next one must start afresh
    client = _client(scheduler) if on_dask and todo else None
    with path.open("a") as fh:

        def save(point: dict, rows: list[dict]) -> None:
            fh.write(_ckpt.checkpoint_line(point, rows))
            fh.flush()
            os.fsync(fh.fileno())
            done[_key(point)] = rows
            if bar is not None:
                bar.update(1)

        try:
            if client is None:
                for point in todo:
                    save(point, _evaluate(fn, point))
            else:
                _run_distributed(client, fn, todo, name, retries, save)
        finally:
            if bar is not None:
                bar.close()
    records = [{**p, **row} for p in points for row in done[_key(p)]]
    return pd.DataFrame.from_records(records)


def _evaluate(fn: Callable[..., dict | list[dict]], point: dict) -> list[dict]:
    """``fn(**point)`` as JSON-able rows, each with the point's wall time ``elapsed_s``."""
    t0 = time.perf_counter()
    out = fn(**point)
    elapsed = time.perf_counter() - t0
    rows = out if isinstance(out, list) else [out]
    return [dict(_jsonable(dict(r)), elapsed_s=elapsed) for r in rows]


def _wants_dask(scheduler: Any) -> bool:
    """True when ``scheduler`` asks for Dask (a name, an address or a ``distributed.Client``)."""
    if scheduler is not None and type(scheduler).__name__ == "Client":
        return True
    return check_scheduler(scheduler) is not None


_CLIENTS: dict[str, Any] = {}


def _client(scheduler: Any):
    """A ``distributed.Client`` for ``scheduler``; embedded clusters are kept for the process."""
    if type(scheduler).__name__ == "Client":
        return scheduler
    spec = check_scheduler(scheduler)
    client = _CLIENTS.get(spec)
    if client is not None and client.status == "running":
        return client
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ParameterError(f"scheduler={scheduler!r} needs Dask: pip install dask distributed "
                             "(the book's extras install them)") from None
    if spec.startswith("local"):
        import dask

        n = int(spec.split(":", 1)[1]) if ":" in spec else (os.cpu_count() or 1)
        # Dask's nannies start workers with MALLOC_TRIM_THRESHOLD_=65536, which turns off glibc's
        # adaptive mmap threshold: every large temporary tensor is then mapped and unmapped
        # afresh, and torch code runs about twice as slowly (mostly in the kernel). Unset it.
        with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
            cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=logging.ERROR)
        client = Client(cluster)
    else:
        try:
            client = Client(spec, timeout="20s")
        except (OSError, TimeoutError) as err:
            raise ParameterError(f"scheduler={spec!r}: no Dask scheduler answers there ({err})") from None
    _CLIENTS[spec] = client
    return client


@atexit.register
def _close_clients() -> None:
    for client in list(_CLIENTS.values()):
        cluster = client.cluster
        try:
            client.close()
            if cluster is not None:
                cluster.close()
        except Exception:  # noqa: BLE001 (best effort at interpreter exit)
            pass
    _CLIENTS.clear()


def _run_distributed(client, fn, todo: list[dict], name: str, retries: int, save) -> None:
    """Submit every point, save each result as it arrives, then report the failed points."""
    from distributed import as_completed

    futures = {}
    token = uuid.uuid4().hex[:8]  # one submission's keys: never shared with another sweep's tasks
    for point in todo:
        key = f"sweep-{name}-{_hash(_key(point))}-{token}"
        futures[client.submit(_evaluate, fn, point, key=key, retries=retries, pure=False)] = point
    failed: dict[str, str] = {}
    try:
        for future in as_completed(futures):
            point = futures[future]
            if future.status == "finished":
                save(point, future.result())
            else:  # "error" after the retries, or "cancelled" by the scheduler
                try:
                    err = future.exception()
                except Exception as cancelled:  # FutureCancelledError: a cancelled future raises it
                    err = cancelled
                failed[_key(point)] = f"{type(err).__name__}: {err}".strip().splitlines()[0][:200]
            future.release()
    finally:
        client.cancel([f for f in futures if f.status == "pending"])
    if failed:
        shown = "; ".join(f"{p} ({e})" for p, e in list(failed.items())[:5])
        more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
        raise SweepError(
            f"sweep {name}: {len(failed)} of {len(todo)} points failed after {retries} retries: "
            f"{shown}{more}; the {len(todo) - len(failed)} others are saved, and running the sweep "
            "again computes only the failed ones", failed)


def _hash(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:16]


# public names (one meaning each, see :mod:`attnbook.checkpoints`)
point_key = _ckpt.point_key  #: point -> its canonical key (str)
read_checkpoint = _ckpt.read_checkpoint  #: path -> {point key: rows}, bad lines set aside
checkpoint_path = _ckpt.checkpoint_path  #: (name, run=None, path=None, fn=None) -> Path
sweep_key = _ckpt.sweep_key  #: (fn, run=None) -> the sweep key (hex SHA-256)


def append_checkpoint(path: str | Path, entries: Iterable[tuple[Mapping[str, Any], list[dict]]]) -> int:
    """Append finished points to the checkpoint ``path`` in the checked line format
    (:func:`attnbook.checkpoints.checkpoint_line`): each entry is ``(point, rows)``. A sweep over
    those points then takes them from there instead of computing them (the table machinery seeds
    a resumed table this way). Returns the number of points written."""
    lines = [_ckpt.checkpoint_line(point, _jsonable(rows)) for point, rows in entries]
    if lines:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        _ckpt.drop_cut_line(path)
        with path.open("a") as fh:
            fh.writelines(lines)
    return len(lines)
