"""What the data-parallel graders read in a message: a chunk of the ranks' vectors,
summed over the right ranks, whether np.array_split cut it or the program's own ring."""

import numpy as np

from ringlab.grading.data_parallel._payloads import _partial_sum


def test_a_chunk_cut_otherwise_than_array_split_is_read_where_it_is():
    rng = np.random.default_rng(0)
    vectors = [rng.standard_normal(7) for _ in range(3)]
    # ceil(7 / 3) = 3 elements per chunk: [0:3], [3:6], [6:7]; array_split makes 3, 2, 2
    ceil_chunk = vectors[0][3:6] + vectors[2][3:6]
    assert _partial_sum(ceil_chunk, vectors, [0, 2], (1.0,)) == slice(3, 6)
    split_chunk = vectors[1][5:7]
    assert _partial_sum(split_chunk, vectors, [1], (1.0,)) == slice(5, 7)
    assert _partial_sum(ceil_chunk, vectors, [0, 1], (1.0,)) is None      # wrong ranks
    assert _partial_sum(ceil_chunk / 3, vectors, [0, 2], (1.0, 1 / 3)) == slice(3, 6)
    assert _partial_sum(ceil_chunk.astype(np.float32), vectors, [0, 2], (1.0,)) is None
