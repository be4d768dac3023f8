"""``attnbook``: execute the chapters with papermill and build the site with Jupyter Book.

Commands::

    attnbook build [-p name=value ...]      execute changed chapters, then build the HTML
    attnbook run CHAPTER [-p name=value]    execute one chapter (e.g. -p profile=full -p seed=1)
    attnbook list                           chapters in the table of contents and their state
    attnbook sync                           rewrite the outputless chapters/*.ipynb from chapters/*.md
    attnbook clean                          remove executed chapters, caches and the built site

Executed notebooks and ``<chapter>.summary.json`` go to ``book/chapters/``. A chapter is
re-executed only when its cache key changes: a hash of the chapter source, attnlib's source, the
parameters and the pinned dependencies (``constraints.txt``). The site is rendered from a staging
tree ``_build/src`` in which each chapter's page is its executed notebook, so a page
``chapters/<id>`` has the committed, outputless ``chapters/<id>.ipynb`` as its launch target.
"""

from __future__ import annotations

import argparse
import ast
import datetime as _dt
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
EXECUTED = ROOT / "book" / "chapters"
CACHE = ROOT / "book" / "_cache"
BUILD = ROOT / "_build"
RECORDS = CACHE / "executions.json"
TABLE = EXECUTED / "execution-table.md"
#: Wall-clock limit of one cell (seconds) per profile; ``None`` means no limit.
CELL_TIMEOUT = {"quick": 900, "full": None}


class BuildError(RuntimeError):
    """A chapter failed to execute or the site failed to build."""


