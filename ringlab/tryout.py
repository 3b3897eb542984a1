"""``try_run``: run a program in a notebook and show what happened.

Exercise notebooks call it in their "try it" cell. Before the exercise is
solved the program is a stub that raises ``NotImplementedError``: the cell
prints one line and the notebook runs on::

    >>> import numpy as np
    >>> def stub(comm, x):
    ...     raise NotImplementedError
    >>> try_run(stub, [np.zeros(2)] * 2)
    not implemented yet

Any other error is raised, as ``ringlab.run`` raises it: a wrong program (or a
broken cell) shows up as an error, never as a printed line that looks like output.
"""

from .errors import RankError, RinglabError
from .runner import run

NOT_IMPLEMENTED = "not implemented yet"


def try_run(program, inputs, *, show_trace=True, **kwargs):
    """Run ``program`` like ``ringlab.run``; print the outputs and the trace.
    Returns the ``RunResult``, or ``None`` (after printing "not implemented yet")
    while the program is the stub. Every other error raises."""
    try:
        res = run(program, inputs, **kwargs)
    except RankError as e:
        if not isinstance(e.exc, NotImplementedError):
            raise e.with_traceback(None) from None   # the message is the diagnosis
        print(NOT_IMPLEMENTED)
        return None
    except RinglabError as e:                        # a deadlock, a timeout, ...
        raise e.with_traceback(None) from None
    for r, out in enumerate(res.outputs):
        print(f"rank {r}: {out}")
    if show_trace:
        print(f"\n{len(res.trace)} messages in {res.trace.steps} steps:")
        print(res.trace.table())
    return res
