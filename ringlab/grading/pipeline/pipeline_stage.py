"""Grader for exercise ``pipeline_stage``: one rank's program of a pipeline.

Signature: ``pipeline_stage(comm, work) -> dict {name: gradient}``. ``work``
is a ``ringlab.pipeline.stages.StageWork`` (its docstring lists the fields, as
the notebook does), and the program does what the reference,
``ringlab.pipeline.stages.pipeline_stage``, documents: F receives its input
from stage s - 1 and sends its output to stage s + 1, B the other way; the
last stage weights each microbatch's mse by rows / batch_rows. It returns the
gradients of the rank's stages, named as in the whole model ("2.weight"),
summed over the microbatches: the gradient of the mse over the whole batch.

Cases: GPipe, 1F1B (m < p, m > p), interleaved 1F1B (v = 2) and ZB-H1, p = 2
to 4, some in rendezvous mode (a blocking send waits for its receive), one on
an ``AlphaBeta`` network. The checks, in order:

1. "the program runs without error" / "no deadlock" (a deadlock names who
   waits for whom; two neighbours each blocked in a send to the other get a
   hint about isend and the order of sends and receives);
2. "returns its gradients": a dict with exactly this rank's names, arrays of
   the parameters' shapes; then, as they would make the gradients wrong,
   "each message has a tag of its own" (a receive that took another message
   of its tag, in the case where a rank takes its neighbour's messages out of
   send order; also when that made the run fail) and "activations and
   gradients travel as float64" (float32 on the wire rounds the gradients);
3. "gradients equal the unpipelined model's" (relative error 1e-9): only one
   microbatch's gradient, gradients not scaled by rows / batch_rows, or
   scaled by some other factor, are named;
4. "each activation and gradient sent once, to its neighbour": every message
   (recorded payloads) holds exactly one microbatch's activation or gradient
   at one stage boundary, sent to the rank of the next (activation) or the
   previous (gradient) stage, and each of them is sent exactly once.
   Zeros sent for show, with the data shared some other way, fail here;
5. "the schedule's order": each rank sends its messages in the order of its
   actions (a program that runs its own plan, GPipe's order when given 1F1B,
   gets the same gradients and messages, but not the same order).
"""

from __future__ import annotations

import functools
import re

import numpy as np

from ...cost.alpha_beta import AlphaBeta
from ..kit.driver import callable_learner, problem, problem_text
from ..kit.frames import without_grader_frames
from ..kit.report import Case, Failure, numbers
from ..kit.running import run_case
from ...errors import DeadlockError
from ...nn import GeLU, Linear, Sequential, mlp_model
from ...pipeline.actions import needs, parse, sends, stage_rank
# StageWork (what a rank is given), stage_works, whole_name and the unpipelined reference
# are tools;
# stages.pipeline_stage is the answer
from ...pipeline.stages import StageWork, stage_works, unpipelined, whole_name

NAME = "pipeline_stage"
# actions, schedules and validate are tools here; ringlab.pipeline.stages holds the answer
USES = ("one_f_one_b",)
TOL = 1e-9
# (schedule, p, m, v, mode, network)
CASES = [("1F1B", 3, 4, 1, "buffered", None),
         ("1F1B", 2, 3, 1, "rendezvous", None),
         ("GPipe", 2, 2, 1, "rendezvous", None),
         ("1F1B", 4, 2, 1, "rendezvous", None),
         ("interleaved 1F1B", 2, 4, 2, "buffered", None),
         ("ZB-H1", 3, 4, 1, "rendezvous", None),
         ("interleaved 1F1B", 2, 2, 2, "rendezvous", None),
         ("1F1B", 4, 6, 1, "buffered", (1e-5, 1e-9)),
         ("interleaved, rank 1 depth-first", 2, 2, 2, "buffered", None)]
# A valid schedule in which a rank takes its neighbour's messages in another order than
# the neighbour sends them (rank 0 runs its chunks breadth-first, rank 1 depth-first): only
# tags tell the messages apart. In the other schedules each rank receives in send order.
MIXED = ["0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1", "1F0 3F0 1F1 3F1 3B0 1B0 3B1 1B1"]
RETURNS = "pipeline_stage(comm, work) -> {name: gradient}, names as in the whole model"
SEND_HINT = ("An F sends its output to the rank of the next stage, stage_rank(s + 1, p); a B "
             "sends its input gradient to the rank of the previous stage, stage_rank(s - 1, p). "
             "Receive from the same neighbours, with the same tags on both sides.")
