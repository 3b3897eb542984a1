"""Graders of Part 2, data parallelism: ``sync_sgd_step``, ``bucketed_grad_sync``
and ``async_ps``; ``_payloads`` reads what their messages carry."""
