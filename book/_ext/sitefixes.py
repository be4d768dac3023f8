"""Small fixes of the rendered pages (a local Sphinx extension).

Jupyter Book 1.x sets sphinx-thebe up twice, so every page declared ``const THEBE_JS_URL`` twice
and the browser console reported a SyntaxError on each page. Here each page's script list keeps
one copy of every script (same file or same inline body, in the original order).
"""

from __future__ import annotations


def _dedupe_scripts(app, pagename, templatename, context, doctree):
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
    app.connect("html-page-context", _dedupe_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
