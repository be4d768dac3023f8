"""The outputless chapter notebooks ``chapters/<id>.ipynb`` that launch buttons open (Colab, Jupyter).

:func:`twin_notebook` turns a MyST chapter into a notebook that runs and reads in plain Jupyter:

* it starts with an **install cell**: when ``attnlib`` is not importable (Colab), it installs
  ``attnlib[notebook]`` at the book's version (tag ``v<version>``) from the repository named in
  ``_config.yml`` (``repository.url``, the same setting the launch buttons read), then a hidden
  Markdown cell defining the book's MathJax macros (``\\R``, ``\\E``, ...), which are also
  expanded in the text;
* MyST that Jupyter does not render becomes Markdown: citations become "Author et al. (2023)"
  with an arXiv/DOI link, ``{eq}``/``{numref}`` references become the numbers the book's pages
  show (each labelled equation carries its ``\\tag``), ``{ref}``/``{doc}``/``{prf:ref}`` become
  titles with links into the repository, theorem/exercise/admonition blocks become quoted blocks
  with a bold title, solutions fold into ``<details>``, glued numbers (``{glue:text}``) appear as
  the name under which the code computes them, and a glued figure shows its caption;
* a small setup cell makes ``glue`` display figures and tables where they are computed, since no
  page pastes them.
"""

from __future__ import annotations

import copy
import posixpath
import re
from functools import lru_cache
from pathlib import Path

#: Placeholder repository (``_config.yml``) until the book is published; see README.
PLACEHOLDER_HINT = "replace repository.url in _config.yml with the book's public repository"


# --------------------------------------------------------------------------------------------
# the book's settings
# --------------------------------------------------------------------------------------------
def book_config(root: Path) -> dict:
    import yaml

    return yaml.safe_load((root / "_config.yml").read_text())


def repository(root: Path) -> tuple[str, str]:
    """``(url, branch)`` of the repository setting in ``_config.yml`` (launch buttons use it too)."""
    repo = book_config(root).get("repository") or {}
    url = str(repo.get("url") or "").rstrip("/")
    if not url:
        raise ValueError(f"_config.yml has no repository.url ({PLACEHOLDER_HINT})")
    return url, str(repo.get("branch") or "main")


def version(root: Path) -> str:
    import tomllib

    return tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]


def install_spec(root: Path) -> str:
    """What the install cell passes to pip: ``attnlib[notebook] @ git+<url>@v<version>``."""
    url, _ = repository(root)
    return f"attnlib[notebook] @ git+{url}@v{version(root)}"


def raw_files_url(root: Path) -> str:
    """Where the repository's files at the book's version are served (``<url>/raw/v<version>``);
    :func:`attnbook.repo.committed_file` downloads benchmark records from there outside a clone."""
    url, _ = repository(root)
    return f"{url}/raw/v{version(root)}"


def macros(root: Path) -> dict[str, str]:
    """The book's MathJax macros (``_config.yml``: sphinx.config.mathjax3_config.tex.macros)."""
    cfg = book_config(root).get("sphinx", {}).get("config", {})
    return dict(cfg.get("mathjax3_config", {}).get("tex", {}).get("macros", {}))


INSTALL_CELL = '''\
# Setup for Colab or a fresh Jupyter: install the book's library, attnlib {version}, when it is
# missing (in a clone of the repository, `make book` has installed it already).
import importlib.util
import os
import subprocess
import sys

if importlib.util.find_spec("attnlib") is None or importlib.util.find_spec("myst_nb") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "{spec}"], check=True)
    importlib.invalidate_caches()
# committed benchmark records are read from the repository at the same version
os.environ.setdefault("ATTNLIB_REPO_RAW", "{raw}")'''

GLUE_CELL = '''\
# Outside the book, show what the chapter glues into its pages (figures and tables) right here.
import myst_nb

_book_glue = myst_nb.glue


def _glue_and_show(name, variable, display=True):
    shown = hasattr(variable, "savefig") or hasattr(variable, "_repr_html_")
    return _book_glue(name, variable, display=display or shown)


myst_nb.glue = _glue_and_show'''


# --------------------------------------------------------------------------------------------
# labels of the whole book: equations, figures, theorems, sections, citations
# --------------------------------------------------------------------------------------------
_EQ_LABEL = re.compile(r"^\$\$\s*\(([^)\s]+)\)\s*$", re.M)
_FIG = re.compile(r"^`{3,}\{glue:figure\}[^\n]*\n((?::[\w-]+:[^\n]*\n)*)", re.M)
_PRF = re.compile(r"^`{3,}\{(prf:\w+|exercise)\}([^\n]*)\n((?::[\w-]+:[^\n]*\n)*)", re.M)
_TARGET = re.compile(r"^\(([\w-]+)\)=\s*\n+(#+)\s+([^\n]+)", re.M)


def _option(block: str, name: str) -> str | None:
    m = re.search(rf"^:{name}:\s*(\S+)", block, re.M)
    return m.group(1) if m else None


