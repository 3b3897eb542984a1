"""ringlab.show.player: the layout chosen for a trace, the data handed to the
JavaScript, and the self-contained HTML. (The JavaScript itself runs in
tests/show/test_browser.py.) Expected values are derived by hand in comments."""

import json
import re
from importlib import resources

import numpy as np
import pytest

import ringlab
from ringlab import Event, Trace
from ringlab.collectives import binomial_broadcast, ring_allreduce
from ringlab.show.player import TracePlayer, infer_layout, layout, player_data
from support.worlds import computes_and_groups


def ring(n, length=8):
    return ringlab.run(ring_allreduce, [np.ones(length)] * n).trace


def reduce_to_root(comm, x):      # every rank sends to rank 0: a star, a tree rooted at 0
    if comm.rank:
        comm.send(x, 0, chunk=0, op="reduce")
        return None
    for r in range(1, comm.world_size):
        x = x + comm.recv(r)
    return x


def alltoall(comm, x):
    n = comm.world_size
    for k in range(1, n):
        comm.send(x, (comm.rank + k) % n)
        comm.recv((comm.rank - k) % n)
    return x


def test_infer_layout():
    assert infer_layout(ring(4)) == "ring"
    assert infer_layout(ring(2)) == "ring"
    pipeline = Trace([Event(s, r, r + 1) for s, r in ((1, 0), (2, 1), (3, 2))], 4)
    assert infer_layout(pipeline) == "line"
    assert infer_layout(ringlab.run(binomial_broadcast, [np.ones(2)] + [None] * 7, args=(0,)).trace) == "tree"
    assert infer_layout(ringlab.run(reduce_to_root, [np.ones(2)] * 5).trace) == "tree"
    assert infer_layout(ringlab.run(alltoall, [np.ones(2)] * 5).trace) == "circle"
    assert infer_layout(Trace([], 3)) == "ring"


def test_positions():
    # ring: rank 0 at the top, clockwise on screen (y down): rank 1 of 4 on the right
    pos = layout(ring(4))["positions"]
    assert [tuple(map(float, p)) for p in pos] == [(0, -1), (1, 0), (0, 1), (-1, 0)]
    # binomial tree of 8 ranks: 0 -> 1, 2, 4; 1 -> 3, 5; 2 -> 6; 3 -> 7 (parent = i
    # with its top bit cleared). Depths: 0; 1, 2, 4 at 1; 3, 5, 6 at 2; 7 at 3.
    tree = layout(ringlab.run(binomial_broadcast, [np.ones(2)] + [None] * 7, args=(0,)).trace)
    assert tree["kind"] == "tree"
    depth = [p[1] for p in tree["positions"]]
    assert depth == [0, 1, 1, 2, 1, 2, 2, 3]
    x = [p[0] for p in tree["positions"]]
    assert x[3] == x[7]                       # 7 is 3's only child: right below it
    assert x[1] == (x[3] + x[5]) / 2          # parents centred over their children
    assert sorted(map(tuple, tree["links"])) == [(0, 1), (0, 2), (0, 4), (1, 3), (1, 5), (2, 6), (3, 7)]
    with pytest.raises(ValueError, match="tree"):
        layout(ring(4), "tree")
    with pytest.raises(ValueError, match="layout must be one of"):
        layout(ring(4), "spiral")


def test_player_data_events_and_holdings_n3():
    trace = ring(3, 6)
    data = player_data(trace)
    assert (data["worldSize"], data["steps"], data["chunks"], data["ops"]) == (3, 4, ["0", "1", "2"],
                                                                             ["copy", "reduce"])
    # step 1 of the ring: rank r sends chunk r to r+1, op reduce (index 1), 16 bytes
    assert [e for e in data["events"] if e[0] == 1] == [[1, r, (r + 1) % 3, r, 1, 16, 0] for r in range(3)]
    # Replay the changes as the JavaScript does and decode the bit masks.
    h = data["holdings"]
    assert h["mode"] == "detail"
    state, sets = list(h["start"]), []
    for changed in h["changes"]:
        for r, c, mask in changed:
            state[r * 3 + c] = mask
        sets.append([[{b for b in range(3) if int(state[r * 3 + c], 16) >> b & 1} for c in range(3)]
                     for r in range(3)])
    # by hand (see tests/show/test_views.py): after step 1 rank 0's chunk 2 = {0, 2},
    # rank 1's chunk 0 = {0, 1}, rank 2's chunk 1 = {1, 2}; after step 4 all complete.
    assert sets[0] == [[{r} for _ in range(3)] for r in range(3)]
    assert sets[1] == [[{0}, {0}, {0, 2}], [{0, 1}, {1}, {1}], [{2}, {1, 2}, {2}]]
    assert sets[4] == [[{0, 1, 2}] * 3] * 3


