"""A scripted reliability probe of the book's command line, run on a copy of chapter 0.

    python tests/probe_reliability.py        # from a clone, after `make book` installed .venv

It copies chapter 0 and its stored table into a temporary book (``$ATTNBOOK_ROOT``,
``$ATTNLIB_RESULTS_DIR``), so the clone itself is never touched, and checks four failures a
user can cause, each answered in one line with the right exit status:

1. a checkpoint line edited by hand: set aside into ``<file>.rejected``, named in one warning,
   and its point recomputed (the published summary equals the one before the edit);
2. a stored table whose provenance record is deleted: the chapter refuses it, naming the file;
3. ``attnbook clean`` while the chapter is executing: refused, the run finishes;
4. a size that cannot fit in memory (chapter 3's ``n_sequences = 10**13``): refused before a
   kernel starts, with the estimate.

Exit status 0 when every scenario behaves; each prints one ``ok`` or ``FAILED`` line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CH = "00-attention"


def _book(where: Path) -> dict:
    """A book with chapter 0 and its stored table at ``where``; the environment that points at it."""
    (where / "chapters").mkdir(parents=True)
    shutil.copy2(ROOT / "chapters" / f"{CH}.md", where / "chapters")
    shutil.copy2(ROOT / "chapters" / "03-positional-semantic.md", where / "chapters")
    (where / "_toc.yml").write_text(f"format: jb-book\nroot: intro\nchapters:\n- file: chapters/{CH}\n")
    shutil.copy2(ROOT / "constraints.txt", where)
    shutil.copytree(ROOT / "results" / CH, where / "results" / CH)
    return {**os.environ, "ATTNBOOK_ROOT": str(where), "ATTNLIB_RESULTS_DIR": str(where / "results"),
            "OMP_NUM_THREADS": "1"}


def _attnbook(env: dict, *args: str, wait: bool = True):
    cmd = [sys.executable, "-m", "attnbook", *args]
    if not wait:
        return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)


def _summary(where: Path) -> dict:
    out = json.loads((where / "book" / "chapters" / f"{CH}.summary.json").read_text())
    return {k: v for k, v in out.items() if not k.endswith("_s")}


def probe(where: Path) -> list[tuple[str, bool, str]]:
    env = _book(where)
    results = []
    first = _attnbook(env, "run", CH)
    assert first.returncode == 0, first.stderr
    before = _summary(where)

    # 1. an edited checkpoint line
    [ckpt] = sorted((where / "book" / "_cache" / "sweeps" / CH).glob("neff.*.jsonl"))
    lines = ckpt.read_text().splitlines()
    entry = json.loads(lines[0])
    entry["rows"][0]["neff_mean"] += 1.0  # one changed number, its checksum left as it was
    ckpt.write_text("\n".join([json.dumps(entry), *lines[1:]]) + "\n")
    again = _attnbook(env, "run", CH, "--force")
    rejected = ckpt.with_name(ckpt.name + ".rejected")
    ok = (again.returncode == 0 and rejected.exists() and ckpt.name in again.stdout + again.stderr
          and _summary(where) == before)
    results.append(("edited checkpoint line: set aside, named, recomputed", ok, again.stderr[-300:]))

    # 2. a deleted provenance record
    record = where / "results" / CH / "neff.provenance.json"
    saved = record.read_bytes()
    record.unlink()
    refused = _attnbook(env, "run", CH, "--force")
    line = refused.stderr.strip().splitlines()
    ok = refused.returncode == 1 and len(line) == 1 and "neff.provenance.json" in line[0]
    results.append(("deleted provenance: refused in one line", ok, refused.stderr[-300:]))
    record.write_bytes(saved)

    # 3. clean while the chapter executes: the probe's copy of the chapter waits for a gate file
    # after its parameters cell, so the run is surely executing when clean is called
    gate = where / "gate"
    source = where / "chapters" / f"{CH}.md"
    text = source.read_text()
    head, sep, rest = text.partition(":tags: [parameters]")
    end = rest.index("```") + 3
    hold = (f"\n\n```{{code-cell}} python\nimport os, time\nwhile not os.path.exists({str(gate)!r}):\n"
            "    time.sleep(0.1)\n```")
    source.write_text(head + sep + rest[:end] + hold + rest[end:])
    running = _attnbook(env, "run", CH, "--force", wait=False)
    lock = where / "book" / "_cache" / "locks" / f"slot-{CH}.lock"
    deadline = time.time() + 120
    while time.time() < deadline and not (lock.exists() and lock.read_text().strip()):
        time.sleep(0.1)
    clean = _attnbook(env, "clean")
    gate.touch()
    out, err = running.communicate(timeout=600)
    ok = (clean.returncode == 1 and "being executed" in clean.stderr
          and len(clean.stderr.strip().splitlines()) == 1 and running.returncode == 0)
    results.append(("clean during a run: refused, the run finishes", ok, clean.stderr[-300:] + err[-300:]))

    # 4. a size that cannot fit in memory
    t0 = time.perf_counter()
    huge = _attnbook(env, "run", "03-positional-semantic", "-p",
                     "sizes={'hist': {'n_sequences': 10000000000000}}")
    ok = (huge.returncode == 2 and "needs at least" in huge.stderr and "memory" in huge.stderr
          and len(huge.stderr.strip().splitlines()) == 1 and time.perf_counter() - t0 < 60)
    results.append(("n_sequences = 10**13: refused before a kernel starts, with the estimate", ok,
                    huge.stderr[-300:]))
    return results


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="attnbook-probe-") as tmp:
        results = probe(Path(tmp) / "book")
    for what, ok, detail in results:
        print(f"{'ok    ' if ok else 'FAILED'} {what}" + ("" if ok else f"\n       {detail.strip()}"))
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
