"""Pipeline schedules: for each rank, the order in which it runs its actions.

A schedule is a list with one list of ``Action``s per rank (see ``actions``).
``p`` is the number of ranks (pipeline stages), ``m`` the number of
microbatches. Each generator has a per-rank form (``gpipe_stage(r, p, m)``)
and a whole-pipeline form (``gpipe(p, m)``); the per-rank forms are the
reference answers of the exercises.

    >>> print(format_schedule(one_f_one_b(2, 3)))
    rank 0: 0F0 0F1 0B0 0F2 0B1 0B2
    rank 1: 1F0 1B0 1F1 1B1 1F2 1B2

The pictures (``validate.picture``) run each action as soon as its rank is
free and its input exists, every action taking one unit of time: one column
per unit, ``F0`` the forward and ``B0`` the backward of microbatch 0, ``.``
where the rank waits.
"""

from ..answers import answer
from .actions import Action, format_schedule
from .validate import picture  # draws the schedules in the docstrings

__all__ = [
    "format_schedule", "gpipe", "gpipe_stage", "interleaved_1f1b", "interleaved_1f1b_rank",
    "one_f_one_b", "one_f_one_b_stage", "zb_h1", "zb_h1_stage",
]


def _check(r, p, m):
    if p < 1 or m < 1:
        raise ValueError(f"need at least one stage and one microbatch, got p={p}, m={m}")
    if not 0 <= r < p:
        raise ValueError(f"rank {r} does not exist: ranks are 0 to {p - 1}")


def gpipe_stage(r, p, m):
    """GPipe on stage ``r``: every forward, then every backward (Huang et al. 2019).

    >>> print(picture(gpipe(3, 4)))
    rank 0: F0 F1 F2 F3 .  .  .  .  B0 B1 B2 B3
    rank 1: .  F0 F1 F2 F3 .  .  B0 B1 B2 B3 .
    rank 2: .  .  F0 F1 F2 F3 B0 B1 B2 B3 .  .

    Stage r holds the activations of all m microbatches before its first
    backward: peak memory grows with m. Each rank waits (p - 1)(t_f + t_b):
    the bubble is (p - 1) / m of the compute.

    >>> [str(a) for a in gpipe_stage(1, p=2, m=2)]
    ['1F0', '1F1', '1B0', '1B1']
    """
    _check(r, p, m)
    return [Action("F", i, r) for i in range(m)] + [Action("B", i, r) for i in range(m)]


def gpipe(p, m):
    """The GPipe schedule of all ``p`` ranks (see ``gpipe_stage``)."""
    return [gpipe_stage(r, p, m) for r in range(p)]


@answer('one_f_one_b')
def one_f_one_b_stage(r, p, m):
    """1F1B on stage ``r`` (PipeDream-Flush; Narayanan et al. 2021, section 2.2.1).

    Warm-up: ``p - 1 - r`` forwards. Steady state: one forward, then one
    backward, until every forward has run. Cool-down: the remaining backwards.

    >>> print(picture(one_f_one_b(3, 4)))
    rank 0: F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3
    rank 1: .  F0 F1 .  B0 F2 B1 F3 B2 .  B3 .
    rank 2: .  .  F0 B0 F1 B1 F2 B2 F3 B3 .  .

    A backward frees its microbatch's activations, so stage r never holds
    more than ``p - r`` microbatches (at most ``m``), whatever m is. The bubble
    is GPipe's, (p - 1) / m of the compute.

    >>> [str(a) for a in one_f_one_b_stage(0, p=2, m=3)]
    ['0F0', '0F1', '0B0', '0F2', '0B1', '0B2']
    """
    _check(r, p, m)
    warmup = min(p - 1 - r, m)
    order = [Action("F", i, r) for i in range(warmup)]
    for i in range(warmup, m):  # forward of microbatch i, backward of the oldest one
        order += [Action("F", i, r), Action("B", i - warmup, r)]
    order += [Action("B", i, r) for i in range(m - warmup, m)]
    return order


@answer('one_f_one_b')
def one_f_one_b(p, m):
    """The 1F1B schedule of all ``p`` ranks (see ``one_f_one_b_stage``)."""
    return [one_f_one_b_stage(r, p, m) for r in range(p)]


