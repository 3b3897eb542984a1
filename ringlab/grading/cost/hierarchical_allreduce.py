"""Grader for exercise ``hierarchical_allreduce``: AllReduce on nodes x GPUs.

Signature: ``hierarchical_allreduce(comm, x, mesh) -> array``. The grader lays
the M*G ranks out as ``mesh = DeviceMesh(comm, (M, G), ("node", "gpu"))``
(row-major: node i holds ranks i*G .. i*G + G-1, so GPU g of node i is rank
i*G + g). ``mesh.group("gpu")`` is this rank's node (its G GPUs),
``mesh.group("node")`` the GPUs with this rank's index on every node. ``x`` is
this rank's float64 vector (length n, not always a multiple of G); every rank
returns the sum of all ranks' ``x``.

Checks, on meshes 2x4, 4x2, 3x3, 2x3, 1x4, 4x1, 2x2 and 1x1, with fresh random
data and lengths drawn from the seed (except the first case, 2x4 with 32), and
one 2x4 case of 2^18 + 1 to 2^18 + 64 elements (2 MiB per GPU), where bandwidth
dominates the time:

1. it runs: no exception, deadlock, endless loop or unreceived message;
2. every rank returns the sum, a plain float64 array, exact up to rounding
   (N eps sum|x_r| per element);
3. bytes between nodes: each GPU sends and receives 2(M-1)/M of n/G elements
   there (8 bytes each), and all GPUs together 2(M-1) n: a ring AllReduce of
   its 1/G block among the M GPUs of its index. Blocks and their pieces are
   ``np.array_split``'s, so when n does not divide a GPU may move one element
   more or less per message;
4. messages between nodes only between GPUs with the same index (on a
   rail-optimised cluster GPU g of every node hangs off the same switch), and
   from each GPU to one GPU only: a ring (recursive doubling is not the exercise);
5. bytes inside nodes: 2(G-1)/G of n per GPU (a ReduceScatter and an
   AllGather of n), 2(G-1) n per node;
6. what messages carry (the recorded payloads): between nodes, a piece of one
   block (the same block for all of a GPU's messages) summed over whole nodes,
   the sender's among them; inside a node, one block, summed over GPUs of the
   sender's node, the sender among them (ReduceScatter), or over every rank
   (AllGather);
7. time: on ``network(G)`` (``TwoLevel``: NVSwitch inside a node, 450 GB/s
   per direction and 1 us a message; InfiniBand NDR between nodes, 50 GB/s
   and 5 us; one NIC per GPU) the simulated time is at most ``SLACK`` times
   ``ringlab.cost.timing.two_level_time("hierarchical_allreduce", ...)``.

Part 1's collectives are tools here: ``ring_reduce_scatter``, ``ring_allreduce``
and ``ring_allgather`` on the mesh's groups pass; ``ringlab.cost.hierarchical``
(the reference) does not under ``ringlab grade``. Hand-written send/recv passes too.
"""

import functools

import numpy as np

from ... import sums
from ..kit.driver import callable_learner
from ..kit.reductions import chunk_sizes, chunk_slices, wrong_values
from ..kit.frames import without_grader_frames
from ..kit.report import Case, Failure, numbers
from ..kit.running import check_outputs_shape, run_case
from ...cost.alpha_beta import AlphaBeta, TwoLevel
from ...cost.interconnects import INTERCONNECTS
from ...cost.timing import two_level_time
from ...mesh import DeviceMesh
from ...trace import Trace

NAME = "hierarchical_allreduce"
# Part 1's collectives are helpers here; the answer to this exercise is not (ringlab.answers).
USES = ("collectives",)
# Every rank's result needs every rank's data (the causality check: see kit/causality.py).
DEPENDS_ON_ALL = True


def causality_case(cases):
    """The smallest mesh of two nodes or more, with two GPUs or more on each: a
    single node's case sends nothing between nodes, and the check would see none
    of the ring across them."""
    multi = [c for c in cases if c.info["nodes"] >= 2 and c.info["gpus"] >= 2
             and c.info["decodable"]]
    return min(multi, key=lambda c: c.world_size, default=None)
