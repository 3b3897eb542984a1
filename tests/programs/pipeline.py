"""Learner-style programs for the Part 4 graders: right ones and usual mistakes.

Shared by tests/grading/pipeline/test_grade_pipeline.py and the cheats of tests/grading/test_grader_cheats.py.
"""

import copy

import numpy as np

from ringlab.nn import mse
from ringlab.pipeline import Action, parse
from ringlab.pipeline.actions import needs, sends, stage_rank


# ------------------------------------------------------------------------ one_f_one_b

def ofob_loop(r, p, m):
    """Right: warm-up, steady state, cool-down, written out."""
    warmup = min(p - 1 - r, m)
    acts = [Action("F", i, r) for i in range(warmup)]
    for i in range(warmup, m):
        acts += [Action("F", i, r), Action("B", i - warmup, r)]
    return acts + [Action("B", i, r) for i in range(m - warmup, m)]


def ofob_text(r, p, m):
    """Right: warm-up, then F/B pairs, then cool-down, as text that parse() reads."""
    w = min(p - 1 - r, m)
    words = [f"{r}F{i}" for i in range(w)]
    words += [f"{r}{k}{i + j}" for i in range(w, m) for k, j in (("F", 0), ("B", -w))]
    words += [f"{r}B{i}" for i in range(m - w, m)]
    return parse(" ".join(words))


def ofob_counter(r, p, m):
    """Right: forwards while the rank holds fewer than p - r microbatches, else a
    backward (the rule 1F1B's memory bound gives), as a tuple."""
    acts, f, b = [], 0, 0
    while b < m:
        if f < m and f - b < p - r:
            acts.append(Action("F", f, r))
            f += 1
        else:
            acts.append(Action("B", b, r))
            b += 1
    return tuple(acts)


def _warm(r, p, m, warmup, swapped=False):
    warmup = max(0, min(warmup, m))
    acts = [Action("F", i, r) for i in range(warmup)]
    for i in range(warmup, m):
        pair = [Action("F", i, r), Action("B", i - warmup, r)]
        acts += pair[::-1] if swapped else pair
    return acts + [Action("B", i, r) for i in range(m - warmup, m)]


def ofob_gpipe(r, p, m):
    return [Action("F", i, r) for i in range(m)] + [Action("B", i, r) for i in range(m)]


def ofob_warmup_long(r, p, m):
    return _warm(r, p, m, p - r)


def ofob_warmup_short(r, p, m):
    return _warm(r, p, m, p - 2 - r)


def ofob_swapped(r, p, m):
    return _warm(r, p, m, p - 1 - r, swapped=True)


def ofob_stage_zero(r, p, m):
    """Forgets the stage: Action("F", i) is stage 0 on every rank."""
    return [Action(a.kind, a.mb) for a in ofob_loop(r, p, m)]


def ofob_strings(r, p, m):
    return [str(a) for a in ofob_loop(r, p, m)]


def ofob_no_last_backward(r, p, m):
    return ofob_loop(r, p, m)[:-1]


def ofob_late_forward(r, p, m):
    """Right peaks, a longer wait: rank 0 runs a backward before its last forward."""
    acts = ofob_loop(r, p, m)
    if r == 0 and m > p:
        i = acts.index(Action("F", m - 1, r))
        acts[i], acts[i + 1] = acts[i + 1], acts[i]
    return acts


# --------------------------------------------------------------------- pipeline_stage

def _tag(kind, mb, from_stage, n, one_tag=False):
    return 0 if one_tag else 2 * (mb * n + from_stage) + (kind == "B")


def _names(work):
    return {f"{first + int(k.split('.')[0])}.{k.split('.', 1)[1]}": g
            for first, mod in work.stages.values() for k, g in mod.named_grads().items()}