RENDEZVOUS_HINT = (
    "In rendezvous mode (NCCL's, for large messages) a blocking send waits until its receive "
    "is posted. Two neighbours that each send to the other before receiving from it wait "
    "forever: a receive posted after a blocking send to the same neighbour. In 1F1B's steady "
    "state a stage sends an activation forward while the next one sends a gradient back. "
    "Send with comm.isend and wait for the requests at the end (or post the receive first with "
    "comm.irecv), so that a rank only ever waits for data its action needs.")


# ------------------------------------------------------------------------- the schedules

def schedule_of(kind, p, m, v):
    from ...pipeline import schedules as S
    return {"GPipe": lambda: S.gpipe(p, m), "1F1B": lambda: S.one_f_one_b(p, m),
            "ZB-H1": lambda: S.zb_h1(p, m),
            "interleaved 1F1B": lambda: S.interleaved_1f1b(p, m, v),
            "interleaved, rank 1 depth-first": lambda: [parse(t) for t in MIXED],
            }[kind]()


# ----------------------------------------------------------------------------- the cases

def _layers(module):
    """A stage as wire-friendly data: [weight, bias] per Linear, [] per GeLU."""
    return [[layer.params["weight"].copy(), layer.params["bias"].copy()]
            if isinstance(layer, Linear) else [] for layer in module.layers]


def _build(layers):
    """The stage back from ``_layers``'s data, in the rank's process."""
    mods = []
    for params in layers:
        mods.append(Linear(*params[0].shape, np.random.default_rng(0)) if params else GeLU())
        for name, value in zip(("weight", "bias"), params):
            mods[-1].params[name][...] = value
    return Sequential(*mods)


def _copies(arrays):
    return None if arrays is None else [a.copy() for a in arrays]


def cases(rng):
    for kind, p, m, v, mode, network in CASES:
        n_stages = p * v
        sizes = [int(k) for k in rng.integers(3, 7, size=n_stages + 1)]
        model = mlp_model(sizes, rng)
        rows = m + int(rng.integers(1, m + 2))         # microbatches of unequal rows
        x, y = rng.standard_normal((rows, sizes[0])), rng.standard_normal((rows, sizes[-1]))
        schedule = schedule_of(kind, p, m, v)
        grads, per_mb, payloads, _ = unpipelined(model, (x, y), n_stages, m)
        works = stage_works(model, (x, y), schedule)     # F, B, W: 1 s per rank's share
        inputs = [[" ".join(map(str, w.actions)),
                   [[s, first, _layers(mod)] for s, (first, mod) in w.stages.items()], n_stages,
                   _copies(w.inputs), _copies(w.targets), rows, dict(w.seconds)] for w in works]
        names = [[whole_name(first, n) for first, mod in w.stages.values()
                  for n in mod.named_grads()] for w in works]
        where = {"buffered": "", "rendezvous": ", rendezvous mode (a send waits for its "
                                              "receive)"}[mode]
        label = (f"{kind}, p={p} ranks, m={m} microbatches of {rows} rows"
                 + (f", v={v} stages per rank" if v > 1 else "") + where
                 + (", AlphaBeta network" if network else ""))
        yield Case(p, inputs, label, args=(names,),
                   info=dict(p=p, m=m, v=v, mode=mode, network=network, grads=grads,
                             per_mb=per_mb, payloads=payloads, names=names, rows=rows,
                             mb_rows=[len(a) for a in works[0].inputs], n_stages=n_stages,
                             schedule=schedule))


# ---------------------------------------------------------------------------- the driver

