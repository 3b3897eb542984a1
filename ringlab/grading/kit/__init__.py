"""What every grader uses: ``report`` (the report, the grade loop, running a
case), ``checks`` (trace checks and the integrity of the grader's modules),
``blocks`` and ``contributions`` (what a message's payload holds; sums of
random floats are ``ringlab.sums``), ``broadcast`` and ``reductions`` (what the
graders of broadcasts and of reductions share), ``sharded``, ``measured`` and
``units`` (what the graders of ZeRO-1/2/3 and HSDP share: cases, reference,
message labels; the measured step loop, on ``ringlab.real_memory``; FSDP's
units), ``causality`` (a message carries only what its sender knew), ``apart``
(the self-check in a process of its own), ``driver`` (what a grader's driver
uses inside the ranks), ``frames`` (tracebacks without the grader's own lines)
and ``widths`` (the hidden MLPs' layer widths). Deadlocks in plain words are
``DeadlockError.explain()``'s."""
