"""Graders of Part 6, cost models and networks: ``hierarchical_allreduce``."""