def test_aggregate_mode_for_big_worlds():
    # Beyond detail_limit ranks: held[s][r] = contributions summed over chunks.
    # Ring N=3: start 3 (own in each chunk); after step 1 one chunk has 2: 4;
    # after step 2 (reduce-scatter done) 1 + 2 + 3 = 6; step 3 completes the chunk
    # that held 1: 3 + 2 + 3 = 8; step 4 the one that held 2: 9.
    data = player_data(ring(3, 6), detail_limit=2)
    assert data["holdings"] == {"mode": "aggregate", "held": [[3] * 3, [4] * 3, [6] * 3, [8] * 3, [9] * 3]}


def test_unlabelled_trace_shows_messages_only():
    data = player_data(ringlab.run(alltoall, [np.ones(2)] * 3).trace)
    assert data["holdings"] is None and "chunk=" in data["note"]
    assert all(e[3] == -1 and e[4] == -1 for e in data["events"])


def test_html_is_self_contained_and_safe(tmp_path):
    def program(comm, x):
        with comm.span("</script><b>oops"):        # must not end the inline script
            return ring_allreduce(comm, x)
    trace = ringlab.run(program, [np.ones(4)] * 2).trace
    one, two = trace.show()._repr_html_(), trace.show()._repr_html_()
    assert one.count("</script>") == 1
    ids = re.findall(r'id="(ringlab-player-[^"]+)"', one) + re.findall(r'id="(ringlab-player-[^"]+)"', two)
    assert len(ids) == 2 and ids[0] != ids[1]
    payload = one.split("RinglabPlayer.mount(", 1)[1].split(", ", 1)[1].rsplit(");", 1)[0]
    assert json.loads(payload)["spans"] == ["</script><b>oops/ring_allreduce"]
    page = trace.save_html(tmp_path / "p.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "RinglabPlayer" in page
    # offline: nothing loaded from elsewhere
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page)
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page


def test_assets_are_package_data():
    js = resources.files("ringlab.show.player").joinpath("player.js").read_text()
    assert "RinglabPlayer" in js and "</script" not in js
    assert ".ringlab-player" in resources.files("ringlab.show.player").joinpath("player.css").read_text()


def test_trace_methods():
    trace = ring(2)
    assert isinstance(trace.show(), TracePlayer)
    assert "ring_allreduce" in repr(trace.show())
    assert trace.show(layout="circle").data["layout"]["kind"] == "circle"
    with pytest.raises(ValueError, match="filter"):
        player_data(Trace([Event(1, 0, 1, seq=i) for i in range(50_001)], 2))


def test_computes_and_groups_in_player_data():
    # Pairs (0, 1) and (2, 3) each all-reduce in their own group, between two computes.
    # With no network the ring of 2 takes steps 1 and 2; "forward" runs at step 0,
    # "optimizer" after the last message, at step 2.
    trace = ringlab.run(computes_and_groups, [np.ones(4)] * 4).trace
    data = player_data(trace)
    assert data["computeLabels"] == ["forward", "optimizer"]
    assert sorted(data["computes"]) == sorted([0, r, 0, 1e-3, 0] for r in range(4)) + sorted(
        [2, r, 1, 2e-3, 0] for r in range(4))
    assert data["groups"] == ["dp[0]", "dp[1]"]
    assert [data["groups"][g] for g in data["eventGroups"]] == [
        "dp[0]" if e.src < 2 else "dp[1]" for e in trace]
    # the whole world's messages: -1; a group named by its ranks: "0,1"
    plain = player_data(ring(2))
    assert plain["eventGroups"] == [-1] * len(ring(2)) and plain["groups"] == []

    def unnamed(comm, x):
        g = comm.new_group([0, 1])
        return ring_allreduce(g, x) if g else x
    assert player_data(ringlab.run(unnamed, [np.ones(2)] * 3).trace)["groups"] == ["0,1"]


# -- an unlabelled run, coloured by what its payloads carried --------------------------