@answer('one_f_one_b')
def interleaved_1f1b_rank(r, p, m, v):
    """Interleaved 1F1B on rank ``r`` with ``v`` model chunks per rank
    (Narayanan et al. 2021, section 2.2.2, Figure 4; Megatron-LM's order).

    The model is cut into ``v * p`` stages; rank r holds stages r, r + p, ...,
    r + (v - 1) p. The rank runs ``v * m`` forwards: microbatches go through
    its chunks in groups of p (chunk 0 for microbatches 0..p-1, chunk 1 for the
    same p, ..., then chunk 0 for the next p). Backwards visit the chunks in
    the opposite order. ``m`` must be a multiple of ``p`` so that the groups of
    p come out even: Megatron-LM's rule with its default group size
    (``microbatch_group_size_per_vp_stage = p``).

    Warm-up: ``(v - 1) p + 2 (p - 1 - r)`` forwards (at most ``v m``), then one
    forward and one backward in turn, then the remaining backwards.
    Megatron-LM before November 2024 (but not torch, nor Megatron since) put
    everything in the warm-up when m = p; we follow torch's
    ``ScheduleInterleaved1F1B``, which does not.

    >>> print(picture(interleaved_1f1b(p=2, m=2, v=2)))  # sFi: stage s, microbatch i
    rank 0: 0F0 0F1 2F0 2F1 .   2B0 .   2B1 0B0 0B1
    rank 1: .   1F0 1F1 3F0 3B0 3F1 3B1 1B0 1B1 .

    Each chunk is 1/v of a stage, so the pipeline fills and drains v times
    faster: the bubble shrinks to (p - 1) / (v m) of the compute.

    >>> [str(a) for a in interleaved_1f1b_rank(1, p=2, m=2, v=2)]
    ['1F0', '1F1', '3F0', '3B0', '3F1', '3B1', '1B0', '1B1']
    """
    _check(r, p, m)
    if v < 1:
        raise ValueError(f"need at least one model chunk per rank, got v={v}")
    if m % p:
        raise ValueError(f"interleaved 1F1B needs the number of microbatches to be a multiple of "
                         f"the number of ranks (Megatron's rule): m={m} is not a multiple of p={p}")
    total = v * m

    def microbatch(k):  # k-th forward (or backward) of this rank: which microbatch
        return (k // (p * v)) * p + k % p

    forwards = [Action("F", microbatch(k), ((k // p) % v) * p + r) for k in range(total)]
    backwards = [Action("B", microbatch(k), (v - 1 - (k // p) % v) * p + r) for k in range(total)]
    warmup = min((v - 1) * p + 2 * (p - 1 - r), total)
    order = forwards[:warmup]
    for k in range(warmup, total):
        order += [forwards[k], backwards[k - warmup]]
    return order + backwards[total - warmup:]


@answer('one_f_one_b')
def interleaved_1f1b(p, m, v):
    """The interleaved 1F1B schedule of all ``p`` ranks (see ``interleaved_1f1b_rank``)."""
    return [interleaved_1f1b_rank(r, p, m, v) for r in range(p)]


def zb_h1_stage(r, p, m):
    """ZB-H1 on stage ``r`` (Qi et al. 2023, "Zero Bubble Pipeline Parallelism",
    arXiv:2311.15214, section 3.1, Figure 3; the order of ``ZeroBubbleH1Pipeline``
    in the authors' code).

    The backward is split in two: ``B`` computes the gradient of the input
    (the next stage down waits for it), ``W`` the gradient of the weights
    (nobody waits for it). ZB-H1 is 1F1B with some ``W``s moved later into
    the bubbles: stage r runs ``p - 1 - r`` warm-up forwards, then ``r`` rounds
    of F B (postponing their W), then F B W rounds, then B W rounds, then the
    r postponed W's.

    >>> print(picture(zb_h1(3, 4)))
    rank 0: F0 F1 F2 .  .  B0 W0 F3 B1 W1 B2 W2 B3 W3
    rank 1: .  F0 F1 .  B0 F2 B1 W0 F3 B2 W1 B3 W2 W3
    rank 2: .  .  F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3

    A microbatch's activations are held until its W. Stage r holds at most
    p of them, as many as 1F1B's first stage: the peak memory of 1F1B. With
    m >= p each rank waits (p - 1)(t_f + t_b - t_w) in all (when t_w <= t_f),
    against (p - 1)(t_f + t_b + t_w) for 1F1B: a third of it when F, B and W
    take the same time.

    >>> [str(a) for a in zb_h1_stage(1, p=2, m=2)]
    ['1F0', '1B0', '1F1', '1B1', '1W0', '1W1']
    """
    _check(r, p, m)
    f = b = w = 0  # next microbatch to forward, to backward, to weight-gradient
    order = []

    def run(*kinds):
        nonlocal f, b, w
        for kind in kinds:
            order.append(Action(kind, {"F": f, "B": b, "W": w}[kind], r))
            f, b, w = f + (kind == "F"), b + (kind == "B"), w + (kind == "W")

    for _ in range(min(p - 1 - r, m)):
        run("F")
    for _ in range(r):  # postpone r weight gradients
        if f < m:
            run("F", "B")
    while f < m:
        run("F", "B", "W")
    while b < m:
        run("B", "W")
    while w < m:
        run("W")
    return order


def zb_h1(p, m):
    """The ZB-H1 schedule of all ``p`` ranks (see ``zb_h1_stage``)."""
    return [zb_h1_stage(r, p, m) for r in range(p)]
