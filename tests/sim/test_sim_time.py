"""The simulator's core: the one-port step model, simulated time (compute and
the alpha-beta network), communication streams, and receiving from anyone.
Checked against closed forms and brute-force properties."""

import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ringlab
from ringlab import AlphaBeta
from ringlab.collectives import binomial_broadcast, binomial_reduce, ring_allgather, ring_allreduce, tree_allreduce
from support.worlds import central_allreduce


def one_port(trace):
    """Every rank sends at most one and receives at most one message per step."""
    sends = Counter((e.step, e.src) for e in trace)
    recvs = Counter((e.step, e.dst) for e in trace)
    return max(sends.values(), default=0) <= 1 and max(recvs.values(), default=0) <= 1


def random_traffic(comm, plan):
    """Rank r sends plan[r] (a list of destinations) in order, then receives
    what the plan says others send to it, in sender order."""
    for dst in plan[comm.rank]:
        comm.send(np.zeros(1), dst)
    got = 0
    for src in range(comm.world_size):
        for _ in range(plan[src].count(comm.rank)):
            comm.recv(src)
            got += 1
    return got


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 7), seed=st.integers(0, 10**6), k=st.integers(1, 5))
def test_any_traffic_keeps_one_send_and_one_receive_per_rank_per_step(n, seed, k):
    rng = np.random.default_rng(seed)
    plan = [[int(d) for d in rng.choice([q for q in range(n) if q != r], size=k)] for r in range(n)]
    res = ringlab.run(random_traffic, [plan] * n)
    assert one_port(res.trace)
    # Causality on each channel: later messages in later steps.
    by_channel = {}
    for e in res.trace:
        by_channel.setdefault((e.src, e.dst), []).append((e.seq, e.step))
    for pairs in by_channel.values():
        steps = [s for _, s in sorted(pairs)]
        assert steps == sorted(steps) and len(set(steps)) == len(steps)
    # A sender's own messages go out in its program order, one step each.
    for r in range(n):
        mine = [e.step for e in res.trace if e.src == r]
        assert len(mine) == len(set(mine))


@pytest.mark.parametrize("algorithm", [ring_allreduce, tree_allreduce, binomial_broadcast,
                                       ring_allgather, binomial_reduce, central_allreduce])
@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_reference_collectives_are_one_port(algorithm, n):
    kwargs = {"root": 0} if algorithm in (binomial_broadcast, binomial_reduce) else {}
    x = [np.arange(8.0) + r for r in range(n)]
    if algorithm is binomial_broadcast:
        x = [x[0]] + [None] * (n - 1)
    assert one_port(ringlab.run(algorithm, x, kwargs=kwargs).trace)


@pytest.mark.parametrize("n", [2, 3, 4, 8, 13])
def test_central_allreduce_pays_two_n_minus_one_full_transfers(n):
    nbytes, alpha, beta = 8 * 1560, 3e-6, 1e-9
    xs = [np.full(1560, float(r)) for r in range(n)]
    net = AlphaBeta(alpha, beta)
    central = ringlab.run(central_allreduce, xs, network=net)
    ring = ringlab.run(ring_allreduce, xs, network=net)
    assert central.trace.steps == 2 * (n - 1)
    assert central.time == pytest.approx(2 * (n - 1) * (alpha + nbytes * beta))
    assert ring.time == pytest.approx(2 * (n - 1) * (alpha + nbytes / n * beta))
    assert ring.time <= central.time


def test_central_never_beats_the_ring_at_any_size():
    net = AlphaBeta(alpha=5e-6, beta=1e-10)
    for length in (8, 64, 512, 4096, 65536):     # 8 elements divide by N = 8
        xs = [np.ones(length)] * 8
        assert (ringlab.run(ring_allreduce, xs, network=net).time
                <= ringlab.run(central_allreduce, xs, network=net).time)