AXES = ("node", "gpu")
# The stated network. Bandwidths from ringlab.cost.interconnects; the alphas are
# assumptions (no source gives them): 1 us inside a node, 5 us between nodes.
INTRA = AlphaBeta.from_interconnect(INTERCONNECTS["NVSwitch (H100 node)"], latency=1e-6)
INTER = AlphaBeta.from_interconnect(INTERCONNECTS["InfiniBand NDR"], latency=5e-6)
SLACK = 1.05
MESHES = ((2, 4), (4, 2), (3, 3), (2, 3), (1, 4), (4, 1), (2, 2), (1, 1))
BIG = 2**18 + 1


def network(gpus_per_node):
    """The two-level network the grader times a program on."""
    return TwoLevel(INTRA, INTER, gpus_per_node)


def cases(rng):
    # 2x4 first: two nodes of four GPUs is small enough to read and has every
    # kind of message. Lengths (2x4): a multiple of M*G (32, always: the case
    # the reports explain), one that divides by no G, and one that divides by G
    # but not by M*G; the other meshes take turns between the first two (each
    # case costs a process per rank under `ringlab grade`). All but the first
    # are drawn from the seed: a program that knows the cases must not be able
    # to treat them apart from any other input.
    for i, (m, g) in enumerate(MESHES):
        n = m * g
        k = [int(v) for v in rng.integers(2, 9, size=3)]
        lengths = ([4 * n, k[0] * n + 1, k[1] * n + g] if (m, g) == (2, 4)
                   else [k[2] * n + i % 2])
        for length in lengths:
            yield Case(n, sums.random_vectors(rng, n, length),
                       f"{m} node{'s' * (m > 1)} x {g} GPU{'s' * (g > 1)}, length={length}",
                       args=((m, g),), info=dict(nodes=m, gpus=g, decodable=True))
    # Big enough that bandwidth, not latency, sets the time. (Sums over subsets
    # of 8 ranks are not all far apart at this length, so no decoding of values.)
    big = BIG + int(rng.integers(0, 64))
    yield Case(8, list(rng.standard_normal((8, big))), f"2 nodes x 4 GPUs, length={big}",
               args=((2, 4),), info=dict(nodes=2, gpus=4, decodable=False))


def drive(comm, x, shape, learner):
    """What every rank runs: the mesh, then the learner's function."""
    learner = callable_learner(learner)
    return learner(comm, x, DeviceMesh(comm, shape, AXES))


def check(program, case, backend="sim"):
    m, g, n, length = _shape(case)
    timed = {"network": network(g)} if backend == "sim" else {}
    result, failure = run_case(functools.partial(drive, learner=program), case, backend, **timed)
    if failure:
        failure.got = without_grader_frames(failure.got)
        return failure
    failure = check_outputs_shape(result, case, (length,))
    if failure:
        return _block_returned(failure, result, case)
    for r, out in enumerate(result.outputs):
        if not sums.holds(out, case.inputs, range(n)):
            return _wrong_sum(case, r, out, result.trace)
    return (cross_node_bytes(result.trace, case) or same_index(result.trace, case)
            or one_ring_across(result.trace, case) or inside_node_bytes(result.trace, case)
            or payloads(result, case) or timing(result, case))


# -- where ranks sit --------------------------------------------------------------------

def _shape(case):
    """(M nodes, G GPUs per node, M*G ranks, n elements) of a case."""
    m, g = case.info["nodes"], case.info["gpus"]
    return m, g, m * g, len(case.inputs[0])

def _where(r, g):
    return f"rank {r} (node {r // g}, GPU {r % g})"


def _off_rail(e, g):
    """Whether message ``e`` goes between nodes from GPU g to a GPU of another index."""
    return e.src // g != e.dst // g and e.src % g != e.dst % g


