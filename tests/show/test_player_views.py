"""The player's views of a strategy (ringlab.show.player.strategy): the data handed to
the JavaScript, checked against the trace it came from. (The drawing itself:
tests/show/test_browser.py.) Expected values derived by hand in comments."""

import json

import numpy as np
import pytest

import ringlab
from ringlab.collectives import ring_allreduce, tree_allreduce
from ringlab.show.player import memory_frames, player_data
from ringlab.show.player.strategy import part_text
from support import strategies
from support.worlds import computes_and_groups


def replay(memory, steps, n):
    """frames[step][rank] = {label: bytes} from the view's deltas, as player.js sums them."""
    held = [dict() for _ in range(n)]
    frames = []
    for s in range(steps + 1):
        for step, r, k, b in memory["deltas"]:
            if step == s:
                label = memory["labels"][k]
                held[r][label] = held[r].get(label, 0) + b
        frames.append([{k: v for k, v in h.items() if v} for h in held])
    return frames


def test_zero3_memory_view():
    trace = strategies.zero3()
    data = player_data(trace)
    assert data["views"] == ["messages", "lanes", "memory"] and data["view"] == "memory"
    mem = data["memory"]
    assert mem["labels"] == ["params.full", "grads.full"]
    assert mem["colours"] == ["#aec7e8", "#ffbb78"]               # as show.memory draws them
    frames = memory_frames(trace)
    assert replay(mem, trace.steps, 4) == frames
    # Units of 40 and 20 (18 + 2 padding) float64s: 320 and 160 bytes gathered.
    # Step 0: unit 0 gathered; its AllGather ends at step 3, unit "2"'s prefetch starts
    # and unit 0 is freed: 160; backward re-gathers unit 0 (prefetch, step 9) while unit
    # "2" computes its full gradient: 480 + 160, the peak; after the last
    # ReduceScatter (step 18) everything full is freed.
    assert [frames[s][0] for s in (0, 3, 9, 18)] == [
        {"params.full": 320}, {"params.full": 160}, {"params.full": 480, "grads.full": 160}, {}]
    assert frames[9][0] == trace.memory_by_label(0)                # the peak, as the trace says
    assert mem["peak"] == [trace.peak_memory(r) for r in range(4)] == [640] * 4
    assert mem["max"] == 640


def test_memory_view_equals_memory_by_label_at_every_event():
    """A timed run (network, compute times): after each step, what a rank holds is what
    trace.memory_by_label says at the time of its last memory event of that step."""
    trace = strategies.zero3_timed()
    frames = memory_frames(trace)
    assert replay(player_data(trace)["memory"], trace.steps, 4) == frames
    checked = 0
    for r in range(4):
        mine = [m for m in trace.memory if m.rank == r]
        for m, after in zip(mine, mine[1:] + [None]):
            if after is None or after.step > m.step:               # the last event of its step
                assert frames[m.step][r] == trace.memory_by_label(r, time=m.time)
                checked += 1
    assert checked > 8
    # Held for the whole run: this rank's shards, 10 + 5 float64s each of params,
    # grads, adam.m and adam.v: 120 bytes each (zero3.py's docstring).
    assert {k: v for k, v in frames[0][0].items() if ".full" not in k} == {
        "params": 120, "grads": 120, "adam.m": 120, "adam.v": 120}


