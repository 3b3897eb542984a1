"""ringlab.show.views: holdings replayed from a trace, and the alpha-beta price of a trace.

Expected values are derived by hand in the comments, never copied from the code.
"""

import numpy as np
import pytest

import ringlab
from ringlab import Event, Trace
from ringlab.collectives import ring_allreduce
from ringlab.show.views import alpha_beta_time, holdings, holdings_table, step_bytes
from support.worlds import central_allreduce

F = frozenset


def ring_trace(n, length):
    return ringlab.run(ring_allreduce, [np.ones(length)] * n).trace


def test_ring_n2_by_hand():
    # N=2: chunks 0 and 1. Reference: at step k of reduce-scatter rank r sends
    # chunk (r - k) % N to the right and adds in chunk (r - k - 1) % N.
    # step 1 (reduce): 0 sends c0 {0} -> 1, so rank 1 c0 = {1} | {0} = {0,1}
    #                  1 sends c1 {1} -> 0, so rank 0 c1 = {0,1}
    # step 2 (copy, all-gather sends chunk (r + 1 - k)): 0 sends c1 {0,1} -> 1;
    #                  1 sends c0 {0,1} -> 0. Everyone complete.
    h = holdings(ring_trace(2, 4))
    assert len(h) == 3
    assert h[0] == {0: {0: F({0}), 1: F({0})}, 1: {0: F({1}), 1: F({1})}}
    assert h[1] == {0: {0: F({0}), 1: F({0, 1})}, 1: {0: F({0, 1}), 1: F({1})}}
    both = F({0, 1})
    assert h[2] == {0: {0: both, 1: both}, 1: {0: both, 1: both}}


def test_ring_n3_by_hand():
    # N=3, reduce-scatter (op reduce), rank r sends chunk (r - k) % 3 at step k+1:
    # step 1: 0:c0{0}->1, 1:c1{1}->2, 2:c2{2}->0
    #   rank1 c0={0,1}; rank2 c1={1,2}; rank0 c2={0,2}
    # step 2: 0:c2{0,2}->1, 1:c0{0,1}->2, 2:c1{1,2}->0
    #   rank1 c2={0,1,2}; rank2 c0={0,1,2}; rank0 c1={0,1,2}  (rank r: chunk r+1 complete)
    # all-gather (op copy), rank r sends chunk (r + 1 - k) % 3 at step 3+k:
    # step 3: 0:c1(all)->1, 1:c2(all)->2, 2:c0(all)->0
    #   rank0: c0 all, c1 all, c2 {0,2};  rank1: c0 {0,1}, c1 all, c2 all;
    #   rank2: c0 all, c1 {1,2}, c2 all
    # step 4: 0:c0->1, 1:c1->2, 2:c2->0  -> everything complete.
    h = holdings(ring_trace(3, 6))
    A = F({0, 1, 2})
    assert len(h) == 5
    assert h[1] == {0: {0: F({0}), 1: F({0}), 2: F({0, 2})},
                    1: {0: F({0, 1}), 1: F({1}), 2: F({1})},
                    2: {0: F({2}), 1: F({1, 2}), 2: F({2})}}
    assert h[2] == {0: {0: F({0}), 1: A, 2: F({0, 2})},
                    1: {0: F({0, 1}), 1: F({1}), 2: A},
                    2: {0: A, 1: F({1, 2}), 2: F({2})}}
    assert h[3] == {0: {0: A, 1: A, 2: F({0, 2})},
                    1: {0: F({0, 1}), 1: A, 2: A},
                    2: {0: A, 1: F({1, 2}), 2: A}}
    assert h[4] == {r: {c: A for c in range(3)} for r in range(3)}


