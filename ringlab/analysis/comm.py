"""Bytes each GPU sends per iteration, by kind of communication, and how long they take.

Every collective is a ring (``ringlab.collectives``), so its bytes are those of
``ringlab.cost``'s closed forms: an AllReduce of n bytes on k ranks sends
``2 (k-1)/k n`` per rank, an AllGather (n = the gathered result) or a
ReduceScatter (n = one rank's input) ``(k-1)/k n``. A ``Comm`` is one kind
of communication over one iteration: how many collectives of how many bytes,
in which group, and whether it can run under compute::

    >>> c = Comm("tp_allreduce", "allreduce", group=4, nbytes=1024, count=8)
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
  every stage boundary: ``2 m (v p - 1)`` messages in all, each b*s*h
  (b*s*h/t with the scatter/gather optimization); a middle rank sends 2vm.
* ``dp_allreduce`` (ZeRO-0), ``dp_reduce_scatter`` + ``dp_allgather``
  (ZeRO-1, -2), ``zero3_allgather`` (2 per microbatch: forward and backward)
  + ``dp_reduce_scatter``: the ZeRO paper's 2Psi / 2Psi / 2Psi / 3Psi, of the
  Psi parameters this GPU holds a slice of (its tensor- and pipeline shard).
  With m > 1 microbatches (gradient accumulation) ZeRO-2 reduce-scatters
  every microbatch (it keeps no full gradient to accumulate in) and ZeRO-3
  gathers and reduce-scatters every microbatch.

Left out: the embedding's and the cross-entropy's tensor-parallel collectives
(2 AllReduces of b*s*h per microbatch on the first and last stage, and three
of b*s numbers), and the tied embedding's gradient AllReduce between first
and last stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cost import closed_forms

RING = {"allreduce": closed_forms.ring_allreduce, "allgather": closed_forms.ring_allgather,
        "reduce_scatter": closed_forms.ring_reduce_scatter}


@dataclass
class Comm:
    """``count`` collectives (``op``: "allreduce", "allgather", "reduce_scatter",
    or "p2p" for single messages) of ``nbytes`` each, in a group of ``group``
    ranks, per iteration per GPU. ``overlap``: how it runs relative to compute,
    one of "exposed", "overlappable" (it can run under compute, given enough of
    it) or "fill_drain" (pipeline messages: hidden in the steady state)."""

    kind: str
    op: str
    group: int
    nbytes: int | float
    count: int
    overlap: str = "exposed"
    link: str = "intra"
    seconds: float = 0.0          # filled in by ``analyze``: count x time on its link

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

def tp_collectives_per_layer(b, s, h, t, act_bytes, sp=False, recompute="none"):
    """``{(kind, op): count}`` and the bytes each moves, per layer per microbatch:
    ``(counts, nbytes)`` with nbytes = b*s*h*act_bytes (the whole activation: an
    AllReduce's vector, an AllGather's result, a ReduceScatter's input)."""
    nbytes = b * s * h * act_bytes
    if t == 1:
        return {}, nbytes
    again = 2 if recompute == "full" else 0       # the recomputed forward, once more
    if not sp:
        return {("tp_allreduce", "allreduce"): 4 + again}, nbytes
    # forward: g (AllGather) and g_bar (ReduceScatter) before/after attention and MLP;
    # backward: their transposes (ReduceScatter, AllGather), and the input shard gathered
    # again for the weight gradients -- unless a full recompute has just gathered it.
    regather = 0 if recompute == "full" else 2
    return {("tp_allgather", "allgather"): 4 + regather + again,
            ("tp_reduce_scatter", "reduce_scatter"): 4 + again}, nbytes


def tp_comms(model, layout, link="intra"):
    """The tensor-parallel ``Comm`` list of one GPU per iteration."""
    lay, m, t = layout, layout.microbatches, layout.tp
    counts, nbytes = tp_collectives_per_layer(lay.micro_batch, model.seq_len, model.hidden, t,
                                              model.act_bytes, lay.sp, lay.recompute)
    layers = model.layers // lay.pp
    out = [Comm(kind, op, t, nbytes, n * layers * m, "exposed", link)
           for (kind, op), n in counts.items()]
    if lay.sp:
        norms = 4 * model.hidden if model.bias else 2 * model.hidden
        out.append(Comm("tp_sp_grad_sync", "allreduce", t, norms * model.grad_bytes, layers,
                        "exposed", link))
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


def pp_comms(model, layout, link="intra"):
    """The pipeline ``Comm`` of the busiest rank (a middle one) per iteration."""
    lay = layout
    if lay.pp == 1:
        return []
    nbytes = lay.micro_batch * model.seq_len * model.hidden * model.act_bytes
    if lay.pp_scatter_gather:
        nbytes //= lay.tp
    count = max(pp_messages_per_rank(lay.pp, lay.microbatches, lay.interleave))
    return [Comm("pp_send", "p2p", 2, nbytes, count, "fill_drain", link)]


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


def dp_comms(model, layout, psi, link="inter"):
    return [Comm(kind, op, layout.dp, nbytes, count, overlap, link)
            for kind, op, nbytes, count, overlap in
            dp_collectives(psi, layout.dp, layout.zero, model.grad_bytes, model.param_bytes,
                           layout.microbatches)]


# -- placement ------------------------------------------------------------------------------------

def group_link(stride, size, gpus_per_node):
    """"intra" if a group of ``size`` ranks ``stride`` apart (ranks numbered tp
    fastest, then dp, then pp, as Megatron-LM numbers them) fits in one node."""
    return "intra" if size == 1 or stride * size <= gpus_per_node else "inter"


def links(layout, hardware):
    """``{"tp": link, "dp": link, "pp": link}`` for this placement."""
    gpn = hardware.gpus_per_node
    return {"tp": group_link(1, layout.tp, gpn),
            "dp": group_link(layout.tp, layout.dp, gpn),
            "pp": group_link(layout.tp * layout.dp, layout.pp, gpn)}
