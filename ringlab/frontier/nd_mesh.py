"""All the dimensions on one mesh: a GPT trained on dp x pp x cp x tp ranks.

The ranks form a ``DeviceMesh`` with axes ``("dp", "pp", "cp", "tp")``,
row-major, so **tp is innermost**: the t ranks of a tensor-parallel group are
consecutive (one node's GPUs), because tp communicates in every layer, twice
each way, on the critical path. cp comes next (its ring hops hide under
attention), then pp (one activation per stage boundary and microbatch), and dp
outermost (one gradient sync per step, overlappable, the only traffic that
must cross the whole cluster). Llama 3 orders its groups the same way
([TP, CP, PP, DP], section 3.3.2).

Rank (d, p, c, t) holds:

* **pp**: stage p of the GPT: a contiguous run of its blocks; stage 0 also the
  embeddings, the last stage ``ln_f`` and the head. Activations go forward and
  their gradients back with ``send``/``recv`` in the pp group (one microbatch:
  this module is about where the bytes go, Part 4 about the bubble);
* **tp**: heads and MLP columns of every block (``ParallelTransformerBlock``:
  f and g AllReduce in the tp group);
* **cp**: the zig-zag tokens c of every sequence; each block's attention core is
  ``RingAttention`` in the cp group; embeddings, LayerNorms and the head act per token;
* **dp**: rows d*B/dp.. of every batch.

After backward every gradient is summed over the cp group (the ranks saw
different tokens of the same sequences) and then over the dp group (different
sequences): two AllReduces of one flat buffer. (Parameters replicated over tp
-- LayerNorms, biases after g, embeddings, head -- get the same gradient on every
tp rank, so tp needs no sync.) Adam on the rank's shard then equals Adam on the
whole model in one process.

    >>> import numpy as np, ringlab
    >>> cfg = dict(vocab=11, dim=8, n_heads=2, hidden=16, n_layers=2, seq_len=8)
    >>> ids = [np.random.default_rng(s).integers(11, size=(2, 9)) for s in range(2)]
    >>> res = ringlab.run(nd_gpt_adam, [ids] * 8,
    ...                   kwargs=dict(shape=(1, 2, 2, 2), config=cfg, seed=0, lr=1e-2))
    >>> ref = single_process_gpt_adam(ids, config=cfg, seed=0, lr=1e-2)
    >>> name, (p, index) = "blocks.1.mlp.fc.weight", res.outputs[7][1]["blocks.1.mlp.fc.weight"]
    >>> bool(np.allclose(p, ref[1][name][index], rtol=0, atol=1e-10))
    True
    >>> sorted(bytes_by_dimension(res.trace))
    ['cp', 'pp', 'tp']
"""

import copy
from collections import defaultdict

import numpy as np

from ..collectives import ring_allreduce
from ..mesh import DeviceMesh
from ..nn import GPT, Adam, Module, cross_entropy, flatten
from ..tensor_parallel import ParallelTransformerBlock
from .context_parallel import ContextParallelAttention
from .layout import positions, shard

AXES = ("dp", "pp", "cp", "tp")
LAYOUT = "zigzag"


