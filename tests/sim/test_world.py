"""The simulated world: semantics, determinism and every error path."""

import signal
import threading
import time

import numpy as np
import pytest

import ringlab
from ringlab import CommError, DeadlockError, ProgramTimeout, RankError, UnreceivedMessagesError


def ring_shift(comm, x):
    n = comm.world_size
    comm.send(x, (comm.rank + 1) % n)
    return comm.recv((comm.rank - 1) % n)


def test_outputs_in_rank_order_and_world_of_one():
    res = ringlab.run(lambda comm, x: (comm.rank, comm.world_size, x), ["a", "b", "c"])
    assert res.outputs == [(0, 3, "a"), (1, 3, "b"), (2, 3, "c")]
    assert ringlab.run(lambda comm, x: x * 2, [np.ones(3)]).trace.steps == 0


def test_empty_world_is_an_error():
    with pytest.raises(ValueError, match="world_size 0"):
        ringlab.run(ring_shift, [])


def test_ring_shift_moves_data_one_to_the_right():
    xs = [np.array([float(r)]) for r in range(5)]
    res = ringlab.run(ring_shift, xs)
    assert [o[0] for o in res.outputs] == [4.0, 0.0, 1.0, 2.0, 3.0]
    # each rank sends once, at step 1, to its right neighbour
    assert [(e.step, e.src, e.dst, e.nbytes) for e in res.trace] == [(1, r, (r + 1) % 5, 8) for r in range(5)]


def test_steps_follow_causality_along_a_chain():
    # rank 0 -> 1 -> 2 -> 3: each hop can only happen after the previous one.
    def chain(comm, x):
        if comm.rank > 0:
            x = comm.recv(comm.rank - 1)
        if comm.rank < comm.world_size - 1:
            comm.send(x, comm.rank + 1)
        return x
    res = ringlab.run(chain, [np.zeros(2)] * 4)
    assert [(e.step, e.src) for e in res.trace] == [(1, 0), (2, 1), (3, 2)]


def test_one_port_sender_serialises_its_sends():
    # A root sending to 3 ranks needs 3 steps: a rank sends one message per step.
    def flat(comm, x):
        if comm.rank == 0:
            for dst in range(1, comm.world_size):
                comm.send(x, dst)
            return x
        return comm.recv(0)
    res = ringlab.run(flat, [np.zeros(1)] * 4)
    assert [(e.step, e.dst) for e in res.trace] == [(1, 1), (2, 2), (3, 3)]


def test_sends_are_buffered_payload_copied_at_send_time():
    def mutate_after_send(comm, x):
        if comm.rank == 0:
            buf = np.array([1.0, 2.0])
            comm.send(buf, 1)
            buf[:] = -1          # must not change what rank 1 receives
            return buf
        return comm.recv(0)
    res = ringlab.run(mutate_after_send, [None, None])
    assert res.outputs[1].tolist() == [1.0, 2.0]


def test_messages_on_a_channel_arrive_in_order_and_tags_separate_channels():
    def prog(comm, x):
        if comm.rank == 0:
            comm.send(np.array([1]), 1, tag=7)
            comm.send(np.array([2]), 1)
            comm.send(np.array([3]), 1)
            return None
        a = comm.recv(0)
        b = comm.recv(0)
        c = comm.recv(0, tag=7)
        return [int(a[0]), int(b[0]), int(c[0])]
    assert ringlab.run(prog, [None, None]).outputs[1] == [2, 3, 1]


def test_isend_irecv_and_recv_into_out():
    def prog(comm, x):
        n = comm.world_size
        out = np.empty(3)
        r = comm.irecv((comm.rank - 1) % n, out=out)
        s = comm.isend(x, (comm.rank + 1) % n)
        got = r.wait()
        s.wait()
        assert got is out
        return out
    xs = [np.full(3, r, float) for r in range(3)]
    res = ringlab.run(prog, xs, mode="rendezvous")
    assert [o[0] for o in res.outputs] == [2.0, 0.0, 1.0]


def test_everyone_sends_first_deadlocks_in_rendezvous_but_not_buffered_mode():
    xs = [np.zeros(2)] * 4
    assert len(ringlab.run(ring_shift, xs).trace) == 4
    t = time.perf_counter()
    with pytest.raises(DeadlockError) as err:
        ringlab.run(ring_shift, xs, mode="rendezvous")
    assert time.perf_counter() - t < 1.0
    assert set(err.value.waiting) == {0, 1, 2, 3}
    assert "rank 0: waits in send(dst=1)" in str(err.value)


