"""Small fixes of the rendered pages (a local Sphinx extension).

Jupyter Book 1.x sets sphinx-thebe up twice, so every page declared ``const THEBE_JS_URL`` twice
and the browser console reported a SyntaxError on each page. Here each page's script list keeps
one copy of every script (same file or same inline body, in the original order).

Numbers glued into the text with an exponent format (``{glue:text}`key:.1e```) are printed by
Python as ``1.6e-03``; here each one, alone or inside a glued string, becomes ``1.6 × 10⁻³`` (a
superscript exponent), the way a reader writes it. The book's one number formatter,
:mod:`attnbook.fmt`, does the cutting (chapters use its ``fmt_sci`` for what they print).

pydata-sphinx-theme reads the colour mode from the template variable ``default_mode``, which
Jupyter Book leaves empty, so every page logged "Got invalid theme mode" to the console; it is
set to ``auto`` (follow the reader's system setting).

The student edition sets the Sphinx tag ``student`` (for ``{only} student`` blocks).

Each figure's image gets its caption as alt text (Sphinx would write the file name), and the
top bar no longer repeats the sidebar's search field.

The book's macros (``\\R``, ``\\E``, ``\\softmax``, ``\\tr``) have one definition, MathJax's
(``mathjax3_config.tex.macros`` in ``_config.yml``); for the PDF (``make pdf``, Sphinx's LaTeX
builder, which ignores MathJax's configuration) the same definitions are written into the LaTeX
preamble. For the PDF too, the figures (SVG, as the chapters draw them) are converted to PDF with
``rsvg-convert`` (Debian's ``librsvg2-bin``), and citations are made robust (a citation's
``\\hyperlink`` broke in a figure caption's moving argument).
"""

from __future__ import annotations

import re
import shutil
import subprocess

from docutils import nodes
from sphinx.transforms.post_transforms.images import ImageConverter


def glued_nodes(text: str) -> list[nodes.Node] | None:
    """The nodes that replace a glued text holding numbers in exponent notation (text and
    superscript nodes, cut by :func:`attnbook.fmt.sci_segments`); None when it holds none."""
    from attnbook.fmt import sci_segments

    segments = sci_segments(text)
    if segments == [("text", text)]:
        return None
    return [nodes.superscript(piece, piece) if kind == "sup" else nodes.Text(piece)
            for kind, piece in segments]


#: a glued value of at least this many words is prose (a sentence the run wrote), not a number
PROSE_WORDS = 10


def _glued_exponents(app, doctree, docname):
    """Glued numbers get typeset exponents; a glued sentence gets the class ``glued-prose``, which
    the book's CSS sets in the weight of the text around it (myst-nb bolds every glued value)."""
    for node in list(doctree.findall(nodes.inline)):
        if "pasted-text" not in node.get("classes", []):
            continue
        if len(node.astext().split()) >= PROSE_WORDS:
            node["classes"].append("glued-prose")
        replacement = glued_nodes(node.astext())
        if replacement is None:
            continue
        node.children = []
        node.extend(replacement)


def _alt_from_caption(app, doctree, docname):
    """Every image of a numbered figure gets its caption as alt text (the HTML writer would
    otherwise use the image's file name)."""
    for figure in doctree.findall(nodes.figure):
        caption = next(iter(figure.findall(nodes.caption)), None)
        if caption is None:
            continue
        text = " ".join(caption.astext().split())
        for image in figure.findall(nodes.image):
            alt = image.get("alt", "")
            if not alt or alt == image.get("uri") or re.search(r"\.(svg|png|jpe?g|pdf)$", alt):
                image["alt"] = text


def _one_search_box(app, config):
    """The book theme has a search field in the sidebar; pydata's top bar added a second one."""
    options = dict(config.html_theme_options or {})
    options.setdefault("navbar_persistent", [])
    config.html_theme_options = options


def _edition_tag(app, config):
    """The student edition (``hide_solutions``, set by :mod:`attnbook.edition`) sets the Sphinx tag
    ``student``, so that a page can say which edition it is in ``{only} student`` blocks."""
    if getattr(config, "hide_solutions", False):
        app.tags.add("student")


def latex_macros(mathjax3_config) -> str:
    """LaTeX definitions of the MathJax macros of ``mathjax3_config`` (``{"tex": {"macros":
    {"R": "\\mathbb{R}", "f": ["#1^2", 1]}}}``): one ``\\providecommand`` and ``\\renewcommand``
    per macro, so that a name LaTeX already knows is redefined the way the pages show it."""
    macros = ((mathjax3_config or {}).get("tex") or {}).get("macros") or {}
    lines = []
    for name, body in macros.items():
        if not re.fullmatch(r"[A-Za-z]+", name):
            raise ValueError(f"mathjax3_config macro {name!r}: only letters can name a LaTeX macro")
        nargs = 0
        if isinstance(body, (list, tuple)):
            body, nargs = body[0], int(body[1]) if len(body) > 1 else 0
        args = f"[{nargs}]" if nargs else ""
        lines.append(rf"\providecommand{{\{name}}}{{}}\renewcommand{{\{name}}}{args}{{{body}}}")
    return "\n".join(lines)


