"""``try_run``: run a program in a notebook and show what happened, never a raw traceback.

Exercise notebooks call it in their "try it" cell, so a notebook runs cleanly
before the exercise is solved::

    >>> import numpy as np
    >>> def stub(comm, x):
    ...     raise NotImplementedError
    >>> try_run(stub, [np.zeros(2)] * 2)
    not implemented yet: fill in the program and run this cell again.
"""

from .errors import RankError, RinglabError
from .runner import run


def try_run(program, inputs, *, show_trace=True, **kwargs):
    """Run ``program`` like ``ringlab.run``; print the outputs and the trace, or the
    diagnosis of what went wrong. Returns the ``RunResult``, or ``None`` on failure."""
    try:
        res = run(program, inputs, **kwargs)
    except RankError as e:
        if isinstance(e.exc, NotImplementedError):
            print("not implemented yet: fill in the program and run this cell again.")
        else:
            print(e)
        return None
    except RinglabError as e:
        print(e)
        return None
    for r, out in enumerate(res.outputs):
        print(f"rank {r}: {out}")
    if show_trace:
        print(f"\n{len(res.trace)} messages in {res.trace.steps} steps:")
        print(res.trace.table())
    return res