def _chapter_numbers(root: Path) -> dict[str, str]:
    """``{chapter id: "1."}`` for chapters of numbered parts of ``_toc.yml``, ``""`` otherwise."""
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    out, k = {}, 0
    for part in toc.get("parts", []):
        for entry in part.get("chapters", []):
            file = str(entry.get("file", ""))
            if not file.startswith("chapters/"):
                continue
            if part.get("numbered"):
                k += 1
                out[file.split("/", 1)[1]] = f"{k}."
            else:
                out[file.split("/", 1)[1]] = ""
    return out


@lru_cache(maxsize=4)
def _labels(root: Path) -> dict:
    """Every label of the chapters: equations and figures with the numbers the site gives them,
    theorem-like blocks and exercises with their kind and title, section targets with their
    heading and chapter."""
    eqs, figs, blocks, targets = {}, {}, {}, {}
    for chapter, prefix in _chapter_numbers(root).items():
        path = root / "chapters" / f"{chapter}.md"
        if not path.exists():
            continue
        text = path.read_text()
        for i, m in enumerate(_EQ_LABEL.finditer(text), 1):
            eqs[m.group(1)] = f"{prefix}{i}"
        for i, m in enumerate(_FIG.finditer(text), 1):
            name = _option(m.group(1), "name")
            if name:
                figs[name] = f"{prefix}{i}"
        for m in _PRF.finditer(text):
            label = _option(m.group(3), "label")
            if label:
                kind = m.group(1).split(":")[-1].capitalize()
                blocks[label] = (kind, m.group(2).strip(), chapter)
        for m in _TARGET.finditer(text):
            targets[m.group(1)] = (m.group(3).strip(), chapter)
    return {"eq": eqs, "fig": figs, "block": blocks, "target": targets}


@lru_cache(maxsize=4)
def _bibliography(root: Path) -> dict[str, tuple[str, str, str]]:
    """``{key: (authors as cited, year, link)}`` from ``book/references.bib``."""
    import codecs

    import latexcodec  # noqa: F401  (registers the "ulatex" codec)
    from pybtex.database import parse_file

    out = {}
    for key, entry in parse_file(str(root / "book" / "references.bib")).entries.items():
        people = entry.persons.get("author") or entry.persons.get("editor") or []
        names = [codecs.decode(" ".join(p.prelast_names + p.last_names), "ulatex")
                 .replace("{", "").replace("}", "") for p in people]
        if len(names) > 2:
            who = f"{names[0]} et al."
        elif len(names) == 2:
            who = f"{names[0]} and {names[1]}"
        else:
            who = names[0] if names else key
        fields = entry.fields
        link = ""
        if fields.get("eprint"):
            link = f"https://arxiv.org/abs/{fields['eprint']}"
        elif fields.get("doi"):
            link = f"https://doi.org/{fields['doi']}"
        elif fields.get("url"):
            link = str(fields["url"])
        out[key] = (who, str(fields.get("year", "")), link)
    return out


# --------------------------------------------------------------------------------------------
# Markdown rewriting
# --------------------------------------------------------------------------------------------
_ROLE = re.compile(r"\{([a-z]+(?::[a-z]+)?)\}`([^`]*)`")
_EXPLICIT = re.compile(r"^(.*?)\s*<([^<>]+)>$", re.S)