def test_send_carries_the_state_before_its_step():
    # A chain 0 -> 1 -> 2 on chunk "a". If 1 forwards at step 1 (the same step
    # in which it receives from 0), it can only forward its own {1}; if it
    # forwards at step 2, it forwards {0, 1}.
    same = Trace([Event(1, 0, 1, "a", "reduce", 8), Event(1, 1, 2, "a", "reduce", 8)], 3)
    assert holdings(same)[1][2]["a"] == F({1, 2})
    assert holdings(same)[1][1]["a"] == F({0, 1})
    later = Trace([Event(1, 0, 1, "a", "reduce", 8), Event(2, 1, 2, "a", "reduce", 8)], 3)
    assert holdings(later)[1][2]["a"] == F({2})
    assert holdings(later)[2][2]["a"] == F({0, 1, 2})


def test_copy_replaces_and_reduce_unions():
    # Rank 2 starts with {2}. A copy from rank 0 makes it {0}: rank 2's own
    # contribution is gone. A reduce from rank 1 next step adds {1}: {0, 1}.
    t = Trace([Event(1, 0, 2, 0, "copy", 8), Event(2, 1, 2, 0, "reduce", 8)], 3)
    h = holdings(t)
    assert h[1][2][0] == F({0})
    assert h[2][2][0] == F({0, 1})
    assert h[2][0][0] == F({0}) and h[2][1][0] == F({1})     # senders keep theirs


def test_steps_without_messages_keep_the_state():
    t = Trace([Event(3, 0, 1, 0, "reduce", 8)], 2)
    h = holdings(t)
    assert len(h) == 4
    assert h[2] == h[0]
    assert h[3][1][0] == F({0, 1})


def test_unlabelled_message_is_a_clear_error():
    def unlabelled(comm, x):
        other = 1 - comm.rank
        return comm.sendrecv(x, other, other)   # no chunk=, no op=
    trace = ringlab.run(unlabelled, [np.ones(2)] * 2).trace
    with pytest.raises(ValueError, match=r"step 1 from rank 0 to rank 1 has chunk=None"):
        holdings(trace)
    with pytest.raises(ValueError, match="knows ops"):
        holdings(Trace([Event(1, 0, 1, 0, "max", 8)], 2))


def test_table_text_and_html():
    # N=2 after step 1 (see test_ring_n2_by_hand): rank 0 holds counts 1 2, rank 1 holds 2 1.
    table = holdings_table(ring_trace(2, 4))
    lines = str(table).splitlines()
    step1 = next(line for line in lines if line.startswith("1 "))
    assert "1 2*" in step1 and "2* 1" in step1 and "0→1 c0 reduce" in step1
    html = table._repr_html_()
    assert html.count("<tr>") == 1 + 3        # header + steps 0, 1, 2
    assert "ranks 0, 1" in html
    ranks = str(holdings_table(ring_trace(2, 4), show="ranks"))
    assert "{0} {0}" in ranks and "all all" in ranks


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_ring_price_matches_closed_form(n):
    # Each of the 2(N-1) steps moves one chunk of n_bytes/N per rank:
    # T = 2(N-1) alpha + 2(N-1)/N * n_bytes * beta (Patarasuk & Yuan 2009).
    length = 840                                # divisible by 2, 3, 4, 5, 8
    n_bytes = 8 * length
    trace = ring_trace(n, length)
    assert step_bytes(trace) == {s: n_bytes // n for s in range(1, 2 * (n - 1) + 1)}
    alpha, beta = 3.0, 0.25
    want = 2 * (n - 1) * alpha + 2 * (n - 1) / n * n_bytes * beta
    assert alpha_beta_time(trace, alpha, beta) == pytest.approx(want)


def test_central_reduction_price_by_hand():
    # Everyone sends its whole vector (v bytes) to rank 0, whose receive port
    # takes one per step (steps 1..N-1). Rank 0 then sends the sum to ranks
    # 1..N-1 one per step (steps N..2N-2): v each. T = 2(N-1) (alpha + v beta).
    n, v = 5, 8 * 10
    trace = ringlab.run(central_allreduce, [np.ones(10)] * n).trace
    assert step_bytes(trace) == {s: v for s in range(1, 2 * (n - 1) + 1)}
    assert alpha_beta_time(trace, 2.0, 0.5) == pytest.approx(2 * (n - 1) * (2.0 + v * 0.5))
