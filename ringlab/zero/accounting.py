"""The ZeRO paper's bookkeeping: memory per device and communication per step.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models" (SC 2020). Mixed-precision Adam keeps, per parameter,
2 bytes of fp16 parameters, 2 bytes of fp16 gradients and K = 12 bytes of
optimizer state (fp32 master weights, momentum and variance, 4 bytes each)
(Section 3.1). With Ψ parameters and N_d data-parallel devices (Section 5,
Figure 1):

=============  ===================  ==================
stage          bytes per device     Ψ = 7.5e9, N_d = 64
=============  ===================  ==================
DP             (2 + 2 + K) Ψ        120 GB
P_os (ZeRO-1)  2Ψ + 2Ψ + KΨ/N_d     31.4 GB
P_os+g (2)     2Ψ + (2 + K)Ψ/N_d    16.6 GB
P_os+g+p (3)   (2 + 2 + K)Ψ/N_d     1.9 GB
=============  ===================  ==================

The paper's GB is 10^9 bytes: 16 x 7.5e9 = 120e9 bytes is 120 GB, but only
111.8 GiB. Activations, buffers and fragmentation come on top.

    >>> [round(memory_per_device(s, 7.5e9, 64) / GB, 1) for s in STAGES]
    [120.0, 31.4, 16.6, 1.9]

Communication (Section 7), in the paper's unit, numbers (elements) sent per
device per step: data parallelism's AllReduce is a ReduceScatter plus an
AllGather, Ψ each, 2Ψ in all; ZeRO-1 and ZeRO-2 do the same two collectives
(on gradients, then on parameters): 2Ψ; ZeRO-3 AllGathers the parameters
twice (forward and backward) and ReduceScatters the gradients: 3Ψ, 1.5x. The
paper rounds: on a ring each collective sends exactly (N-1)/N Ψ per device.

    >>> elements_sent_per_device("dp", 60, 4), elements_sent_per_device("zero3", 60, 4)
    (90.0, 135.0)
    >>> elements_sent_per_device("dp", 60, 4, exact=False)
    120
"""

GB = 10**9        # the paper's unit: Figure 1's numbers come out in 1e9 bytes, not GiB
K_ADAM = 12       # fp32 master weights + momentum + variance: 4 + 4 + 4 bytes a parameter

STAGES = ("dp", "zero1", "zero2", "zero3")
NAMES = {"dp": "DP", "zero1": "P_os", "zero2": "P_os+g", "zero3": "P_os+g+p"}


def _check(stage):
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")


def memory_per_device(stage, psi, n_d, k=K_ADAM, param_bytes=2, grad_bytes=2):
    """Bytes of model states per device: parameters, gradients and ``k`` bytes of
    optimizer state per parameter, each replicated or divided by ``n_d``."""
    _check(stage)
    params = param_bytes * psi / (n_d if stage == "zero3" else 1)
    grads = grad_bytes * psi / (n_d if stage in ("zero2", "zero3") else 1)
    optim = k * psi / (n_d if stage != "dp" else 1)
    return params + grads + optim


def elements_sent_per_device(stage, psi, n, exact=True):
    """Numbers each device sends per training step with ring collectives:
    2 (dp, zero1, zero2) or 3 (zero3) collectives of ``psi`` numbers, each
    sending (n-1)/n of them (``exact=False``: the paper's rounded Ψ each)."""
    _check(stage)
    collectives = 3 if stage == "zero3" else 2
    return collectives * psi * ((n - 1) / n if exact else 1)


def table(psi=7.5e9, n_d=64, k=K_ADAM):
    """Figure 1's rows: ``[(name, bytes per device), ...]``."""
    return [(NAMES[s], memory_per_device(s, psi, n_d, k)) for s in STAGES]
