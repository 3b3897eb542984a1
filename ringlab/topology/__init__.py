"""Part 6, network topologies for a contention-aware network model.

Empty until its part of the book lands."""
