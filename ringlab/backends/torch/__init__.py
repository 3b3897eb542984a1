"""``backend="torch"``: every rank a real process, every message a torch.distributed transfer.

Parent side (no torch): ``supervisor`` (one run: dispatch, watch, errors),
``pool`` (the worker processes), ``status`` (shared memory in which each rank
says what it is doing), ``outcome`` (what a rank reports). Rank side:
``worker`` (a worker process), ``protocol`` (one rank's ``comm``), ``wire``
(how a message travels), ``timing`` (AllReduce timings). ``launch``: the
``torchrun`` entry point, ``python -m ringlab.launch``.
"""
