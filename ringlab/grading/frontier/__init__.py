"""Graders of Part 7, how today's largest runs communicate: ``hsdp_step``."""
