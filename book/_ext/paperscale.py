"""The ``{paper-scale}`` directive: prose about a stored paper-scale run, written in Markdown.

A quick chapter run draws the stored ``full`` table of an experiment beside its own (when one is
stored) and discusses the two in a paragraph. That paragraph is prose with glued numbers, so it
belongs in the chapter's Markdown, not in a Python f-string; but it can only be shown when the
stored table was there. The directive makes the paragraph conditional::

    ```{paper-scale} ch9-full
    At paper scale ($d$ = {glue:text}`ch9-full-d`) the ratio is {glue:text}`ch9-full-ratio:.2f`.
    ```

Its argument is a *marker*: a glue key the chapter sets only when it read the stored table
(``run.publish({"ch9-full": True, ...})``, :meth:`attnbook.Run.publish`). With the marker glued,
the body is rendered as ordinary MyST, and every glue key it names must be glued too (a missing
one is a build error, not a silently empty paragraph). Without the marker, one sentence stands in
its place: on a ``full`` page, that the page shows the paper-scale run itself; otherwise, that no
paper-scale run of this experiment is stored. The profile is read from the executed notebook's
papermill parameters. The Colab twins (:mod:`attnbook.colab`) keep the body as it is written.
"""

from __future__ import annotations

import re

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

#: a glue role or directive naming a key: {glue:text}`key:.2f`, {glue}`key`, {glue:md}`key`
GLUE_REF = re.compile(r"\{glue(?::\w+)?\}`([^`:]+)(?::[^`]*)?`")

FULL_PAGE = "This page shows the paper-scale (full) run itself."
NOT_STORED = ("No paper-scale (full) run of this experiment is stored; the Reproducibility page "
              "lists what it costs and how to compute it.")


def glued_keys(document) -> set[str] | None:
    """The glue keys of the notebook behind ``document`` (None for a page that is no notebook)."""
    renderer = document.get("nb_renderer") if hasattr(document, "get") else None
    if renderer is None:
        return None
    return set(renderer.renderer.nb_client.glue_data)


def profile_of(document) -> str | None:
    """The ``profile`` parameter the notebook behind ``document`` was executed with, if known."""
    renderer = document.get("nb_renderer")
    client = renderer.renderer.nb_client if renderer is not None else None
    notebook = getattr(client, "notebook", None) or getattr(client, "_notebook", None)
    if notebook is None:
        return None
    return notebook.metadata.get("papermill", {}).get("parameters", {}).get("profile")


class PaperScale(SphinxDirective):
    """Render the body when the marker glue key is glued; else one standard sentence."""

    required_arguments = 1
    has_content = True

    def run(self):
        marker = self.arguments[0]
        document = self.state.document
        glued = glued_keys(document)
        if glued is not None and marker in glued:
            missing = sorted({key for key in GLUE_REF.findall("\n".join(self.content))} - glued)
            if missing:
                raise self.error(f"paper-scale block {marker!r}: the chapter glued the marker but "
                                 f"not {missing}")
            box = nodes.container(classes=["paper-scale"])
            self.state.nested_parse(self.content, self.content_offset, box)
            return box.children
        text = FULL_PAGE if profile_of(document) == "full" else NOT_STORED
        return [nodes.paragraph(text, text, classes=["paper-scale-missing"])]


def setup(app):
    app.add_directive("paper-scale", PaperScale)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