def stage_recompute(comm, work, *, blocking=False, wrong_neighbour=False, zero_each_b=False,
                    unweighted=False, scale=1.0, shared_module=False, zeros=None, twice=False,
                    hide_grads=None, own_order=False, one_tag=False, float32=False):
    """Right (with the defaults): keeps each microbatch's input and runs the forward
    again just before its backward (the layers remember only their last input);
    isends, waited for at the end; W does nothing (B did the whole backward).
    The keywords make the usual mistakes."""
    n, p = work.n_stages, comm.world_size
    saved, dloss, sent = {}, {}, []
    actions = work.actions
    if own_order:       # ignores the schedule: GPipe's order (all F, then all B), isends
        mbs, mine = sorted({a.mb for a in actions}), sorted(work.stages)
        actions = ([Action("F", mb, s) for s in mine for mb in mbs]
                   + [Action("B", mb, s) for s in reversed(mine) for mb in mbs])
    for a in actions:
        if a.kind == "W":
            continue
        mod = work.stages[a.stage][1]
        need = needs(a, n)
        got = None
        if hide_grads is not None and a.kind == "B" and need is not None:
            comm.recv(stage_rank(need[1], p), tag=_tag(a.kind, a.mb, need[1], n))  # a token
            got, need = hide_grads[a.mb, need[1]], None        # the data: through memory
        for _ in range(1 + twice if need is not None else 0):
            got = comm.recv(stage_rank(need[1], p), tag=_tag(a.kind, a.mb, need[1], n, one_tag))
        if zeros is not None and need is not None:     # the real data, through memory
            got = zeros[a.kind, a.mb, need[1]]
        if a.kind == "F":
            x = work.inputs[a.mb] if a.stage == 0 else got
            saved[a.stage, a.mb] = x
            out = mod.forward(x)
            if a.stage == n - 1:
                _, d = mse(out, work.targets[a.mb])
                dloss[a.mb] = d if unweighted else d * len(x) / work.batch_rows
        else:
            if zero_each_b:
                for g in mod.named_grads().values():
                    g[...] = 0
            if not shared_module:
                mod.forward(saved[a.stage, a.mb])     # recompute: the layers keep the last x
            del saved[a.stage, a.mb]
            dy = dloss.pop(a.mb) if a.stage == n - 1 else got
            out = mod.backward(dy)
        to = sends(a, n)
        if to is not None and hide_grads is not None and a.kind == "B":
            hide_grads[a.mb, a.stage] = out
            comm.isend(np.zeros(1), stage_rank(to[1], p), tag=_tag("B", a.mb, a.stage, n))
            to = None
        if to is not None:
            dst = to[1] + (2 if wrong_neighbour and a.kind == "B" else 0)
            payload = out.astype(np.float32) if float32 else out    # half the bytes on the wire
            if zeros is not None:                 # the data through memory, zeros for show
                zeros[a.kind, a.mb, a.stage] = out
                payload = np.zeros_like(out)
            for _ in range(1 + twice):
                args = (payload, stage_rank(dst, p))
                if blocking:
                    comm.send(*args, tag=_tag(a.kind, a.mb, a.stage, n, one_tag))
                else:
                    sent.append(comm.isend(*args, tag=_tag(a.kind, a.mb, a.stage, n, one_tag)))
    for req in sent:
        req.wait()
    return {k: g * scale for k, g in _names(work).items()}


def stage_twins(comm, work):
    """Right: a copy of the stage per microbatch in flight (parameters and grads
    shared), receives posted first (irecv) and B/W split in zero-bubble schedules."""
    n, p = work.n_stages, comm.world_size
    has_w = {(a.stage, a.mb) for a in work.actions if a.kind == "W"}
    held, pending, dloss, sent = {}, {}, {}, []
    for a in work.actions:
        mod = work.stages[a.stage][1]
        need = needs(a, n)
        got = None
        if need is not None:
            got = comm.irecv(stage_rank(need[1], p), tag=_tag(a.kind, a.mb, need[1], n)).wait()
        if a.kind == "F":
            memo = {id(v): v for v in [*mod.named_parameters().values(),
                                       *mod.named_grads().values()]}
            twin = held[a.stage, a.mb] = copy.deepcopy(mod, memo)
            x = work.inputs[a.mb] if a.stage == 0 else got
            out = twin.forward(x)
            if a.stage == n - 1:
                _, d = mse(out, work.targets[a.mb])
                dloss[a.mb] = d * len(x) / work.batch_rows
        elif a.kind == "B":
            twin = held[a.stage, a.mb]
            dy = dloss.pop(a.mb) if a.stage == n - 1 else got
            if (a.stage, a.mb) in has_w:
                todo = pending[a.stage, a.mb] = []
                for layer in reversed(twin.layers):
                    if layer.params:
                        todo.append((layer, dy))
                        dy = layer.backward_input(dy)
                    else:
                        dy = layer.backward(dy)
                out = dy
            else:
                out = twin.backward(dy)
                del held[a.stage, a.mb]
        else:
            for layer, dy in pending.pop((a.stage, a.mb)):
                layer.backward_weight(dy)
            del held[a.stage, a.mb]
            out = None
        to = sends(a, n)
        if to is not None:
            sent.append(comm.isend(out, stage_rank(to[1], p), tag=_tag(a.kind, a.mb, a.stage, n)))
    for req in sent:
        req.wait()
    return _names(work)


# ------------------------------------------------------------------------------ cheats

def ofob_duck_typed(r, p, m):
    """Objects that look like Actions (kind, mb, stage) but are not."""
    from collections import namedtuple
    Fake = namedtuple("Fake", "kind mb stage")
    return [Fake(a.kind, a.mb, a.stage) for a in ofob_loop(r, p, m)]


def ofob_whole_pipeline(r, p, m):
    """Every rank's list at once, as if one rank ran the whole pipeline."""
    return [a for q in range(p) for a in ofob_loop(q, p, m)]


def ofob_m1_forward_only(r, p, m):
    """Wrong: with one microbatch, only the forward."""
    return [Action("F", 0, r)] if m == 1 else ofob_loop(r, p, m)


def ofob_float_mb(r, p, m):
    """Wrong: microbatch numbers that are not whole numbers."""
    return [Action(a.kind, a.mb + 0.5, a.stage) for a in ofob_loop(r, p, m)]
