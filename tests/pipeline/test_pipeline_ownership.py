"""Part 4's who-holds-what pieces say what a real pipeline run holds: each rank's
layer pieces are the layers whose gradients it returns, stage 0's rank has the
inputs and the last stage's the targets, and the activations are its peak."""

import numpy as np
import pytest

from ringlab.nn import mlp_model
from ringlab.pipeline import gpipe, interleaved_1f1b, one_f_one_b, run_pipeline, zb_h1
from ringlab.pipeline.ownership import pipeline_pieces

SCHEDULES = {"gpipe": lambda p, m, v: gpipe(p, m), "1f1b": lambda p, m, v: one_f_one_b(p, m),
             "interleaved": interleaved_1f1b, "zb_h1": lambda p, m, v: zb_h1(p, m)}


@pytest.mark.parametrize("name, p, m, v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1),
                                           ("1f1b", 3, 5, 1), ("interleaved", 4, 8, 2),
                                           ("zb_h1", 2, 4, 1)])
def test_pieces_are_what_each_rank_of_the_run_holds(name, p, m, v):
    sched = SCHEDULES[name](p, m, v)
    model = mlp_model([4] * (v * p + 1), np.random.default_rng(0))
    rng = np.random.default_rng(1)
    batch = rng.normal(size=(2 * m, 4)), rng.normal(size=(2 * m, 4))
    res = run_pipeline(model, batch, sched)
    held = pipeline_pieces(model, batch, sched, peak_held=res.peak_held)
    linear = [i for i, layer in enumerate(model.layers) if layer.params]   # Sequential index
    for r, out in enumerate(res.outputs):
        layers = [p_ for p_ in held[r] if p_.tensor.startswith("layers")]
        covered = [linear[k] for piece in layers
                   for k in range(round(piece.start * len(linear)),
                                  round(piece.stop * len(linear)))]
        assert sorted(covered) == sorted({int(g.split(".")[0]) for g in out.grads})
        assert [piece.text for piece in layers] == [str(s) for s in range(r, v * p, p)]
        batch_text = [piece.text for piece in held[r] if piece.tensor == "batch"]
        assert batch_text == (["inputs"] if r == 0 else []) + (["targets"] if r == p - 1 else [])
        act, = [piece for piece in held[r] if piece.tensor == "activations (peak)"]
        assert act.text == f"{res.peak_held[r]} of {v * m}"
        assert act.stop == res.peak_held[r] / (v * m)
    # every layer is on exactly one rank
    spans = sorted((piece.start, piece.stop) for ps in held.values() for piece in ps
                   if piece.tensor.startswith("layers"))
    assert spans[0][0] == 0 and spans[-1][1] == 1
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
