"""Who holds what in a pipeline, read off the library's own stage split.

``pipeline_pieces`` asks ``stage_works`` (what ``run_pipeline`` gives each
rank) which stages each rank holds, and returns the
``ringlab.show.ownership.Piece`` lists that ``plot_who_holds_what`` draws: the
model's layers with parameters, each stage's labelled with its number; the
batch (stage 0's rank holds the inputs, the last stage's the targets); and,
given a run's ``peak_held``, the most microbatch states each rank kept at once
for a backward, out of all it could (m per stage it holds).

    >>> import numpy as np
    >>> from ringlab.nn import mlp_model
    >>> from ringlab.pipeline import gpipe
    >>> model = mlp_model([4] * 5, np.random.default_rng(0))       # 4 Linear layers
    >>> batch = np.zeros((8, 4)), np.zeros((8, 4))
    >>> held = pipeline_pieces(model, batch, gpipe(4, 8), peak_held=[8, 8, 8, 8])
    >>> [(p.tensor, p.text) for p in held[3]]
    [('layers, by stage', '3'), ('batch', 'targets'), ('activations (peak)', '8 of 8')]
    >>> held[3][0]
    Piece(tensor='layers, by stage', start=0.75, stop=1.0, kind='parameters', text='3')
"""

from ..show.ownership import Piece
from .stages import stage_works


def pipeline_pieces(model, batch, schedule, *, peak_held=None,
                    names=("layers, by stage", "batch", "activations (peak)")):
    """``{rank: [Piece, ...]}`` for ``schedule`` (one action list per rank) run on
    ``model`` and ``batch``, as ``run_pipeline`` would split them; ``peak_held``
    (optional, one count per rank, e.g. ``PipelineResult.peak_held``) adds the
    activations column."""
    works = stage_works(model, batch, schedule)
    m = 1 + max(a.mb for acts in schedule for a in acts)
    # Each stage's layers with parameters, in model order: their index among all such.
    heavy = {s: [first + i for i, layer in enumerate(seq.layers) if layer.params]
             for w in works for s, (first, seq) in w.stages.items()}
    order = sorted(i for layers in heavy.values() for i in layers)
    n = len(order)
    out = {}
    for r, w in enumerate(works):
        pieces = [Piece(names[0], order.index(heavy[s][0]) / n,
                        (order.index(heavy[s][-1]) + 1) / n, "parameters", str(s))
                  for s in sorted(w.stages)]
        data = [what for what, held in (("inputs", w.inputs), ("targets", w.targets))
                if held is not None]
        if data:
            pieces.append(Piece(names[1], 0, 1, "data", " + ".join(data)))
        if peak_held is not None and peak_held[r]:
            most = m * len(w.stages)
            pieces.append(Piece(names[2], 0, peak_held[r] / most, "activations",
                                f"{peak_held[r]} of {most}"))
        out[r] = pieces
    return out
