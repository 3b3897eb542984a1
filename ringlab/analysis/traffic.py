"""Bytes each GPU sends per iteration, by kind of communication, and how long they take.

Every collective is a ring (``ringlab.collectives``), so its bytes are those of
``ringlab.cost``'s closed forms: an AllReduce of n bytes on k ranks sends
``2 (k-1)/k n`` per rank, an AllGather (n = the gathered result) or a
ReduceScatter (n = one rank's input) ``(k-1)/k n``. A ``Traffic`` is one kind
of communication over one iteration: how many collectives of how many bytes,
in which group, and whether it can run under compute::

    >>> c = Traffic("tp_allreduce", "allreduce", group=4, nbytes=1024, count=8)
    >>> c.bytes_sent                  # 8 x 2 x 3/4 x 1024
    12288
    >>> round(c.time(alpha=1e-6, beta=1e-9) * 1e6, 3)    # 8 x 6 x (1 us + 256 ns)
    60.288

The kinds (Narayanan et al. 2021, sec. 3.2-3.3; Korthikanti et al. 2022,
sec. 4.2.2; Rajbhandari et al. 2020, sec. 7):

* ``tp_allreduce``: per layer per microbatch, 2 AllReduces of the b*s*h
  activation forward and 2 backward (Shoeybi et al. 2019, Figure 4); full
  recomputation runs the forward's 2 again.
* ``tp_allgather`` / ``tp_reduce_scatter`` (sequence parallelism): each
  AllReduce becomes a ReduceScatter plus an AllGather, the same bytes; the
  QKV and fc layers keep only their shard of the input, so backward gathers
  it again: 2 more AllGathers, 10 halves instead of 8 (``tp_bytes_per_layer``).
  ``tp_sp_grad_sync``: the LayerNorm gradients, partial sums over the
  tokens, one AllReduce of 4h numbers per layer per iteration.
* ``pp_send``: per microbatch, an activation forward and a gradient back at
  every stage boundary: ``2 m (v p - 1)`` messages in all, each b*s*h/cp
  (b*s*h/(cp t) with sequence parallelism, where each tensor-parallel rank
  holds 1/t of the tokens, or with the scatter/gather optimization); a middle
  rank sends 2vm.
* ``cp_kv`` / ``cp_dkv`` (context parallelism over c ranks, each holding 1/c
  of the sequence: ``2c`` chunks, chunks i and 2c-1-i on rank i for a
  balanced causal mask), per layer per microbatch, with K and V of one rank
  ``n = 2 b (s/c) kv`` elements (kv: the width of K on this tensor-parallel
  rank). "ring": forward, c-1 steps each passing the K, V block it holds to the
  next rank: ``(c-1) n``; backward, the blocks go round again with their
  gradient accumulators, and the accumulators take one more step home:
  ``(c-1) n + c n``. Both ``2 (c-1)/c`` and ``2 (2c-1)/c`` times ``b s kv`` per
  rank. "allgather" (Llama 3): an AllGather of K and V forward, a
  ReduceScatter of their gradients backward, ``(c-1) n`` each.
* ``ep_alltoall`` (experts over e ranks): per layer with experts, per
  microbatch, dispatch and combine forward and again backward, 4 AlltoAlls
  of the ``top_k`` x capacity copies of a rank's tokens (``routed_tokens`` x h
  elements), of which ``(e-1)/e`` leave the rank when routing is uniform; the
  part to peers in the same node goes over NVLink, the rest over the NICs.
* ``dp_allreduce`` (ZeRO-0), ``dp_reduce_scatter`` + ``dp_allgather``
  (ZeRO-1, -2), ``zero3_allgather`` (2 per microbatch: forward and backward)
  + ``dp_reduce_scatter``: the ZeRO paper's 2Psi / 2Psi / 2Psi / 3Psi, of the
  Psi parameters this GPU holds a slice of (its tensor- and pipeline shard).
  With m > 1 microbatches (gradient accumulation) ZeRO-2 reduce-scatters
  every microbatch (it keeps no full gradient to accumulate in) and ZeRO-3
  gathers and reduce-scatters every microbatch.

The data-parallel group of dense parameters is dp x cp (context-parallel ranks
hold the same weights); that of the experts, dp x cp x tp / ep.

Left out: the embedding's and the cross-entropy's tensor-parallel collectives
(2 AllReduces of b*s*h per microbatch on the first and last stage, and three
of b*s numbers), and the tied embedding's gradient AllReduce between first
and last stage.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..cost import closed_forms

RING = {"allreduce": closed_forms.ring_allreduce, "allgather": closed_forms.ring_allgather,
        "reduce_scatter": closed_forms.ring_reduce_scatter, "alltoall": closed_forms.alltoall}


@dataclass
class Traffic:
    """``count`` collectives (``op``: "allreduce", "allgather", "reduce_scatter",
    "alltoall", or "p2p" for single messages) of ``nbytes`` each, in a group of
    ``group`` ranks, per iteration per GPU. ``overlap``: how it runs relative to
    compute, one of "exposed", "overlappable" (it can run under compute, given
    enough of it), "fill_drain" (pipeline messages: hidden in the steady state)
    or "partly" (under the matmul or attention block next to it, as far as
    that lasts). ``link``: "intra", "inter", or "mixed" (an AlltoAll whose
    ``intra_share`` of the bytes stays in the node)."""

    kind: str
    op: str
    group: int
    nbytes: int | float
    count: int
    overlap: str = "exposed"
    link: str = "intra"
    seconds: float = 0.0          # filled in by ``analyze``: count x time on its link
    intra_share: float = 1.0      # AlltoAll only: bytes to peers in the same node

    @property
    def bytes_sent(self):
        """Bytes this GPU sends for all ``count`` collectives."""
        if self.op == "p2p":
            return self.count * self.nbytes
        return self.count * RING[self.op](self.group, self.nbytes).max_bytes_sent

    @property
    def steps(self):
        """Message latencies one after another, per collective."""
        if self.op == "p2p":
            return 1
        return RING[self.op](self.group, self.nbytes).steps

    def time_one(self, alpha, beta):
        """Seconds of one collective on a ring where every link costs alpha + n beta:
        its steps, each moving one chunk. An AllReduce: 2(k-1)(alpha + n/k beta)."""
        if self.op == "p2p":
            return alpha + self.nbytes * beta
        if self.group == 1:
            return 0.0
        return self.steps * (alpha + self.nbytes / self.group * beta)

    def time(self, alpha, beta):
        return self.count * self.time_one(alpha, beta)


# -- tensor (and sequence) parallelism -----------------------------------------------------------

def tp_collectives_per_layer(b, s, h, t, act_bytes, sp=False, recompute="none", blocks=2):
    """``{(kind, op): count}`` and the bytes each moves, per layer per microbatch:
    ``(counts, nbytes)`` with nbytes = b*s*h*act_bytes (the whole activation: an
    AllReduce's vector, an AllGather's result, a ReduceScatter's input).
    ``blocks``: tensor-parallel blocks in the layer, 2 (attention and MLP) or 1
    (attention only: experts are not split over tensor-parallel ranks)."""
    nbytes = b * s * h * act_bytes
    if t == 1:
        return {}, nbytes
    again = 1 if recompute == "full" else 0       # the recomputed forward, once more
    if not sp:
        return {("tp_allreduce", "allreduce"): (2 + again) * blocks}, nbytes
    # forward: g (AllGather) and g_bar (ReduceScatter) before/after attention and MLP;
    # backward: their transposes (ReduceScatter, AllGather), and the input shard gathered
    # again for the weight gradients -- unless a full recompute has just gathered it.
    regather = 0 if recompute == "full" else 1
    return {("tp_allgather", "allgather"): (2 + regather + again) * blocks,
            ("tp_reduce_scatter", "reduce_scatter"): (2 + again) * blocks}, nbytes


def tp_pairs_per_block(sp, recompute, overlap):
    """The collectives of one tensor-parallel block (attention or MLP) per
    microbatch, each as ``(op, pass, matmul it can hide under or None)``: the
    matmul is ``(linear, which)`` with linear "in" (QKV or fc1, column-parallel)
    or "out" (projection or fc2, row-parallel) and which "fwd", "dgrad" or
    "wgrad". ``overlap``: "none", "backward" or "full" (``Layout.overlap_tp``)."""
    back, full = overlap in ("backward", "full"), overlap == "full"
    if not sp:
        out = [("allreduce", "fwd", None), ("allreduce", "bwd", ("in", "wgrad") if back else None)]
        if recompute == "full":
            out.append(("allreduce", "fwd", None))
        return out
    fwd = [("allgather", "fwd", ("in", "fwd") if full else None),
           ("reduce_scatter", "fwd", ("out", "fwd") if full else None)]
    out = fwd + [("allgather", "bwd", ("out", "dgrad") if full else None),
                 ("reduce_scatter", "bwd", ("in", "wgrad") if back else None)]
    if recompute == "full":
        return out + fwd
    return out + [("allgather", "bwd", ("in", "dgrad") if back else None)]


def tp_blocks(model, layer):
    """Tensor-parallel blocks of a layer: attention and MLP; in a layer with
    experts the MLP is one only if there are shared experts."""
    return 2 if not model.is_moe(layer) or model.shared_experts else 1


def tp_comms(model, layout, link="intra", layers=None):
    """The tensor-parallel ``Traffic`` list of one GPU per iteration, for its
    ``layers`` (layer indices; default: the first stage's)."""
    lay, m, t = layout, layout.microbatches, layout.tp
    if layers is None:
        layers = range(lay.split(model)[0])
    counts = Counter()
    for layer in layers:
        c, nbytes = tp_collectives_per_layer(lay.micro_batch, model.seq_len // lay.cp,
                                             model.hidden, t, model.act_bytes, lay.sp,
                                             lay.recompute, tp_blocks(model, layer))
        counts.update(c)
    nbytes = lay.micro_batch * model.seq_len // lay.cp * model.hidden * model.act_bytes
    overlap = "exposed" if lay.overlap_tp == "none" else "partly"
    out = [Traffic(kind, op, t, nbytes, n * m, overlap, link) for (kind, op), n in counts.items()]
    if lay.sp and t > 1 and len(layers):
        norms = 4 * model.hidden if model.bias else 2 * model.hidden
        out.append(Traffic("tp_sp_grad_sync", "allreduce", t, norms * model.grad_bytes,
                        len(layers), "exposed", link))
    return out


# -- pipeline parallelism -------------------------------------------------------------------------

def pp_messages_per_rank(p, m, v=1):
    """Messages each pipeline rank sends per iteration: stage k (on rank k mod p)
    sends m activations unless it is the last stage and m gradients unless it
    is the first. They add up to ``2 m (v p - 1)`` (``ringlab.pipeline.bubble``)."""
    if p == 1:
        return [0]
    counts = [0] * p
    for stage in range(v * p):
        counts[stage % p] += m * ((stage < v * p - 1) + (stage > 0))
    return counts


def pp_message_bytes(model, layout):
    """One pipeline message: the b x s/cp x h activation (or its gradient); 1/t of
    it with sequence parallelism (each tensor-parallel rank holds 1/t of the
    tokens and sends those) or with the scatter/gather optimization."""
    lay = layout
    nbytes = lay.micro_batch * model.seq_len // lay.cp * model.hidden * model.act_bytes
    if lay.sp or lay.pp_scatter_gather:
        nbytes //= lay.tp
    return nbytes


def pp_comms(model, layout, link="intra"):
    """The pipeline ``Traffic`` of the busiest rank (a middle one) per iteration."""
    lay = layout
    if lay.pp == 1:
        return []
    nbytes = pp_message_bytes(model, lay)
    count = max(pp_messages_per_rank(lay.pp, lay.microbatches, lay.interleave))
    return [Traffic("pp_send", "p2p", 2, nbytes, count, "fill_drain", link)]


# -- context parallelism ------------------------------------------------------------------------

def cp_block_bytes(model, layout):
    """K and V of one context-parallel rank for one microbatch: 2 b (s/c) kv elements."""
    from .timing import kv_per_rank
    return (2 * layout.micro_batch * model.seq_len // layout.cp
            * kv_per_rank(model, layout.tp) * model.act_bytes)


def cp_messages_per_layer(c, kind="ring", recompute="none"):
    """``{(kind, op): count}`` of K/V-sized messages or collectives per layer per
    microbatch on one rank (see the module)."""
    if c == 1:
        return {}
    again = 1 if recompute == "full" else 0
    if kind == "ring":
        return {("cp_kv", "p2p"): (c - 1) * (2 + again), ("cp_dkv", "p2p"): c}
    return {("cp_kv", "allgather"): 1 + again, ("cp_dkv", "reduce_scatter"): 1}


def cp_comms(model, layout, layers, link="intra"):
    lay = layout
    if lay.cp == 1 or not layers:
        return []
    n = cp_block_bytes(model, lay)
    size = n if lay.cp_kind == "ring" else n * lay.cp      # a gathered result: all c blocks
    return [Traffic(kind, op, lay.cp, size, count * layers * lay.microbatches, "partly"
                 if op == "p2p" else "exposed", link)
            for (kind, op), count in cp_messages_per_layer(lay.cp, lay.cp_kind,
                                                           lay.recompute).items()]


# -- expert parallelism -------------------------------------------------------------------------

def ep_intra_share(layout, gpus_per_node):
    """The share of an AlltoAll's outgoing bytes that stays inside the node: its
    peers are consecutive ranks (tp fastest), ``min(ep, gpus per node)`` of the
    e ranks in each node (routing uniform over them)."""
    e = layout.ep
    if e == 1:
        return 1.0
    local = min(e, gpus_per_node)
    return (local - 1) / (e - 1)


def ep_comms(model, layout, moe_layers, gpus_per_node):
    from .timing import routed_tokens
    lay = layout
    if lay.ep == 1 or not moe_layers:
        return []
    nbytes = routed_tokens(model, lay) * model.hidden * model.act_bytes
    count = (4 + (2 if lay.recompute == "full" else 0)) * moe_layers * lay.microbatches
    share = ep_intra_share(lay, gpus_per_node)
    link = "intra" if share == 1 else ("inter" if share == 0 else "mixed")
    return [Traffic("ep_alltoall", "alltoall", lay.ep, nbytes, count, "exposed", link, 0.0,
                 share)]


# -- data parallelism and ZeRO -------------------------------------------------------------------

def dp_collectives(psi, d, zero=0, grad_bytes=2, param_bytes=2, microbatches=1):
    """``[(kind, op, nbytes, count, overlap)]`` of the data-parallel group for
    ``psi`` parameters per GPU (its model-parallel shard) over ``d`` replicas."""
    if d == 1:
        return []
    g, p, m = psi * grad_bytes, psi * param_bytes, microbatches
    if zero == 0:
        return [("dp_allreduce", "allreduce", g, 1, "overlappable")]
    if zero in (1, 2):
        rs = 1 if zero == 1 else m
        return [("dp_reduce_scatter", "reduce_scatter", g, rs, "overlappable"),
                ("dp_allgather", "allgather", p, 1, "exposed")]
    return [("zero3_allgather", "allgather", p, 2 * m, "overlappable"),
            ("dp_reduce_scatter", "reduce_scatter", g, m, "overlappable")]


def dp_comms(model, layout, psi, link="inter", expert_psi=0, expert_link="inter"):
    """Dense parameters over the dp x cp ranks that hold them; experts' over the
    dp x cp x tp / ep ranks that hold the same experts (kinds "ex_...")."""
    lay = layout
    d = lay.dp * lay.cp
    out = [Traffic(kind, op, d, nbytes, count, overlap, link)
           for kind, op, nbytes, count, overlap in
           dp_collectives(psi, d, lay.zero, model.grad_bytes, model.param_bytes,
                          lay.microbatches)]
    de = lay.dp * lay.cp * lay.tp // lay.ep
    out += [Traffic("ex_" + kind, op, de, nbytes, count, overlap, expert_link)
            for kind, op, nbytes, count, overlap in
            dp_collectives(expert_psi, de, lay.zero, model.grad_bytes, model.param_bytes,
                           lay.microbatches) if expert_psi]
    return out


# -- placement ------------------------------------------------------------------------------------

def group_link(stride, size, gpus_per_node):
    """"intra" if a group of ``size`` ranks ``stride`` apart (ranks numbered tp
    fastest, then cp, then dp, then pp, as Megatron-LM numbers them) fits in one
    node."""
    return "intra" if size == 1 or stride * size <= gpus_per_node else "inter"


def links(layout, hardware):
    """``{"tp", "cp", "dp", "pp", "ep", "expert_dp"}`` -> "intra" or "inter" for
    this placement (the data-parallel group is dp x cp ranks, tp apart)."""
    gpn, lay = hardware.gpus_per_node, layout
    t, c, d = lay.tp, lay.cp, lay.dp
    return {"tp": group_link(1, t, gpn),
            "cp": group_link(t, c, gpn),
            "dp": group_link(t, d * c, gpn),
            "pp": group_link(t * c * d, lay.pp, gpn),
            "ep": group_link(1, lay.ep, gpn),
            "expert_dp": group_link(lay.ep, t * c * d // lay.ep, gpn)}
