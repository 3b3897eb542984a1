"""A program with a bug put in, and the diff that shows it: the book's pitfalls.

The diff on the page is made from the very text that runs, so a chapter cannot
show one program and grade another::

    bug, diff = with_bug(tree_broadcast, ("comm.send(x, (child + root) % n,",
                                          "comm.send(x, child,"))
    diff                                    # the changed lines, as a Markdown diff
    ringlab.grade("tree_broadcast", bug, seed=0, log=False)
"""

import difflib
import inspect
import linecache
import textwrap


def with_bug(program, *edits, helpers=()):
    """``program`` with each ``(old, new)`` text of its source replaced once; returns
    (the buggy function, its diff as Markdown). ``helpers``: functions whose source
    goes before the program's (edits may change them too). The bug is compiled in a
    copy of the program's module globals, under a file name of its own so that
    tracebacks show its lines."""
    from IPython.display import Markdown     # a view: only the book needs IPython here
    src = "\n\n".join(textwrap.dedent(inspect.getsource(f)) for f in (*helpers, program))
    new = src
    for old, repl in edits:
        assert new.count(old) == 1, f"{old!r} is not in the source exactly once"
        new = new.replace(old, repl)
    name = f"<bug {len(linecache.cache)}>"
    linecache.cache[name] = (len(new), None, new.splitlines(True), name)
    namespace = dict(inspect.unwrap(program).__globals__)
    exec(compile(new, name, "exec"), namespace)
    lines = difflib.unified_diff(src.splitlines(), new.splitlines(), lineterm="", n=0)
    diff = [line for line in lines if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    return namespace[program.__name__], Markdown("```diff\n" + "\n".join(diff) + "\n```")