def drive(comm, inp, names, learner):
    """What every rank runs: its ``StageWork`` rebuilt, the learner's function, its gradients
    as arrays in ``names`` order (or the words of what was wrong)."""
    learner = callable_learner(learner)
    text, stages, n_stages, inputs, targets, rows, seconds = inp
    work = StageWork(parse(text), {s: (first, _build(layers)) for s, first, layers in stages},
                     n_stages, inputs, targets, rows, seconds)
    names = names[comm.rank]
    out = learner(comm, work)
    grads = out.grads if not isinstance(out, dict) and isinstance(getattr(out, "grads", None),
                                                                  dict) else out
    if not isinstance(grads, dict):
        return problem(f"rank {comm.rank} returned a {type(out).__name__}, not a dict "
                       f"{{name: gradient}}")
    missing = [n for n in names if n not in grads]
    extra = [str(n) for n in grads if n not in names]
    if missing or extra:
        return problem(f"rank {comm.rank} returned the gradients {sorted(map(str, grads))}; "
                       f"its stages' parameters are {names}: names as in the whole model "
                       f"(first + the layer's index in its stage)")
    for n in names:
        if not isinstance(grads[n], np.ndarray):
            return problem(f"rank {comm.rank}'s gradient {n!r} is a {type(grads[n]).__name__}, "
                           f"not a numpy array")
    return [np.zeros(0)] + [np.array(grads[n], dtype=np.float64) if grads[n].dtype != np.float64
                            else grads[n] for n in names]


# ---------------------------------------------------------------------------- the checks

def check(program, case, backend="sim"):
    info = case.info
    kw = {} if backend != "sim" else dict(mode=info["mode"])
    if backend == "sim" and info["network"]:
        kw["network"] = AlphaBeta(*info["network"])
    result, failure = run_case(functools.partial(drive, learner=program), case, backend, **kw)
    if failure:
        failure.got = without_grader_frames(failure.got)
        return _explain(failure, case)
    # The tags before the values: a receive that took another message's data makes the
    # gradients wrong (or crashes), and it is the tags that say why.
    return (_returned(result, case) or _tags(result.trace, case) or _wire(result, case)
            or _gradients(result, case) or _messages(result, case))


def _explain(failure, case):
    """A deadlock of two neighbours each blocked in a send to the other: say why. A
    run that failed after a receive took another message of the same tag: say that."""
    err = failure.error
    trace = getattr(err, "trace", None)
    mixed = _tags(trace, case) if trace is not None else None
    if mixed is not None:
        mixed.what += f"\nThen: {failure.what.splitlines()[0]}"
        return mixed
    if isinstance(err, DeadlockError):
        sending = {r: w.peer for r, w in err.waiting.items() if w.kind == "send"}
        pair = next(((a, b) for a, b in sending.items() if sending.get(b) == a), None)
        if pair is None and sending:
            a = min(sending)
            pair = (a, sending[a])
        if pair is not None:
            failure.what += (f"\nRank {pair[0]} is blocked in a send to rank {pair[1]}, which "
                             f"does not receive it"
                             + (f": rank {pair[1]} is itself blocked in a send to rank "
                                f"{pair[0]}." if sending.get(pair[1]) == pair[0] else "."))
            failure.hint = RENDEZVOUS_HINT
        elif err.trace is not None and list(err.trace.unreceived):
            wanted = {}     # (src, tag) -> the rank that waits for that message
            for q, w in err.waiting.items():
                tag = re.search(r"tag=(-?\d+)", str(w))
                if w.kind == "recv" and tag:
                    wanted[w.peer, int(tag.group(1))] = q
            stray = [(e, wanted[e.src, e.tag]) for e in err.trace.unreceived
                     if wanted.get((e.src, e.tag), e.dst) != e.dst]
            if stray:
                e, q = stray[0]
                failure.what += (f"\nRank {e.src} sent rank {e.dst} the message (tag {e.tag}) "
                                 f"that rank {q} waits for: a send to the wrong neighbour.")
            else:
                e = err.trace.unreceived[0]
                failure.what += (f"\nRank {e.src} sent rank {e.dst} a message (tag {e.tag}) "
                                 f"that rank {e.dst} never received.")
            failure.hint = SEND_HINT
    elif failure.check == "every message sent is received":
        failure.hint = SEND_HINT
    return failure


def _name(key):
    what, s, mb = key
    return (f"the activation of microbatch {mb} from stage {s}" if what == "activation" else
            f"the gradient of microbatch {mb} from stage {s + 1}")


