"""The whole-trace figures (ringlab.show.figures, second half): the data each one is
drawn from, checked against values derived by hand from the ring algorithm,
and the figures themselves checked to draw exactly that data."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import ringlab  # noqa: E402
from ringlab import Event, Trace  # noqa: E402
from ringlab.collectives import ring_allreduce  # noqa: E402
from ringlab.show.figures import bytes_by_rank, holdings_grid, plot_bytes_sent, plot_holdings_grid, plot_spacetime, spacetime_arrows
from ringlab.show.timeline import AlphaBeta  # noqa: E402


def ring(n, length):
    return ringlab.run(ring_allreduce, [np.ones(length)] * n).trace


def ring_counts_by_hand(n):
    """counts[r][s][c] for the ring AllReduce, from the algorithm's definition:
    reduce-scatter step j (1..N-1): rank r receives chunk (r - j) % N carrying
    ranks r-j..r-1, so it then holds j + 1 contributions, and is never touched
    again in that phase. All-gather step N-1+k (k = 1..N-1): rank r receives
    chunk (r - k + 1) % N complete. Everything else stays at 1 (own only)."""
    steps = 2 * (n - 1)
    counts = np.ones((n, steps + 1, n), dtype=int)
    for r in range(n):
        for s in range(1, steps + 1):
            for j in range(1, min(s, n - 1) + 1):
                counts[r, s, (r - j) % n] = j + 1
            for k in range(1, s - (n - 1) + 1):
                counts[r, s, (r - k + 1) % n] = n
    return counts


@pytest.mark.parametrize("n", [2, 3, 4, 6])
def test_holdings_grid_matches_the_ring_by_hand(n):
    counts, chunks = holdings_grid(ring(n, 2 * n))
    assert chunks == list(range(n))
    assert counts.shape == (n, 2 * (n - 1) + 1, n)
    np.testing.assert_array_equal(counts, ring_counts_by_hand(n))


def test_holdings_grid_n3_spelled_out():
    # The N=3 case written out (rank r's chunks 0, 1, 2 after each step), as in
    # tests/show/test_views.py: after step 2 rank r has chunk r+1 complete.
    counts, _ = holdings_grid(ring(3, 6))
    assert counts[:, 1].tolist() == [[1, 1, 2], [2, 1, 1], [1, 2, 1]]
    assert counts[:, 2].tolist() == [[1, 3, 2], [2, 1, 3], [3, 2, 1]]
    assert counts[:, 3].tolist() == [[3, 3, 2], [2, 3, 3], [3, 2, 3]]
    assert counts[:, 4].tolist() == [[3, 3, 3]] * 3


def test_holdings_grid_needs_labels():
    with pytest.raises(ValueError, match="chunk="):
        holdings_grid(Trace([Event(1, 0, 1)], 2))


def test_spacetime_arrows_default_and_alpha_beta():
    trace = ring(3, 6)
    arrows = spacetime_arrows(trace)
    assert len(arrows) == 2 * 3 * 2                # 2(N-1) steps, N messages each
    for a in arrows:                                # ring: always to the right neighbour
        assert a["dst"] == (a["src"] + 1) % 3
        assert (a["t0"], a["t1"]) == (a["step"] - 1, a["step"])
        assert a["op"] == ("reduce" if a["step"] <= 2 else "copy")
    # Alpha-beta: 6 float64 over 3 chunks = 16 bytes a message; every step costs
    # alpha + 16 beta, so step s starts at (s - 1)(alpha + 16 beta).
    alpha, beta = 2.0, 0.25
    for a in spacetime_arrows(trace, AlphaBeta(alpha, beta)):
        assert a["t0"] == pytest.approx((a["step"] - 1) * (alpha + 16 * beta))
        assert a["t1"] - a["t0"] == pytest.approx(alpha + 16 * beta)


def test_bytes_by_rank_split_by_span():
    # Ring AllReduce of 12 float64 on N=3: each rank sends 2(N-1) = 4 chunks of
    # 4 values = 32 bytes: 128 bytes. Then rank 0 sends 5 float64 outside any span.
    def program(comm, x):
        y = ring_allreduce(comm, x)
        if comm.rank == 0:
            comm.send(np.zeros(5), 1)
        if comm.rank == 1:
            comm.recv(0)
        return y
    trace = ringlab.run(program, [np.ones(12)] * 3).trace
    assert bytes_by_rank(trace) == {"": [40, 0, 0], "ring_allreduce": [128, 128, 128]}


def test_plots_draw_the_data():
    trace = ring(4, 8)
    fig = plot_holdings_grid(trace)
    image = fig.axes[0].images[0].get_array()
    counts, _ = holdings_grid(trace)
    np.testing.assert_array_equal(image, counts.transpose(0, 2, 1).reshape(16, 7))
    summed = plot_holdings_grid(trace, per_chunk=False).axes[0].images[0].get_array()
    np.testing.assert_array_equal(summed, counts.sum(axis=2))

    fig = plot_spacetime(trace)
    quivers = fig.axes[0].collections
    assert sum(q.N for q in quivers) == len(trace) == 24
    ends = np.concatenate([q.X + q.U for q in quivers])
    assert sorted(ends) == sorted(float(e.step) for e in trace)

    # the legend names the ops; never "None" (book/start/world.md's relay sends without labels)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["copy", "reduce"]
    relay = Trace([Event(s, s - 1, s) for s in (1, 2, 3)], 4)
    assert plot_spacetime(relay).axes[0].get_legend() is None
    mixed = Trace([Event(1, 0, 1, chunk=0, op="copy"), Event(2, 1, 2)], 3)
    assert [t.get_text() for t in plot_spacetime(mixed).axes[0].get_legend().get_texts()] == [
        "copy", "no op="]

    fig = plot_bytes_sent(trace)
    heights = [p.get_height() for p in fig.axes[0].patches]
    # 8 float64 in 4 chunks: 16 bytes a message, 6 messages a rank: 96 sent and received.
    assert heights == [96] * 8
    plt.close("all")
