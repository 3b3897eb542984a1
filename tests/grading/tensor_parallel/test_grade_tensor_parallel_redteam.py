"""Red team for the four Part 3 graders: programs written without seeing their tests.

Each wrong or cheating program must fail (with the check that names what is
wrong where that is clear); each right but unusual program must pass. The
cheats: right values with fake, decorative or missing communication, data
shared through Python memory (all ranks run in one process in ``ringlab.run``),
the inputs or the grader's arrays changed in place, the reference solution
reached under another name. The ones aimed at process isolation run through
``run_isolated`` (and one notebook through ``ringlab grade``).
"""

import csv
import importlib
import math
import subprocess
import sys
from pathlib import Path

import cloudpickle
import nbformat
import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_notebook

import ringlab
from ringlab.collectives import binomial_reduce, flat_broadcast, ring_allgather, ring_allreduce, ring_reduce_scatter, tree_allreduce
from ringlab.grading import GRADERS
from ringlab.backends.isolated import runner
from ringlab.grading.kit.loop import grade_cases
from ringlab.nn import GeLU

ROOT = Path(__file__).resolve().parents[3]
cloudpickle.register_pickle_by_value(sys.modules[__name__])
SHARED = {}      # what a cheat shares between ranks without messages (one process only)


def grade(exercise, program):
    return ringlab.grade(exercise, program, seed=0, log=False)


def grade_isolated(exercise, program):
    module = importlib.import_module(f"ringlab.grading.{GRADERS[exercise]}")
    return grade_cases(exercise, module, program, seed=0, runner=runner())


Y, DX = "y equals the unsharded layer's", "dx equals the unsharded layer's"
DEPENDS = "every rank's result needs every rank's data"
FWD, BWD = "forward communication", "backward communication"


def check_of(report):
    return report.failure.check if report.failure else None


# -- building blocks a learner would write ------------------------------------------------

def block(n, comm):
    size = n // comm.world_size
    return slice(comm.rank * size, (comm.rank + 1) * size)


def allreduce(comm, a, algo=ring_allreduce):
    flat = np.array(a, copy=True).reshape(-1)
    return algo(comm, flat).reshape(np.shape(a))


def rs_ag_allreduce(comm, a):
    """AllReduce as the library's reduce-scatter then all-gather."""
    mine = ring_reduce_scatter(comm, np.array(a, copy=True).reshape(-1))
    return ring_allgather(comm, mine).reshape(a.shape)


def reduce_then_flat_broadcast(comm, a):
    total = binomial_reduce(comm, np.array(a, copy=True).reshape(-1), 0)
    return flat_broadcast(comm, total, 0).reshape(a.shape)


def segmented_left_ring(comm, a):
    """A ring that turns left, with isend/recv, each chunk in two messages."""
    n, r = comm.world_size, comm.rank
    out = np.array(a, copy=True).reshape(-1, order="F")        # another element order
    ch = np.array_split(out, n)
    right, left = (r - 1) % n, (r + 1) % n

    def swap(c, add):
        pieces = np.array_split(ch[c], 2)
        for p in pieces:
            comm.isend(p.copy(), right)
        return np.concatenate([comm.recv(left) for _ in pieces])
    for k in range(n - 1):
        ch[(r + k + 1) % n] += swap((r + k) % n, True)
    for k in range(n - 1):
        ch[(r + k) % n][...] = swap((r + k - 1) % n, False)
    return out.reshape(a.shape, order="F")


