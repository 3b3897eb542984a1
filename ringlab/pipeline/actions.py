"""A pipeline schedule as data: for each rank, the ordered list of what it computes.

An ``Action`` is one computation on one microbatch:

* ``F``: the forward of microbatch ``mb`` through model stage ``stage``;
* ``B``: its backward (with zero-bubble schedules, only the input gradient);
* ``W``: the weight gradient (zero-bubble schedules split it from ``B``).

Stages are the model's pieces, in order: stage 0 holds the first layers.
Without interleaving rank r holds stage r; with v model chunks per rank
(interleaved 1F1B) stage s lives on rank ``s % p``, so rank r holds stages
r, r + p, ..., r + (v - 1) p (Megatron-LM's placement).

The communication is implied, never written: ``F`` of stage s > 0 needs the
activation that ``F`` of stage s - 1 produced; ``B`` of stage s < last needs
the gradient that ``B`` of stage s + 1 produced.

Text form, as torch.distributed.pipelining prints it: ``"2F3"`` is stage 2's
forward of microbatch 3.

    >>> a = Action("F", 3, stage=2)
    >>> str(a), parse("2F3 2B3") == [a, Action("B", 3, 2)]
    ('2F3', True)
    >>> needs(Action("B", 0, stage=1), n_stages=4)
    ('gradient', 2)
"""

from dataclasses import dataclass

KINDS = ("F", "B", "W")


@dataclass(frozen=True, order=True)
class Action:
    """``kind`` ("F", "B" or "W") of microbatch ``mb`` on model stage ``stage``."""

    kind: str
    mb: int
    stage: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"action kind {self.kind!r}: expected one of {', '.join(KINDS)}")
        if self.mb < 0 or self.stage < 0:
            raise ValueError(f"{self}: microbatch and stage are numbered from 0")

    def __str__(self):
        return f"{self.stage}{self.kind}{self.mb}"


def parse(text):
    """``"0F0 0F1 0B0"`` -> a list of Actions (one rank's schedule)."""
    out = []
    for word in text.split():
        for i, ch in enumerate(word):
            if ch in KINDS:
                out.append(Action(ch, int(word[i + 1:]), int(word[:i] or 0)))
                break
        else:
            raise ValueError(f"{word!r} is not an action like '2F3' (stage, F/B/W, microbatch)")
    return out


def stage_rank(stage, world_size):
    """The rank that holds model stage ``stage`` (interleaved: stages loop over ranks)."""
    return stage % world_size


def needs(action, n_stages):
    """What ``action`` must receive before it runs: ("activation" | "gradient",
    from stage), or None (the first stage's F, the last stage's B, every W)."""
    if action.kind == "F" and action.stage > 0:
        return ("activation", action.stage - 1)
    if action.kind == "B" and action.stage < n_stages - 1:
        return ("gradient", action.stage + 1)
    return None


def sends(action, n_stages):
    """What ``action`` produces for another stage: ("activation" | "gradient",
    to stage), or None."""
    if action.kind == "F" and action.stage < n_stages - 1:
        return ("activation", action.stage + 1)
    if action.kind == "B" and action.stage > 0:
        return ("gradient", action.stage - 1)
    return None


def format_schedule(schedule):
    """One line per rank: ``rank 0: 0F0 0F1 0B0 ...``."""
    return "\n".join(f"rank {r}: " + " ".join(map(str, acts)) for r, acts in enumerate(schedule))
