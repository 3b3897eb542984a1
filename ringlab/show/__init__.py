"""Ways to look at a trace: ``views`` (holdings tables), ``figures`` (matplotlib),
``timeline`` (per-rank Gantt charts and the Perfetto export), ``player`` (the
interactive offline player) and ``widgets`` (live panels in a notebook)."""