def test_even_odd_ordering_avoids_the_rendezvous_deadlock():
    def even_odd(comm, x):
        n, r = comm.world_size, comm.rank
        if r % 2 == 0:
            comm.send(x, (r + 1) % n)
            return comm.recv((r - 1) % n)
        got = comm.recv((r - 1) % n)
        comm.send(x, (r + 1) % n)
        return got
    res = ringlab.run(even_odd, [np.array([float(r)]) for r in range(4)], mode="rendezvous")
    assert [o[0] for o in res.outputs] == [3.0, 0.0, 1.0, 2.0]


def test_deadlock_names_each_blocked_rank_and_whom_it_waits_for():
    def wait_left(comm, x):
        if comm.rank == 0:
            return x            # rank 0 finishes without sending
        return comm.recv(comm.rank - 1)
    with pytest.raises(DeadlockError) as err:
        ringlab.run(wait_left, [np.zeros(1)] * 3)
    assert err.value.waiting.keys() == {1, 2}
    assert err.value.finished == [0]
    assert "rank 1: waits in recv(src=0)" in str(err.value)


def test_exception_names_rank_and_shows_learner_traceback_only():
    def boom(comm, x):
        if comm.rank == 2:
            raise KeyError("oops")
        return x
    with pytest.raises(RankError) as err:
        ringlab.run(boom, [np.zeros(1)] * 3)
    e = err.value
    assert e.rank == 2 and isinstance(e.exc, KeyError)
    assert "in boom" in e.program_traceback and "ringlab/world.py" not in e.program_traceback


def test_infinite_loop_is_stopped_with_a_clear_message():
    def spin(comm, x):
        while True:
            try:
                pass
            except Exception:     # a learner's broad except must not swallow the stop
                pass
    t = time.perf_counter()
    with pytest.raises(ProgramTimeout, match="did not finish within 0.3 s; rank 0"):
        ringlab.run(spin, [None, None], timeout=0.3)
    assert time.perf_counter() - t < 2.0
    # and the interpreter is fine afterwards: the next run works and is not interrupted
    time.sleep(0.4)
    assert ringlab.run(ring_shift, [np.zeros(1)] * 2).outputs[0].shape == (1,)


@pytest.mark.parametrize("dst, match", [
    (3, r"rank 2, step 1: send\(dst=3\): there is no rank 3; ranks are 0..2"),
    (-1, r"there is no rank -1"),
    (1.0, r"dst must be an int"),
    (2, r"cannot send to or from itself"),
])
def test_bad_destination(dst, match):
    def prog(comm, x):
        if comm.rank == 2:
            comm.send(x, dst)
        return x
    with pytest.raises(RankError, match=match) as err:
        ringlab.run(prog, [np.zeros(1)] * 3)
    assert err.value.rank == 2 and isinstance(err.value.exc, CommError)


def test_sending_a_non_array_is_an_error():
    with pytest.raises(RankError, match=r"rank 0, step 1: send\(dst=1\) needs a numpy array, got list"):
        ringlab.run(lambda comm, x: comm.send([1, 2], 1) if comm.rank == 0 else comm.recv(0), [0, 0])


def test_wrong_shape_on_receive_names_rank_step_and_expectation():
    def prog(comm, x):
        if comm.rank == 0:
            comm.send(np.zeros(4), 1, chunk=2)
        else:
            comm.recv(0, out=np.zeros(3))
    with pytest.raises(RankError, match=r"rank 1, step 1: recv\(src=0\) expected shape \(3,\) float64 "
                                        r"but rank 0 sent shape \(4,\) float64 .*chunk 2") as err:
        ringlab.run(prog, [None, None])
    assert err.value.rank == 1


def test_unreceived_messages_are_reported():
    def extra_send(comm, x):
        if comm.rank == 0:
            comm.send(x, 1)
            comm.send(x, 1)
            return x
        return comm.recv(0)
    with pytest.raises(UnreceivedMessagesError, match=r"(?s)1 message\(s\).*step 2: rank 0 -> rank 1"):
        ringlab.run(extra_send, [np.zeros(1)] * 2)
    res = ringlab.run(extra_send, [np.zeros(1)] * 2, check_unreceived=False)
    assert [e.step for e in res.trace.unreceived] == [2]


def test_spans_label_events_and_nest():
    def prog(comm, x):
        with comm.span("layer"):
            with comm.span("allreduce"):
                got = ring_shift(comm, x)
        ring_shift(comm, x)
        return got
    res = ringlab.run(prog, [np.zeros(1)] * 3)
    assert [e.span for e in res.trace] == ["layer/allreduce"] * 3 + [""] * 3
    assert {(s.rank, s.path) for s in res.trace.spans} == {(r, p) for r in range(3) for p in ("layer", "layer/allreduce")}
    (row,) = [c for c in res.trace.collectives() if c["span"] == "layer/allreduce"]
    assert row["messages"] == 3 and row["start"] == 0 and row["end"] == 1


