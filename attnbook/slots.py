"""Output slots and their cache keys, and the records of the executions that filled them.

A run of a chapter fills a slot: the book's own (default parameters) or one named by its other
parameters (:func:`slot_name`, :func:`slot_paths`). Its cache key (:func:`cache_key`) hashes
everything the outputs depend on (:func:`key_inputs`: chapter source, code, pins, device,
parameters, stored tables). The records of the executions (``book/_cache/executions.json``,
slot -> record, updated under a lock) tell whether a slot is current (:func:`is_current`) and, if
not, why (:func:`stale_reasons`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

from .deps import code_hashes
from .layout import Lock, _atomic_write, _read_chapter, _rel, _sha, current
from .params import EXECUTION_ONLY, parameter_schema, validate_parameters


def _pins_hash() -> str:
    """Hash of the pins in ``constraints.txt``: its requirement lines, without comments, blank
    lines or surrounding whitespace, so that editing a comment re-executes nothing."""
    path = current().root / "constraints.txt"
    text = path.read_text() if path.exists() else ""
    pins = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    return _sha("\n".join(p for p in pins if p))[:16]


def device_label(device: str = "auto") -> str:
    """The device a run with parameter ``device`` actually uses: ``cpu`` or ``cuda:<GPU name>``."""
    import torch

    from .runs import resolve_device

    dev = resolve_device(device)
    return f"cuda:{torch.cuda.get_device_name(dev)}" if dev.type == "cuda" else dev.type


def _canonical(params: dict) -> dict:
    return json.loads(json.dumps(params, sort_keys=True, default=str))


def results_hash(chapter: str) -> str:
    """Hash of the chapter's stored paper-scale tables, ``results/<chapter>/`` (or the store
    ``$ATTNLIB_RESULTS_DIR`` names): a quick page draws them beside its own, a full run loads them."""
    from .store import results_root

    folder = results_root() / chapter
    h = hashlib.sha256()
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def key_inputs(chapter: str, params: dict, nb=None) -> dict:
    """Everything an execution's outputs depend on (what :func:`cache_key` hashes)."""
    return {
        "chapter": _sha((current().chapters / f"{chapter}.md").read_bytes())[:16],
        "code": code_hashes(chapter, nb),
        "pins": _pins_hash(),
        "device": device_label(params.get("device", "auto")),
        "params": _canonical({k: v for k, v in params.items() if k not in EXECUTION_ONLY}),
        "results": results_hash(chapter),
    }


def _key_of(inputs: dict) -> str:
    return _sha(json.dumps(inputs, sort_keys=True))[:16]


def cache_key(chapter: str, params: dict, nb=None) -> str:
    """Hash of the chapter source, the code it imports, the parameters, the pins and the device."""
    return _key_of(key_inputs(chapter, params, nb))


def slot_name(chapter: str, params: dict, defaults: dict) -> str:
    """``<chapter>`` for the default parameters, else ``<chapter>@<name>=<value>,...``.

    Values that are not short plain words (dicts, lists, long strings) are named by a hash.
    :data:`EXECUTION_ONLY` parameters (``scheduler``) do not name a slot.
    """
    parts = []
    for name in sorted(params):
        value = params[name]
        if name in EXECUTION_ONLY:
            continue
        if name in defaults and value == defaults[name] and type(value) is type(defaults[name]):
            continue
        text = str(value)
        if isinstance(value, dict | list | tuple) or not re.fullmatch(r"[A-Za-z0-9._+-]{1,24}", text):
            text = "h" + _sha(json.dumps(value, sort_keys=True, default=str))[:8]
        parts.append(f"{name}={text}")
    return chapter if not parts else f"{chapter}@{','.join(parts)}"


def slot_paths(chapter: str, slot: str) -> tuple[Path, Path]:
    """Executed notebook and summary of ``slot``."""
    executed = current().executed
    folder = executed if slot == chapter else executed / "runs" / slot
    return folder / f"{chapter}.ipynb", folder / f"{chapter}.summary.json"


# --------------------------------------------------------------------------------------------
# execution records (book/_cache/executions.json: slot -> record)
# --------------------------------------------------------------------------------------------
_WARNED: set[str] = set()


