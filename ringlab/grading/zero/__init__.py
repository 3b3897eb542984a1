"""Graders of Part 5, ZeRO: ``zero1_step``, ``zero2_step``, ``zero3_step``.

The threat model: a learner who wants a pass without doing the work, or who
has a subtle bug. So every grader checks, on hidden models, world sizes 1 to
8 and unequal batch shards, against data-parallel Adam computed here:

* the numbers: the parameters after 3 steps (float64, 1e-10), and the objects
  handed to the program (the optimizer over the shard, the units) after
  every step;
* the messages (recorded payloads, read by the grader): each must hold a ring
  partial sum of the ranks' weighted gradients (a ReduceScatter's) or one
  rank's shard of the parameters (an AllGather's), so zeros sent for show,
  an AllReduce, or an AllGather of gradients followed by full Adam fail;
* the collectives those messages add up to, in order, with their sizes;
* real memory, measured per rank with tracemalloc (``kit/measured.py``), never the
  memory a program reports: what a rank keeps between steps and its peak.

``kit/sharded.py`` holds what the three share (with HSDP). Each grader's module says what it
checks and why; the submissions may use ``ringlab.collectives`` (and
``ringlab.data_parallel.buckets`` for ZeRO-2's timed backward), never
``ringlab.zero``, the reference answers.
"""
