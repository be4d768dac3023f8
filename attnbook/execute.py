"""Executing a chapter into its output slot, with papermill.

:func:`execute_chapter` checks the parameters, skips a slot whose cache key is unchanged, and
otherwise runs the chapter in a temporary folder on a kernel of its own (Unix sockets, its
messages to a log), with the sweeps' progress printed as it comes. On success the executed
notebook, summary and record replace the previous ones (each rename atomic, the record last); on
failure or interruption the previous outputs and the finished sweep points are kept, and the
failing cell, its traceback and the kernel's messages go to the slot's log.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnlib._validation import ParameterError

from . import checkpoints as _checkpoints
from .layout import BuildError, Interrupted, Lock, _atomic_write, _rel, _sha, current
from .slots import (
    _canonical,
    _key_of,
    _load_records,
    _prepare,
    _update_records,
    is_current,
    results_hash,
    slot_paths,
)

#: Wall-clock limit of one cell (seconds) per profile; ``None`` means no limit.
CELL_TIMEOUT = {"quick": 900, "full": None}


class _Tail:
    """Print lines appended to ``path`` (the sweeps' progress) while a chapter executes."""

    def __init__(self, path: Path, prefix: str, log=print, every_s: float = 1.0):
        import threading

        self.path, self.prefix, self.log, self.every_s = path, prefix, log, every_s
        self.offset, self.done = 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _flush(self) -> None:
        with contextlib.suppress(OSError), self.path.open() as fh:
            fh.seek(self.offset)
            chunk = fh.read()
            complete, _, _ = chunk.rpartition("\n")
            if complete:
                self.offset += len(complete) + 1
                for line in complete.splitlines():
                    self.log(self.prefix + line)

    def _run(self) -> None:
        while not self.done.wait(self.every_s):
            self._flush()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        self._flush()


def _tag_parameter_cells(nb) -> None:
    """Hide the defaults cell entirely and collapse the injected-parameters cell."""
    for cell in nb.cells:
        tags = cell.metadata.setdefault("tags", [])
        if "parameters" in tags and "remove-cell" not in tags:
            tags.append("remove-cell")
        if "injected-parameters" in tags and "hide-input" not in tags:
            tags.append("hide-input")


def _report_failure(chapter: str, err) -> str:
    lines = [f"chapter {chapter} failed"]
    cell_index = getattr(err, "exec_count", None)
    source = getattr(err, "source", None)
    if cell_index is not None:
        lines.append(f"--- failing cell (execution count {cell_index}) ---")
    if source:
        lines.append(source)
    traceback = getattr(err, "traceback", None)
    if traceback:
        lines.append("--- traceback ---")
        lines.extend(re.sub(r"\x1b\[[0-9;]*m", "", t) for t in traceback)
    else:
        lines.append(str(err))
    return "\n".join(lines)


def _kernel_manager_class(socket_dir: str, kernel_log: Path):
    """A kernel manager talking to its kernel over Unix sockets in ``socket_dir``.

    IPC instead of TCP: no loopback network is needed, and ipykernel's warning about unencrypted
    TCP never arises. The kernel process's own messages go to ``kernel_log``, not the terminal.
    """
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class IpcKernelManager(AsyncKernelManager):
        started: list = []  # the managers of this run, to stop their kernels

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.started.append(self)

        async def start_kernel(self, **kwargs):
            self._log_fh = open(kernel_log, "ab")  # noqa: SIM115 (closed by the kernel's end)
            kwargs.setdefault("stdout", self._log_fh)
            kwargs.setdefault("stderr", self._log_fh)
            return await super().start_kernel(**kwargs)

        @default("transport")
        def _default_transport(self):
            return "ipc"

        @default("ip")
        def _default_ip(self):
            return os.path.join(socket_dir, "kernel")

        @default("connection_file")
        def _default_connection_file(self):
            return os.path.join(socket_dir, "kernel.json")

    return IpcKernelManager


def _stop_kernels(manager_class) -> None:
    """Kill a kernel still running after an interruption (before its sockets are removed)."""
    for km in getattr(manager_class, "started", []):
        process = getattr(getattr(km, "provisioner", None), "process", None)
        if process is not None and process.poll() is None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait(timeout=10)
        with contextlib.suppress(OSError, AttributeError):
            km._log_fh.close()


def _saved_points(folder: Path) -> int:
    return _checkpoints.saved_points(folder)


def execute_chapter(chapter: str, params: dict | None = None, force: bool = False,
                    log=print, wait: bool = True) -> dict:
    """Execute ``chapters/<chapter>.md`` with papermill into its output slot.

    Every parameter is checked before a kernel starts. Skips execution when the slot's cache key
    is unchanged (unless ``force``). The chapter runs in a temporary folder; its notebook,
    summary and record replace the previous ones only on success. Raises :class:`BuildError`
    (one line; ``details`` has the failing cell and its traceback) or :class:`Interrupted`;
    either way the previous outputs and the finished sweep points are kept.
    """
    nb, merged, slot, inputs, key = _prepare(chapter, params)
    _check_scheduler_answers(merged.get("scheduler"))  # a dead address is an error even for a current slot
    if merged.get("profile") == "full":
        _warn_cost(chapter, log)
    if not force and is_current(chapter, key, _load_records(), slot):
        log(f"  {slot}: unchanged (cache key {key}), not executed")
        return _load_records()[slot] | {"executed": False, "slot": slot}
    with Lock(f"slot-{slot}", f"an execution of {slot}", wait=wait, log=log):
        if not force and is_current(chapter, key, _load_records(), slot):
            log(f"  {slot}: executed meanwhile by another process (cache key {key})")
            return _load_records()[slot] | {"executed": False, "slot": slot}
        return _execute(chapter, nb, merged, slot, inputs, key, log)


def _warn_cost(chapter: str, log=print) -> None:
    """Before a ``full`` run: one line with the estimated CPU time of the tables it will compute
    (those not stored in ``results/``), from the cost report ``benchmarks/results/full_cost.json``
    (nothing when the report is missing or the run is short)."""
    path = current().root / "benchmarks" / "results" / "full_cost.json"
    try:
        rows = json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    stored = current().root / "results" / chapter
    todo = [r for r in rows if isinstance(r, dict) and chapter.startswith(str(r.get("chapter")) + "-")
            and isinstance(r.get("cpu_s"), int | float)
            and not any(stored.glob(f"{str(r.get('table')).split(' ')[0]}*.csv"))]
    cpu_h = sum(r["cpu_s"] for r in todo) / 3600
    if cpu_h >= 1:
        names = ", ".join(str(r.get("table")).split(" ")[0] for r in todo)
        log(f"  note: the full profile of {chapter} computes {names} (not stored in results/): about "
            f"{cpu_h:.0f} CPU h on one core by the cost report; stored tables are loaded, sweeps resume")


def _check_scheduler_answers(scheduler, timeout_s: float = 5.0) -> None:
    """A scheduler address must accept a connection before a kernel starts (ParameterError)."""
    import socket

    from .sweeps import check_scheduler

    if scheduler == "auto":  # a chapter's own choice of serial or local execution
        return
    spec = check_scheduler(scheduler)
    if spec is None or spec.startswith("local"):
        return
    host, _, port = spec.split("://", 1)[1].rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ParameterError(f"scheduler={spec!r}: no Dask scheduler answers there "
                             f"({type(err).__name__}: {err}); start one (`dask scheduler`) or "
                             "choose 'serial' or 'local'") from None


def _execute(chapter, nb, merged, slot, inputs, key, log) -> dict:
    import nbformat
    import papermill as pm
    import torch

    from attnlib import __version__

    from .runs import device_name, resolve_device

    notebook, summary = slot_paths(chapter, slot)
    cache = current().cache
    work = cache / "work" / f"{slot}.{os.getpid()}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    logs = cache / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_file = logs / f"{slot}.log"
    sweeps = cache / "sweeps" / slot  # checkpoints <name>.<sweep key>.jsonl: keyed by code, not prose
    sweep_env = _checkpoints.begin_execution(sweeps, inputs)
    _atomic_write(sweeps / "params.json", json.dumps(_canonical(merged), sort_keys=True) + "\n")
    source, partial = work / f"{chapter}.input.ipynb", work / f"{chapter}.ipynb"
    nbformat.write(nb, source)
    progress = work / "progress.log"
    progress.write_text("")
    # the kernel's sockets and connection file, in one folder named by this process: a killed run
    # leaves nothing elsewhere, and `clean --stale` removes the folder once the process is gone
    socket_dir = tempfile.mkdtemp(prefix=f"attnbook-{os.getpid()}-")

    env_before = dict(os.environ)
    os.environ.update(sweep_env)
    os.environ["ATTNLIB_PROGRESS_FILE"] = str(progress)
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    log(f"  {slot}: executing with {json.dumps(merged, sort_keys=True, default=str)}")
    t0 = time.perf_counter()
    tail = _Tail(progress, prefix=f"  {slot}: ", log=log)
    manager_class = _kernel_manager_class(socket_dir, work / "kernel.log")
    failure: BuildError | None = None
    try:
        pm.execute_notebook(
            str(source), str(partial), parameters=merged, cwd=str(work),
            kernel_name="python3", progress_bar=sys.stderr.isatty(), log_output=False,
            execution_timeout=CELL_TIMEOUT[merged["profile"]], report_mode=False,
            kernel_manager_class=manager_class,
        )
    except pm.PapermillExecutionError as err:
        if err.ename == "KeyboardInterrupt":  # Ctrl-C reaches the kernel too (same process group)
            failure = Interrupted(f"chapter {slot} was interrupted after {time.perf_counter() - t0:.0f} s",
                                  _report_failure(slot, err))
        where = f"in cell {err.exec_count}" if getattr(err, "exec_count", None) else ""
        what = f"{err.ename}: {err.evalue}".strip().splitlines()[0][:300] if err.ename else "error"
        failure = failure or BuildError(f"chapter {slot} failed {where}: {what}".replace("  ", " "),
                                        _report_failure(slot, err))
    except KeyboardInterrupt:
        failure = Interrupted(f"chapter {slot} was interrupted after {time.perf_counter() - t0:.0f} s",
                              f"chapter {slot} interrupted (KeyboardInterrupt or SIGTERM)")
        # nbclient's kernel-liveness task then ends in a DeadKernelError nobody awaits; asyncio
        # would print its traceback at exit, after the one-line message (seen on a loaded machine)
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    except Exception as err:  # kernel death, timeout, no kernel reply, ...
        text = f"{type(err).__name__}: {err}".strip().splitlines()[0][:300]
        failure = BuildError(f"chapter {slot} failed: {text}", f"chapter {slot} failed: {text}")
    finally:
        tail.stop()
        _stop_kernels(manager_class)
        os.environ.clear()
        os.environ.update(env_before)
        shutil.rmtree(socket_dir, ignore_errors=True)
    wall = time.perf_counter() - t0
    if failure is None and not (work / summary.name).exists():
        failure = BuildError(f"chapter {slot} ran but wrote no {summary.name}")
    if failure is not None:
        return _fail(failure, slot, work, partial, log_file, notebook, sweeps, progress)

    executed = nbformat.read(partial, as_version=4)
    _tag_parameter_cells(executed)
    # papermill records the temporary work folder (with this process's id): the published notebook
    # names the chapter's source and its slot instead, the same on every machine
    pm = executed.metadata.get("papermill", {})
    pm.update(input_path=f"chapters/{chapter}.md", output_path=_rel(notebook))
    device = resolve_device(merged.get("device", "auto"))
    # a full run stores the tables it computed: its outputs are current with the store as it left it
    inputs = dict(inputs, results=results_hash(chapter))
    key = _key_of(inputs)
    record = {
        "key": key,
        "slot": slot,
        "chapter": chapter,
        "inputs": inputs,
        "params": _canonical(merged),
        "profile": merged["profile"],
        "device": device_name(device),
        "wall_s": round(wall, 1),
        "attnlib": __version__,
        "torch": torch.__version__,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "notebook": _rel(notebook),
        "summary": _rel(summary),
        "summary_sha256": _sha((work / summary.name).read_bytes()),
    }
    executed.metadata["attnbook"] = {k: v for k, v in record.items() if k != "inputs"}
    nbformat.write(executed, work / "final.ipynb")
    notebook.parent.mkdir(parents=True, exist_ok=True)
    # promote: each rename is atomic; the record (written last) vouches for the pair
    os.replace(work / summary.name, summary)
    os.replace(work / "final.ipynb", notebook)
    _update_records(slot, record)
    _checkpoints.end_execution(sweeps)
    _atomic_write(log_file, f"chapter {slot} executed in {wall:.1f} s (cache key {key})\n")
    shutil.rmtree(work, ignore_errors=True)
    log(f"  {slot}: executed in {wall:.1f} s")
    return record | {"executed": True}


def _fail(failure, slot, work, partial, log_file, notebook, sweep_dir, progress):
    """Keep the previous outputs, save the log and the partial notebook, raise one line."""
    text = [failure.details, "", "--- sweep progress ---"]
    with contextlib.suppress(OSError):
        text.append(progress.read_text())
    with contextlib.suppress(OSError):
        text += ["--- kernel messages ---", (work / "kernel.log").read_text(errors="replace")]
    logged = True
    try:  # the message goes out even when the log cannot be written (a full disk)
        _atomic_write(log_file, "\n".join(text) + "\n")
        if partial.exists():
            os.replace(partial, log_file.with_suffix(".partial.ipynb"))
    except OSError:
        logged = False
    shutil.rmtree(work, ignore_errors=True)
    kept = (f"the last good output is kept ({_rel(notebook)})" if notebook.exists()
            else "there was no earlier output")
    points = _saved_points(sweep_dir)
    saved = f"{points} finished sweep point{'s' * (points != 1)} saved for the next run"
    log_note = f"log: {_rel(log_file)}" if logged else "no log written (the disk is full)"
    failure.args = (f"{failure}; {kept}; {saved}; {log_note}",)
    raise failure