def _warn(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        print(f"warning: {message}", file=sys.stderr)


def _load_records(report: bool = True) -> dict:
    """The execution records; an unreadable file counts as empty and is reported in one line."""
    path = current().records
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as err:
        if report:
            _warn(f"{_rel(path)} is unreadable ({type(err).__name__}: {str(err)[:80]}); "
                  "every chapter counts as not executed, the file is set aside at the next run")
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)}


def _update_records(slot: str, record: dict | None) -> None:
    """Set ``records[slot]`` (``None``: remove it) under a short lock, writing the file atomically.

    An unreadable records file is moved aside (``executions.corrupt-<time>.json``), not lost.
    """
    with Lock("records", "an update of the execution records"):
        path = current().records
        if path.exists() and not _records_readable():
            aside = path.with_name(f"executions.corrupt-{int(time.time())}.json")
            os.replace(path, aside)
            _warn(f"the unreadable records were moved to {_rel(aside)}")
        records = _load_records(report=False)
        if record is None:  # the slot is dropped (attnbook clean --slot)
            records.pop(slot, None)
        else:
            records[slot] = record
        _atomic_write(path, json.dumps(records, indent=2, sort_keys=True) + "\n")


def _records_readable() -> bool:
    try:
        return isinstance(json.loads(current().records.read_text()), dict)
    except (OSError, ValueError):
        return False


def _output_problem(chapter: str, slot: str, record: dict) -> str | None:
    """Why the slot's files on disk are not the recorded execution, or ``None`` if they are."""
    notebook, summary = slot_paths(chapter, slot)
    if not notebook.exists():
        return "executed notebook missing"
    if not summary.exists():
        return "summary missing"
    try:
        meta = json.loads(notebook.read_text())["metadata"]["attnbook"]
    except (OSError, ValueError, KeyError, TypeError):
        return "executed notebook unreadable or incomplete"
    if meta.get("key") != record.get("key"):
        return "executed notebook is from another execution"
    want = record.get("summary_sha256")
    if want and _sha(summary.read_bytes()) != want:
        return "summary altered since the execution"
    return None


def stale_reasons(chapter: str, slot: str, key: str, inputs: dict, records: dict) -> list[str]:
    """Why ``slot`` needs execution (empty when its outputs are current)."""
    record = records.get(slot)
    if record is None:
        return ["never executed"]
    if record.get("key") != key:
        old = record.get("inputs")
        if not isinstance(old, dict):
            return ["executed by an older attnbook (no record of its inputs)"]
        reasons = []
        if old.get("chapter") != inputs["chapter"]:
            reasons.append(f"chapters/{chapter}.md changed")
        before, now = old.get("code", {}), inputs["code"]
        changed = sorted(m for m in set(before) | set(now) if before.get(m) != now.get(m))
        if changed:
            shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
            reasons.append(f"code changed: {shown}")
        if old.get("pins") != inputs["pins"]:
            reasons.append("constraints.txt changed")
        if old.get("device") != inputs["device"]:
            reasons.append(f"device changed ({old.get('device')} -> {inputs['device']})")
        if old.get("params") != inputs["params"]:
            reasons.append("parameters changed")
        if old.get("results") != inputs["results"]:
            reasons.append(f"stored results changed (results/{chapter}/)")
        return reasons or ["cache key changed"]
    problem = _output_problem(chapter, slot, record)
    return [problem] if problem else []


def is_current(chapter: str, key: str, records: dict | None = None, slot: str | None = None) -> bool:
    """True when the slot's notebook and summary on disk were made with this cache key."""
    records = _load_records() if records is None else records
    slot = slot or chapter
    record = records.get(slot)
    return record is not None and record.get("key") == key and _output_problem(chapter, slot, record) is None


def _prepare(chapter: str, params: dict | None):
    """The chapter, its checked parameters, slot, key inputs and cache key for ``params``."""
    nb = _read_chapter(chapter)
    schema = parameter_schema(nb)
    defaults = {name: p.default for name, p in schema.items()}
    merged = validate_parameters(chapter, params or {}, defaults, nb=nb)
    slot = slot_name(chapter, merged, defaults)
    inputs = key_inputs(chapter, merged, nb)
    return nb, merged, slot, inputs, _key_of(inputs)
