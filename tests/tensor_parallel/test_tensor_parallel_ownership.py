"""Part 3's who-holds-what pieces say what the shards of a real run hold: each
weight piece is exactly the block of the unsharded weight the rank keeps, the
ranks' pieces tile the tensor, and the sequence-parallel tokens are the ones the
block takes."""

import numpy as np
import pytest

import ringlab
from ringlab.nn import MLP, CausalSelfAttention, Linear, TransformerBlock
from ringlab.show.ownership import held_fraction
from ringlab.tensor_parallel import (ColumnParallelLinear, ParallelAttention, ParallelMLP,
                                     ParallelTransformerBlock, RowParallelLinear)
from ringlab.tensor_parallel.ownership import (attention_pieces, index_pieces, linear_pieces,
                                               mlp_pieces, sequence_parallel_pieces,
                                               sequence_tokens)


def by_rank(program, t):
    res = ringlab.run(lambda comm, _: program(comm), [None] * t)
    return res.outputs


def block_of(pieces, tensor, n):
    """The indices the pieces of ``tensor`` cover, from their fractions."""
    return [i for p in pieces if p.tensor == tensor
            for i in range(round(p.start * n), round(p.stop * n))]


def tiles(holdings, tensor):
    spans = sorted((p.start, p.stop) for ps in holdings.values() for p in ps
                   if p.tensor == tensor)
    return spans[0][0] == 0 and spans[-1][1] == 1 and \
        all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_index_pieces_are_the_contiguous_runs():
    assert [(p.start, p.stop, p.text) for p in index_pieces("W", [5, 0, 1, 2, 7], 8)] == \
        [(0.0, 0.375, "0-2"), (0.625, 0.75, "5"), (0.875, 1.0, "7")]
    with pytest.raises(ValueError, match=r"in range\(4\)"):
        index_pieces("W", [4], 4)


@pytest.mark.parametrize("t", [2, 4])
def test_linear_pieces_are_the_shards_weights(t):
    fc, proj = Linear(8, 16, np.random.default_rng(0)), Linear(16, 8, np.random.default_rng(1))
    outs = by_rank(lambda c: (ColumnParallelLinear.from_linear(fc, c),
                              RowParallelLinear.from_linear(proj, c)), t)
    h = {r: linear_pieces(col, row) for r, (col, row) in enumerate(outs)}
    for r, (col, row) in enumerate(outs):
        cols, rows = block_of(h[r], "W: cols", 16), block_of(h[r], "W: rows", 16)
        assert np.array_equal(fc.params["weight"][:, cols], col.params["weight"])
        assert np.array_equal(proj.params["weight"][rows], row.params["weight"])
        assert block_of(h[r], "Y: cols", 16) == cols and block_of(h[r], "X: cols", 16) == rows
        assert held_fraction(h, r, "X") == held_fraction(h, r, "Y") == 1
    assert all(tiles(h, name) for name in ("W: cols", "Y: cols", "X: cols", "W: rows"))


def test_mlp_pieces_pair_a_columns_with_b_rows():
    mlp = MLP(8, 32, np.random.default_rng(0))
    outs = by_rank(lambda c: ParallelMLP.from_mlp(mlp, c), 4)
    h = {r: mlp_pieces(o) for r, o in enumerate(outs)}
    for r, o in enumerate(outs):
        a = block_of(h[r], "A", 32)
        assert np.array_equal(mlp.fc.params["weight"][:, a], o.fc.params["weight"])
        assert block_of(h[r], "B", 32) == block_of(h[r], "GeLU(XA)", 32) == a
        assert np.array_equal(mlp.proj.params["weight"][a], o.proj.params["weight"])
    assert [p.text for p in h[3] if p.tensor == "A"] == ["24-31"]


def test_attention_pieces_are_the_heads_in_each_third_of_qkv():
    attn = CausalSelfAttention(dim=8, n_heads=4, rng=np.random.default_rng(0))
    outs = by_rank(lambda c: ParallelAttention.from_attention(attn, c), 2)
    h = {r: attention_pieces(o) for r, o in enumerate(outs)}
    for r, o in enumerate(outs):
        cols = [part * 8 + i for part, name in enumerate("qkv") for i in block_of(h[r], name, 8)]
        assert np.array_equal(attn.qkv.params["weight"][:, cols], o.qkv.params["weight"])
        rows = block_of(h[r], "$W_O$", 8)
        assert np.array_equal(attn.proj.params["weight"][rows], o.proj.params["weight"])
        want = f"{o.heads.start}-{o.heads.stop - 1}"
        assert {p.text for p in h[r] if p.tensor in ("q", "k", "v", "$W_O$")} == {want}
    assert want == "2-3"


def test_sequence_parallel_tokens_are_the_ones_the_block_takes():
    s, t = 12, 4
    block = TransformerBlock(24, 12, 96, np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((2, s, 24))

    def program(comm):
        layer = ParallelTransformerBlock.from_block(block, comm, sequence_parallel=True)
        tokens = sequence_tokens(comm, s)
        return layer, tokens, layer.forward(x[:, tokens])

    outs = by_rank(program, t)
    y_ref = block.forward(x)
    h = {r: sequence_parallel_pieces(layer, tokens, s)
         for r, (layer, tokens, _) in enumerate(outs)}
    for r, (layer, tokens, y) in enumerate(outs):
        assert list(tokens) == list(range(r * s // t, (r + 1) * s // t))
        assert np.allclose(y, y_ref[:, tokens], rtol=0, atol=1e-12)
        assert block_of(h[r], "attn: heads", 12) == list(layer.attn.heads)
        assert block_of(h[r], "MLP: hidden", 96) == list(layer.mlp.fc.columns)
    assert all(tiles(h, name) for name in ("x: tokens", "attn: heads", "MLP: hidden"))
