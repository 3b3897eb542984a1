"""Tensor parallelism inside data parallelism: one SGD step of a block on a 2-D mesh.

The ranks form a ``(dp, tp)`` grid (``DeviceMesh``, row-major): each row is a
tensor-parallel group holding one copy of the block, split t ways; each
column joins the ranks that hold the *same* shard in different copies. A step:

1. row k takes its b/dp sequences of the batch (and, with sequence
   parallelism, each rank its s/t tokens of them), forward and backward:
   the block's collectives run in the row's ``tp[k]`` group;
2. with sequence parallelism, the partial LayerNorm gradients are summed
   over the row (``tp.sp.grad_sync``, group ``tp[k]``);
3. each gradient shard is summed over its column (``dp.grad_sync``, group
   ``dp[j]``): the copies saw different sequences;
4. every rank updates its shard: ``p -= lr * g``.

``dy`` is the gradient of a loss *summed* over the batch, so the column sums
are the whole batch's gradient and the step equals single-process SGD
(without dropout: each row draws its own masks, for its b/dp sequences).

    >>> import numpy as np, ringlab
    >>> from ringlab.nn import TransformerBlock
    >>> block = TransformerBlock(8, 2, 32, np.random.default_rng(0))
    >>> x, dy = np.ones((2, 4, 8)), np.ones((2, 4, 8))
    >>> res = ringlab.run(tp_dp_sgd_step, [(block, x, dy, (2, 2), 0.1, False)] * 4)
    >>> res.trace.groups
    ['tp[0]', 'tp[1]', 'dp[0]', 'dp[1]']
"""

from ..collectives import ring_allreduce
from ..mesh import DeviceMesh
from .block import ParallelTransformerBlock


def tp_dp_sgd_step(comm, args):
    """``args = (block, x, dy, (dp, tp), lr, sequence_parallel)``; x and dy the whole
    batch (b, s, h). Returns my updated parameters and ``shard_index()``."""
    block, x, dy, shape, lr, sequence_parallel = args
    mesh = DeviceMesh(comm, shape, ("dp", "tp"))
    tp, dp = mesh.group("tp"), mesh.group("dp")
    layer = ParallelTransformerBlock.from_block(block, tp, sequence_parallel)
    rows = x.shape[0] // dp.world_size
    mine = slice(dp.rank * rows, (dp.rank + 1) * rows)           # my row's sequences
    x, dy = x[mine], dy[mine]
    if sequence_parallel:                                        # ... and my tokens of them
        n = x.shape[1] // tp.world_size
        x, dy = x[:, tp.rank * n:(tp.rank + 1) * n], dy[:, tp.rank * n:(tp.rank + 1) * n]
    layer.forward(x)
    layer.backward(dy)
    layer.sync_sequence_parallel_grads()                         # over tp, if SP
    grads = layer.named_grads()
    with dp.span("dp.grad_sync"):
        for g in grads.values():
            ring_allreduce(dp, g, out=g)                         # my shard, over the copies
    for name, p in layer.named_parameters().items():
        p -= lr * grads[name]
    return {k: v.copy() for k, v in layer.named_parameters().items()}, layer.shard_index()