def _tags(trace, case):
    """Each receive gets the message its action needs: a receive takes the oldest
    message of its (source, tag), so two messages on one channel with the same tag
    that the receiver needs in the other order than they were sent get swapped.
    Read from the trace (a rank's sends have increasing steps, in its program's
    order) and the schedule (which message each send and receive is), assuming
    the receiver asks for the tag the sender used."""
    info = case.info
    p, n = info["p"], info["n_stages"]
    sent, needed = {}, {}         # (src, dst) -> keys, in the sender's / the receiver's order
    for r, actions in enumerate(info["schedule"]):
        for a in actions:
            if sends(a, n):
                sent.setdefault((r, stage_rank(sends(a, n)[1], p)), []).append((a, _boundary(a, n)))
            need = needs(a, n)
            if need:
                key = ((need[0], need[1] if need[0] == "activation" else need[1] - 1, a.mb))
                needed.setdefault((stage_rank(need[1], p), r), []).append((a, key))
    for (src, dst), want in sent.items():
        events = sorted((e for e in trace if e.src == src and e.dst == dst), key=lambda e: e.step)
        if len(events) > len(want):
            continue                  # more messages than the schedule's: other checks say so
        tag = {k: e.tag for (_, k), e in zip(want, events)}
        waiting = [k for _, k in want[:len(events)]]          # sent, not yet received
        for a, k in needed.get((src, dst), []):
            if k in tag:
                got = next(w for w in waiting if tag[w] == tag[k])
                then = f"{_name(got)} and then {_name(k)}, both with tag {tag[k]}"
            elif waiting and len(tag) > 1 and len(set(tag.values())) == 1:
                # a run that failed early: k not sent yet, and the sender tells nothing apart
                got, k_tag = waiting[0], next(iter(tag.values()))
                then = (f"{_name(got)} with tag {k_tag}, the tag of all its messages, before "
                        f"{_name(k)}")
                tag[k] = k_tag
            else:
                break
            if got != k:
                return Failure(
                    case.label, "each message has a tag of its own",
                    f"rank {src} sent rank {dst} {then}; rank {dst}'s action {a} needs {_name(k)} "
                    f"first, and a receive takes the oldest message of its tag: {a} got "
                    f"{_name(got)}",
                    expected="a tag per message, the same on both sides, e.g. "
                             "2 * (mb * n_stages + stage) + (kind == \"B\"), the sender's stage",
                    got=f"tag {tag[k]} on {sum(tag[w] == tag[k] for w in tag)} of the "
                        f"{len(tag)} messages from rank {src} to rank {dst}",
                    hint="A rank may take its neighbour's messages in another order than they "
                         "were sent (here its schedule does): give each message its own tag, "
                         "from the microbatch, the stage and F or B, and receive with it.")
            waiting.remove(k)
    return None


def _returned(result, case):
    for r, out in enumerate(result.outputs):
        want, text = case.info["names"][r], problem_text(out)
        if text is not None:
            return Failure(case.label, "returns its gradients", text, expected=RETURNS,
                           hint="Return a dict of this rank's stages' gradients, e.g. "
                                "{f\"{first + int(k.split('.')[0])}.{k.split('.')[1]}\": g "
                                "for k, g in module.named_grads().items()}.")
        if not (isinstance(out, (list, tuple)) and len(out) == 1 + len(want)):
            return Failure(case.label, "returns its gradients",
                           f"rank {r}'s result could not be read", expected=RETURNS)
        for n, g in zip(want, out[1:]):
            shape = case.info["grads"][n].shape
            if g.shape != shape:
                return Failure(case.label, "returns its gradients",
                               f"rank {r}'s gradient {n!r} has shape {g.shape}",
                               expected=f"shape {shape}, the parameter's", got=f"{g.shape}")
    return None


