"""Part 2, data parallelism: synchronous SGD, DDP-style bucketed gradient sync, asynchronous SGD.

Empty until its part of the book lands."""