def unlabelled_ring_allreduce(comm, x):       # ring_allreduce without chunk=/op=
    n, r = comm.world_size, comm.rank
    chunks = np.array_split(x.copy(), n)
    for k in range(n - 1):
        chunks[(r - k - 1) % n] += comm.sendrecv(chunks[(r - k) % n], (r + 1) % n, (r - 1) % n)
    for k in range(n - 1):
        chunks[(r - k) % n][...] = comm.sendrecv(chunks[(r + 1 - k) % n], (r + 1) % n, (r - 1) % n)
    return np.concatenate(chunks)


def unlabelled_ring_allgather(comm, x):
    n, r = comm.world_size, comm.rank
    blocks = [None] * n
    blocks[r] = x
    for k in range(n - 1):
        blocks[(r - k - 1) % n] = comm.sendrecv(blocks[(r - k) % n], (r + 1) % n, (r - 1) % n)
    return np.concatenate(blocks)


def random_inputs(n, length):
    return [np.random.default_rng(r).random(length) for r in range(n)]


def decoded(data):
    """Per step, per rank, per chunk: the set of ranks, replayed as the JavaScript does."""
    h, k = data["holdings"], len(data["chunks"])
    state, out = list(h["start"]), []
    for changed in h["changes"]:
        for r, c, mask in changed:
            state[r * k + c] = mask
        out.append([[{b for b in range(data["worldSize"]) if int(state[r * k + c], 16) >> b & 1}
                     for c in range(k)] for r in range(data["worldSize"])])
    return out


def test_unlabelled_ring_allreduce_reads_like_the_reference():
    # The same program with and without labels: the player must show the same
    # chunks, ops and holdings (N=4, 10 elements: np.array_split's chunks 3, 3, 2, 2).
    inputs = random_inputs(4, 10)
    res = ringlab.run(unlabelled_ring_allreduce, inputs, record_payloads=True)
    assert all(e.chunk is None for e in res.trace)
    assert player_data(res.trace)["holdings"] is None             # labels only: nothing to colour
    data = res.show(inputs).data
    ref = player_data(ringlab.run(ring_allreduce, inputs).trace)
    assert data["chunks"] == ref["chunks"] == ["0", "1", "2", "3"]
    assert data["ops"] == ref["ops"] == ["copy", "reduce"]
    assert [e[:5] for e in data["events"]] == [e[:5] for e in ref["events"]]
    assert decoded(data) == decoded(ref)
    # What each message carried: step 1, rank r's own chunk r; step 2, rank 0 passes
    # on chunk 3 = rank 3's + its own; from step 4 on only complete chunks travel.
    assert data["carried"][0] == ["1", [0]]
    step2_from0 = next(i for i, e in enumerate(res.trace) if (e.step, e.src) == (2, 0))
    assert data["carried"][step2_from0] == [format(0b1001, "x"), [3]]
    assert all(c[0] == "f" for c, e in zip(data["carried"], res.trace) if e.step >= 4)
    assert data["note"] == ""


def test_unlabelled_ring_allgather_shows_whose_block():
    inputs = random_inputs(4, 3)
    res = ringlab.run(unlabelled_ring_allgather, inputs, record_payloads=True)
    c = ringlab.show.contributions(res, inputs)
    assert c.mode == "copy" and c.chunks == [0, 1, 2, 3] and c.note == ""
    # ring: at step k rank r passes on block (r - k + 1): rank r's own at step 1
    assert [(e.step, e.src, sorted(carried[1])) for e, carried in zip(res.trace, c.carried)] == [
        (e.step, e.src, [(e.src - e.step + 1) % 4]) for e in res.trace]
    data = res.trace.show(contributions=c).data
    assert data["ops"] == ["copy"] and data["contributionMode"] == "copy"
    steps = decoded(data)
    # at the start rank r holds only its own block; the other slots are empty
    assert steps[0] == [[{r} if k == r else set() for k in range(4)] for r in range(4)]
    assert steps[-1] == [[{k} for k in range(4)]] * 4               # every block everywhere


def test_contributions_need_payloads_and_different_inputs():
    res = ringlab.run(unlabelled_ring_allreduce, [np.ones(4)] * 2)
    with pytest.raises(ValueError, match="record_payloads"):
        ringlab.show.contributions(res, [np.ones(4)] * 2)
    # identical inputs: rank 0's chunk cannot be told from rank 1's, so no message is read
    res = ringlab.run(unlabelled_ring_allreduce, [np.ones(4)] * 2, record_payloads=True)
    c = ringlab.show.contributions(res, [np.ones(4)] * 2)
    assert c.note and all(x is None for x in c.carried)
    res.show([np.ones(4)] * 2).html()                               # still a player, with a note
