"""The graders read what messages carry, not only who sent how many bytes.

Each program below games the grader as a learner might: the right trace shape
with other data in the messages (zeros, negated blocks, packed floats, empty
messages), the real data passed through a module-level dict (all ranks run in
one process), a result that only claims to be equal, outputs no message
delivered. Each must fail with a check that says what the messages held.
Then the feedback items: the real mistake named, not a symptom. And
mutation-style tests: each trace check fails on a trace made to break it.
"""

import functools

import numpy as np
import pytest

import ringlab
from ringlab import collectives as C
from ringlab.grading.kit import checks
from ringlab.grading.kit.report import Case, Failure, Report
from ringlab.grading.kit.running import run_case
from ringlab.grading.kit.loop import grade_cases
from ringlab.trace import Event, Trace

import programs.hierarchical as HP
import programs.moe as MP
import programs.hsdp as HS
import programs.pipeline as P
import programs.ring_attention as RA
import programs.zero as Z

SHARED = {}     # what a cheat shares between ranks without messages


def ring(comm):
    n, r = comm.world_size, comm.rank
    return n, r, (r + 1) % n, (r - 1) % n


def _ring_allreduce(comm, x, encode=lambda a: a, decode=lambda a: a, pad=False):
    """A right ring AllReduce whose messages go through encode/decode; ``pad``:
    every chunk sent padded with zeros to ceil(L/N) elements."""
    n, r, right, left = ring(comm)
    out = x.copy()
    ch = np.array_split(out, n)
    size = -(-len(x) // n) if n else 0

    def swap(c):
        a = encode(ch[c])
        if pad:
            a = np.concatenate([a, np.zeros(size - len(a))])
        return decode(comm.sendrecv(a, right, left))
    for k in range(n - 1):
        g = (r - k - 1) % n
        ch[g] += swap((r - k) % n)[:len(ch[g])]
    for k in range(n - 1):
        g = (r - k) % n
        ch[g][...] = swap((r - k + 1) % n)[:len(ch[g])]
    return out


class AlwaysEqual(np.ndarray):
    """An array that says it equals anything."""

    def __eq__(self, other):
        return np.ones(self.shape, dtype=bool)

    def __array_function__(self, func, types, args, kwargs):
        return True


# ============================================================== ring_allreduce
def ar_zeros_and_shared_memory(comm, x):
    """The right messages, of zeros; the real sum from a dict all ranks share."""
    SHARED[comm.rank] = x.copy()
    _ring_allreduce(comm, np.zeros_like(x))
    return np.sum([SHARED[q] for q in range(comm.world_size)], axis=0)


def ar_negated(comm, x):
    """Every message negated on the way and negated back on arrival."""
    return _ring_allreduce(comm, x, encode=np.negative, decode=np.negative)


def ar_always_equal(comm, x):
    return np.zeros_like(x).view(AlwaysEqual)


def ar_float32(comm, x):
    return C.ring_allreduce(comm, x).astype(np.float32)


# ============================================================== ring_reduce_scatter
def rs_zeros_and_shared_memory(comm, x):
    SHARED[comm.rank] = x.copy()
    C.ring_reduce_scatter(comm, np.zeros_like(x))
    total = np.sum([SHARED[q] for q in range(comm.world_size)], axis=0)
    return np.array_split(total, comm.world_size)[comm.rank]


def rs_negated(comm, x):
    n, r, right, left = ring(comm)
    ch = np.array_split(x.copy(), n)
    for k in range(n - 1):
        ch[(r - k - 2) % n] += -comm.sendrecv(-ch[(r - k - 1) % n], right, left)
    return ch[r]


def rs_always_equal(comm, x):
    return C.ring_reduce_scatter(comm, x).view(AlwaysEqual)


# ============================================================== ring_allgather
def ag_own_block_and_shared_memory(comm, x):
    """Sends its own x at every step (the right sizes); the rest from a shared dict."""
    n, r, right, left = ring(comm)
    SHARED[r] = x.copy()
    for _ in range(n - 1):
        comm.sendrecv(x, right, left)
    return np.concatenate([SHARED[q] for q in range(n)])


def ag_negated_undone_in_place(comm, x):
    """Blocks travel negated; the receiver undoes it in the array it received
    (which, before, also changed the grader's record of the message)."""
    n, r, right, left = ring(comm)
    blocks = [None] * n
    blocks[r] = x
    for k in range(n - 1):
        got = comm.sendrecv(-blocks[(r - k) % n], right, left)
        got *= -1
        blocks[(r - k - 1) % n] = got
    return np.concatenate(blocks)


def ag_packs_in_float32(comm, x):
    """A block as float32 in a message of its own size: room for a second one
    (with whole numbers, which float32 holds exactly, this passed)."""
    n, r, right, left = ring(comm)
    blocks = [None] * n
    blocks[r] = x
    for k in range(n - 1):
        packed = np.concatenate([blocks[(r - k) % n], np.zeros(len(x))]).astype(np.float32).view(np.float64)
        got = comm.sendrecv(packed, right, left)
        blocks[(r - k - 1) % n] = got.view(np.float32)[:len(x)].astype(np.float64)
    return np.concatenate(blocks)


def ag_keeps_the_receive_buffer(comm, x):
    """recv(out=buf) into one buffer, kept by reference: every block becomes the last."""
    n, r, right, left = ring(comm)
    blocks = [None] * n
    blocks[r] = x
    buf = np.empty_like(x)
    for k in range(n - 1):
        comm.send(blocks[(r - k) % n], right)
        blocks[(r - k - 1) % n] = comm.recv(left, out=buf)
    return np.concatenate(blocks)


# ============================================================== broadcasts
def tb_empty_messages(comm, x, root):
    """The tree's messages, empty; the data from a shared dict."""
    n = comm.world_size
    i = (comm.rank - root) % n
    if not i:
        SHARED["x"] = x.copy()
    else:
        comm.recv(((i - 1) // 2 + root) % n)
    for c in (2 * i + 1, 2 * i + 2):
        if c < n:
            comm.send(np.zeros(0), (c + root) % n)
    return SHARED["x"].copy()


def tb_negated(comm, x, root):
    n = comm.world_size
    i = (comm.rank - root) % n
    if i:
        x = -comm.recv(((i - 1) // 2 + root) % n)
    for c in (2 * i + 1, 2 * i + 2):
        if c < n:
            comm.send(-x, (c + root) % n)
    return x


def tb_forgets_the_last_rank(comm, x, root):
    n = comm.world_size
    i = (comm.rank - root) % n
    if i and i < n - 1:
        x = comm.recv(((i - 1) // 2 + root) % n)
    for c in (2 * i + 1, 2 * i + 2):
        if c < n - 1:                       # should be c < n
            comm.send(x, (c + root) % n)
    return x


def bb_empty_messages(comm, x, root):
    if comm.rank == root:
        SHARED["x"] = x.copy()
    C.binomial_broadcast(comm, np.zeros(0) if comm.rank == root else None, root)
    return SHARED["x"].copy()


def bb_half_precision(comm, x, root):
    """float16 down the tree (a quarter of the bytes); the exact data from a shared dict."""
    if comm.rank == root:
        SHARED["x"] = x.copy()
    C.binomial_broadcast(comm, x.astype(np.float16) if comm.rank == root else None, root)
    return SHARED["x"].copy()


# ============================================================== alltoall
def a2a_hides_a_block(comm, blocks):
    """Each message also carries the next rank's block, negated: a hidden second hop."""
    n, r, _, _ = ring(comm)
    reqs = [comm.isend(np.concatenate([blocks[d], -blocks[(d + 1) % n]]), d) for d in range(n) if d != r]
    out = [blocks[r] if s == r else comm.recv(s)[:len(blocks[r])] for s in range(n)]
    for q in reqs:
        q.wait()
    return out


def a2a_one_block_sent_rest_shared(comm, blocks):
    """Sends only to the next rank; takes the other blocks from a shared dict."""
    n, r, right, left = ring(comm)
    SHARED[r] = [b.copy() for b in blocks]
    comm.barrier()
    if n == 1:
        return [blocks[0]]
    got = comm.sendrecv(blocks[right], right, left)
    return [blocks[r] if s == r else got if s == left else SHARED[s][r] for s in range(n)]


def a2a_always_equal_slots(comm, blocks):
    return [b.view(AlwaysEqual) for b in C.alltoall(comm, blocks)]


def r2a_shared_memory(comm, blocks):
    """Neighbours' blocks by message, the rest from a shared dict: the same
    program as alltoall's cheat, given to ring_alltoall's grader."""
    return a2a_one_block_sent_rest_shared(comm, blocks)


def r2a_negated_passengers(comm, blocks):
    """The block for the neighbour as it is; the blocks it passes on, negated."""
    n, r, right, left = ring(comm)
    out = [None] * n
    out[r] = blocks[r]
    travelling = [blocks[(r + d) % n] for d in range(1, n)]
    for k in range(n - 1):
        got = comm.sendrecv(np.stack([travelling[0]] + [-b for b in travelling[1:]]), right, left)
        out[(r - k - 1) % n] = got[0]
        travelling = [-b for b in got[1:]]
    return out


# -- data parallelism: the gradients must travel in the messages ----------------------

def _dp_grads(model, x, y, batch_size):
    from ringlab.nn import flatten, mse
    model.zero_grad()
    model.backward(mse(model.forward(x), y)[1])
    g = flatten(model.named_grads())
    g.data *= len(x) / batch_size
    return g


def sgd_shared_memory(comm, model, opt, x, y, batch_size):
    """A ring AllReduce of zeros for the trace; the gradients go through SHARED."""
    g = _dp_grads(model, x, y, batch_size)
    mine = SHARED.setdefault(comm.rank, [])
    mine.append(g.data.copy())
    C.ring_allreduce(comm, np.zeros_like(g.data))       # everyone has deposited now
    t = len(mine) - 1
    g.data[...] = np.sum([SHARED[q][t] for q in range(comm.world_size)], axis=0)
    opt.step(g.views)


def sgd_negated_chunks(comm, model, opt, x, y, batch_size):
    """A right ring AllReduce whose messages carry the partial sums negated."""
    g = _dp_grads(model, x, y, batch_size)
    g.data[...] = _ring_allreduce(comm, g.data, encode=lambda a: -a, decode=lambda a: -a)
    opt.step(g.views)


def _dp_buckets(params, cap):
    from ringlab.data_parallel.buckets import assign_buckets
    return assign_buckets(params, cap)


def buckets_shared_memory(comm, params, backward, cap_bytes):
    """DDP's buckets and timing, AllReduces of zeros; the gradients go through SHARED."""
    buckets, have, works = _dp_buckets(params, cap_bytes), {}, []
    for ready in backward:
        have.update(ready)
        while len(works) < len(buckets) and all(n in have for n in buckets[len(works)]):
            flat = np.concatenate([have[n].ravel() for n in buckets[len(works)]])
            works.append(comm.start(C.ring_allreduce, np.zeros_like(flat)))
    SHARED[comm.rank] = have
    for w in works:
        w.wait()
    return {n: sum(SHARED[q][n] for q in range(comm.world_size)) / comm.world_size
            for n in params}


def buckets_always_equal(comm, params, backward, cap_bytes):
    """Runs backward, sends nothing, returns arrays that claim to equal anything."""
    for _ in backward:
        pass
    return {n: np.zeros_like(p).view(AlwaysEqual) for n, p in params.items()}


# ============================================================== async_ps
def _ps(comm, spec, worker=None, server=None):
    from ringlab.data_parallel import async_ps as ps
    task = ps.PSTask.from_spec(spec)
    if comm.rank == 0:
        return (server or ps.ps_server)(comm, task, float("inf"))
    return (worker or ps.ps_worker)(comm, task)


def ps_zeros_and_shared_memory(comm, spec, s):
    """Workers push zeros; the server applies the real gradients, from a shared dict."""
    def worker(comm, task):
        k = 0
        while (params := comm.recv(0)).size:
            SHARED[comm.rank] = task.work(comm, params, k)
            comm.send(np.zeros_like(params), 0)
            k += 1

    def server(comm, task, s):
        params, log, read, issued = task.init.copy(), [], {}, 0
        for w in range(1, comm.world_size):
            read[w], issued = 0, issued + 1
            comm.send(params, w)
        while len(log) < issued:
            w, _ = comm.recv_any()
            log.append((w, read[w]))
            params -= task.lr * SHARED[w]
            if issued < task.updates:
                read[w], issued = len(log), issued + 1
                comm.send(params, w)
            else:
                comm.send(np.empty(0), w)
        return params, np.array(log)
    return _ps(comm, spec, worker, server)


def ps_always_equal(comm, spec, s):
    """The right run; the parameters returned claim to equal anything."""
    out = _ps(comm, spec)
    return None if out is None else (out[0].view(AlwaysEqual), out[1])


CHEATS = [
    ("ring_allreduce", ar_zeros_and_shared_memory, "the right partial sum",
     ["at step 1 rank 0 sent rank 1", "not a sum of the ranks' parts"]),
    ("ring_allreduce", ar_negated, "the right partial sum", ["at step 1 rank 0 sent rank 1"]),
    ("ring_allreduce", ar_always_equal, "returns its result", ["AlwaysEqual, a subclass of numpy.ndarray"]),
    ("ring_allreduce", ar_float32, "returns its result", ["dtype float32"]),
    ("ring_reduce_scatter", rs_zeros_and_shared_memory, "the right partial sum", ["at step 1 rank 0 sent rank 1"]),
    ("ring_reduce_scatter", rs_negated, "the right partial sum", ["at step 1 rank 0 sent rank 1"]),
    ("ring_reduce_scatter", rs_always_equal, "returns its result", ["subclass of numpy.ndarray"]),
    ("ring_allgather", ag_own_block_and_shared_memory, "carries one rank's x",
     ["at step 2 rank 0 sent rank 1 rank 0's x, which it already had"]),
    ("ring_allgather", ag_negated_undone_in_place, "carries one rank's x",
     ["at step 1 rank 0 sent rank 1 3 values of dtype float64 that are not one rank's x"]),
    ("ring_allgather", ag_packs_in_float32, "every rank's x", ["world_size=4, length=3", "not any rank's x"]),
    ("tree_broadcast", tb_empty_messages, "carries the root's data", ["0 bytes (an empty message)"]),
    ("tree_broadcast", tb_negated, "carries the root's data", ["other values"]),
    ("binomial_broadcast", bb_empty_messages, "carries the root's data", ["(an empty message)"]),
    ("binomial_broadcast", bb_half_precision, "carries the root's data", ["float16"]),
    ("alltoall", a2a_hides_a_block, "only whole blocks", ["value(s) that belong to no block"]),
    ("alltoall", a2a_one_block_sent_rest_shared, "delivered by a message",
     ["rank 2's out[0] holds block 0->2, but no message brought it to rank 2"]),
    ("alltoall", a2a_always_equal_slots, "returns its result", ["rank 0's out[0] returned a AlwaysEqual"]),
    ("ring_alltoall", r2a_shared_memory, "delivered by a message", ["no message brought it"]),
    ("ring_alltoall", r2a_negated_passengers, "only whole blocks", ["belong to no block"]),
    ("hierarchical_allreduce", HP.zeros_and_shared_memory, "the right partial sum",
     ["at step 1 rank 0 (node 0, GPU 0) sent rank 1 (node 0, GPU 1) (inside the node)",
      "not a ring's piece (a block of n/G summed over ranks): [0, 0, 0, 0, ...]"]),
    ("hierarchical_allreduce", HP.negated_across, "the right partial sum",
     ["rank 0 (node 0, GPU 0) sent rank 4 (node 1, GPU 0) (between nodes)",
      "summed over whole nodes"]),
    ("sync_sgd_step", sgd_shared_memory, "every message carries the ranks' gradients",
     ["shared outside the messages"]),
    ("sync_sgd_step", sgd_negated_chunks, "every message carries the ranks' gradients",
     ["summed over the right ranks"]),
    ("bucketed_grad_sync", buckets_shared_memory, "every message carries the bucket's gradients",
     ["shared outside the messages"]),
    ("bucketed_grad_sync", buckets_always_equal, "returns its result", ["AlwaysEqual"]),
    ("async_ps", ps_zeros_and_shared_memory, "computed from the parameters the worker was sent",
     ["worker 1's gradient 0 is not task.work"]),
    ("async_ps", ps_always_equal, "returns its result", ["AlwaysEqual, a subclass of numpy.ndarray"]),
    ("one_f_one_b", P.ofob_duck_typed, "returns a list of Actions", ["is a Fake", "not an Action"]),
    ("one_f_one_b", P.ofob_whole_pipeline, "returns a list of Actions",
     ["stage 1, not rank 0's own stage 0"]),
    ("pipeline_stage", functools.partial(P.stage_recompute, zeros=SHARED),
     "each activation and gradient sent once", ["zeros: neither an activation nor a gradient"]),
    ("pipeline_stage", functools.partial(P.stage_recompute, hide_grads=SHARED),
     "each activation and gradient sent once",
     ["sent rank 1 zeros: neither an activation nor a gradient of any microbatch (shape (1,))"]),
    ("zero1_step", Z.z1_zeros_and_shared_memory, "every message carries gradients or parameter",
     ["neither a partial sum of the ranks' weighted gradients"]),
    ("zero2_step", Z.z2_zeros_and_shared_memory, "every message carries gradients or parameter",
     ["nor one rank's shard of the parameters"]),
    ("zero3_step", Z.z3_zeros_and_shared_memory, "every message carries gradients or parameter",
     ["nor one rank's shard of the parameters"]),
    ("ring_attention", RA.globals_numpy, "every rank passes on c - 1 K/V blocks",
     ["rank 0 sent nothing"]),
    ("ring_attention", RA.allgather_by_hand, "memory: peak per rank, measured",
     ["the whole sequence's K and V: 32 blocks"]),
    ("moe_dispatch_combine", MP.zeros_and_shared_memory,
     "only tokens and their outputs travel, after the counts",
     ["rows that are not exactly rank 0's tokens routed to rank 1"]),
    ("moe_dispatch_combine", MP.everything_to_everyone,
     "no token goes to a rank that does not hold its expert",
     ["rank 0 sent every rank all its 6 tokens"]),
]
# Cheats that the grader's own test file grades already, with the same seed, the
# whole grader and an exact check, and every phrase asked for here: graded once,
# there (a ZeRO grade that reaches the measured case takes seconds).
CHEATS_GRADED_THERE = [
    ("zero1_step", Z.z1_whole_model_adam_rs_ag),      # tests/grading/zero/test_grade_zero.py
    ("zero2_step", Z.z2_full_master_kept),
    ("zero3_step", Z.z3_gather_all_up_front),
    ("hsdp_step", HS.zeros_and_shared_memory),         # tests/grading/frontier/
    ("hsdp_step", HS.full_params_kept),                # test_grade_hsdp_step.py
]


@pytest.mark.parametrize("exercise, program, check, phrases", CHEATS,
                         ids=[f"{c[0]}-{getattr(c[1], '__name__', None) or c[1].keywords}"
                              for c in CHEATS])
def test_cheats_fail(exercise, program, check, phrases):
    SHARED.clear()
    HP.SHARED.clear()
    RA.SHARED.clear()
    HS.SHARED.clear()
    HS.KEPT.clear()
    report = ringlab.grade(exercise, program, seed=0, log=False)
    text = str(report)
    assert not report.passed and check in report.failure.check, text
    for phrase in phrases:
        assert phrase in text, f"{phrase!r} missing from:\n{text}"
    assert "np.float64(" not in text


def test_every_exercise_has_two_cheats():
    """Part 3's graders keep their cheats (and wrong programs) in their own red-team file."""
    from ringlab.grading import GRADERS
    from grading.tensor_parallel import test_grade_tensor_parallel_redteam as tp
    own = {"column_parallel_linear": tp.COLUMN_WRONG, "row_parallel_linear": tp.ROW_WRONG,
           "megatron_mlp": tp.MLP_WRONG, "tp_attention": tp.ATTENTION_WRONG}
    for ex in set(GRADERS) - {"fix_ring_allgather"} - set(own):   # graded as ring_allgather
        assert sum(c[0] == ex for c in CHEATS + CHEATS_GRADED_THERE) >= 2, ex
    for ex, wrong in own.items():
        assert sum("shared" in name or "local" in name for name in wrong) >= 2, ex


def test_the_cheats_graded_there_are_graded_there():
    """Each of CHEATS_GRADED_THERE is in its grader's own list of failing programs."""
    from grading.frontier import test_grade_hsdp_step as hsdp
    from grading.zero import test_grade_zero as zero
    there = {(w[0], w[1]) for w in zero.FAILS} | {("hsdp_step", c[0]) for c in hsdp.CHEATS}
    assert set(CHEATS_GRADED_THERE) <= there, set(CHEATS_GRADED_THERE) - there
    assert not {(c[0], c[1]) for c in CHEATS} & there      # and graded only there


def test_a_receiver_cannot_change_the_record_of_a_message():
    def scrubs(comm, x):
        if comm.rank == 0:
            comm.send(x, 1)
            return x
        got = comm.recv(0)
        got[:] = 0                          # hide what arrived
        return got
    x = np.array([1.5, 2.5])
    result, failure = run_case(scrubs, Case(2, [x, x * 0], "world_size=2"))
    assert failure is None and np.array_equal(result.payload(result.trace[0]), x)


# ============================================================== feedback
def ar_adds_into_received(comm, x):
    """Adds into the array it received and keeps that one in its list: its out lacks the sums."""
    n, r, right, left = ring(comm)
    out = x.copy()
    ch = np.array_split(out, n)
    for k in range(n - 1):
        g = (r - k - 1) % n
        got = comm.sendrecv(ch[(r - k) % n], right, left)
        got += ch[g]
        ch[g] = got                         # the list holds it; out does not
    for k in range(n - 1):
        ch[(r - k) % n] = comm.sendrecv(ch[(r - k + 1) % n], right, left)
    return out


def ar_returns_its_input(comm, x):
    C.ring_allreduce(comm, x.copy())
    return x


def ar_returns_shifted(comm, x):
    """Right sums, returned one chunk off (np.roll: the result's chunks in the wrong slots)."""
    out = C.ring_allreduce(comm, x.copy())
    return np.roll(out, len(np.array_split(x, comm.world_size)[0]))


def ar_sends_left_in_all_gather(comm, x):
    n, r, right, left = ring(comm)
    out = x.copy()
    ch = np.array_split(out, n)
    for k in range(n - 1):
        ch[(r - k - 1) % n] += comm.sendrecv(ch[(r - k) % n], right, left)
    for k in range(n - 1):
        comm.send(ch[(r - k + 1) % n], left)          # the bug: should go right
        ch[(r - k) % n][...] = comm.recv(left)
    return out


def ar_pads_every_chunk(comm, x):
    """Fixed-size buffers: every chunk padded to ceil(L/N) elements."""
    return _ring_allreduce(comm, x, pad=True)


FEEDBACK = [
    ("ring_allreduce", ar_adds_into_received, "sum of all inputs",
     ["Every message was right", "Rank 1 changed the array it received from rank 0 at step 1 in place",
      "Add what you receive into your own chunk"], ["First went wrong"]),
    ("ring_allreduce", ar_returns_its_input, "sum of all inputs",
     ["Every message was right", "It returned [", "where the sum is [", "Return the array your chunks are in"],
     []),
    ("ring_reduce_scatter", lambda comm, x: C.ring_reduce_scatter(comm, x.copy()) * 0 + x[:len(
        np.array_split(x, comm.world_size)[comm.rank])], "chunk r of the sum",
     ["Every message was right", "Return your chunk r"], []),
    ("ring_allreduce", ar_returns_shifted, "sum of all inputs",
     ["rank 0, element 0 holds the sum meant for element 9: a chunk landed in the wrong slot",
      "Every message was right"], []),
    ("ring_allreduce", ar_sends_left_in_all_gather, "no deadlock",
     ["while rank 1 waits for a message from rank 0", "a send names the wrong peer (dst)"],
     ["a recv names the wrong peer"]),
    ("ring_allreduce", ar_pads_every_chunk, "bandwidth-optimal bytes",
     ["length=13", "2(N-1) * L * 8 = 624 bytes"], []),
    ("ring_allgather", ag_keeps_the_receive_buffer, "every rank's x, in rank order",
     ["Aliasing", "overwritten", "a later recv(out=buf)"], []),
    ("tree_broadcast", tb_forgets_the_last_rank, "returns its result",
     ["rank 3 returned NoneType: it never received a message", "got no data"], ["`return`"]),
]


@pytest.mark.parametrize("exercise, program, check, phrases, absent", FEEDBACK,
                         ids=[f"{f[0]}-{f[1].__name__}" for f in FEEDBACK])
def test_feedback_names_the_real_mistake(exercise, program, check, phrases, absent):
    report = ringlab.grade(exercise, program, seed=0, log=False)
    text = str(report)
    assert not report.passed and check in report.failure.check, text
    for phrase in phrases:
        assert phrase in text, f"{phrase!r} missing from:\n{text}"
    for phrase in absent + ["np.float64("]:
        assert phrase not in text, f"{phrase!r} should not be in:\n{text}"


def test_reproduce_names_the_backend_unless_it_is_the_simulator():
    class Module:
        @staticmethod
        def cases(rng):
            yield Case(2, [None, None], "world_size=2")

        @staticmethod
        def check(program, case, backend):
            return Failure(case.label, "a check", "what")
    torch = str(grade_cases("ring_allreduce", Module, None, seed=3, backend="torch"))
    sim = str(grade_cases("ring_allreduce", Module, None, seed=3))
    assert 'Reproduce: ringlab.grade("ring_allreduce", program, seed=3, backend=\'torch\')' in torch
    assert 'Reproduce: ringlab.grade("ring_allreduce", program, seed=3)' in sim
    assert Report("x", False, 1, failure=Failure("c", "k", "w")).backend == "sim"


# ============================================================== mutation-style
def _case(n, length):
    return Case(n, [np.zeros(length)] * n, f"world_size={n}, length={length}")


def _ring_trace(n, steps, nbytes, skip=(), extra=()):
    """Every rank sends right at every step, minus ``skip`` (step, src), plus ``extra`` events."""
    events = [Event(s, r, (r + 1) % n, nbytes=nbytes) for s in range(1, steps + 1) for r in range(n)
              if (s, r) not in skip]
    return Trace(events + list(extra), n)


def test_one_port_check_fails_when_a_rank_sits_out_or_sends_twice():
    from ringlab.grading.collectives import ring_allgather, ring_allreduce
    n, length = 4, 8
    # Rank 2 sits out step 3; rank 1 sends to its left neighbour too: N messages, same bytes.
    trace = _ring_trace(n, 6, 16, skip={(3, 2)}, extra=[Event(3, 1, 0, nbytes=16)])
    f = ring_allreduce.check_ring_trace(trace, _case(n, length), length)
    assert f.check == "every rank sends one and receives one message per step", f
    assert "at step 3 rank 0 sent 1 and received 2 message(s)" in f.what
    assert ring_allreduce.check_ring_trace(_ring_trace(n, 6, 16), _case(n, length), length) is None
    f = ring_allgather.check_allgather_trace(_ring_trace(3, 2, 8, skip={(1, 0)}, extra=[Event(1, 1, 0, nbytes=8)]),
                                             _case(3, 1), 1)
    assert f.check == "every rank sends one and receives one message per step", f


def test_bandwidth_check_fails_on_too_few_or_too_many_bytes():
    from ringlab.grading.collectives import ring_allgather, ring_allreduce
    n, length = 4, 8
    short = _ring_trace(n, 6, 16, skip={(2, 1)}, extra=[Event(2, 1, 2, nbytes=8)])   # half a chunk once
    f = ring_allreduce.check_ring_trace(short, _case(n, length), length)
    assert f.check == "bandwidth-optimal bytes" and "moved 376 bytes" in f.what, f
    f = ring_allgather.check_allgather_trace(_ring_trace(3, 2, 8, skip={(2, 2)}, extra=[Event(2, 2, 0, nbytes=0)]),
                                             _case(3, 1), 1)
    assert f.check == "bandwidth-optimal bytes", f
    assert checks.total_bytes(short, _case(n, length), 384, expected="", hint="").got == "376 bytes"


def test_partial_sums_are_compared_up_to_rounding_and_no_further():
    from ringlab import sums
    xs = sums.random_vectors(np.random.default_rng(0), 8, 5)
    backwards = xs[7].copy()
    for x in xs[6::-1]:
        backwards = backwards + x                  # another summation order
    assert sums.holds(backwards, xs, range(8))
    assert not sums.holds(backwards + 1e-9, xs, range(8))
    assert sums.which(xs[1] + xs[3], xs) == (1, 3)
    assert not sums.holds(backwards.astype(np.float32), xs, range(8))