def test_same_program_same_trace_every_run():
    from ringlab.collectives import ring_allreduce
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(23) for _ in range(6)]
    first = ringlab.run(ring_allreduce, xs)
    for _ in range(3):
        again = ringlab.run(ring_allreduce, xs)
        assert again.trace == first.trace and again.trace.diff(first.trace) == ""
        assert all(np.array_equal(a, b) for a, b in zip(again.outputs, first.outputs))


def test_trace_json_round_trip_and_diff():
    from ringlab.collectives import ring_allreduce
    res = ringlab.run(ring_allreduce, [np.ones(5)] * 3)
    back = ringlab.Trace.from_json(res.trace.to_json())
    assert back == res.trace
    other = ringlab.run(ring_allreduce, [np.ones(6)] * 3).trace
    assert other != res.trace and "event 2" in res.trace.diff(other)  # 5 = 2+2+1 vs 6 = 2+2+2: chunk 2 differs


def test_trace_json_round_trip_keeps_tuple_chunk_labels():
    # AlltoAll labels a block (source, destination); JSON turns tuples into lists.
    from ringlab.collectives import ring_alltoall
    t = ringlab.run(ring_alltoall, [[np.full(2, 10.0 * r + d) for d in range(3)] for r in range(3)]).trace
    assert any(isinstance(e.chunk, tuple) for e in t)
    back = ringlab.Trace.from_json(t.to_json())
    assert back == t and back.diff(t) == ""
    back.show()                                # labels are hashable again: the player can index them


def test_trace_table_text_and_html():
    from ringlab.collectives import ring_allreduce
    t = ringlab.run(ring_allreduce, [np.ones(4)] * 2).trace
    text = str(t.table())
    assert text.splitlines()[0].split() == ["step", "src", "dst", "chunk", "op", "nbytes", "span"]
    assert len(text.splitlines()) == 1 + len(t)
    assert t._repr_html_().count("<tr>") == 1 + len(t)


@pytest.mark.parametrize("stuck", [
    lambda: time.sleep(60),                  # one long C call: the interrupt alone would wait for it
    lambda: threading.Event().wait(),        # blocks on a lock for ever
])
def test_a_rank_stuck_in_a_blocking_call_is_stopped_too(stuck):
    def prog(comm, x):
        if comm.rank == 1:
            stuck()
        return x
    t = time.perf_counter()
    with pytest.raises(ProgramTimeout, match="within 0.3 s; rank 1") as err:
        ringlab.run(prog, [np.zeros(1)] * 3, timeout=0.3)
    assert time.perf_counter() - t < 5.0
    assert "stuck()" in str(err.value)                     # the learner's line
    # After a wake-up our empty handler stays (a late signal must not end the
    # process); it still works for the next run, and a run that ends in time
    # puts the default back.
    from ringlab.sim.watchdog import _woken
    assert signal.getsignal(signal.SIGUSR2) is _woken
    time.sleep(0.4)
    with pytest.raises(ProgramTimeout):
        t = time.perf_counter()
        ringlab.run(prog, [np.zeros(1)] * 2, timeout=0.3)
    assert time.perf_counter() - t < 5.0
    assert ringlab.run(ring_shift, [np.zeros(1)] * 2).outputs[0].shape == (1,)
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL


def test_a_signal_someone_else_handles_is_left_alone():
    seen = []
    previous = signal.signal(signal.SIGUSR2, lambda *a: seen.append(a))
    try:
        assert ringlab.run(ring_shift, [np.zeros(1)] * 2).outputs[0].shape == (1,)
        assert signal.getsignal(signal.SIGUSR2) not in (signal.SIG_DFL, None)
        with pytest.raises(ProgramTimeout):
            ringlab.run(lambda comm, x: time.sleep(1.0), [0, 0], timeout=0.2)   # the sleep ends on its own
        assert seen == []                                    # we never used their signal
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_a_work_started_before_a_compute_sends_the_buffer_as_it_was():
    # The work starts at t = 0; the program computes 1 s and only then writes the
    # buffer. In simulated time the work's send comes first, so it carries the
    # zeros: comm.compute lets the actors it ran past (the work) go first.
    def program(comm, x):
        buf = np.zeros(2)
        peer = 1 - comm.rank
        work = comm.start(lambda c: c.sendrecv(buf, peer, peer))
        comm.compute(1.0, "backward")
        buf[...] = x
        return work.wait()
    res = ringlab.run(program, [np.ones(2), np.ones(2)])
    assert [y.tolist() for y in res.outputs] == [[0.0, 0.0]] * 2
    assert res.time == 1.0
