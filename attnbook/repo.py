"""Files committed to the book's repository (benchmark records), found from wherever attnlib runs.

In a clone of the repository the file is read where it is. A notebook run elsewhere (Colab, a
fresh Jupyter with attnlib installed from its wheel) has no checkout: its install cell sets
``$ATTNLIB_REPO_RAW`` to the repository's files at the book's version, and the file is downloaded
once into the attnlib cache. ``$ATTNLIB_REPO_DIR`` points at a local copy of the repository instead
(the fresh-environment test of the notebooks uses it).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

__all__ = ["committed_file", "cache_dir"]

_CHECKOUT = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """attnlib's cache folder (:func:`attnlib.glyphs.glyph_cache_dir`)."""
    from attnlib.glyphs import glyph_cache_dir

    return glyph_cache_dir()


def committed_file(relpath: str) -> Path:
    """Local path of the repository file ``relpath`` (e.g. ``benchmarks/results/bench_paths.json``).

    Looked up, in order, in ``$ATTNLIB_REPO_DIR``, in the checkout attnlib was imported from, and
    in the cache (downloaded from ``$ATTNLIB_REPO_RAW/<relpath>`` on first use). Raises
    :class:`FileNotFoundError` naming the file and both settings when none has it.
    """
    rel = Path(relpath)
    if rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"committed_file: {relpath!r} must be a path inside the repository")
    roots = [Path(p) for p in [os.environ.get("ATTNLIB_REPO_DIR")] if p] + [_CHECKOUT]
    for root in roots:
        if (root / rel).is_file():
            return root / rel
    cached = cache_dir() / "repository" / rel
    if cached.is_file():
        return cached
    raw = os.environ.get("ATTNLIB_REPO_RAW", "").rstrip("/")
    if not raw:
        raise FileNotFoundError(
            f"{relpath} is not here: attnlib is not running from a clone of the book's repository. "
            "Set ATTNLIB_REPO_DIR to a clone, or ATTNLIB_REPO_RAW to the repository's raw-file URL "
            "(the notebooks' install cell sets it)."
        )
    url = f"{raw}/{rel.as_posix()}"
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            data = response.read()
    except (urllib.error.URLError, OSError) as err:
        raise FileNotFoundError(f"{relpath}: could not download {url} ({err})") from err
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(cached.name + ".part")
    tmp.write_bytes(data)
    tmp.replace(cached)
    return cached
