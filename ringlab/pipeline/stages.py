"""Pipeline stages on ranks: a model cut into consecutive pieces, and the
program each rank runs to execute its part of a schedule.

``split_model`` cuts a ``Sequential`` into stages; ``pipeline_stage`` is one
rank's program: it walks its action list, receiving activations (F) and
gradients (B) from the neighbouring stages, and returns its gradients.
``run_pipeline`` does both and runs every rank; ``unpipelined`` computes, in one
process, what any schedule must give (the reference its grader compares with):

    >>> import numpy as np
    >>> from ringlab.nn import mlp_model
    >>> from ringlab.pipeline import parse
    >>> model = mlp_model([4, 8, 8, 2], np.random.default_rng(0))
    >>> x, y = np.random.default_rng(1).normal(size=(6, 4)), np.zeros((6, 2))
    >>> gpipe = [parse("0F0 0F1 0B1 0B0"), parse("1F0 1F1 1B1 1B0")]
    >>> res = run_pipeline(model, (x, y), gpipe, t_f=1, t_b=1, t_w=1)
    >>> list(res.grads), res.time              # B does the whole backward: t_b + t_w
    (['0.weight', '0.bias', '2.weight', '2.bias', '4.weight', '4.bias'], 9.0)
    >>> [str(e.span) for e in res.trace]       # each message: the action that sent it
    ['0F0', '0F1', '1B1', '1B0']
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..runner import run
from ..answers import answer
from ..nn import Linear, Sequential, mse
from .actions import needs, sends, stage_rank


# -- the model, cut ---------------------------------------------------------------------------

def split_model(model, n_stages):
    """Cut a ``Sequential`` into ``n_stages`` consecutive ``(first_layer, Sequential)``.

    Every stage gets the same number of layers with parameters (give or take
    one, the first stages taking the extra), and a layer without parameters
    (GeLU) stays with the layer before it. The stages share the model's layers.
    """
    if not isinstance(model, Sequential):
        raise TypeError(f"split_model needs a ringlab.nn.Sequential, got {type(model).__name__}")
    heavy = [i for i, layer in enumerate(model.layers) if layer.params]
    if not 1 <= n_stages <= len(heavy):
        raise ValueError(f"cannot cut a model with {len(heavy)} layers with parameters into "
                         f"{n_stages} stages: each stage needs at least one such layer")
    # Stage k starts at its first heavy layer; the first stage also takes any leading
    # parameter-free layers.
    starts = [0] + [heavy[int(c[0])] for c in np.array_split(np.arange(len(heavy)), n_stages)[1:]]
    ends = starts[1:] + [len(model.layers)]
    return [(a, Sequential(*model.layers[a:b])) for a, b in zip(starts, ends)]


def whole_name(first, name):
    """A stage's parameter name as the whole model names it, from the index of
    the stage's first layer: "1.weight" of a stage that starts at layer 2 is
    "3.weight".

    >>> whole_name(2, "1.weight")
    '3.weight'
    """
    return f"{first + int(name.split('.', 1)[0])}.{name.split('.', 1)[1]}"


class Unpipelined(NamedTuple):
    """``unpipelined``'s answers: ``grads`` of the whole batch, each microbatch's
    (``per_microbatch``, whole-model names), every message's payload (``messages``:
    ``{("activation" | "gradient", boundary s, microbatch): array}``, boundary s
    between stages s and s + 1) and the ``stages`` (``split_model``'s, of a copy)."""

    grads: dict
    per_microbatch: list
    messages: dict
    stages: list


# The reference the grader compares a stage program with: no tool for the program itself.
@answer('pipeline_stage')
def unpipelined(model, batch, n_stages, m):
    """What a pipeline of ``n_stages`` stages must compute on ``batch = (x, y)`` in
    ``m`` microbatches (``np.array_split``'s), computed in one process without a
    schedule: the whole model's mse gradients on the whole batch, and, stage by
    stage, each microbatch's forward and backward (its loss weighted by its share
    of the rows), with the activation and the gradient that cross each stage
    boundary. ``model`` is copied. -> ``Unpipelined``

    >>> from ringlab.nn import mlp_model
    >>> from ringlab.pipeline import parse
    >>> model = mlp_model([4, 8, 8, 2], np.random.default_rng(0))
    >>> x, y = np.random.default_rng(1).normal(size=(6, 4)), np.zeros((6, 2))
    >>> ref = unpipelined(model, (x, y), n_stages=2, m=2)
    >>> sorted(ref.messages)[:2], ref.messages["activation", 0, 1].shape
    ([('activation', 0, 0), ('activation', 0, 1)], (3, 8))
    >>> run = run_pipeline(model, (x, y), [parse("0F0 0F1 0B1 0B0"), parse("1F0 1F1 1B1 1B0")])
    >>> all(np.allclose(run.grads[k], g, rtol=0, atol=1e-14) for k, g in ref.grads.items())
    True
    """
    x, y = batch
    whole = copy.deepcopy(model)
    _, dloss = mse(whole.forward(x), y)
    whole.backward(dloss)
    grads = {k: g.copy() for k, g in whole.named_grads().items()}
    pieces = split_model(copy.deepcopy(model), n_stages)
    per_mb, payloads = [], {}
    for i, (xi, yi) in enumerate(zip(np.array_split(x, m), np.array_split(y, m))):
        for _, mod in pieces:
            for g in mod.named_grads().values():
                g[...] = 0
        a = xi
        for s, (_, mod) in enumerate(pieces):
            a = mod.forward(a)
            if s < n_stages - 1:
                payloads["activation", s, i] = a.copy()
        _, d = mse(a, yi)
        d = d * len(xi) / len(x)
        for s in reversed(range(n_stages)):
            d = pieces[s][1].backward(d)
            if s > 0:
                payloads["gradient", s - 1, i] = d.copy()
        per_mb.append({whole_name(first, n): g.copy()
                       for first, mod in pieces for n, g in mod.named_grads().items()})
    return Unpipelined(grads, per_mb, payloads, pieces)


def _twin(module):
    """A copy of ``module`` that shares its parameters and gradients but keeps its
    own forward state (each layer's saved ``x``): one per microbatch in flight."""
    shared = {id(a): a for a in module.named_parameters().values()}
    shared.update({id(g): g for g in module.named_grads().values()})
    return copy.deepcopy(module, memo=shared)


# -- one rank's program -------------------------------------------------------------------------

@dataclass
class StageWork:
    """What one rank is given: its ``actions``; its model stages, ``{stage: (first
    layer index in the whole model, Sequential)}``; ``n_stages``; the microbatches'
    ``inputs`` (rank of stage 0) and ``targets`` (rank of the last stage); the
    whole batch's number of rows; and the seconds each F, B and W takes
    (``seconds_b`` maps a B without a W of its own to ``t_b + t_w``)."""

    actions: list
    stages: dict
    n_stages: int
    inputs: list | None = None
    targets: list | None = None
    batch_rows: int = 0
    seconds: dict = field(default_factory=lambda: {"F": 0.0, "B": 0.0, "W": 0.0, "BW": 0.0})


@dataclass
class StageOutput:
    """What ``pipeline_stage`` returns: ``grads`` (whole-model names), the
    ``loss`` (last stage only, else None) and ``peak_held``, the most microbatch
    states (activations kept for a backward) this rank held at once."""

    grads: dict
    loss: float | None
    peak_held: int


def message_tag(kind, mb, from_stage, n_stages):
    """The tag of the message that ``kind`` ("F" or "B") of microbatch ``mb`` on
    ``from_stage`` sends: one tag per message, so a receive matches its message
    whatever order the two neighbours run their actions in."""
    return 2 * (mb * n_stages + from_stage) + (kind == "B")


class _Held:
    """A microbatch in flight on one stage: the stage's twin that ran its forward,
    the loss gradient (last stage) and, between B and W, the weight gradients' dy."""

    def __init__(self, twin):
        self.twin, self.dloss, self.pending = twin, None, []


@answer('pipeline_stage')
def pipeline_stage(comm, work):
    """Run this rank's ``work.actions`` in order; return a ``StageOutput``.

    F: receive the activation (unless stage 0), forward, send it on (unless the
    last stage, which computes the mse loss instead). B: receive the output
    gradient (unless last), backward, send the input gradient back (unless stage
    0). If the schedule has a W for this microbatch, B computes only the input
    gradient and W the weight gradient (zero-bubble pipelines).

    Sends are ``isend``s, waited for at the end. Why: a blocking send in
    rendezvous mode (NCCL's behaviour for large messages) waits for the receive,
    and in 1F1B a stage sending an activation forward while its neighbour sends
    a gradient back would wait for each other forever (Megatron-LM avoids this by
    batching the pair of p2p calls). With sends that never block, a stage only
    ever waits for data its action truly needs, so any schedule whose needs
    form no cycle runs to the end.
    """
    n, held, sent = work.n_stages, {}, []
    has_w = {(a.stage, a.mb) for a in work.actions if a.kind == "W"}
    loss, peak = (0.0 if n - 1 in work.stages else None), 0
    for a in work.actions:
        if a.stage not in work.stages:
            raise ValueError(f"rank {comm.rank}: action {a} is for stage {a.stage}, which lives "
                             f"on rank {stage_rank(a.stage, comm.world_size)}")
        module = work.stages[a.stage][1]
        need = needs(a, n)
        got = None
        if need is not None:
            got = comm.recv(stage_rank(need[1], comm.world_size),
                            tag=message_tag(a.kind, a.mb, need[1], n))
        with comm.span(str(a)):
            if a.kind == "F":
                x = work.inputs[a.mb] if a.stage == 0 else got
                state = held[a.stage, a.mb] = _Held(_twin(module))
                out = state.twin.forward(x)
                if a.stage == n - 1:         # the loss: per microbatch, weighted by its rows
                    weight = len(x) / work.batch_rows
                    mb_loss, dloss = mse(out, work.targets[a.mb])
                    loss += weight * mb_loss
                    state.dloss, out = weight * dloss, None
            elif a.kind == "B":
                state = held[a.stage, a.mb]
                dy = state.dloss if a.stage == n - 1 else got
                if (a.stage, a.mb) in has_w:
                    out = _backward_input(state.twin, dy, state.pending, comm.rank, a)
                else:
                    out = state.twin.backward(dy)
                    del held[a.stage, a.mb]
            else:
                state = held.pop((a.stage, a.mb))
                for layer, dy in state.pending:
                    layer.backward_weight(dy)
                out = None
            peak = max(peak, len(held))
            seconds = work.seconds["BW" if a.kind == "B" and (a.stage, a.mb) not in has_w
                                   else a.kind]
            comm.compute(seconds, a.kind, mb=a.mb, stage=a.stage, kind=a.kind, held=len(held))
            to = sends(a, n)
            if to is not None:
                sent.append(comm.isend(out, stage_rank(to[1], comm.world_size), chunk=a.mb,
                                       tag=message_tag(a.kind, a.mb, a.stage, n)))
    for req in sent:
        req.wait()
    if held:
        left = ", ".join(f"stage {s} microbatch {mb}" for s, mb in held)
        raise ValueError(f"rank {comm.rank}: the schedule ended with activations still held, "
                         f"never freed by a B (or W): {left}")
    grads = {whole_name(first, name): g
             for first, module in work.stages.values() for name, g in module.named_grads().items()}
    return StageOutput(grads, loss, peak)


@answer('pipeline_stage')
def _backward_input(module, dy, pending, rank, action):
    """B of a zero-bubble schedule: the input gradient through ``module``'s layers;
    each Linear's dy waits in ``pending`` for W."""
    for layer in reversed(module.layers):
        if isinstance(layer, Linear):
            pending.append((layer, dy))
            dy = layer.backward_input(dy)
        elif layer.params:
            raise TypeError(f"rank {rank}, {action}: a split backward (B then W) needs layers "
                            f"that can defer their weight gradient (Linear); got "
                            f"{type(layer).__name__}")
        else:
            dy = layer.backward(dy)
    return dy


# -- the whole run ---------------------------------------------------------------------------------

@dataclass
class PipelineResult:
    """``grads`` (whole-model names, summed over microbatches), ``loss``,
    ``peak_held`` per rank, the run's ``trace`` and ``time`` (simulated seconds),
    ``outputs`` (each rank's ``StageOutput``) and the ``schedule`` run."""

    grads: dict
    loss: float
    peak_held: list
    trace: object
    time: float
    outputs: list
    schedule: list


def stage_works(model, batch, schedule, *, t_f=1.0, t_b=1.0, t_w=1.0):
    """Each rank's ``StageWork`` for ``schedule`` (one action list per rank).

    ``t_f``, ``t_b``, ``t_w``: seconds of one microbatch's forward, input-gradient
    and weight-gradient pass through one rank's share of the model; with v stages
    per rank (interleaved) each action takes 1/v of that, as in Narayanan et al.
    (2021). A B with no W does the whole backward: ``t_b + t_w``. ``model`` is
    copied: its own gradients stay as they were.
    """
    x, y = batch
    p = len(schedule)
    actions = [a for acts in schedule for a in acts]
    n_stages = 1 + max(a.stage for a in actions)
    m = 1 + max(a.mb for a in actions)
    if n_stages % p:
        raise ValueError(f"{n_stages} stages on {p} ranks: each rank needs the same number")
    if len(x) < m:
        raise ValueError(f"a batch of {len(x)} rows cannot make {m} microbatches")
    v = n_stages // p
    pieces = split_model(copy.deepcopy(model), n_stages)
    xs, ys = np.array_split(x, m), np.array_split(y, m)
    seconds = {"F": t_f / v, "B": t_b / v, "W": t_w / v, "BW": (t_b + t_w) / v}
    return [StageWork(list(schedule[r]), {s: pieces[s] for s in range(r, n_stages, p)}, n_stages,
                      xs if r == 0 else None, ys if r == stage_rank(n_stages - 1, p) else None,
                      len(x), seconds) for r in range(p)]


def run_pipeline(model, batch, schedule, *, t_f=1.0, t_b=1.0, t_w=1.0, network=None,
                 backend="sim", mode="buffered", timeout=30.0):
    """Run ``schedule`` (one action list per rank) on ``model`` and ``batch =
    (inputs, targets)``, split into as many microbatches as the schedule has, with
    ``pipeline_stage`` on every rank. See ``stage_works`` for the times;
    ``network``, ``backend``, ``mode`` as in ``ringlab.run``. -> ``PipelineResult``.
    """
    works = stage_works(model, batch, schedule, t_f=t_f, t_b=t_b, t_w=t_w)
    kw = dict(network=network, mode=mode) if backend == "sim" else {}
    res = run(pipeline_stage, works, backend=backend, timeout=timeout, **kw)
    grads = {}
    for out in res.outputs:
        grads.update(out.grads)
    names = list(model.named_grads())
    loss = next(out.loss for out in res.outputs if out.loss is not None)
    return PipelineResult({k: grads[k] for k in names}, loss, [o.peak_held for o in res.outputs],
                          res.trace, res.time, res.outputs, schedule)