#: sphinxcontrib-bibtex writes a citation as ``\\hyperlink{cite...}{Author et al., 2002}``, which
#: is fragile: in a figure caption (a moving argument, written to the list of figures) LaTeX
#: stopped with "Argument of \\Hy@tempa has an extra }". etoolbox makes it robust.
ROBUST_LINKS = r"\usepackage{etoolbox}\AtBeginDocument{\robustify{\hyperlink}}"
#: The chapters write the all-ones vector ``\\mathbb 1`` (MathJax has it); amssymb's blackboard
#: bold has no digits, so ``1`` is taken from Latin Modern Math (Debian's ``fonts-lmodern``, a
#: dependency of TeX Live) and every other letter from amssymb.
BLACKBOARD_ONE = (
    r"\newfontfamily\bookbbfont{Latin Modern Math}\let\bookamsmathbb\mathbb"
    r"\protected\def\mathbb#1{\def\bookbbarg{#1}\def\bookbbone{1}"
    r"\ifx\bookbbarg\bookbbone\text{\bookbbfont \U0001d7d9}\else\bookamsmathbb{#1}\fi}"
).replace(r"\U0001d7d9", "\U0001d7d9")


def _latex_preamble(app, config):
    """The MathJax macros, defined for the LaTeX builder too (``make pdf``)."""
    definitions = latex_macros(config.mathjax3_config)
    elements = dict(config.latex_elements or {})
    elements["preamble"] = (elements.get("preamble", "") + "\n% the book's macros (mathjax3_config)\n"
                            + definitions + "\n" + ROBUST_LINKS + "\n" + BLACKBOARD_ONE + "\n")
    # Sphinx titles the table of contents with the first caption of the root's toctree
    # ("Using this book"); the PDF's is "Contents"
    elements.setdefault("tableofcontents",
                        r"\renewcommand{\contentsname}{Contents}\sphinxtableofcontents")
    config.latex_elements = elements


def latex_structure(toc: dict) -> dict[str, str]:
    """``{docname: LaTeX to put before it}``: the parts of ``_toc.yml`` as ``\\part``, and the
    chapter numbers of the site (only the chapters of a ``numbered`` part are numbered, from 1;
    the others, the prologue among them, number their figures and equations 1, 2, ... as the
    site does). Sphinx's LaTeX builder alone would number every page 1 to 12."""
    out = {}
    for part in toc.get("parts", []):
        files = [str(entry["file"]) for entry in part.get("chapters", []) if "file" in entry]
        if not files:
            continue
        numbered = bool(part.get("numbered"))
        depth = r"\setcounter{secnumdepth}{2}" if numbered else (
            r"\setcounter{secnumdepth}{-1}\setcounter{chapter}{0}")
        caption = part.get("caption")
        title = (r"\setcounter{secnumdepth}{-2}\part{" + caption + "}") if caption else ""
        out[files[0]] = title + depth
        for file in files[1:]:
            out[file] = depth
    return out


def _latex_numbering(app, doctree, docname):
    """Parts and chapter numbers of the PDF as on the site (LaTeX builder only)."""
    if app.builder.format != "latex":
        return
    from pathlib import Path

    import yaml
    from sphinx import addnodes

    toc_file = Path(app.srcdir) / "_toc.yml"
    if not toc_file.exists():
        return
    before = latex_structure(yaml.safe_load(toc_file.read_text()))
    # the root page's sections come first, unnumbered
    doctree.insert(0, nodes.raw("", r"\setcounter{secnumdepth}{-1}", format="latex"))
    for node in doctree.findall(addnodes.start_of_file):
        latex = before.get(node.get("docname"))
        if latex:
            node.insert(0, nodes.raw("", latex, format="latex"))


class SvgToPdf(ImageConverter):
    """SVG figures to PDF for the LaTeX builder (vector, through ``rsvg-convert``)."""

    default_priority = 150
    conversion_rules = [("image/svg+xml", "application/pdf")]

    def is_available(self) -> bool:
        return shutil.which("rsvg-convert") is not None

    def convert(self, _from: str, _to: str) -> bool:
        subprocess.run(["rsvg-convert", "-f", "pdf", "-o", _to, _from], check=True,
                       capture_output=True)
        return True


def _dedupe_scripts(app, pagename, templatename, context, doctree):
    # pydata-sphinx-theme reads the colour mode from ``default_mode``, which Jupyter Book leaves
    # empty: every page then logged "Got invalid theme mode" to the console.
    if not context.get("default_mode"):
        context["default_mode"] = "auto"
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for script in scripts:
        attributes = getattr(script, "attributes", {})
        key = (getattr(script, "filename", None) or "", attributes.get("body"))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def setup(app):
    app.connect("config-inited", _one_search_box)
    app.connect("config-inited", _edition_tag)
    app.connect("config-inited", _latex_preamble)
    app.add_post_transform(SvgToPdf)
    app.connect("doctree-resolved", _latex_numbering)
    app.connect("html-page-context", _dedupe_scripts)
    app.connect("doctree-resolved", _glued_exponents)
    app.connect("doctree-resolved", _alt_from_caption)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