def test_every_event_has_times_and_the_makespan_is_the_last_end():
    res = ringlab.run(ring_allreduce, [np.ones(40)] * 4, network=AlphaBeta(1e-6, 1e-9))
    assert all(e.start is not None and e.end > e.start for e in res.trace)
    assert res.time == max(e.end for e in res.trace) == res.trace.time
    untimed = ringlab.run(ring_allreduce, [np.ones(40)] * 4)
    assert all(e.start is None and e.end is None for e in untimed.trace) and untimed.time == 0
    # Same steps, same messages: the network only adds times.
    assert [e._replace(start=None, end=None) for e in res.trace] == untimed.trace.events


def test_ports_queue_messages_first_come_first_served():
    # Ranks 1 and 2 both send 1000 bytes to rank 0 at time 0: the second waits.
    def gather(comm, x):
        if comm.rank:
            comm.send(x, 0)
        else:
            return [comm.recv(1), comm.recv(2)]
    net = AlphaBeta(alpha=1.0, beta=0.001)
    res = ringlab.run(gather, [np.zeros(125)] * 3, network=net)   # 1000 bytes: 2 s each
    first, second = res.trace
    assert (first.src, first.start, first.end) == (1, 0.0, 2.0)
    assert (second.src, second.start, second.end) == (2, 2.0, 4.0)
    assert (first.step, second.step) == (1, 2)


def test_compute_advances_time_and_is_recorded():
    def prog(comm, x):
        comm.compute(0.5 * (comm.rank + 1), "forward", layer=comm.rank)
        return ring_allreduce(comm, x)
    res = ringlab.run(prog, [np.ones(4)] * 2, network=AlphaBeta(0.1, 0.0))
    assert [(c.rank, c.label, c.start, c.end, c.get("layer")) for c in res.trace.computes] == [
        (0, "forward", 0.0, 0.5, 0), (1, "forward", 0.0, 1.0, 1)]
    # Rank 0's first message leaves at 0.5 and waits for nobody; rank 1's leaves at 1.0.
    # The all-reduce has 2 steps; the last message arrives at 1.0 + 0.1 + 0.1.
    assert res.time == pytest.approx(1.2)
    with pytest.raises(ringlab.RankError, match="seconds >= 0"):
        ringlab.run(lambda comm, x: comm.compute(-1), [None] * 2)


def test_a_work_overlaps_compute_and_wait_returns_its_result():
    alpha, beta, n, length = 1e-4, 1e-8, 4, 4000
    comm_time = 2 * (n - 1) * (alpha + 8 * length / n * beta)

    def overlapped(comm, x):
        work = comm.start(ring_allreduce, x)
        comm.compute(1e-2, "backward")
        return work.wait()

    def serial(comm, x):
        comm.compute(1e-2, "backward")
        return ring_allreduce(comm, x)

    xs = [np.full(length, float(r)) for r in range(n)]
    net = AlphaBeta(alpha, beta)
    a, b = ringlab.run(overlapped, xs, network=net), ringlab.run(serial, xs, network=net)
    assert np.array_equal(a.outputs[0], b.outputs[0]) and a.outputs[0][0] == 6.0
    assert a.time == pytest.approx(max(1e-2, comm_time))
    assert b.time == pytest.approx(1e-2 + comm_time)
    assert {e.stream for e in a.trace} == {1} and {e.stream for e in b.trace} == {0}


def test_waiting_on_a_finished_work_moves_the_rank_to_its_end():
    # The work is one exchange of 8 * length bytes: it ends at alpha + 8 length beta.
    # The program computes a quarter of that, then waits: a work the scheduler has
    # already run to its end (in Python) still ends later in simulated time.
    alpha, beta, length = 1e-4, 1e-8, 4000
    end = alpha + 8 * length * beta

    def prog(comm, x):
        peer = 1 - comm.rank
        work = comm.start(lambda c, x: c.sendrecv(x, peer, peer), x)
        comm.compute(end / 4)
        finished = work.done
        work.wait()
        return finished, comm.time

    res = ringlab.run(prog, [np.ones(length)] * 2, network=AlphaBeta(alpha, beta))
    assert any(finished for finished, _ in res.outputs)      # the case under test happened
    assert [e.end for e in res.trace] == [pytest.approx(end, rel=1e-12)] * 2
    assert [t for _, t in res.outputs] == [pytest.approx(end, rel=1e-12)] * 2


