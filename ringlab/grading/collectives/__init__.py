"""Graders of Part 1, collectives from send and receive."""
