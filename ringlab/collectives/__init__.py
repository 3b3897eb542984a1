"""Reference collectives, built from point-to-point ``send``/``recv`` only.

One module per collective; each function has the signature of the exercise
that asks for it, so ``ringlab.grade("ring_allreduce", ring_allreduce)`` passes.
"""

from .allreduce import ring_allreduce

__all__ = ["ring_allreduce"]