# --------------------------------------------------------------------------------------------
# chapters and parameters
# --------------------------------------------------------------------------------------------
def toc_chapters(root: Path = ROOT) -> list[str]:
    """Chapter ids (``chapters/<id>``) in the order of ``_toc.yml``."""
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(str(node["file"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(toc)
    return [f.split("/", 1)[1] for f in files if f.startswith("chapters/")]


def _read_chapter(chapter: str):
    import jupytext

    path = CHAPTERS / f"{chapter}.md"
    if not path.exists():
        known = ", ".join(toc_chapters()) or "none"
        raise BuildError(f"chapter={chapter!r} not found in chapters/; known chapters: {known}")
    return jupytext.read(path)


def default_parameters(nb) -> dict:
    """The values assigned in the cell tagged ``parameters``."""
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            values: dict = {}
            exec(compile(cell.source, "<parameters>", "exec"), {}, values)  # noqa: S102
            return {k: v for k, v in values.items() if not k.startswith("_")}
    raise BuildError("the chapter has no code cell tagged 'parameters'")


def parse_parameters(pairs: list[str] | None) -> dict:
    """``["profile=full", "seed=3"]`` -> ``{"profile": "full", "seed": 3}`` (Python literals)."""
    out = {}
    for pair in pairs or []:
        name, sep, raw = pair.partition("=")
        if not sep or not name.strip():
            raise BuildError(f"parameter {pair!r} must be written name=value")
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        out[name.strip()] = value
    return out


def validate_parameters(chapter: str, params: dict, defaults: dict) -> dict:
    """Merge ``params`` over the chapter defaults and validate them before anything runs."""
    from . import _runtime
    from ._validation import ParameterError, check_choice, check_int

    unknown = sorted(set(params) - set(defaults))
    if unknown:
        allowed = ", ".join(sorted(defaults))
        raise ParameterError(
            f"{unknown[0]} is not a parameter of chapter {chapter}; its parameters are: {allowed}"
        )
    merged = {**defaults, **params}
    check_choice("profile", merged.get("profile"), _runtime.PROFILES)
    check_int("seed", merged.get("seed"), minimum=0)
    _runtime.resolve_device(merged.get("device", "auto"))
    return merged


def _pins_hash() -> str:
    path = ROOT / "constraints.txt"
    return hashlib.sha256(path.read_bytes() if path.exists() else b"").hexdigest()


def cache_key(chapter: str, params: dict) -> str:
    """Hash of the chapter source, attnlib's source, the parameters and the pinned dependencies."""
    from ._runtime import source_hash

    digest = hashlib.sha256()
    digest.update((CHAPTERS / f"{chapter}.md").read_bytes())
    digest.update(source_hash().encode())
    digest.update(json.dumps(params, sort_keys=True, default=str).encode())
    digest.update(_pins_hash().encode())
    return digest.hexdigest()[:16]


def _load_records() -> dict:
    return json.loads(RECORDS.read_text()) if RECORDS.exists() else {}


def _save_records(records: dict) -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    RECORDS.write_text(json.dumps(records, indent=2, sort_keys=True) + "\n")


def is_current(chapter: str, key: str, records: dict | None = None) -> bool:
    """True when the executed notebook and summary on disk were made with this cache key."""
    records = _load_records() if records is None else records
    return (
        records.get(chapter, {}).get("key") == key
        and (EXECUTED / f"{chapter}.ipynb").exists()
        and (EXECUTED / f"{chapter}.summary.json").exists()
    )


# --------------------------------------------------------------------------------------------
# execution
# --------------------------------------------------------------------------------------------
class _Tail:
    """Print lines appended to ``path`` (the sweeps' progress) while a chapter executes."""

    def __init__(self, path: Path, prefix: str, log=print, every_s: float = 1.0):
        import threading

        self.path, self.prefix, self.log, self.every_s = path, prefix, log, every_s
        self.offset, self.done = 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _flush(self) -> None:
        with self.path.open() as fh:
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
        import re

        lines.append("--- traceback ---")
        lines.extend(re.sub(r"\x1b\[[0-9;]*m", "", t) for t in traceback)
    else:
        lines.append(str(err))
    return "\n".join(lines)


def execute_chapter(chapter: str, params: dict | None = None, force: bool = False,
                    log=print) -> dict:
    """Execute ``chapters/<chapter>.md`` with papermill into ``book/chapters/<chapter>.ipynb``.

    Returns the chapter's execution record. Skips execution when the cache key is unchanged
    (unless ``force``). Raises :class:`BuildError` with the failing cell and its traceback.
    """
    import nbformat
    import papermill as pm
    import torch

    from . import __version__
    from ._runtime import device_name, resolve_device

    nb = _read_chapter(chapter)
    merged = validate_parameters(chapter, params or {}, default_parameters(nb))
    key = cache_key(chapter, merged)
    records = _load_records()
    if not force and is_current(chapter, key, records):
        log(f"  {chapter}: unchanged (cache key {key}), not executed")
        return records[chapter] | {"executed": False}

    EXECUTED.mkdir(parents=True, exist_ok=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    source = CACHE / f"{chapter}.input.ipynb"
    partial = CACHE / f"{chapter}.partial.ipynb"
    final = EXECUTED / f"{chapter}.ipynb"
    summary = EXECUTED / f"{chapter}.summary.json"
    nbformat.write(nb, source)
    for stale in (final, summary):
        stale.unlink(missing_ok=True)

    progress = CACHE / f"{chapter}.progress.log"
    progress.write_text("")
    env_before = dict(os.environ)
    os.environ["ATTNLIB_SWEEP_DIR"] = str(CACHE / "sweeps" / chapter / key)
    os.environ["ATTNLIB_PROGRESS_FILE"] = str(progress)
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    log(f"  {chapter}: executing with {json.dumps(merged, sort_keys=True)}")
    t0 = time.perf_counter()
    tail = _Tail(progress, prefix=f"  {chapter}: ", log=log)
    try:
        pm.execute_notebook(
            str(source), str(partial), parameters=merged, cwd=str(EXECUTED),
            kernel_name="python3", progress_bar=sys.stderr.isatty(), log_output=False,
            execution_timeout=CELL_TIMEOUT[merged["profile"]], report_mode=False,
        )
    except pm.PapermillExecutionError as err:
        raise BuildError(_report_failure(chapter, err)) from None
    except Exception as err:  # kernel death, timeout, ...
        raise BuildError(f"chapter {chapter} failed: {type(err).__name__}: {err}") from None
    finally:
        tail.stop()
        os.environ.clear()
        os.environ.update(env_before)
    wall = time.perf_counter() - t0
    if not summary.exists():
        raise BuildError(f"chapter {chapter} ran but wrote no {summary.name}")

    executed = nbformat.read(partial, as_version=4)
    _tag_parameter_cells(executed)
    device = resolve_device(merged.get("device", "auto"))
    record = {
        "key": key,
        "params": merged,
        "profile": merged["profile"],
        "device": device_name(device),
        "wall_s": round(wall, 1),
        "attnlib": __version__,
        "torch": torch.__version__,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
    }
    executed.metadata["attnbook"] = record
    nbformat.write(executed, final)
    partial.unlink(missing_ok=True)
    records = _load_records()
    records[chapter] = record
    _save_records(records)
    log(f"  {chapter}: executed in {wall:.1f} s")
    return record | {"executed": True}


# --------------------------------------------------------------------------------------------
# site
# --------------------------------------------------------------------------------------------
def execution_table(chapters: list[str], records: dict) -> str:
    """Markdown table: chapter, profile, device, wall time, versions, date."""
    rows = [
        "| chapter | profile | device | wall time (s) | attnlib | torch | executed (UTC) |",
        "| --- | --- | --- | ---: | --- | --- | --- |",
    ]
    for chapter in chapters:
        r = records.get(chapter, {})
        rows.append(
            f"| `{chapter}` | {r.get('profile', '?')} | {r.get('device', '?')} | "
            f"{r.get('wall_s', float('nan')):.1f} | {r.get('attnlib', '?')} | "
            f"{r.get('torch', '?')} | {r.get('date', '?')} |"
        )
    return "\n".join(rows) + "\n"


def stage_site(chapters: list[str]) -> Path:
    """Assemble ``_build/src``: config, prose pages and the executed chapters as pages."""
    src = BUILD / "src"
    if src.exists():
        shutil.rmtree(src)
    (src / "chapters").mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "book", src / "book",
        ignore=shutil.ignore_patterns("_build", "_cache", "*.ipynb", "*.summary.json"),
    )
    for chapter in chapters:
        shutil.copy2(EXECUTED / f"{chapter}.ipynb", src / "chapters" / f"{chapter}.ipynb")
    return src


def build_site(chapters: list[str], log=print) -> Path:
    """Render the executed chapters strictly (``--all -W -n --keep-going``); return the HTML dir."""
    src = stage_site(chapters)
    html = BUILD / "html"
    out_root = BUILD / "jb"
    cmd = [
        str(Path(sys.executable).parent / "jupyter-book"), "build", str(src), "--path-output", str(out_root),
        "--all", "-W", "-n", "--keep-going",
    ]
    log("  rendering the site: jupyter-book " + " ".join(cmd[1:]))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError("the site build failed:\n" + proc.stdout[-6000:] + proc.stderr[-6000:])
    if html.exists():
        shutil.rmtree(html)
    shutil.copytree(out_root / "_build" / "html", html)
    log(f"  site built in {time.perf_counter() - t0:.1f} s")
    return html


def build(params: dict | None = None, force: bool = False, site: bool = True, log=print) -> dict:
    """Execute every chapter of the table of contents (cached), then build the site."""
    chapters = toc_chapters()
    t0 = time.perf_counter()
    records = {}
    for i, chapter in enumerate(chapters, 1):
        log(f"[{i}/{len(chapters)}] {chapter}  (elapsed {time.perf_counter() - t0:.0f} s)")
        records[chapter] = execute_chapter(chapter, params, force=force, log=log)
    n_run = sum(r["executed"] for r in records.values())
    log(f"{n_run} of {len(chapters)} chapters executed, {len(chapters) - n_run} unchanged")
    TABLE.write_text(execution_table(chapters, _load_records()))
    log("\n" + TABLE.read_text())
    if site:
        html = build_site(chapters, log=log)
        log(f"open {html / 'index.html'}")
    return records


def clean(log=print) -> None:
    for path in (EXECUTED, CACHE, BUILD):
        if path.exists():
            shutil.rmtree(path)
            log(f"removed {path.relative_to(ROOT)}")


def sync(log=print) -> list[Path]:
    """Write ``chapters/<id>.ipynb`` (no outputs) from each ``chapters/<id>.md``."""
    import jupytext

    written = []
    for md in sorted(CHAPTERS.glob("*.md")):
        target = md.with_suffix(".ipynb")
        nb = jupytext.read(md)
        for i, cell in enumerate(nb.cells):
            cell.id = f"cell-{i:03d}"  # stable ids: re-syncing an unchanged chapter changes nothing
        jupytext.write(nb, target, fmt="ipynb")
        written.append(target)
        log(f"wrote {target.relative_to(ROOT)}")
    return written


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    from ._validation import ParameterError

    parser = argparse.ArgumentParser(prog="attnbook", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="execute changed chapters and build the site")
    p_build.add_argument("-p", "--param", action="append", metavar="NAME=VALUE")
    p_build.add_argument("--force", action="store_true", help="re-execute every chapter")
    p_build.add_argument("--no-site", action="store_true", help="execute only, skip the HTML")
    p_run = sub.add_parser("run", help="execute one chapter")
    p_run.add_argument("chapter")
    p_run.add_argument("-p", "--param", action="append", metavar="NAME=VALUE")
    p_run.add_argument("--force", action="store_true")
    sub.add_parser("list", help="chapters and whether their executed notebook is current")
    sub.add_parser("sync", help="write outputless chapters/*.ipynb from chapters/*.md")
    sub.add_parser("clean", help="remove executed chapters, caches and the site")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build(parse_parameters(args.param), force=args.force, site=not args.no_site)
        elif args.command == "run":
            execute_chapter(args.chapter, parse_parameters(args.param), force=args.force)
        elif args.command == "list":
            records = _load_records()
            for chapter in toc_chapters():
                merged = validate_parameters(chapter, {}, default_parameters(_read_chapter(chapter)))
                state = "current" if is_current(chapter, cache_key(chapter, merged), records) \
                    else "needs execution"
                print(f"{chapter:28s} {state}")
        elif args.command == "sync":
            sync()
        elif args.command == "clean":
            clean()
    except ParameterError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
