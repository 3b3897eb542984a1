"""How long one matrix multiplication takes on one GPU: a roofline with tile and waves.

A GEMM ``C[m, n] = A[m, k] B[k, n]`` does ``2 m n k`` FLOPs and moves at least
``m k + k n + m n`` elements through HBM. A GPU's GEMM library cuts C into
tiles and gives each streaming multiprocessor (SM) one tile at a time, so the
tiles run in *waves* of ``sms``. Two things waste work: a tile that hangs over
the edge of C computes padding (tile quantization) and the last wave may not
fill every SM (wave quantization). With the tile the library picks (the best
of 256 x 128, 128 x 256 and 128 x 128), the fraction of the GPU doing useful
work is

    q = m n / (waves * sms * tile_m * tile_n),    waves = ceil(tiles / sms)

and the time is the larger of the two roofs:

    time = max(2 m n k / (peak * efficiency * q),  bytes / (hbm_bw * hbm_efficiency))

``efficiency`` is what the library reaches on a well-shaped matmul, a
measurement, not a fit: ``presets`` takes Bekman's "maximum achievable matmul
FLOPS" (MAMF). NVIDIA's "Matrix multiplication background" guide describes
the same two quantization effects; real libraries also pick among more tile
shapes and split K for skinny matrices, which this model does not.

    >>> from ringlab.analysis.config import Hardware
    >>> a100 = Hardware(sms=108, peak_flops=312e12, efficiency=0.869)
    >>> round(wave_quantization(2048, 6912, a100), 3)      # 16 x 27 = 432 tiles: 4 waves
    1.0
    >>> round(wave_quantization(2048, 1536, a100), 3)      # 96 tiles on 108 SMs
    0.889
"""

from __future__ import annotations

import math

TILES = ((256, 128), (128, 256), (128, 128))


def wave_quantization(m, n, hardware, batch=1):
    """q in (0, 1]: the useful share of the SM-tile slots, with the best tile."""
    best = 0.0
    for tm, tn in TILES:
        tiles = math.ceil(m / tm) * math.ceil(n / tn) * batch
        waves = math.ceil(tiles / hardware.sms)
        best = max(best, m * n * batch / (waves * hardware.sms * tm * tn))
    return best


def gemm_seconds(m, n, k, hardware, batch=1, fp8=False, itemsize=2):
    """Seconds of ``batch`` GEMMs of m x k times k x n on one GPU. In FP8 the inputs
    are 1 byte and the output 16-bit; else every operand is ``itemsize`` bytes."""
    if min(m, n, k, batch) <= 0:
        return 0.0
    flops = 2 * m * n * k * batch
    if fp8:
        peak, eff, ins = hardware.fp8_flops, hardware.fp8_efficiency, 1
    else:
        peak, eff, ins = hardware.peak_flops, hardware.efficiency, itemsize
    compute = flops / (peak * eff * wave_quantization(m, n, hardware, batch))
    moved = batch * ((m * k + k * n) * ins + m * n * itemsize)
    return max(compute, moved / (hardware.hbm_bw * hardware.hbm_efficiency))


def linear_seconds(m, n, k, hardware, fp8=False, itemsize=2):
    """A linear layer Y[m, n] = X[m, k] W[k, n]: ``(forward, input gradient, weight
    gradient)`` seconds. The backward's two matmuls have other shapes:
    dX[m, k] = dY[m, n] W^T and dW[k, n] = X^T[k, m] dY[m, n]."""
    return (gemm_seconds(m, n, k, hardware, fp8=fp8, itemsize=itemsize),
            gemm_seconds(m, k, n, hardware, fp8=fp8, itemsize=itemsize),
            gemm_seconds(k, n, m, hardware, fp8=fp8, itemsize=itemsize))


def memory_seconds(nbytes, hardware):
    """A memory-bound kernel that reads and writes ``nbytes`` in all."""
    return nbytes / (hardware.hbm_bw * hardware.hbm_efficiency)
