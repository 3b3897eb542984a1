"""Graders of Part 7, how today's largest runs communicate: ``ring_attention``,
``moe_dispatch_combine``, ``hsdp_step``."""
