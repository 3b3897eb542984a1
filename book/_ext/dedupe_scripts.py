"""Sphinx extension: drop duplicate <script> entries from every page.

sphinx-thebe (which jupyter-book always loads) adds its inline configuration
script once per read pass, so a page can end up declaring ``const
THEBE_JS_URL`` twice and the browser logs "has already been declared". The
book's pages must load with no JavaScript errors (the trace player is tested
that way), so identical scripts are kept once.
"""


def _dedupe(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for js in scripts:
        # filename and attributes (an inline script's text is its "body"
        # attribute); not the priority, which differs between the copies
        key = (str(getattr(js, "filename", js) or ""),   # inline scripts: None or ""
               tuple(sorted((k, str(v)) for k, v in getattr(js, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            kept.append(js)
    context["script_files"] = kept


def setup(app):
    app.connect("html-page-context", _dedupe, priority=900)   # after the themes add theirs
    return {"parallel_read_safe": True, "parallel_write_safe": True}