def _wire(result, case):
    """Every message a float64 array: before the gradients, which a message rounded to
    float32 on the way makes wrong by about 1e-7 (not a stale activation)."""
    for e in result.trace:
        pay = result.payload(e) if result.payloads is not None else None
        if pay is None or (type(pay) is np.ndarray and pay.dtype == np.float64):
            continue
        kind = getattr(pay, "dtype", type(pay).__name__)
        return Failure(case.label, "activations and gradients travel as float64",
                       f"rank {e.src} sent rank {e.dst} a {kind} message (tag {e.tag}): "
                       + (f"{kind} rounds the values on the way, so the gradients come out "
                          f"wrong by about {np.finfo(pay.dtype).eps:.0e} of their size"
                          if isinstance(pay, np.ndarray) and pay.dtype.kind == "f" else
                          "not an array of the activations or gradients"),
                       expected="float64 activations and gradients, as the layers make them",
                       got=repr(pay)[:100] if not isinstance(pay, np.ndarray)
                       else f"dtype {pay.dtype}, shape {pay.shape}",
                       hint="Send the arrays the layers return as they are: no astype on the "
                            "way (the grader compares with the float64 model to 1e-9).")
    return None


def _close(got, want, tol=TOL):
    scale = np.abs(want).max(initial=0.0)
    return (got.shape == want.shape and bool(np.all(np.isfinite(got)))
            and np.abs(got - want).max(initial=0.0) <= tol * max(scale, 1e-300))


def _gradients(result, case):
    info = case.info
    for r, out in enumerate(result.outputs):
        names = info["names"][r]
        got = dict(zip(names, out[1:]))
        bad = [n for n in names if not _close(got[n], info["grads"][n])]
        if bad:
            words, hint = _diagnose(got, names, info["per_mb"], info)
            return Failure(case.label, "gradients equal the unpipelined model's",
                           f"rank {r}'s gradient {bad[0]!r} differs from the unpipelined "
                           f"model's (the mse over the whole batch of {info['rows']} rows, as "
                           f"ringlab.nn computes it)" + (f":\n{words}" if words else ""),
                           expected=numbers(info["grads"][bad[0]]), got=numbers(got[bad[0]]),
                           hint=hint)
    return None


def _same(got, names, want):
    return all(_close(got[n], want[n]) for n in names)


def _diagnose(got, names, per_mb, info):
    m, rows, mb_rows = info["m"], info["rows"], info["mb_rows"]
    acc = ("The layers add into module.grads at every backward: keep them across the "
           "microbatches (zero them once, before the first), and return them after the last.")
    for i, which in ((m - 1, "last"), (0, "first")):
        if m > 1 and _same(got, names, per_mb[i]):
            return (f"it is only the {which} microbatch's gradient (microbatch {i}): the "
                    f"gradients are not accumulated over the {m} microbatches", acc)
    unweighted = {n: sum(g[n] * rows / k for g, k in zip(per_mb, mb_rows)) for n in names}
    if _same(got, names, unweighted):
        return ("each microbatch's loss gradient is not weighted by its share of the batch, "
                "rows / batch_rows: the sum of the microbatches' mse is not the batch's mse",
                "On the last stage: loss, dloss = mse(out, targets[mb]); use dloss * "
                "len(out) / work.batch_rows.")
    total = {n: sum(g[n] for g in per_mb) for n in names}
    flat_got = np.concatenate([got[n].ravel() for n in names])
    flat_want = np.concatenate([total[n].ravel() for n in names])
    k = float(flat_got @ flat_want / (flat_want @ flat_want)) if flat_want.any() else 0.0
    if k and _close(flat_got, k * flat_want):
        scales = [(m, "m, the number of microbatches"),
                  (1 / m, "1 / m, one over the number of microbatches"),
                  (rows, "batch_rows"), (2.0, "2: each microbatch counted twice?")]
        words = next((words for value, words in scales if abs(k - value) <= 1e-9 * abs(value)),
                     f"{k:.6g}: scaled wrong")
        return (f"it is the right gradient times {words}",
                "Weight each microbatch's loss gradient by rows / batch_rows, once.")
    if not flat_got.any():
        return "it is all zeros: no backward ran into these layers", acc
    return "", ("Each microbatch's backward must use the activations its own forward saved: the "
                "layers keep only their last input, so keep a copy of the stage per microbatch "
                "in flight (copy.deepcopy sharing the parameters and grads), or run the forward "
                "again on the saved input just before the backward.")