def test_works_on_one_stream_run_in_order_and_have_their_own_message_space():
    def prog(comm, x):
        w1 = comm.start(ring_allreduce, x)
        w2 = comm.start(ring_allreduce, 2 * x)
        # A message of the program with the same tag as the works' never mixes with theirs.
        peer = 1 - comm.rank
        got = comm.sendrecv(x + 100, peer, peer)
        return w1.wait(), w2.wait(), got
    res = ringlab.run(prog, [np.array([1.0]), np.array([2.0])])
    assert [float(v[0]) for v in res.outputs[0]] == [3.0, 6.0, 102.0]
    spans = sorted((s.start, s.path) for s in res.trace.spans if s.rank == 0 and s.stream == 1)
    assert [p for _, p in spans] == ["ring_allreduce", "ring_allreduce"]
    assert spans[0][0] < spans[1][0]                  # the second starts after the first


def test_polling_is_completed_lets_the_others_progress():
    def prog(comm, x):
        if comm.rank == 0:
            req = comm.irecv(1)
            polls = 0
            while not req.is_completed():
                polls += 1
            return req.wait(), polls
        comm.compute(1.0)
        comm.send(x, 0)
    res = ringlab.run(prog, [np.ones(2)] * 2, timeout=5)
    assert res.outputs[0][1] >= 1 and res.time == 1.0


def test_ranks_polling_their_works_do_not_starve_them():
    # Every rank polls its work: the pollers used to queue behind each other forever
    # and never let the works (which come after them in the order) run.
    def prog(comm, x):
        work = comm.start(ring_allreduce, x)
        while not work.is_completed():
            pass
        return work.wait()
    res = ringlab.run(prog, [np.ones(8)] * 4, timeout=5)
    assert all(np.array_equal(y, np.full(8, 4.0)) for y in res.outputs)


def test_recv_any_takes_the_earliest_arrival():
    def server(comm, x):
        if comm.rank == 0:
            return [comm.recv_any()[0] for _ in range(comm.world_size - 1)]
        comm.compute(x)           # worker r computes x[r] seconds, then pushes
        comm.send(np.zeros(1), 0)
    speeds = [None, 3.0, 1.0, 2.0, 1.0]
    res = ringlab.run(server, speeds, network=AlphaBeta(0.1, 0.0))
    # Ranks 2 and 4 finish together: the receive port takes 2 first (lower rank), then 4.
    assert res.outputs[0] == [2, 4, 3, 1]
    assert res.outputs[0] == ringlab.run(server, speeds, network=AlphaBeta(0.1, 0.0)).outputs[0]


def test_recv_any_without_a_network_takes_the_earliest_step_then_the_lowest_rank():
    def server(comm, x):
        if comm.rank == 0:
            return [comm.recv_any()[0] for _ in range(comm.world_size - 1)]
        if comm.rank == 1:             # rank 1 first talks to rank 2: it sends to 0 later
            comm.send(np.zeros(1), 2)
        if comm.rank == 2:
            comm.recv(1)
        comm.send(np.zeros(1), 0)
    assert ringlab.run(server, [None] * 4).outputs[0] == [3, 1, 2]


def test_recv_any_deadlock_is_reported():
    with pytest.raises(ringlab.DeadlockError, match="recv_any"):
        ringlab.run(lambda comm, x: comm.recv_any() if comm.rank == 0 else None, [None] * 2)


def test_rendezvous_mode_prices_the_transfer_when_both_sides_are_ready():
    def prog(comm, x):
        if comm.rank == 0:
            comm.send(x, 1)
        else:
            comm.compute(5.0)
            return comm.recv(0)
    res = ringlab.run(prog, [np.zeros(10)] * 2, mode="rendezvous", network=AlphaBeta(1.0, 0.0))
    (e,) = res.trace
    assert (e.start, e.end) == (5.0, 6.0) and res.time == 6.0