def test_pipeline_lanes():
    trace = strategies.gpipe()
    data = player_data(trace)
    assert data["views"] == ["messages", "lanes"] and data["view"] == "lanes" and data["memory"] is None
    lanes = data["lanes"]
    assert lanes["rows"] == [[r, 0, 1] for r in range(4)]          # one lane per stage, no streams
    assert lanes["time"] and lanes["cursor"] is None and lanes["end"] == 33.0   # (m + p - 1) * 3 s
    # One box per action (its span "2F3" is the same box: drawn once), at its compute.
    assert len(lanes["items"]) == len(trace.computes) == 4 * 8 * 2
    boxes = sorted((lanes["rows"][it[0]][0], it[2], it[3], it[4], lanes["texts"][it[7]]) for it in lanes["items"])
    assert boxes == sorted((c.rank, c.start, c.end, c.step, str(c.get("mb"))) for c in trace.computes)
    # Rank 3's first forward starts at 3 s, after the activation of step 3;
    # forward boxes are the light shade of the microbatch colour, backward the colour.
    first = min((b for b in boxes if b[0] == 3), key=lambda b: b[1])
    assert first == (3, 3.0, 4.0, 3, "0")
    colour = {(lanes["rows"][it[0]][0], it[2]): lanes["colours"][it[6]] for it in lanes["items"]}
    assert colour[0, 0.0] == "#9eb5cf" and colour[3, 11.0] == "#4e79a7"   # mb 0: F (45% white), B
    assert [t for _, t in lanes["legend"]] == ["F forward, number: microbatch", "B backward, number: microbatch"]


def test_ddp_bucket_lanes():
    trace = strategies.ddp()
    lanes = player_data(trace)["lanes"]
    assert player_data(trace)["view"] == "lanes"
    assert lanes["rows"] == [[r, s, 1] for r in range(4) for s in (0, 1)]   # the program, the comm stream
    texts = {}
    for it in lanes["items"]:
        rank, stream = lanes["rows"][it[0]][:2]
        title = lanes["titles"][it[8]]
        texts.setdefault((rank, stream), []).append((it[2], lanes["texts"][it[7]], title))
    # Backward runs the last layer (10) first; buckets hold two layers each: layers 10
    # and 8 fill b0, 6 and 4 b1, 2 and 0 b2, whose AllReduces run on stream 1 in order.
    backward = [t for _, t, title in sorted(texts[0, 0]) if "backward" in title]
    assert backward == ["b0", "b0", "b1", "b1", "b2", "b2"]
    assert [t for _, t, _ in sorted(texts[0, 1])] == ["b0", "b1", "b2"]
    # Bucket 0's AllReduce starts the moment the backward that completes it ends (the
    # stream is free); the next ones start once it is free again, after their last layer.
    ends = [c.end for c in trace.computes if c.rank == 0 and c.label == "backward"]
    starts = sorted(x for x, _, _ in texts[0, 1])
    assert starts[0] == pytest.approx(ends[1], rel=1e-6)
    assert ends[3] < starts[1] < ends[4] and ends[5] <= starts[2] * (1 + 1e-9)
    # The cursor: when step s's last message ended, then the end of the run.
    cursor = lanes["cursor"]
    assert cursor[0] == 0 and cursor == sorted(cursor) and cursor[-1] == pytest.approx(trace.time)
    assert cursor[1] == pytest.approx(max(e.end for e in trace.at_step(1)))


def test_tensor_parallel_lanes_and_parts():
    trace, outputs = strategies.tp_attention()
    data = player_data(trace, parts=outputs)
    lanes = data["lanes"]
    assert data["view"] == "lanes"
    assert lanes["rows"] == [[0, 0, 2], [1, 0, 2]]                  # region above, its AllReduce below
    items = sorted((lanes["rows"][it[0]][0], it[1], lanes["texts"][it[7]], it[4], it[5]) for it in lanes["items"])
    # forward's AllReduce (g) is steps 1-2, backward's (f) steps 3-4: lit there.
    assert [i for i in items if i[0] == 0] == [(0, 0, "tp.attention.backward", 3, 4),
                                               (0, 0, "tp.attention.forward", 1, 2),
                                               (0, 1, "AR", 1, 2), (0, 1, "AR", 3, 4)]
    # Rank 0 holds heads 0, 1: qkv columns 0-3 (q), 8-11 (k), 16-19 (v).
    assert lanes["parts"] == ["heads 0–1; qkv columns 0–3, 8–11, 16–19",
                              "heads 2–3; qkv columns 4–7, 12–15, 20–23"]
    assert part_text("rows 4-7") == "rows 4-7" and part_text(np.arange(3)) == "0–2"
    with pytest.raises(ValueError, match="one text per rank: 2, got 1"):
        player_data(trace, parts=["heads 0–1"])