ONCE = "each activation and gradient sent once, to its neighbour"
EXACTLY_ONCE = "each activation and each gradient sent exactly once"


def _messages(result, case):
    info = case.info
    p, want = info["p"], info["payloads"]
    count, sent = dict.fromkeys(want, 0), {}
    for e in result.trace:
        pay = result.payload(e) if result.payloads is not None else None
        match = next((k for k in want if want[k].shape == pay.shape and _close(pay, want[k])),
                     None)
        if match is None:
            held = "zeros:" if not pay.any() else "values that are"
            return Failure(case.label, ONCE,
                           f"rank {e.src} sent rank {e.dst} {held} neither an activation nor a "
                           f"gradient of any microbatch (shape {pay.shape})",
                           expected="each message: the output of one microbatch's F (to the next "
                                    "stage) or the input gradient of its B (to the previous one)",
                           got=numbers(pay),
                           hint="The grader reads every message: the data must travel in the "
                                "messages; zeros or stand-ins sent for show, with the data shared "
                                "some other way, do not pass.")
        (what, _, mb), (frm, to) = match, _ends(match)
        if e.dst != stage_rank(to, p) or e.src != stage_rank(frm, p):
            return Failure(case.label, ONCE,
                           f"rank {e.src} sent the {what} of microbatch {mb} from stage {frm} to "
                           f"rank {e.dst}; stage {to}, which needs it, lives on rank "
                           f"{stage_rank(to, p)}",
                           expected=f"rank {stage_rank(frm, p)} -> rank {stage_rank(to, p)} only",
                           got=f"rank {e.src} -> rank {e.dst}", hint=SEND_HINT)
        sent.setdefault(e.src, []).append((e.step, len(sent.get(e.src, ())), match))
        count[match] += 1
        if count[match] > 1:
            return Failure(case.label, ONCE,
                           f"the {what} of microbatch {mb} from stage {frm} to stage {to} was "
                           f"sent {count[match]} times", expected=EXACTLY_ONCE,
                           got=f"rank {e.src} -> rank {e.dst}, again", hint=SEND_HINT)
    for key, c in count.items():
        if c == 0:
            (frm, to), (what, _, mb) = _ends(key), key
            return Failure(case.label, ONCE,
                           f"the {what} of microbatch {mb} from stage {frm} to stage {to} was "
                           f"never sent, yet the gradients are right: the data did not come "
                           f"through the messages", expected=EXACTLY_ONCE,
                           got="never sent", hint=SEND_HINT)
    return _in_schedule_order(case, sent)


def _ends(key):
    """(from stage, to stage) of the message ``key`` = (what, boundary s, mb)."""
    what, s, _ = key
    return (s, s + 1) if what == "activation" else (s + 1, s)


def _boundary(action, n_stages):
    """The key of the message ``action`` sends: (what, boundary stage, microbatch)."""
    what, to = sends(action, n_stages)
    return (what, to - 1 if what == "activation" else to, action.mb)


def _in_schedule_order(case, sent):
    """Each rank sends in the order of its actions: a program that runs its own
    plan (GPipe when given 1F1B, say) gets the same gradients and messages, but
    not the same order."""
    info = case.info
    for r, actions in enumerate(info["schedule"]):
        want = [_boundary(a, info["n_stages"]) for a in actions if sends(a, info["n_stages"])]
        got = [k for *_, k in sorted(sent.get(r, []))]      # the rank's sends, in its order
        if got != want:
            i = next(i for i, (g, w) in enumerate(zip(got + [None] * len(want), want)) if g != w)
            name = lambda k: f"the {k[0]} of microbatch {k[2]}" if k else "nothing"
            return Failure(case.label, "the schedule's order",
                           f"rank {r}'s message {i + 1} was "
                           f"{name(got[i] if i < len(got) else None)}; its schedule sends "
                           f"{name(want[i])} there",
                           expected="the messages in the order of the rank's actions: "
                                    + " ".join(map(str, actions)),
                           got=f"message {i + 1}: {name(got[i] if i < len(got) else None)}",
                           hint="Run the actions of work.actions one by one, in their order: "
                                "each F or B sends its result when it runs.")
    return None
