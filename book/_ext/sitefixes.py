"""Small fixes of the rendered pages (a local Sphinx extension).

Jupyter Book 1.x sets sphinx-thebe up twice, so every page declared ``const THEBE_JS_URL`` twice
and the browser console reported a SyntaxError on each page. Here each page's script list keeps
one copy of every script (same file or same inline body, in the original order).

Numbers glued into the text with an exponent format (``{glue:text}`key:.1e```) are printed by
Python as ``1.6e-03``; here each one, alone or inside a glued string, becomes ``1.6 × 10⁻³`` (a
superscript exponent), the way a reader writes it. The book's one number formatter,
:mod:`attnlib.fmt`, does the cutting (chapters use its ``fmt_sci`` for what they print).

pydata-sphinx-theme reads the colour mode from the template variable ``default_mode``, which
Jupyter Book leaves empty, so every page logged "Got invalid theme mode" to the console; it is
set to ``auto`` (follow the reader's system setting).

Each figure's image gets its caption as alt text (Sphinx would write the file name), and the
top bar no longer repeats the sidebar's search field.
"""

from __future__ import annotations

import re

from docutils import nodes


def glued_nodes(text: str) -> list[nodes.Node] | None:
    """The nodes that replace a glued text holding numbers in exponent notation (text and
    superscript nodes, cut by :func:`attnlib.fmt.sci_segments`); None when it holds none."""
    from attnlib.fmt import sci_segments

    segments = sci_segments(text)
    if segments == [("text", text)]:
        return None
    return [nodes.superscript(piece, piece) if kind == "sup" else nodes.Text(piece)
            for kind, piece in segments]


def _glued_exponents(app, doctree, docname):
    for node in list(doctree.findall(nodes.inline)):
        if "pasted-text" not in node.get("classes", []):
            continue
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
    app.connect("html-page-context", _dedupe_scripts)
    app.connect("doctree-resolved", _glued_exponents)
    app.connect("doctree-resolved", _alt_from_caption)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