class _Rewriter:
    def __init__(self, root: Path, chapter: str):
        self.root, self.chapter = root, chapter
        self.url, self.branch = repository(root)
        self.labels = _labels(root)
        self.bib = _bibliography(root)
        self.macros = macros(root)

    # links ----------------------------------------------------------------------------------
    def _file_link(self, path: str) -> str:
        return f"{self.url}/blob/{self.branch}/{path}"

    def _chapter_link(self, chapter: str, anchor: str = "") -> str:
        if chapter == self.chapter:
            return ""
        return self._file_link(f"chapters/{chapter}.ipynb")

    # roles ----------------------------------------------------------------------------------
    def _cite(self, role: str, body: str) -> str:
        parts = []
        for key in (k.strip() for k in body.split(",")):
            who, year, link = self.bib.get(key, (key, "", ""))
            text = f"{who} ({year})" if role == "cite:t" else f"{who}, {year}"
            parts.append(f"[{text}]({link})" if link else text)
        return "; ".join(parts) if role == "cite:t" else "(" + "; ".join(parts) + ")"

    def _role(self, m: re.Match) -> str:
        role, body = m.group(1), m.group(2)
        explicit = _EXPLICIT.match(body)
        text, target = (explicit.group(1), explicit.group(2)) if explicit else (None, body)
        if role.startswith("cite"):
            return self._cite(role, body)
        if role == "eq":
            return f"({self.labels['eq'].get(target, target)})"
        if role == "numref":
            number = self.labels["fig"].get(target)
            if number is None:
                return text or target
            return text.replace("%s", number).replace("{number}", number) if text else f"Fig. {number}"
        if role == "prf:ref":
            kind, title, chapter = self.labels["block"].get(target, ("", target, ""))
            shown = text or (f"{kind} ({title})" if title else kind or target)
            link = self._chapter_link(chapter) if chapter else ""
            return f"[{shown}]({link})" if link else shown
        if role == "ref":
            if target in self.labels["block"]:
                kind, title, chapter = self.labels["block"][target]
                shown = text or (f"the {kind.lower()} “{title}”" if title else kind)
            else:
                title, chapter = self.labels["target"].get(target, (target, ""))
                shown = text or title
            link = self._chapter_link(chapter) if chapter else ""
            return f"[{shown}]({link})" if link else shown
        if role == "doc":
            path = posixpath.normpath(posixpath.join("chapters", target))
            source = self.root / f"{path}.md"
            title = text
            if title is None and source.exists():
                heading = re.search(r"^#\s+(.+)$", source.read_text(), re.M)
                title = heading.group(1).strip() if heading else path
            return f"[{title or path}]({self._file_link(path + '.md')})"
        if role == "glue:text":
            return f"`{body.split(':', 1)[0]}`"
        return body

    # math -----------------------------------------------------------------------------------
    def _expand_macros(self, text: str) -> str:
        for name, expansion in self.macros.items():
            text = re.sub(rf"\\{name}(?![A-Za-z])", lambda _m, e=expansion: e, text)
        return text

    def _tag_equations(self, text: str) -> str:
        def tag(m: re.Match) -> str:
            body, label = m.group(1), m.group(2)
            number = self.labels["eq"].get(label, label)
            return f"$$\n{body.strip()}\n\\tag{{{number}}}\n$$"

        return re.sub(r"^\$\$\s*\n(.*?)\n\$\$\s*\(([^)\s]+)\)\s*$", tag, text, flags=re.M | re.S)

    # directives -----------------------------------------------------------------------------
    def _directive(self, name: str, argument: str, options: dict, body: str) -> str:
        inner = self.markdown(body).strip()
        if name == "chapter-facts":
            return ("*Estimated reading time and the run time of the book's execution: see this "
                    "chapter's page in the book.*")
        if name == "glue:figure":
            number = self.labels["fig"].get(options.get("name", ""), "")
            return (f"**Figure {number}.** {inner}" if number else f"**Figure.** {inner}") + (
                f"  *(The figure is drawn by the code cell that glues `{argument}` above.)*")
        if name == "solution":
            return f"<details>\n<summary>Solution</summary>\n\n{inner}\n\n</details>"
        if name.startswith("prf:") or name in ("exercise", "admonition"):
            kind = name.split(":")[-1].capitalize()
            if name == "admonition":
                title = argument
            elif name == "prf:proof":
                title = "Proof"
            else:
                title = f"{kind} ({argument})" if argument else kind
            quoted = "\n".join(f"> {line}" if line else ">" for line in inner.splitlines())
            return f"> **{title}.**\n>\n{quoted}"
        return inner

    def markdown(self, text: str) -> str:
        """Rewrite one Markdown cell (directives, roles, labelled equations, macros)."""
        lines = text.split("\n")
        out: list[str] = []
        i = 0
        while i < len(lines):
            m = re.match(r"^(`{3,})\{([\w:-]+)\}\s*(.*)$", lines[i])
            if not m:
                out.append(lines[i])
                i += 1
                continue
            fence, name, argument = m.groups()
            j, options = i + 1, {}
            while j < len(lines) and re.match(r"^:[\w-]+:", lines[j]):
                key, _, value = lines[j][1:].partition(":")
                options[key] = value.strip()
                j += 1
            k = j
            while k < len(lines) and lines[k].rstrip() != fence:
                k += 1
            out.append(self._directive(name, argument.strip(), options, "\n".join(lines[j:k])))
            i = k + 1
        text = "\n".join(out)
        text = re.sub(r"^\([\w-]+\)=\s*$\n?", "", text, flags=re.M)  # (label)= targets
        text = self._tag_equations(text)
        text = _ROLE.sub(self._role, text)
        return self._expand_macros(text)


def twin_notebook(root: Path, chapter: str, nb):
    """The outputless notebook of ``chapter`` (a jupytext notebook read from its ``.md``)."""
    import nbformat

    nb = copy.deepcopy(nb)
    rewriter = _Rewriter(root, chapter)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = rewriter.markdown(cell.source)
    spec = install_spec(root)
    install = nbformat.v4.new_code_cell(
        INSTALL_CELL.format(version=version(root), spec=spec, raw=raw_files_url(root)))
    install.metadata = {"tags": ["colab-setup"]}
    definitions = " ".join(
        rf"\newcommand{{\{name}}}{{{expansion}}}" for name, expansion in macros(root).items())
    hidden = nbformat.v4.new_markdown_cell(f"$${definitions}$$")
    hidden.metadata = {"tags": ["colab-setup", "remove-cell"], "jupyter": {"source_hidden": True}}
    glue_cell = nbformat.v4.new_code_cell(GLUE_CELL)
    glue_cell.metadata = {"tags": ["colab-setup"], "jupyter": {"source_hidden": True}}
    nb.cells = [install, hidden, glue_cell, *nb.cells]
    return nb