def test_lockstep_time_is_the_old_alpha_beta_sum():
    from ringlab.show.views import alpha_beta_time
    trace = ringlab.run(ring_allreduce, [np.ones(12)] * 4).trace
    assert AlphaBeta(2.0, 0.5).lockstep_time(trace) == alpha_beta_time(trace, 2.0, 0.5) == (
        6 * (2.0 + 0.5 * 24))


def test_json_round_trip_keeps_groups_streams_times_and_computes():
    def prog(comm, x):
        comm.compute(0.25, "fwd", layer=1)
        g = comm.new_group([0, 1], name="pair")
        w = comm.start(ring_allreduce, x)
        if g is not None:
            ring_allreduce(g, x)
        return w.wait()
    res = ringlab.run(prog, [np.ones(4)] * 3, network=AlphaBeta(1e-3, 0.0))
    back = ringlab.Trace.from_json(res.trace.to_json())
    assert back == res.trace and back.computes == res.trace.computes
    assert back.spans == res.trace.spans and back.time == res.trace.time


# -- polling: a loop that only polls ends when a blocking wait would -----------------------
def test_a_polling_loop_ends_at_the_works_end_not_later():
    """Three ranks each poll two works in a loop (a red team's program livelocked here):
    the run ends, and each rank goes on at the time its work ended, as with wait()."""
    from ringlab.collectives import ring_allreduce
    net = ringlab.AlphaBeta(alpha=1e-6, beta=1e-9)

    def program(comm, x, poll):
        works = [comm.start(ring_allreduce, np.ones(4)), comm.start(ring_allreduce, np.ones(5))]
        ends = []
        for w in works:
            while poll and not w.is_completed():
                pass
            w.wait()
            ends.append(comm.time)
        return np.array(ends)
    waited = ringlab.run(program, [np.ones(3)] * 3, args=(False,), network=net, timeout=5)
    polled = ringlab.run(program, [np.ones(3)] * 3, args=(True,), network=net, timeout=5)
    for a, b in zip(waited.outputs, polled.outputs):
        np.testing.assert_array_equal(a, b)
    assert polled.trace == waited.trace and polled.time == waited.time


def test_a_polling_loop_goes_on_when_its_message_arrives():
    """Rank 1 polls a receive whose sender is itself waiting in recv_any; the message
    arrives at 0.102 s. The loop must go on then, not when an unrelated rank (at 0.3 s)
    next does something."""
    net = ringlab.AlphaBeta(alpha=1e-3, beta=1e-9)

    def program(comm, x, poll):
        r = comm.rank
        if r == 0:
            comm.recv_any()
            comm.send(np.ones(3), 1)
        elif r == 1:
            req = comm.irecv(0)
            while poll and not req.is_completed():
                pass
            req.wait()
            comm.compute(0.01, "after")
        elif r == 2:
            comm.compute(0.1, "work")
            comm.send(np.ones(3), 0)
        else:
            comm.compute(0.3, "long")
        return x
    for poll in (False, True):
        res = ringlab.run(program, [np.ones(1)] * 4, args=(poll,), network=net)
        arrival = [e.end for e in res.trace if e.dst == 1][0]
        went_on = [c.start for c in res.trace.computes if c.rank == 1][0]
        # 0.1 s of compute, then two messages of alpha + 24 B * beta each
        assert arrival == pytest.approx(0.1 + 2 * (1e-3 + 24e-9), rel=1e-12)
        assert went_on == arrival, (poll, went_on)


def test_polling_what_never_comes_is_a_deadlock_not_a_hang():
    def program(comm, x):
        req = comm.irecv((comm.rank + 1) % comm.world_size)
        while not req.is_completed():
            pass
    t = time.monotonic()
    with pytest.raises(ringlab.DeadlockError, match="recv"):
        ringlab.run(program, [np.ones(1)] * 3, timeout=5)
    assert time.monotonic() - t < 2