class GPTStage(Module):
    """Rank (d, p, c, t)'s part of a ``GPT``; parameter names are the GPT's
    (``blocks.3.attn.qkv.weight``), ``shard_index()`` where each sits in them."""

    def __init__(self, gpt, mesh):
        super().__init__()
        pp, cp, tp = mesh.group("pp"), mesh.group("cp"), mesh.group("tp")
        n_layers = len(gpt.blocks.layers)
        p, P = pp.rank, pp.world_size
        if n_layers % P:
            raise ValueError(f"{P} pipeline stages cannot split {n_layers} blocks evenly")
        self.first, self.last, self.cp = p == 0, p == P - 1, cp
        self.mine = range(p * n_layers // P, (p + 1) * n_layers // P)
        if self.first:
            self.tok_emb, self.pos_emb = copy.deepcopy(gpt.tok_emb), copy.deepcopy(gpt.pos_emb)
        self.blocks = Module()                       # children named by their number in the GPT
        for i in self.mine:
            block = ParallelTransformerBlock.from_block(gpt.blocks.layers[i], tp)
            block.attn = ContextParallelAttention(block.attn, cp, "ring", LAYOUT)
            setattr(self.blocks, str(i), block)
        if self.last:
            self.ln_f, self.head = copy.deepcopy(gpt.ln_f), copy.deepcopy(gpt.head)

    def _blocks(self):
        return [getattr(self.blocks, str(i)) for i in self.mine]

    def forward(self, x):
        """Stage 0: my tokens' ids (b, n); others: the activation (b, n, dim)."""
        if self.first:
            n = x.shape[1]
            pos = positions(LAYOUT, self.cp.rank, self.cp.world_size, n)
            x = self.tok_emb.forward(x) + self.pos_emb.forward(pos)
        for block in self._blocks():
            x = block.forward(x)
        if self.last:
            x = self.head.forward(self.ln_f.forward(x))
        return x

    def backward(self, dy):
        if self.last:
            dy = self.ln_f.backward(self.head.backward(dy))
        for block in reversed(self._blocks()):
            dy = block.backward(dy)
        if self.first:
            self.tok_emb.backward(dy)
            self.pos_emb.backward(dy.sum(axis=0))    # my positions, shared by my rows
            return None
        return dy

    def shard_index(self):
        """{name: index into the GPT's parameter}; replicated ones: everything."""
        out = {name: slice(None) for name in self.named_parameters()}
        for i in self.mine:
            for name, index in getattr(self.blocks, str(i)).shard_index().items():
                out[f"blocks.{i}.{name}"] = index
        return out


def nd_train_step(comm, mesh, stage, opt, ids, targets, n_tokens):
    """One step of rank (d, p, c, t): forward through my stage (receiving the
    activation from stage p-1, sending mine to p+1), the loss on the last stage
    (``cross_entropy`` of my tokens, weighted by my share of the ``n_tokens``
    of the global batch), backward the other way, the gradients summed over cp
    and then dp, Adam. ``ids``, ``targets``: my rows and tokens (b, n).
    Returns the loss on my tokens (None off the last stage)."""
    pp, cp, dp = mesh.group("pp"), mesh.group("cp"), mesh.group("dp")
    p, P = pp.rank, pp.world_size
    stage.zero_grad()
    with comm.span("pp.forward"):
        x = ids if p == 0 else pp.recv(p - 1)
    out = stage.forward(x)
    loss = None
    if p < P - 1:
        with comm.span("pp.forward"):
            pp.send(out, p + 1, op="activation")
        with comm.span("pp.backward"):
            dy = pp.recv(p + 1)
    else:
        loss, dy = cross_entropy(out, targets)
        dy *= targets.size / n_tokens                # my mean, weighted: the sums give the mean
    dx = stage.backward(dy)
    if p > 0:
        with comm.span("pp.backward"):
            pp.send(dx, p - 1, op="gradient")
    grads = flatten(stage.named_grads())             # one buffer, two AllReduces
    with cp.span("cp.grad_sync"):
        ring_allreduce(cp, grads.data, out=grads.data)
    with dp.span("dp.grad_sync"):
        ring_allreduce(dp, grads.data, out=grads.data)
    opt.step(grads.views)
    return loss


def nd_gpt_adam(comm, batches, *, shape, config, seed, lr, **adam):
    """Train ``GPT(**config)`` (from ``seed``) on a ``shape = (dp, pp, cp, tp)``
    mesh with ``nd_train_step`` and Adam; ``batches``: token ids (B, S+1), the
    targets the ids shifted by one. Returns ``(losses, {name: (my shard, its
    index)})``."""
    mesh = DeviceMesh(comm, shape, AXES)
    gpt = GPT(**config, rng=np.random.default_rng(seed))
    stage = GPTStage(gpt, mesh)
    opt = Adam(stage.named_parameters(), lr, **adam)
    dp, cp = mesh.group("dp"), mesh.group("cp")
    losses = []
    for ids in batches:
        inputs, targets = ids[:, :-1], ids[:, 1:]
        rows = np.array_split(np.arange(len(ids)), dp.world_size)[dp.rank]
        mine = [shard(a[rows], cp.rank, cp.world_size, LAYOUT, axis=1) for a in (inputs, targets)]
        losses.append(nd_train_step(comm, mesh, stage, opt, *mine, targets.size))
    index = stage.shard_index()
    return losses, {name: (p.copy(), index[name]) for name, p in stage.named_parameters().items()}


def single_process_gpt_adam(batches, *, config, seed, lr, **adam):
    """The same GPT and Adam in one process, whole batches: ``(losses, params)``."""
    gpt = GPT(**config, rng=np.random.default_rng(seed))
    opt = Adam(gpt.named_parameters(), lr, **adam)
    losses = []
    for ids in batches:
        gpt.zero_grad()
        loss, dlogits = cross_entropy(gpt.forward(ids[:, :-1]), ids[:, 1:])
        gpt.backward(dlogits)
        opt.step(gpt.named_grads())
        losses.append(loss)
    return losses, {k: v.copy() for k, v in gpt.named_parameters().items()}


def bytes_by_dimension(trace):
    """{"tp": bytes, "cp": ..., "pp": ..., "dp": ...}: every message by the mesh
    axis of its group (labels ``"tp[3]"``, ...), axes without messages left out."""
    out = defaultdict(int)
    for e in trace:
        out[str(e.group).split("[")[0]] += e.nbytes
    return dict(out)