def test_learner_run_gets_the_same_views():
    """A learner's FSDP loop (no library strategy code): memory first; its lanes show
    its named regions above their AllGathers and ReduceScatters, and its computes."""
    trace = strategies.learner()
    data = player_data(trace)
    assert data["views"] == ["messages", "lanes", "memory"] and data["view"] == "memory"
    frames = memory_frames(trace)
    # 4 ranks x 16 B shards: a full layer is 64 B. Forward gathers one layer at a time;
    # backward holds its parameters and its full gradient together: 128 B, the peak.
    assert max(sum(f[0].values()) for f in frames) == 128 == data["memory"]["peak"][0]
    assert replay(data["memory"], trace.steps, 4) == frames
    lanes = data["lanes"]
    assert lanes["rows"] == [[r, 0, 2] for r in range(4)]
    regions = [lanes["texts"][it[7]] for it in lanes["items"] if it[0] == 0 and it[1] == 0
               and lanes["colours"][it[6]] == "#d9d9d9"]
    assert regions == ["layer0.forward", "layer1.forward", "layer1.backward", "layer0.backward"]


def test_learner_pipeline_lanes():
    """A learner's GPipe loop (computes labelled "forward"/"backward" with mb=): the lanes
    colour its microbatches as run_pipeline's. p = 3, m = 4: rank 2's first forward
    after the activation's 2 steps, at 2 s; the last backward ends at (m + p - 1) 3 s = 18 s."""
    trace = strategies.learner_pipeline()
    data = player_data(trace)
    assert data["view"] == "lanes"
    lanes = data["lanes"]
    boxes = sorted((lanes["rows"][it[0]][0], it[2], it[3], it[4], lanes["texts"][it[7]],
                    lanes["colours"][it[6]]) for it in lanes["items"])
    assert min(b for b in boxes if b[0] == 2)[:5] == (2, 2.0, 3.0, 2, "0")
    assert lanes["end"] == 18.0
    colour = {(b[0], b[1]): b[5] for b in boxes}
    assert colour[0, 0.0] == "#9eb5cf"                           # mb 0's forward, as in the GPipe run
    assert colour[2, 6.0] == "#4e79a7"                           # rank 2's backward of mb 0


def test_default_view_and_view_option():
    ring = ringlab.run(ring_allreduce, [np.ones(8)] * 4).trace
    assert player_data(ring)["views"] == ["messages"]              # one collective: nothing more to show
    assert player_data(ring)["lanes"] is None and player_data(ring)["memory"] is None
    tree = ringlab.run(tree_allreduce, [np.ones(8)] * 4).trace     # nested spans, but all a collective's
    assert player_data(tree)["views"] == ["messages", "lanes"] and player_data(tree)["view"] == "messages"
    groups = ringlab.run(computes_and_groups, [np.ones(4)] * 4).trace
    assert player_data(groups)["view"] == "messages"
    zero3 = strategies.zero3()
    assert player_data(zero3, view="lanes")["view"] == "lanes"
    with pytest.raises(ValueError, match=r"view='memory': this trace has the views \['messages'\]"):
        player_data(ring, view="memory")
    with pytest.raises(ValueError, match="views are"):
        player_data(zero3, view="heads")
    assert ringlab.run(ring_allreduce, [np.ones(8)] * 4).trace.show().data["view"] == "messages"


def test_too_many_boxes_leave_the_lanes_out(monkeypatch):
    from ringlab.show.player import strategy
    trace = strategies.zero3()                   # 24 spans
    monkeypatch.setattr(strategy, "MAX_ITEMS", 23)
    data = player_data(trace)
    assert data["views"] == ["messages", "memory"] and data["lanes"] is None


def test_sizes_stay_small():
    """A view's data only when the trace has it; the book-sized runs stay a few kB."""
    sizes = {}
    for name in ("zero3", "gpipe", "ddp", "learner"):
        sizes[name] = len(json.dumps(player_data(getattr(strategies, name)()), separators=(",", ":")))
    sizes["tp"] = len(json.dumps(player_data(strategies.tp_attention()[0]), separators=(",", ":")))
    assert max(sizes.values()) < 15_000, sizes
