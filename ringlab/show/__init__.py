"""Ways to look at a trace: ``views`` (holdings tables), ``figures`` (matplotlib),
``timeline`` (per-rank Gantt charts and the Perfetto export), ``ownership`` (who holds
which part of each tensor: the picture a strategy starts from), ``memory`` (what each
rank holds over time, from ``comm.alloc``/``free``), ``player`` (the
interactive offline player) and ``widgets`` (live panels in a notebook).

``plot_gantt`` is here too, as the chapters on overlap and pipelines use it most, and
``contributions`` (what each message of an unlabelled run carried, for the player)."""


def plot_gantt(trace, ax=None, **options):
    """``ringlab.show.timeline.plot_gantt``: a per-rank timeline of compute and messages."""
    from .timeline import plot_gantt as plot
    return plot(trace, ax, **options)


def plot_memory(trace, ranks=None, ax=None, **options):
    """``ringlab.show.memory.plot_memory``: the bytes a rank holds over time, by label."""
    from .memory import plot_memory as plot     # lazy, as above
    return plot(trace, ranks, ax, **options)


def contributions(res, inputs):
    """``ringlab.show.player.contributions``: what each message of a run carried,
    read back from its recorded payloads; ``res.trace.show(contributions=...)`` draws it."""
    from .player import contributions as read    # lazy, as above
    return read(res, inputs)
