"""Where the book lives, and the small helpers every part of the machinery shares.

A :class:`Book` names the folders of one book tree: its chapters (``chapters/``), executed
outputs (``book/chapters/``), cache (``book/_cache/``, with the execution records), built site
(``_build/``) and execution table. The *current* book (:func:`current`) is the checkout that holds
:mod:`attnlib`, or ``$ATTNBOOK_ROOT`` when set; :func:`use` points the machinery at another one
(tests build a tiny book in a temporary folder, ``make pdf`` stages into ``_build/pdf``). Every
function of :mod:`attnbook` reads its paths from the current book when it is called. Here too:
:class:`BuildError` and :class:`Interrupted`, a chapter's source (:func:`_read_chapter`), atomic
writes and the per-checkout :class:`Lock`.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import attnlib
from attnlib._validation import ParameterError


@dataclass(frozen=True)
class Book:
    """The folders of one book tree rooted at ``root``.

    Each folder defaults to its place under ``root`` and may be given instead, e.g.
    ``Book(root, build=root / "_build" / "pdf")``; ``records`` and ``table`` default to their
    places in the (given or default) ``cache`` and ``executed`` folders. After construction every
    field holds a :class:`~pathlib.Path`.
    """

    root: Path
    chapters: Path | None = None
    executed: Path | None = None
    cache: Path | None = None
    build: Path | None = None
    records: Path | None = None
    table: Path | None = None

    def __post_init__(self):
        root = Path(self.root)
        executed = Path(self.executed or root / "book" / "chapters")
        cache = Path(self.cache or root / "book" / "_cache")
        for name, value in {
            "root": root, "chapters": self.chapters or root / "chapters", "executed": executed,
            "cache": cache, "build": self.build or root / "_build",
            "records": self.records or cache / "executions.json",
            "table": self.table or executed / "execution-table.md",
        }.items():
            object.__setattr__(self, name, Path(value))

    @classmethod
    def default(cls) -> Book:
        """The book of ``$ATTNBOOK_ROOT``, else of the checkout that holds :mod:`attnlib`."""
        package = Path(attnlib.__file__).resolve().parent
        return cls(Path(os.environ.get("ATTNBOOK_ROOT") or package.parent).resolve())


#: The book set by :func:`use`; ``None``: :meth:`Book.default`.
BOOK: Book | None = None


def current() -> Book:
    """The book the machinery works on now (:func:`use`, else :meth:`Book.default`)."""
    return BOOK if BOOK is not None else Book.default()


def use(book: Book | str | Path | None) -> Book:
    """Make ``book`` (a :class:`Book`, or the root of one) the current book and return it;
    ``None`` goes back to the default."""
    global BOOK
    BOOK = book if book is None or isinstance(book, Book) else Book(Path(book))
    return current()


class BuildError(RuntimeError):
    """A chapter failed to execute or the site failed to build.

    ``str(err)`` is one line; ``err.details`` holds the failing cell and its traceback.
    """

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details or message


class Interrupted(BuildError):
    """An execution was interrupted (Ctrl-C, SIGTERM); the previous outputs are kept."""


def _rel(path: Path) -> str:
    try:
        return str(Path(path).relative_to(current().root))
    except ValueError:
        return str(path)


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _atomic_write(path: Path, data: str | bytes) -> None:
    """Write ``path`` through a temporary file (fsynced) and a rename: readers never see half a
    file. The one way the book writes a file atomically; on any failure (a full disk) the
    temporary file is removed and the error raised, the old file untouched."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class Lock:
    """An exclusive ``flock`` on ``<cache>/locks/<name>.lock`` (of the current book), released when
    the process ends.

    A second holder waits and says so (``wait=True``) or raises :class:`BuildError` at once.
    """

    def __init__(self, name: str, what: str, wait: bool = True, log=print):
        self.path = current().cache / "locks" / f"{name}.lock"
        self.what, self.wait, self.log, self.fh = what, wait, log, None

    def __enter__(self) -> Lock:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.path, "a+")  # noqa: SIM115 (held until __exit__)
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.seek(0)
            holder = self.fh.read().strip() or "another process"
            if not self.wait:
                self.fh.close()
                raise BuildError(f"{self.what} is already running ({holder}); "
                                 "try again when it has finished") from None
            self.log(f"  waiting: {self.what} is already running ({holder}) ...")
            t0 = time.perf_counter()
            fcntl.flock(self.fh, fcntl.LOCK_EX)
            self.log(f"  waited {time.perf_counter() - t0:.0f} s for {self.what}")
        self.fh.seek(0)
        self.fh.truncate()
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%H:%M:%S UTC")
        self.fh.write(f"pid {os.getpid()}, since {stamp}")
        self.fh.flush()
        return self

    def __exit__(self, *exc) -> None:
        import fcntl

        if self.fh is not None:
            self.fh.seek(0)
            self.fh.truncate()
            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()
            self.fh = None


def _read_chapter(chapter: str):
    """``chapters/<chapter>.md`` of the current book, read by jupytext (ParameterError if none)."""
    import jupytext

    chapters = current().chapters
    path = chapters / f"{chapter}.md"
    if not re.fullmatch(r"[A-Za-z0-9._-]+", chapter) or not path.exists():
        known = ", ".join(sorted(p.stem for p in chapters.glob("*.md"))) or "none"
        raise ParameterError(f"chapter={chapter!r} not found in chapters/; known chapters: {known}")
    return jupytext.read(path)
