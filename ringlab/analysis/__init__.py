"""The training-step analyzer: bytes, times, bubble, memory and MFU of one iteration.

For a model on a cluster with a parallel layout, per GPU and iteration: the
bytes of each kind of communication and how long they take, which of it can
overlap compute, the pipeline bubble, compute time, memory, the step time and
MFU. It composes ringlab's own formulas (``ringlab.cost``,
``ringlab.pipeline.bubble``, ``ringlab.tensor_parallel.activation_memory``,
``ringlab.zero.accounting``), each checked against the simulator's traces.

    >>> from ringlab.analysis import analyze, presets, Layout
    >>> r = analyze(presets.MODELS["llama2-7b"], Layout(dp=8, global_batch=64, zero=1),
    ...             presets.HARDWARE["dgx-h100"])
    >>> sorted(r.by_kind())
    ['dp_allgather', 'dp_reduce_scatter']

``ringlab analyze --model gpt3-175b --dp 8 --tp 8 --pp 12 --microbatches 32``
prints ``Report.table()``; ``compare_layouts`` puts several layouts side by side.
"""

from .compare import compare_layouts
from .config import Hardware, Layout, Model
from .step import Report, analyze

__all__ = ["Model", "Layout", "Hardware", "analyze", "Report", "compare_layouts"]
