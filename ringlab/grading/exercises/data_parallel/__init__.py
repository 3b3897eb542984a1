"""Graders of Part 2, data parallelism."""
