"""Who holds what in tensor parallelism, read off the shards the library gives a rank.

Each function takes one rank's layer(s), as ``from_linear`` / ``from_mlp`` /
``from_attention`` / ``from_block`` built them inside a run, and returns the
``ringlab.show.ownership.Piece`` list that ``plot_who_holds_what`` draws: the
columns or rows of each weight the shard holds (its ``columns`` / ``rows``),
and which part of the activations it sees. Nothing is typed by hand, so Part
3's pictures are the library's split. Each piece's text is its index range
(``"4-7"``); the column names say of what.

    >>> import numpy as np, ringlab
    >>> from ringlab.nn import Linear
    >>> from ringlab.tensor_parallel import ColumnParallelLinear
    >>> fc = Linear(8, 16, np.random.default_rng(0))
    >>> res = ringlab.run(lambda comm, _: ColumnParallelLinear.from_linear(fc, comm), [0] * 4)
    >>> index_pieces("W", res.outputs[1].columns, 16)
    [Piece(tensor='W', start=0.25, stop=0.5, kind='parameters', text='4-7')]
"""

import numpy as np

from ..show.ownership import Piece
from .sequence import reduce_scatter_sequence


def index_pieces(tensor, indices, n, kind="parameters"):
    """The pieces of ``tensor`` (``n`` long) made of ``indices``: one per contiguous
    run, ``[first/n, (last+1)/n)``, its text ``"first-last"``."""
    idx = np.unique(np.asarray(indices, dtype=int))
    if idx.size == 0 or idx[0] < 0 or idx[-1] >= n:
        raise ValueError(f"{tensor}: indices must be in range({n}), got {indices!r}")
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    return [Piece(tensor, float(run[0] / n), float((run[-1] + 1) / n), kind,
                  f"{run[0]}" if len(run) == 1 else f"{run[0]}-{run[-1]}")
            for run in np.split(idx, breaks)]


def whole(tensor, kind="activations", text="whole"):
    """A tensor every rank holds all of."""
    return Piece(tensor, 0, 1, kind, text)


def _n(comm, local):
    return comm.world_size * local           # Megatron's shards are equal


def linear_pieces(col, row, names=("X", "W: cols", "Y: cols", "X: cols", "W: rows", "Y")):
    """A ``ColumnParallelLinear`` ``col`` (X whole, W and Y by columns) and a
    ``RowParallelLinear`` ``row`` (X by columns, W by rows, Y whole after g's
    AllReduce), one rank's shards; ``names`` of the six columns."""
    n_col, n_row = _n(col.comm, len(col.columns)), _n(row.comm, len(row.rows))
    return [whole(names[0]), *index_pieces(names[1], col.columns, n_col),
            *index_pieces(names[2], col.columns, n_col, "activations"),
            *index_pieces(names[3], row.rows, n_row, "activations"),
            *index_pieces(names[4], row.rows, n_row), whole(names[5])]


def mlp_pieces(mlp, names=("X", "A", "GeLU(XA)", "B", "Y")):
    """A ``ParallelMLP``: X whole, A by columns, its hidden units of GeLU(XA),
    the same rows of B, Y whole after g's AllReduce."""
    n = _n(mlp.comm, len(mlp.fc.columns))
    return [whole(names[0]), *index_pieces(names[1], mlp.fc.columns, n),
            *index_pieces(names[2], mlp.fc.columns, n, "activations"),
            *index_pieces(names[3], mlp.proj.rows, n), whole(names[4])]


def attention_pieces(attn, names=("X", "q", "k", "v", "$W_O$", "Y")):
    """A ``ParallelAttention``: X whole; its heads' columns of each third
    (q, k, v) of the fused QKV weight, labelled by head; the same heads' rows
    of the output projection W_O; Y whole after g's AllReduce."""
    dim = _n(attn.comm, len(attn.proj.rows))          # the model width, h
    hd = attn.head_dim
    out = [whole(names[0])]
    for part, name in enumerate(names[1:4]):
        cols = attn.qkv.columns[(attn.qkv.columns >= part * dim)
                                & (attn.qkv.columns < (part + 1) * dim)] - part * dim
        out += _as_heads(index_pieces(name, cols, dim), hd)
    return out + _as_heads(index_pieces(names[4], attn.proj.rows, dim), hd) + [whole(names[5])]


def _as_heads(pieces, hd):
    """Relabel column pieces by the heads they hold (head j: columns j*hd ...)."""
    out = []
    for p in pieces:
        first, last = (int(x) for x in p.text.split("-")) if "-" in p.text else \
            (int(p.text),) * 2
        heads = (first // hd, last // hd)
        text = f"{heads[0]}" if heads[0] == heads[1] else f"{heads[0]}-{heads[1]}"
        out.append(Piece(p.tensor, p.start, p.stop, p.kind, text))
    return out


def sequence_tokens(comm, s):
    """The tokens (of ``s``) this rank holds in the sequence-parallel regions,
    as the library's ReduceScatter over the sequence leaves them."""
    ids = np.arange(s, dtype=float).reshape(1, s, 1)
    return np.rint(reduce_scatter_sequence(comm, ids).ravel() / comm.world_size).astype(int)


def sequence_parallel_pieces(block, tokens, s,
                             names=("x: tokens", "attn: heads", "MLP: hidden", "LN weights")):
    """A ``ParallelTransformerBlock`` built with ``sequence_parallel=True``, and
    ``tokens`` (``sequence_tokens``) of ``s``: the activations of the LayerNorm,
    dropout and residual regions by tokens (every feature), those of attention
    by heads and of the MLP by hidden units (every token), and the LayerNorm
    weights, which every rank holds whole."""
    H = _n(block.comm, len(block.attn.heads))
    n_hidden = _n(block.comm, len(block.mlp.fc.columns))
    heads = index_pieces(names[1], list(block.attn.heads), H, "activations")
    return [*index_pieces(names[0], tokens, s, "activations"), *heads,
            *index_pieces(names[2], block.mlp.fc.columns, n_hidden, "activations"),
            whole(names[3], "parameters")]