def _traffic(trace, g, across):
    """The messages between nodes (``across``) or inside them, and the bytes each rank
    sent and received in them."""
    part = Trace([e for e in trace if (e.src // g != e.dst // g) == across], trace.world_size)
    return part, part.bytes_sent(), part.bytes_received()


def _range(lo, hi):
    return f"{lo} bytes" if lo == hi else f"{lo} to {hi} bytes"


# -- 2. the result ---------------------------------------------------------------------

def _block_returned(failure, result, case):
    _, g, _, length = _shape(case)
    sizes = set(chunk_sizes(length, g))
    out = result.outputs[0]
    if g > 1 and isinstance(out, np.ndarray) and out.shape and out.shape[0] in sizes:
        failure.hint = ("That is one GPU's block, 1/G of the vector: after the inter-node step "
                        "each GPU holds its block of the total; an AllGather inside the node "
                        "(ring_allgather on mesh.group('gpu')) puts the G blocks back together.")
    return failure


def _wrong_sum(case, rank, out, trace):
    _, g, n, _ = _shape(case)
    want = np.sum(case.inputs, axis=0)
    fail = wrong_values(case, rank, out, sums.close(out, case.inputs, range(n)), want,
                        "every rank ends with the sum of all inputs")
    fail.what = fail.what.replace(f"rank {rank} ", f"{_where(rank, g)} ", 1)
    nz = want != 0
    ratio = out[nz] / want[nz]
    if ratio.size and np.allclose(ratio, ratio[0], rtol=1e-9, atol=0) and ratio[0] != 1:
        average = abs(ratio[0] * n - 1) < 1e-9
        fail.what += (f"\nEvery element is the sum times {ratio[0]:.6g}"
                      + (f" = 1/{n}: the average, not the sum." if average else "."))
        fail.hint = ("An AllReduce here sums: return the sum itself, without dividing by the "
                     "number of ranks or scaling it.")
    elif case.info["decodable"]:
        i = int(np.flatnonzero(~sums.close(out, case.inputs, range(n)))[0])
        members = sums.which(out[i:i + 1], case.inputs, slice(i, i + 1))
        fail.what += f"\nElement {i} on rank {rank} holds " + _held(members, case)
        fail.hint = _held_hint(members, rank, case)
    e = next((e for e in trace if _off_rail(e, g)), None)
    if e is not None:
        fail.what += (f"\nAt step {e.step} {_where(e.src, g)} sent to {_where(e.dst, g)}: "
                      f"between nodes, to a GPU of another index.")
        fail.hint = ("Across nodes, GPU g talks only to GPU g of the other nodes: they hold the "
                     "same block after the ReduceScatter. Use mesh.group('node'). "
                     + (fail.hint or ""))
    return fail


def _held(members, case):
    if members is None:
        return "a value that is no sum over one set of ranks."
    return f"the contributions of ranks {', '.join(map(str, members))} only."


def _held_hint(members, rank, case):
    m, g = case.info["nodes"], case.info["gpus"]
    node = set(range(rank // g * g, rank // g * g + g))
    column = {i * g + rank % g for i in range(m)}
    if members is None:
        return ("A contribution counted twice (in an AllGather, copy what you receive: it is "
                "complete; do not add it), or added into the wrong slice of the vector.")
    if set(members) == node:
        return ("Only this node's GPUs: the sum never crossed nodes. After the ReduceScatter "
                "inside the node, AllReduce your block over mesh.group('node').")
    if set(members) == column:
        return ("Only the GPUs with this rank's index: the node's GPUs were never added. Start "
                "with a ReduceScatter inside the node (mesh.group('gpu')).")
    return ("Some ranks' contributions are missing: every phase must cover its whole group "
            "(G-1 steps inside a node, M-1 per half of the ring across nodes).")


# -- 3.-5. traffic -----------------------------------------------------------------------

def _ring_bytes(length, parts, ring):
    """(fewest, most) bytes a GPU sends in a ring of ``ring`` GPUs that moves 2(ring - 1)
    pieces of ``length / parts`` float64s (np.array_split's: one element more or less)."""
    return tuple(2 * (ring - 1) * k * 8 for k in (length // parts, -(-length // parts)))


def cross_node_bytes(trace, case):
    """Each GPU sends and receives 2(M-1)/M of n/G between nodes; all together 2(M-1) n."""
    m, g, n, length = _shape(case)
    cross, sent, got = _traffic(trace, g, across=True)
    lo, hi = _ring_bytes(length, n, m)   # a piece of a GPU's block, for each of M nodes
    want = (f"2(M-1)/M x n/G x 8 = 2*{m - 1}/{m} x {length}/{g} x 8 = {_range(lo, hi)} "
            f"per GPU, sent and received (a ring AllReduce of its 1/G block among the "
            f"{m} GPUs of its index)")
    if m == 1:
        return None                      # one node: nothing can cross
    # The biggest sender first (a flat ring's is the GPU at a node's edge), then receiver.
    over = [(count, which, r) for which, per in (("sent", sent), ("received", got))
            for r, count in sorted(enumerate(per), key=lambda rc: -rc[1]) if count > hi]
    if over:
        count, which, r = over[0]
        times = count / (2 * (m - 1) / m * length / g * 8)
        return Failure(case.label, "only 1/G of the data per GPU crosses nodes",
                       f"{_where(r, g)} {which} {count} bytes between nodes, "
                       f"{times:.3g} times what the hierarchical algorithm sends",
                       expected=want, got=_per_rank(sent, got, g),
                       hint=_cross_hint(cross, sent, case))
    short = next((r for r in range(n) if min(sent[r], got[r]) < lo), None)
    if short is not None:
        r = short
        return Failure(case.label, "only 1/G of the data per GPU crosses nodes",
                       f"{_where(r, g)} sent {sent[r]} and received {got[r]} bytes between "
                       f"nodes: too little",
                       expected=want, got=_per_rank(sent, got, g),
                       hint=_cross_hint(cross, sent, case)
                       or ("Every GPU takes part in the AllReduce across nodes, each with its "
                           "own block: G rings at once, each using its own GPU's link."))
    total = 2 * (m - 1) * length * 8
    if sum(sent) != total:
        return Failure(case.label, "only 1/G of the data per GPU crosses nodes",
                       f"{sum(sent)} bytes crossed nodes in total",
                       expected=f"2(M-1) x n x 8 = {total} bytes: every element passes M-1 "
                                f"links between nodes in each half of the ring",
                       got=f"{sum(sent)} bytes", hint=PIECES)
    return None


PIECES = ("Split each block into M pieces with np.array_split and send every piece exactly once "
          "per ring step.")


def _per_rank(sent, got, g):
    rows = [f"rank {r}: {s} sent, {v} received" for r, (s, v) in enumerate(zip(sent, got))]
    return "; ".join(rows[:2 * g]) + ("; ..." if len(rows) > 2 * g else "")


def _cross_hint(cross, sent, case):
    """Name the pattern of the messages between nodes, when it is a known one."""
    m, g, _, length = _shape(case)
    talkers = {e.src % g for e in cross} | {e.dst % g for e in cross}
    if g > 1 and all(e.src % g == g - 1 and e.dst % g == 0 or e.src % g == 0 and e.dst % g == g - 1
                     for e in cross):
        return ("Only the last GPU of a node talks to the first of the next: that is one flat "
                "ring over all M*G ranks, which pushes 2(N-1)/N of the whole vector through "
                "each node boundary. Reduce inside the node first (ReduceScatter over "
                "mesh.group('gpu')); then each GPU carries only its 1/G across nodes.")
    if g > 1 and len(talkers) == 1:
        return (f"Only GPU {talkers.pop()} of each node talks to other nodes, with the whole "
                f"vector: a leader per node. Its one link carries G = {g} times the data "
                f"while the other GPUs' links sit idle. Let every GPU AllReduce its own "
                f"1/G block across nodes instead.")
    full = _ring_bytes(length, m, m)[1]
    if g > 1 and max(sent) <= full and max(sent) * 2 > full:
        return ("Every GPU sends the whole vector's worth across nodes: an AllReduce of all n "
                "elements over mesh.group('node'). ReduceScatter inside the node first, then "
                "AllReduce only your 1/G block across nodes.")
    return None


def same_index(trace, case):
    """Messages between nodes connect GPU g of one node with GPU g of another."""
    g = case.info["gpus"]
    e = next((e for e in trace if _off_rail(e, g)), None)
    if e is None:
        return None
    return Failure(case.label, what=f"at step {e.step} {_where(e.src, g)} sent {e.nbytes} bytes "
                                    f"to {_where(e.dst, g)}",
                   got=f"GPU {e.src % g} -> GPU {e.dst % g}", **SAME_INDEX)


SAME_INDEX = dict(
    check="between nodes, only GPUs with the same index talk",
    expected="messages between nodes only from GPU g to GPU g (mesh.group('node'))",
    hint="On a rail-optimised cluster GPU g of every node is wired to the same switch; a message "
         "from GPU g to GPU h != g takes extra hops. Keep the same block on the same GPU index on "
         "every node and AllReduce it over mesh.group('node').")


def one_ring_across(trace, case):
    """Between nodes, a ring: each GPU sends to one GPU of another node only (the
    next node's, for a ring in node order). Recursive halving and doubling can
    move the same bytes, but talks to log2(M) nodes: not the exercise's ring."""
    g = case.info["gpus"]
    peers = {}
    for e in trace:
        if e.src // g != e.dst // g:
            peers.setdefault(e.src, []).append(e)
    for r, sent in sorted(peers.items()):
        to = sorted({e.dst for e in sent})
        if len(to) > 1:
            return Failure(case.label, what=f"{_where(r, g)} sent to {len(to)} GPUs on other "
                                            f"nodes: " + ", ".join(_where(d, g) for d in to),
                           got=f"{len(to)} destinations", **ONE_RING)
    return None


ONE_RING = dict(
    check="between nodes, a ring: each GPU sends to one neighbour",
    expected="messages between nodes to one GPU only: the next node's GPU with the same index "
             "(a ring over mesh.group('node'))",
    hint="Across nodes the exercise asks for a ring AllReduce of the block: 2(M-1) steps, each "
         "GPU sending to its right neighbour in mesh.group('node') only (ring_allreduce on that "
         "group).")


def inside_node_bytes(trace, case):
    """A ReduceScatter and an AllGather of n inside each node: 2(G-1)/G of n per GPU."""
    m, g, n, length = _shape(case)
    _, sent, got = _traffic(trace, g, across=False)
    lo, hi = _ring_bytes(length, g, g)   # a block, in a ReduceScatter and an AllGather
    want = (f"2(G-1)/G x n x 8 = 2*{g - 1}/{g} x {length} x 8 = {_range(lo, hi)} per GPU "
            f"(a ReduceScatter and an AllGather of the vector inside the node), "
            f"{2 * (g - 1) * length * 8} per node")
    hint = ("Inside the node: one ReduceScatter (each GPU ends with the node's sum of one "
            "block) before the step across nodes, one AllGather after it. An AllReduce inside "
            "the node (or a gather to one GPU) moves more.")
    for r in range(n):
        if not lo <= sent[r] <= hi or not lo <= got[r] <= hi:
            return Failure(case.label, "bytes inside a node: one ReduceScatter, one AllGather",
                           f"{_where(r, g)} sent {sent[r]} and received {got[r]} bytes inside "
                           f"its node", expected=want, got=_per_rank(sent, got, g), hint=hint)
    for node in range(m):
        moved = sum(sent[node * g:(node + 1) * g])
        if moved != 2 * (g - 1) * length * 8:
            return Failure(case.label, "bytes inside a node: one ReduceScatter, one AllGather",
                           f"node {node}'s GPUs sent {moved} bytes to each other",
                           expected=want, got=f"{moved} bytes", hint=hint)
    return None


# -- 6. payloads --------------------------------------------------------------------------

def payloads(result, case):
    """Between nodes: a piece of the sender's one block, summed over whole nodes
    (the sender's among them). Inside a node: a whole block, summed over GPUs of
    the sender's node (the sender among them) or over every rank."""
    if result.payloads is None:
        return None
    (m, g, n, length), inputs = _shape(case), case.inputs
    blocks = list(enumerate(chunk_slices(length, g)))             # (block, where)
    pieces = [(b, slice(blk.start + s.start, blk.start + s.stop))
              for b, blk in blocks for s in chunk_slices(blk.stop - blk.start, m)]
    block_of = {}
    for e in result.trace:
        p, home = result.payload(e), e.src // g
        across = home != e.dst // g
        places, sets = ((pieces, list(_whole_nodes(home, m, g))) if across
                        else (blocks, _node_sums(e.src, g, n)))
        found = next((b for b, where in places for members in sets
                      if where.stop - where.start == np.size(p)
                      and sums.holds(p, inputs, members, where)), None)
        if found is None and across:
            return _bad_payload(case, e, p, pieces, "between nodes",
                                f"a piece of one block (np.array_split(x, {g}), then each "
                                f"block into {m}), summed over whole nodes: all {g} GPUs "
                                f"of node {home} and of any other nodes")
        if found is None:
            return _bad_payload(case, e, p, blocks, "inside the node",
                                f"one block of np.array_split(x, {g}), summed over GPUs of "
                                f"node {home} with rank {e.src} among them (ReduceScatter) "
                                f"or over all {n} ranks (AllGather)")
        b = block_of.setdefault(e.src, found) if across else found
        if b != found:
            return Failure(case.label, what=f"at step {e.step} {_where(e.src, g)} sent a "
                                            f"piece of block {found} across nodes, after "
                                            f"pieces of block {b}",
                           got=f"blocks {b} and {found}", **ONE_BLOCK)
    return None


def _node_sums(rank, g, n):
    """The sets of ranks a message inside a node may sum over: GPUs of ``rank``'s
    node, ``rank`` among them (ReduceScatter), or all ``n`` ranks (AllGather)."""
    mates = [r for r in range(rank // g * g, rank // g * g + g) if r != rank]
    return [sorted([rank, *(r for j, r in enumerate(mates) if mask >> j & 1)])
            for mask in range(2 ** (g - 1))] + [list(range(n))]


ONE_BLOCK = dict(
    check="what crosses nodes is one GPU's block",
    expected="every message a GPU sends across nodes belongs to one block: the one it holds after "
             "the ReduceScatter",
    hint="AllReduce across nodes only your own block, the one the ReduceScatter inside the node "
         "left you.")


def _whole_nodes(home, m, g):
    """The ranks of every union of whole nodes that includes node ``home``."""
    others = [k for k in range(m) if k != home]
    for mask in range(2 ** (m - 1)):
        nodes = sorted([home] + [k for j, k in enumerate(others) if mask >> j & 1])
        yield [r for k in nodes for r in range(k * g, (k + 1) * g)]


def _bad_payload(case, e, p, places, where, want):
    g = case.info["gpus"]
    if not isinstance(p, np.ndarray) or p.dtype != np.float64 or p.ndim != 1:
        held = f"an array of shape {np.shape(p)} and dtype {getattr(p, 'dtype', type(p).__name__)}"
    else:
        held = f"{p.size} values that are not a ring's piece (a block of n/G summed over ranks)"
        if case.info["decodable"]:
            for _, s in places:
                if s.stop - s.start == p.size and p.size:
                    members = sums.which(p, case.inputs, s)
                    if members is not None:
                        held = (f"elements {s.start}..{s.stop - 1} summed over ranks "
                                f"{', '.join(map(str, members))}")
                        break
    return Failure(case.label, "every message carries the right partial sum",
                   f"at step {e.step} {_where(e.src, g)} sent {_where(e.dst, g)} ({where}) {held}",
                   expected=want, got=f"{held}: {numbers(p)}",
                   hint="Send your data as it is after adding what you received: the real partial "
                        "sums, unchanged, as float64. The grader reads every message and follows "
                        "the ring algorithms of Part 1 (array_split blocks); a tree or a "
                        "bidirectional ring moves other pieces, even when they are right sums.")


# -- 7. time ------------------------------------------------------------------------------

def closed_form(case):
    """Seconds the hierarchical algorithm takes for this case on ``network(G)``."""
    m, g, _, length = _shape(case)
    return two_level_time("hierarchical_allreduce", m, g, length * 8, INTRA, INTER)


def timing(result, case):
    if result.time is None or not any(e.end is not None for e in result.trace):
        return None
    (m, g, _, length), want = _shape(case), closed_form(case)
    if result.time <= SLACK * want + 1e-12:
        return None
    us = lambda t: f"{t * 1e6:.4g} us"    # noqa: E731
    across = [e for e in result.trace if e.src // g != e.dst // g]
    inter = 2 * (m - 1) * INTER.message(length * 8 / (m * g))
    window = (max(e.end for e in across) - min(e.start for e in across)) if across else 0.0
    what = (f"the run took {us(result.time)} on the stated network: {us(window)} from the "
            f"first message between nodes to the end of the last (the closed form's part "
            f"between nodes: {us(inter)}), {us(result.time - window)} outside that window "
            f"(the closed form's part inside nodes: {us(want - inter)})")
    return Failure(case.label, f"time within {SLACK} x the closed form",
                   what,
                   expected=f"at most {SLACK} x {us(want)}: 2(G-1)(a_intra + n/G b_intra) + "
                            f"2(M-1)(a_inter + n/(MG) b_inter), G = {g}, M = {m}",
                   got=f"{us(result.time)}" + (f" ({result.time / want:.3g} x)" if want else ""),
                   hint="The G rings across nodes run at the same time, each on its own GPU's "
                        "link, and every phase starts as soon as its data is there. Do not wait "
                        "for other groups (a barrier, a loop over the groups in turn), and send "
                        "each piece once.")

