"""Who holds which tokens: a sequence of s tokens split over c context-parallel ranks.

Each rank holds n = s/c tokens of every sequence. Which ones is the *layout*:

* ``"contiguous"``: rank r holds tokens r*n .. (r+1)*n - 1. Under a causal
  mask rank r's queries see r full key blocks and half of its own: rank c-1
  does about (2c-1)/c, nearly twice, the average work, and everyone waits for it.
* ``"zigzag"``: cut the sequence into 2c chunks of n/2 tokens; rank r holds
  chunks r and 2c-1-r, one early and one late (Llama 3, section 3.3.2: "The
  i-th CP rank received both the i-th and the (2 x CP - 1 - i)-th chunks").
  Every rank then does the same causal work (see ``blockwise.causal_pairs``).

Positions, not order, carry the meaning: a rank's block lists its tokens'
positions in the sequence, and causality compares positions.

    >>> positions("contiguous", 1, c=4, n=4).tolist()
    [4, 5, 6, 7]
    >>> [positions("zigzag", r, c=4, n=4).tolist() for r in range(4)]
    [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]
    >>> import numpy as np
    >>> x = np.arange(8)
    >>> blocks = [shard(x, r, 2, "zigzag") for r in range(2)]
    >>> [b.tolist() for b in blocks], unshard(blocks, "zigzag").tolist()
    ([[0, 1, 6, 7], [2, 3, 4, 5]], [0, 1, 2, 3, 4, 5, 6, 7])
"""

import numpy as np

LAYOUTS = ("contiguous", "zigzag")


def positions(layout, rank, c, n):
    """The sequence positions of ``rank``'s n tokens when c ranks split the sequence."""
    if layout == "contiguous":
        return np.arange(rank * n, (rank + 1) * n)
    if layout == "zigzag":
        if n % 2:
            raise ValueError(f"the zig-zag layout gives each rank two chunks of n/2 tokens: "
                             f"n = {n} tokens per rank must be even")
        h = n // 2
        early, late = rank, 2 * c - 1 - rank
        return np.concatenate([np.arange(early * h, (early + 1) * h),
                               np.arange(late * h, (late + 1) * h)])
    raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")


def gathered_positions(layout, c, n):
    """The positions of every rank's n tokens, rank after rank: what a block
    gathered from all c ranks (in rank order) holds.

    >>> gathered_positions("zigzag", c=2, n=2).tolist()
    [0, 3, 1, 2]
    """
    return np.concatenate([positions(layout, r, c, n) for r in range(c)])


def shard(x, rank, c, layout, axis=0):
    """``rank``'s tokens of ``x`` (the whole sequence along ``axis``)."""
    s = x.shape[axis]
    if s % c:
        raise ValueError(f"{c} context-parallel ranks cannot split {s} tokens evenly")
    return np.take(x, positions(layout, rank, c, s // c), axis=axis)


def unshard(blocks, layout, axis=0):
    """The whole sequence from every rank's block (in rank order): ``shard``'s inverse."""
    c, n = len(blocks), blocks[0].shape[axis]
    shape = list(blocks[0].shape)
    shape[axis] = c * n
    out = np.empty(shape, dtype=blocks[0].dtype)
    for r, block in enumerate(blocks):
        index = [slice(None)] * len(shape)
        index[axis] = positions(layout, r, c, n)
        out[tuple(index)] = block
    return out