def halving_doubling(comm, a):
    """Rabenseifner's AllReduce on powers of two, the ring otherwise."""
    n, r = comm.world_size, comm.rank
    if n & (n - 1):
        return allreduce(comm, a)
    out = np.array(a, copy=True).reshape(-1)
    lo, hi, dist = 0, out.size, n // 2
    ranges = []
    while dist:
        peer, mid = r ^ dist, (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if r & dist == 0 else ((mid, hi), (lo, mid))
        got = comm.sendrecv(out[give[0]:give[1]].copy(), peer, peer)
        out[keep[0]:keep[1]] += got
        ranges.append((peer, keep, give))
        lo, hi = keep
        dist //= 2
    for peer, keep, give in reversed(ranges):
        out[give[0]:give[1]] = comm.sendrecv(out[keep[0]:keep[1]].copy(), peer, peer)
    return out.reshape(a.shape)


def rows2(a):
    return a.reshape(-1, a.shape[-1])


# -- 1. column_parallel_linear -------------------------------------------------------------

def make_column(sync=allreduce, forward_hook=None, matmul_dx=None):
    def column_parallel_linear(comm, x, weight, bias):
        cols = block(weight.shape[1], comm)
        w, b = weight[:, cols], bias[cols]
        y = x @ w + b
        if forward_hook:
            forward_hook(comm, y)

        def backward(dy):
            dx = sync(comm, dy @ w.T if matmul_dx is None else matmul_dx(dy, w))
            return dx, {"weight": rows2(x).T @ rows2(dy), "bias": rows2(dy).sum(axis=0)}
        return y, backward
    return column_parallel_linear


def col_gather_dy(comm, x, weight, bias):
    """Right values: AllGather dY's columns and compute dX whole on every rank."""
    cols = block(weight.shape[1], comm)
    y = x @ weight[:, cols] + bias[cols]

    def backward(dy):
        whole = np.moveaxis(ring_allgather(comm, np.moveaxis(dy, -1, 0).copy()), 0, -1)
        return whole @ weight.T, {"weight": rows2(x).T @ rows2(dy), "bias": rows2(dy).sum(0)}
    return y, backward


def allgather_sum(comm, a):
    """Every rank's partial dX gathered, then added up here: t(t-1) N elements."""
    parts = ring_allgather(comm, a.reshape(1, -1).copy())
    return parts.sum(axis=0).reshape(a.shape)


def two_allreduces(comm, a):
    allreduce(comm, a)                                   # a rehearsal, result thrown away
    return allreduce(comm, a)


def shared(comm):
    """This group's slot in the shared dict (several tp groups run at once on a mesh)."""
    return SHARED.setdefault(comm.group.ranks, {})


def own_partials_and_memory(comm, a):
    """Ring-shaped messages of my own partial only (the AllReduce's volume, every
    element a partial sum over one rank); the sum from shared memory."""
    shared(comm)[comm.rank] = a.copy()
    n, r = comm.world_size, comm.rank
    flat = a.reshape(-1)
    for k in range(2 * (n - 1)):
        c = np.array_split(flat, n)[(r - k) % n]
        comm.sendrecv(c.copy(), (r + 1) % n, (r - 1) % n)
    comm.barrier()
    return sum(shared(comm)[q] for q in range(n))


def zeros_ring(comm, a):
    """The ring's messages, all zeros; the sum from shared memory."""
    shared(comm)[comm.rank] = a.copy()
    allreduce(comm, np.zeros_like(a))
    return sum(shared(comm)[q] for q in range(comm.world_size))


def forward_barrier(comm, y):
    comm.barrier()


def forward_send_junk(comm, y):
    t = comm.world_size
    if t > 1:
        comm.sendrecv(y[..., :1].copy(), (comm.rank + 1) % t, (comm.rank - 1) % t)


def col_interleaved(comm, x, weight, bias):
    t, r = comm.world_size, comm.rank
    w, b = weight[:, r::t], bias[r::t]

    def backward(dy):
        grads = {"weight": rows2(x).T @ rows2(dy), "bias": rows2(dy).sum(0)}
        return allreduce(comm, dy @ w.T), grads
    return x @ w + b, backward


def col_whole_grad(comm, x, weight, bias):
    y, back = make_column()(comm, x, weight, bias)

    def backward(dy):
        dx, g = back(dy)
        whole = np.zeros_like(weight)
        whole[:, block(weight.shape[1], comm)] = g["weight"]
        return dx, {"weight": whole, "bias": g["bias"]}
    return y, backward


def col_in_place_vandal(comm, x, weight, bias):
    """Zero the grader's arrays in place: if it computes what to expect after the run,
    zeros everywhere would look right."""
    for a in (x, weight, bias):
        a[...] = 0
    y, back = make_column()(comm, x, weight, bias)

    def backward(dy):
        dy[...] = 0
        return back(dy)
    return y, backward


def col_async(comm, x, weight, bias):
    """The dX AllReduce started as a work (communication stream), dW computed meanwhile."""
    cols = block(weight.shape[1], comm)
    w, b = weight[:, cols], bias[cols]

    def backward(dy):
        work = comm.start(allreduce, dy @ w.T)
        grads = {"weight": np.einsum("bsi,bso->io", x, dy), "bias": dy.sum(axis=(0, 1))}
        return work.wait(), grads
    return x @ w + b, backward


def col_same_ranks_new_group(comm, x, weight, bias):
    group = comm.new_group(range(comm.world_size), name="mine")
    return make_column()(group, x, weight, bias)


COLUMN_WRONG = {
    "no_allreduce": (make_column(sync=lambda comm, a: a), DX),
    "allgather_dy": (col_gather_dy, BWD),
    "allgather_partials": (make_column(sync=allgather_sum), BWD),
    "two_allreduces": (make_column(sync=two_allreduces), BWD),
    "own_partials_shared_memory": (make_column(sync=own_partials_and_memory), BWD),
    "zeros_ring_shared_memory": (make_column(sync=zeros_ring), BWD),
    "forward_sends": (make_column(forward_hook=forward_send_junk), FWD),
    "interleaved_columns": (col_interleaved, Y),
    "whole_weight_grad": (col_whole_grad, "every output has its shape"),
    "in_place_vandal": (col_in_place_vandal, Y),
    "float32_dx": (make_column(matmul_dx=lambda dy, w: (dy @ w.T).astype(np.float32)),
                   "every rank returns its result"),
}

COLUMN_RIGHT = {
    "tree_allreduce": make_column(sync=lambda c, a: allreduce(c, a, tree_allreduce)),
    "reduce_scatter_allgather": make_column(sync=rs_ag_allreduce),
    "reduce_then_flat_broadcast": make_column(sync=reduce_then_flat_broadcast),
    "segmented_left_ring_F_order": make_column(sync=segmented_left_ring),
    "halving_doubling": make_column(sync=halving_doubling),
    "einsum_dx": make_column(matmul_dx=lambda dy, w: np.einsum("bso,io->bsi", dy, w)),
    # the AllReduce on the communication stream (comm.start): its work inherits the
    # backward span it was started in
    "async_work": col_async,
    "same_ranks_new_group": col_same_ranks_new_group,
    "barrier_in_forward": make_column(forward_hook=forward_barrier),   # no message: no traffic
}


# -- 2. row_parallel_linear ----------------------------------------------------------------

def make_row(sync=allreduce, bias_mode="after", backward_hook=None):
    def row_parallel_linear(comm, x, weight, bias):
        t, r = comm.world_size, comm.rank
        w = weight[block(weight.shape[0], comm)]
        partial = x @ w
        if bias_mode == "rank0":
            partial = partial + (bias if r == 0 else 0)
        elif bias_mode == "last":
            partial = partial + (bias if r == t - 1 else 0)
        elif bias_mode == "split":
            partial = partial + bias / t
        elif bias_mode == "every":
            partial = partial + bias
        y = sync(comm, partial)
        if bias_mode == "after":
            y = y + bias

        def backward(dy):
            if backward_hook:
                backward_hook(comm, dy)
            return dy @ w.T, {"weight": rows2(x).T @ rows2(dy), "bias": rows2(dy).sum(0)}
        return y, backward
    return row_parallel_linear


def row_gather_x(comm, x, weight, bias):
    """Right values: AllGather X's columns, then the whole product on every rank."""
    whole = np.moveaxis(ring_allgather(comm, np.moveaxis(x, -1, 0).copy()), 0, -1)
    y = whole @ weight + bias
    w = weight[block(weight.shape[0], comm)]

    def backward(dy):
        return dy @ w.T, {"weight": rows2(x).T @ rows2(dy), "bias": rows2(dy).sum(0)}
    return y, backward


def reduce_and_memory(comm, a):
    """A real reduce to rank 0; the others read the sum from shared memory."""
    total = binomial_reduce(comm, a.reshape(-1).copy(), 0)
    if comm.rank == 0:
        shared(comm)["sum"] = total
    comm.barrier()
    return shared(comm)["sum"].reshape(a.shape)


def reduce_pad_and_memory(comm, a):
    """A real reduce, padded to the AllReduce's volume with my own partial again."""
    n, r = comm.world_size, comm.rank
    total = binomial_reduce(comm, a.reshape(-1).copy(), 0)
    if r == 0:
        shared(comm)["sum"] = total
    for k in range(n - 1):
        c = np.array_split(a.reshape(-1), n)[(r - k) % n]
        comm.sendrecv(c.copy(), (r + 1) % n, (r - 1) % n)
    comm.barrier()
    return shared(comm)["sum"].reshape(a.shape)


def row_bias_own_allreduce(comm, x, weight, bias):
    """Right values, two AllReduces: the product's, then the bias spread as bias/t."""
    w = weight[block(weight.shape[0], comm)]
    spread = np.broadcast_to(bias / comm.world_size, (x.shape[0], x.shape[1], bias.size))
    y = allreduce(comm, x @ w) + allreduce(comm, spread)

    def backward(dy):
        return dy @ w.T, {"weight": rows2(x).T @ rows2(dy), "bias": rows2(dy).sum(0)}
    return y, backward


def backward_zero_exchange(comm, dy):
    t = comm.world_size
    if t > 1:
        comm.sendrecv(np.zeros(3), (comm.rank + 1) % t, (comm.rank - 1) % t)


def row_shared_partials(comm, x, weight, bias):
    """The partial products added up through shared memory: no messages at all."""
    w = weight[block(weight.shape[0], comm)]
    shared(comm)[comm.rank] = x @ w
    comm.barrier()
    y = sum(shared(comm)[q] for q in range(comm.world_size)) + bias

    def backward(dy):
        return dy @ w.T, {"weight": rows2(x).T @ rows2(dy), "bias": rows2(dy).sum(0)}
    return y, backward


ROW_WRONG = {
    "bias_every_rank": (make_row(bias_mode="every"), Y),
    "no_allreduce": (make_row(sync=lambda c, a: a), Y),
    "allgather_x": (row_gather_x, FWD),
    "allgather_partials": (make_row(sync=allgather_sum), FWD),
    "reduce_and_shared_memory": (make_row(sync=reduce_and_memory), FWD),
    "reduce_padded_and_shared_memory": (make_row(sync=reduce_pad_and_memory), FWD),
    "bias_in_its_own_allreduce": (row_bias_own_allreduce, FWD),
    "backward_exchanges_zeros": (make_row(backward_hook=backward_zero_exchange), BWD),
    "partials_in_shared_memory": (row_shared_partials, FWD),
    "zeros_ring_shared_memory": (make_row(sync=zeros_ring), FWD),
}

ROW_RIGHT = {
    "bias_on_rank0": make_row(bias_mode="rank0"),
    "bias_on_last_rank": make_row(bias_mode="last"),
    "bias_split": make_row(bias_mode="split"),
    "tree_allreduce": make_row(sync=lambda c, a: allreduce(c, a, tree_allreduce)),
    "reduce_then_flat_broadcast": make_row(sync=reduce_then_flat_broadcast),
    "segmented_left_ring_bias_rank0": make_row(sync=segmented_left_ring, bias_mode="rank0"),
    "halving_doubling": make_row(sync=halving_doubling),
    "reduce_scatter_allgather": make_row(sync=rs_ag_allreduce),
    "barrier_in_backward": make_row(backward_hook=lambda c, dy: c.barrier()),
}


def _summed_db(make):
    prog = make()

    def row_parallel_linear(comm, x, weight, bias):
        y, back = prog(comm, x, weight, bias)

        def backward(dy):
            dx, g = back(dy)
            return dx, {"weight": g["weight"], "bias": allreduce(comm, g["bias"])}
        return y, backward
    return row_parallel_linear


ROW_WRONG["summed_bias_grad"] = (_summed_db(make_row),
                                 'grads["bias"] equals the unsharded layer\'s')


# -- 3. megatron_mlp -----------------------------------------------------------------------

SQ = math.sqrt(2 / math.pi)


def gelu_by_hand(z):
    th = np.tanh(SQ * (z + 0.044715 * z ** 3))
    slope = 0.5 * (1 + th) + 0.5 * z * (1 - th ** 2) * SQ * (1 + 3 * 0.044715 * z ** 2)
    return 0.5 * z * (1 + th), slope


def make_mlp(fwd_sync=allreduce, bwd_sync=allreduce, units=None, gelu=gelu_by_hand,
             bias_mode="after", local_all=False):
    def megatron_mlp(comm, x, fc_weight, fc_bias, proj_weight, proj_bias):
        t, r = comm.world_size, comm.rank
        mine = block(fc_weight.shape[1], comm) if units is None else units(comm, fc_weight.shape[1])
        w1, b1, w2 = fc_weight[:, mine], fc_bias[mine], proj_weight[mine]
        z = x @ w1 + b1
        a, da_dz = gelu(z)
        partial = a @ w2
        if bias_mode == "rank0":
            partial = partial + (proj_bias if r == 0 else 0)
        elif bias_mode == "every":
            partial = partial + proj_bias
        y = fwd_sync(comm, partial)
        if bias_mode == "after":
            y = y + proj_bias
        if local_all:                          # the whole MLP here; the AllReduce was decoration
            zz = x @ fc_weight + fc_bias
            y = gelu(zz)[0] @ proj_weight + proj_bias

        def backward(dy):
            da = dy @ w2.T
            dz = da * da_dz
            if local_all:
                aa, dd = gelu(zz)
                whole_dz = (dy @ proj_weight.T) * dd
                dx = whole_dz @ fc_weight.T
                bwd_sync(comm, dz @ w1.T)
            else:
                dx = bwd_sync(comm, dz @ w1.T)
            return dx, {"fc.weight": rows2(x).T @ rows2(dz), "fc.bias": rows2(dz).sum(0),
                        "proj.weight": rows2(a).T @ rows2(dy), "proj.bias": rows2(dy).sum(0)}
        return y, backward
    return megatron_mlp


def exact_gelu(z):
    g = GeLU("none")
    out = g.forward(z)
    return out, g.backward(np.ones_like(z))


def mlp_allgather_hidden(comm, x, fc_weight, fc_bias, proj_weight, proj_bias):
    """Right values: AllGather the hidden activations, proj whole on every rank."""
    mine = block(fc_weight.shape[1], comm)
    z = x @ fc_weight[:, mine] + fc_bias[mine]
    a, d = gelu_by_hand(z)
    whole = np.moveaxis(ring_allgather(comm, np.moveaxis(a, -1, 0).copy()), 0, -1)
    y = whole @ proj_weight + proj_bias
    w1, w2 = fc_weight[:, mine], proj_weight[mine]

    def backward(dy):
        dz = (dy @ w2.T) * d
        return allreduce(comm, dz @ w1.T), {
            "fc.weight": rows2(x).T @ rows2(dz), "fc.bias": rows2(dz).sum(0),
            "proj.weight": rows2(a).T @ rows2(dy), "proj.bias": rows2(dy).sum(0)}
    return y, backward


def interleaved(comm, n):
    return np.arange(comm.rank, n, comm.world_size)


def mlp_extra_copy(comm, x, fc_weight, fc_bias, proj_weight, proj_bias):
    """Right: the learner copies its blocks first and works in a different order."""
    mine = block(fc_weight.shape[1], comm)
    w1, b1 = np.array(fc_weight[:, mine]), np.array(fc_bias[mine])
    w2 = np.ascontiguousarray(proj_weight[mine])
    act = GeLU()
    a = act.forward(np.einsum("bsh,hk->bsk", x, w1) + b1)
    y = allreduce(comm, np.einsum("bsk,kh->bsh", a, w2)) + proj_bias

    def backward(dy):
        dz = act.backward(np.einsum("bsh,kh->bsk", dy, w2))
        grads = {"proj.bias": dy.sum(axis=(0, 1)), "proj.weight": np.einsum("bsk,bsh->kh", a, dy),
                 "fc.bias": dz.sum(axis=(0, 1)), "fc.weight": np.einsum("bsh,bsk->hk", x, dz)}
        return allreduce(comm, np.einsum("bsk,hk->bsh", dz, w1), tree_allreduce), grads
    return y, backward


MLP_WRONG = {
    "exact_gelu": (make_mlp(gelu=exact_gelu), Y),
    "no_forward_allreduce": (make_mlp(fwd_sync=lambda c, a: a), Y),
    "no_backward_allreduce": (make_mlp(bwd_sync=lambda c, a: a), DX),
    "bias_every_rank": (make_mlp(bias_mode="every"), Y),
    "interleaved_hidden_units": (make_mlp(units=interleaved),
                                 'grads["fc.weight"] equals the unsharded layer\'s'),
    "allgather_hidden": (mlp_allgather_hidden, FWD),
    "allgather_partials_forward": (make_mlp(fwd_sync=allgather_sum), FWD),
    "two_allreduces_backward": (make_mlp(bwd_sync=two_allreduces), BWD),
    "own_partials_shared_memory": (make_mlp(fwd_sync=own_partials_and_memory), FWD),
    "zeros_ring_backward": (make_mlp(bwd_sync=zeros_ring), BWD),
    "local_everything_decorative_allreduce": (make_mlp(local_all=True), DEPENDS),
}

MLP_RIGHT = {
    "hand_gelu_ring": make_mlp(),
    "bias_rank0_tree": make_mlp(bias_mode="rank0",
                                fwd_sync=lambda c, a: allreduce(c, a, tree_allreduce)),
    "left_ring_and_halving_doubling": make_mlp(fwd_sync=segmented_left_ring,
                                               bwd_sync=halving_doubling),
    "extra_copy_einsum": mlp_extra_copy,
}


# -- 4. tp_attention -----------------------------------------------------------------------

def softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def make_attention(fwd_sync=allreduce, bwd_sync=allreduce, layout="blocks", bias_mode="after",
                   causal=True, check_heads=True, error=ValueError, local_all=False):
    def tp_attention(comm, x, qkv_weight, qkv_bias, proj_weight, proj_bias, n_heads):
        t, r = comm.world_size, comm.rank
        if check_heads and n_heads % t:
            raise error(f"tensor-parallel degree {t} does not divide n_heads={n_heads}")
        h = x.shape[-1]
        hd, nh = h // n_heads, max(n_heads // t, 1)
        if layout == "blocks":
            mine = np.arange(r * nh * hd, (r + 1) * nh * hd)
            cols = np.concatenate([mine, h + mine, 2 * h + mine])
        elif layout == "contiguous":                    # one block of the 3h columns
            cols = np.arange(r * 3 * h // t, (r + 1) * 3 * h // t)
            mine = np.arange(r * nh * hd, (r + 1) * nh * hd)
        else:                                           # heads r, r+t, ...
            heads = np.arange(r, n_heads, t)
            mine = (heads[:, None] * hd + np.arange(hd)).reshape(-1)
            cols = np.concatenate([mine, h + mine, 2 * h + mine])
        wq, bq, wp = qkv_weight[:, cols], qkv_bias[cols], proj_weight[mine]

        def attend(wq, bq, wp, nh):
            qkv = x @ wq + bq
            B, T, _ = qkv.shape
            q, k, v = qkv.reshape(B, T, 3, nh, hd).transpose(2, 0, 3, 1, 4)
            s = q @ k.swapaxes(-1, -2) / math.sqrt(hd)
            if causal:
                s = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, s)
            p = softmax(s)
            o = (p @ v).transpose(0, 2, 1, 3).reshape(B, T, nh * hd)
            return (q, k, v, p, o), o @ wp

        saved, partial = attend(wq, bq, wp, nh)
        if bias_mode == "every":
            partial = partial + proj_bias
        y = fwd_sync(comm, partial)
        if bias_mode == "after":
            y = y + proj_bias
        if local_all:
            whole_saved, yy = attend(qkv_weight, qkv_bias, proj_weight, n_heads)
            y = yy + proj_bias

        def grads_and_dx(dy, saved, wq, wp, nh):
            q, k, v, p, o = saved
            B, _, T, _ = q.shape
            do = (dy @ wp.T).reshape(B, T, nh, hd).transpose(0, 2, 1, 3)
            dv = p.swapaxes(-1, -2) @ do
            dp = do @ v.swapaxes(-1, -2)
            ds = p * (dp - (p * dp).sum(-1, keepdims=True)) / math.sqrt(hd)
            dq, dk = ds @ k, ds.swapaxes(-1, -2) @ q
            dqkv = np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(B, T, 3 * nh * hd)
            return dqkv @ wq.T, {"qkv.weight": rows2(x).T @ rows2(dqkv),
                                 "qkv.bias": rows2(dqkv).sum(0),
                                 "proj.weight": rows2(o).T @ rows2(dy),
                                 "proj.bias": rows2(dy).sum(0)}

        def backward(dy):
            o = saved[4]
            partial_dx, grads = grads_and_dx(dy, saved, wq, wp, nh)
            grads["proj.weight"] = rows2(o).T @ rows2(dy)
            if local_all:
                bwd_sync(comm, partial_dx)
                dx, _ = grads_and_dx(dy, whole_saved, qkv_weight, proj_weight, n_heads)
                return dx, grads
            return bwd_sync(comm, partial_dx), grads
        return y, backward
    return tp_attention


def attention_assert_instead(comm, x, *args):
    n_heads = args[-1]
    assert n_heads % comm.world_size == 0, "heads"
    return make_attention()(comm, x, *args)


def attention_silent_uneven(comm, x, qkv_weight, qkv_bias, proj_weight, proj_bias, n_heads):
    return make_attention(check_heads=False)(comm, x, qkv_weight, qkv_bias, proj_weight,
                                             proj_bias, n_heads)


def attention_error_no_numbers(comm, x, *args):
    if args[-1] % comm.world_size:
        raise ValueError("cannot split the heads")
    return make_attention()(comm, x, *args)


def attention_via_library_layer(comm, x, qkv_weight, qkv_bias, proj_weight, proj_bias, n_heads):
    """Right and unusual: the unsharded ringlab.nn layer's own code run on my shard."""
    from ringlab.nn import CausalSelfAttention, Linear
    t, r = comm.world_size, comm.rank
    if n_heads % t:
        raise ValueError(f"{t} ranks cannot split n_heads={n_heads} heads")
    h = x.shape[-1]
    w = h // t
    mine = np.arange(r * w, (r + 1) * w)
    cols = np.concatenate([mine, h + mine, 2 * h + mine])
    layer = CausalSelfAttention.__new__(CausalSelfAttention)
    ringlab.nn.Module.__init__(layer)
    layer.n_heads, layer.head_dim = n_heads // t, h // n_heads
    layer.qkv, layer.proj = Linear.__new__(Linear), Linear.__new__(Linear)
    for lin, wt, bs in ((layer.qkv, qkv_weight[:, cols], qkv_bias[cols]),
                        (layer.proj, proj_weight[mine], np.zeros(h))):
        ringlab.nn.Module.__init__(lin)
        lin.in_features, lin.out_features = wt.shape
        lin.add_param("weight", wt.copy())
        lin.add_param("bias", bs.copy())
    y = allreduce(comm, layer.forward(x), halving_doubling) + proj_bias

    def backward(dy):
        dx = rs_ag_allreduce(comm, layer.backward(dy))
        return dx, {"qkv.weight": layer.qkv.grads["weight"], "qkv.bias": layer.qkv.grads["bias"],
                    "proj.weight": layer.proj.grads["weight"], "proj.bias": rows2(dy).sum(0)}
    return y, backward


ATTENTION_WRONG = {
    "qkv_one_contiguous_block": (make_attention(layout="contiguous"), Y),
    "heads_interleaved": (make_attention(layout="interleaved"),
                          'grads["qkv.weight"] equals the unsharded layer\'s'),
    "no_forward_allreduce": (make_attention(fwd_sync=lambda c, a: a), Y),
    "no_backward_allreduce": (make_attention(bwd_sync=lambda c, a: a), DX),
    "bias_every_rank": (make_attention(bias_mode="every"), Y),
    "not_causal": (make_attention(causal=False), Y),
    "assert_instead_of_valueerror": (attention_assert_instead, None),
    "uneven_heads_silently": (attention_silent_uneven,
                              "raises ValueError when t does not divide n_heads"),
    "valueerror_without_numbers": (attention_error_no_numbers, None),
    "allgather_partials": (make_attention(fwd_sync=allgather_sum), FWD),
    "own_partials_shared_memory": (make_attention(bwd_sync=own_partials_and_memory), BWD),
    "local_everything_decorative_allreduce": (make_attention(local_all=True), DEPENDS),
}

ATTENTION_RIGHT = {
    "hand_written_ring": make_attention(),
    "tree_and_left_ring": make_attention(fwd_sync=lambda c, a: allreduce(c, a, tree_allreduce),
                                         bwd_sync=segmented_left_ring),
    "library_layer_on_shard": attention_via_library_layer,
}


# -- every exercise: its wrong programs fail (at their check, where one is named), its right
# programs pass
LISTS = {"column_parallel_linear": (COLUMN_WRONG, COLUMN_RIGHT),
         "row_parallel_linear": (ROW_WRONG, ROW_RIGHT), "megatron_mlp": (MLP_WRONG, MLP_RIGHT),
         "tp_attention": (ATTENTION_WRONG, ATTENTION_RIGHT)}


@pytest.mark.parametrize("exercise, name", [(ex, name) for ex, (wrong, _) in LISTS.items()
                                            for name in wrong])
def test_wrong_fails(exercise, name):
    program, check = LISTS[exercise][0][name]
    SHARED.clear()
    report = grade(exercise, program)
    assert not report.passed, str(report)
    if check:
        assert check_of(report) == check, str(report)


@pytest.mark.parametrize("exercise, name", [(ex, name) for ex, (_, right) in LISTS.items()
                                            for name in right])
def test_right_passes(exercise, name):
    report = grade(exercise, LISTS[exercise][1][name])
    assert report.passed, str(report)


# -- isolated runs (what `ringlab grade NOTEBOOK` does) -----------------------------------

def mlp_patches_grader(comm, x, fc_weight, fc_bias, proj_weight, proj_bias):
    """No AllReduce at all, and every check of the grader replaced by one that says fine."""
    import ringlab.grading.tensor_parallel._common as common
    for name in ("check", "_values", "_messages", "_pass", "close"):
        setattr(common, name, lambda *a, **k: None)
    return make_mlp(fwd_sync=lambda c, a: a, bwd_sync=lambda c, a: a)(
        comm, x, fc_weight, fc_bias, proj_weight, proj_bias)


def test_isolated_right_programs_pass():
    assert grade_isolated("megatron_mlp", MLP_RIGHT["left_ring_and_halving_doubling"]).passed
    assert grade_isolated("tp_attention", ATTENTION_RIGHT["tree_and_left_ring"]).passed


@pytest.mark.parametrize("program", [
    MLP_WRONG["local_everything_decorative_allreduce"][0],     # no process isolation needed
    MLP_WRONG["own_partials_shared_memory"][0],                 # SHARED is per process there
    mlp_patches_grader,
], ids=["decorative_allreduce", "shared_memory", "patches_grader"])
def test_isolated_cheats_fail(program):
    report = grade_isolated("megatron_mlp", program)
    assert not report.passed, str(report)


def test_isolated_dynamic_import_of_the_reference_is_refused():
    from ringlab.grading.trusted import banned_answers
    module = importlib.import_module(f"ringlab.grading.{GRADERS['megatron_mlp']}")

    def cheat(comm, x, fc_weight, fc_bias, proj_weight, proj_bias):
        tp = importlib.import_module(".".join(["ringlab", "tensor_parallel"]))
        from ringlab.nn import MLP
        mlp = MLP(x.shape[-1], fc_weight.shape[1], np.random.default_rng(0))
        for name, v in zip(("fc.weight", "fc.bias", "proj.weight", "proj.bias"),
                           (fc_weight, fc_bias, proj_weight, proj_bias)):
            mlp.named_parameters()[name][...] = v
        layer = tp.ParallelMLP.from_mlp(mlp, comm)
        y = layer.forward(x)

        def backward(dy):
            dx = layer.backward(dy)
            return dx, dict(layer.named_grads())
        return y, backward
    report = grade_cases("megatron_mlp", module, cheat, seed=0,
                         runner=runner(banned=banned_answers("megatron_mlp")))
    assert not report.passed, str(report)


# -- `ringlab grade` on notebooks ----------------------------------------------------------

NB_RIGHT = '''\
import numpy as np
from ringlab.collectives import ring_allreduce
def column_parallel_linear(comm, x, weight, bias):
    t, r = comm.world_size, comm.rank
    n = weight.shape[1] // t
    w, b = weight[:, r * n:(r + 1) * n], bias[r * n:(r + 1) * n]
    def backward(dy):
        part = (dy @ w.T).reshape(-1)
        dx = ring_allreduce(comm, part).reshape(x.shape)
        x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        return dx, {"weight": x2.T @ dy2, "bias": dy2.sum(axis=0)}
    return x @ w + b, backward
'''
NB_GETATTR_REFERENCE = '''\
import importlib
def column_parallel_linear(comm, x, weight, bias):
    tp = importlib.import_module("ringlab." + "_".join(["tensor", "parallel"]))
    t, r = comm.world_size, comm.rank
    n = weight.shape[1] // t
    cols = list(range(r * n, (r + 1) * n))
    layer = tp.ColumnParallelLinear(comm, weight[:, cols], bias[cols], columns=cols)
    y = layer.forward(x)
    def backward(dy):
        return layer.backward(dy), {"weight": layer.grads["weight"], "bias": layer.grads["bias"]}
    return y, backward
'''


def test_notebooks_graded_in_isolation(tmp_path):
    paths = []
    for name, code in {"right": NB_RIGHT, "getattr_reference": NB_GETATTR_REFERENCE}.items():
        nb = new_notebook(cells=[new_code_cell(code)], metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3"},
            "ringlab": {"exercises": {"column_parallel_linear": "column_parallel_linear"}}})
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
        paths.append(tmp_path / f"{name}.ipynb")
    table = tmp_path / "grades.csv"
    proc = subprocess.run([sys.executable, "-m", "ringlab.cli", "grade", *map(str, paths),
                           "--jobs", "2", "--timeout", "60", "--csv", str(table)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    rows = {Path(r["notebook"]).stem: r for r in csv.DictReader(table.open())}
    assert rows["right"]["result"] == "passed", (rows, proc.stderr)
    assert rows["getattr_reference"]["result"] == "failed", rows
    assert "own answer to column_parallel_linear" in rows["getattr_reference"]["reason"], rows
