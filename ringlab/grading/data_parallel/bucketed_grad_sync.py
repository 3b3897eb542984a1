"""Grader for exercise ``bucketed_grad_sync``: DDP's gradient buckets, overlapped.

Signature: ``bucketed_grad_sync(comm, params, backward, cap_bytes) -> {name: gradient}``.

``params``: ``{name: array}`` in forward (registration) order, "0.weight",
"0.bias", "1.weight", ...; only their sizes matter (they plan the buckets).
``backward``: an iterator standing in for autograd's hooks; each ``next()``
runs one layer's backward, last layer first (a ``comm.compute`` event), and
gives ``{name: gradient}`` for that layer's parameters. Return every
parameter's gradient averaged over the ranks.

Buckets as in ``ringlab.data_parallel.buckets.assign_buckets``: walk the
parameters in reverse order, add each to the open bucket, close it as soon as
it holds ``cap_bytes`` or more. Each bucket is AllReduced with
``comm.start(ringlab.collectives.ring_allreduce, ...)`` as soon as its last
gradient is ready, buckets in order.

Checks, world sizes 2 to 8, hidden layer sizes and caps (some exactly the bytes
of the last few tensors, so that a bucket lands on the cap), on a network where
an AllReduce is much shorter than a layer's backward:

1. it runs: no exception, deadlock or unreceived message;
2. it returns a dict with every parameter's name and shape, and backward ran
   on every rank, every layer (gradients taken without it are not real);
3. the averaged gradients are exact on every rank (the hidden gradients are
   whole multiples of P, so every summation order gives the same numbers);
   diagnosed: no communication, summed not averaged, averaged twice, a bucket
   sent before its gradients were in it;
4. every AllReduce runs on the communication stream (``comm.start``), none in
   the program itself (that would stop backward while it runs);
5. the buckets: their number, sizes and order (reverse layer order; each
   closed once it reaches the cap), read from the trace's AllReduce calls;
6. what the messages carry (recorded payloads): each bucket's AllReduce
   carries that bucket's gradients, summed over the right ranks;
7. overlap, from the simulated times: every bucket but the last (more
   precisely: every bucket without a gradient of layer 0, which is ready only
   when backward ends) starts its AllReduce before backward ends, and backward
   never waits for the network (each layer's backward starts when the one
   before it ends).

On ``backend="torch"`` checks 4-7 are skipped (they read simulated times).
"""

import functools

import numpy as np

from ..kit.checks import first_wait
from ..kit.report import Case, Failure
from ..kit.running import plain_array, run_case
from . import _payloads as payloads
from ..kit.driver import callable_learner
from ...cost.alpha_beta import AlphaBeta
from ...data_parallel.buckets import assign_buckets

NAME = "bucketed_grad_sync"
# Part 1's collectives are the tools here: `ringlab grade` lets submissions use them
# (ring_allreduce), but not ringlab.data_parallel, which holds the reference answers.
USES = ("collectives",)
# Every rank's result needs every rank's data (the causality check: see kit/causality.py).
DEPENDS_ON_ALL = True
NETWORK = AlphaBeta(alpha=1e-6, beta=1e-9)   # an AllReduce here: ~10 us; a layer: >= 1 ms


def cases(rng):
    # (world size, layers, how the cap compares with the tensors)
    for p, layers, cap_kind in ((4, 5, "mid"), (2, 4, "mid"), (3, 6, "small"), (8, 5, "mid"),
                                (5, 4, "large"), (4, 7, "mid"), (6, 3, "tiny")):
        widths = [int(w) for w in rng.choice(np.arange(2, 14), size=layers + 1, replace=False)]
        shapes = []
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            shapes += [(f"{i}.weight", (a, b)), (f"{i}.bias", (b,))]
        nbytes = [8 * int(np.prod(s)) for _, s in shapes]
        # "mid": the bytes of the last few tensors exactly, about 1/3.5 of the model, so
        # that the first bucket lands on the cap: closing at > instead of >= fails.
        walk = np.cumsum(nbytes[::-1])
        mid = int(walk[np.searchsorted(walk, sum(nbytes) / 3.5)])
        cap = {"tiny": 8, "small": min(nbytes[2:]) + 8, "mid": mid,
               "large": 10 * sum(nbytes)}[cap_kind]
        seconds = [float(t) for t in rng.choice([1e-3, 2e-3, 3e-3], size=layers)]
        inputs = []
        for _ in range(p):
            # Whole multiples of P: the mean over ranks is exact in any summation order.
            grads = {n: p * rng.integers(-50, 51, s).astype(np.float64) for n, s in shapes}
            inputs.append(grads)
        params = {n: np.zeros(s) for n, s in shapes}
        yield Case(p, inputs, f"world_size={p}, {layers} layers (widths {widths}), "
                   f"cap_bytes={cap}", args=(cap, seconds),
                   info=dict(shapes=shapes, cap=cap, seconds=seconds, params=params,
                             buckets=assign_buckets(params, cap)))


def layer_backward(comm, grads, seconds):
    """The hidden backward: layer by layer, last first; compute, then the layer's gradients."""
    for i in reversed(range(len(seconds))):
        comm.compute(seconds[i], "backward", layer=i)
        yield {n: g.copy() for n, g in grads.items() if n.split(".")[0] == str(i)}


def _train(comm, grads, cap, seconds, learner):
    """What every rank runs. Returns the learner's gradients as a list in
    ``params`` order (a run's result must be arrays, not a dict)."""
    learner = callable_learner(learner)
    params = {n: np.zeros_like(g) for n, g in grads.items()}
    out = learner(comm, params, layer_backward(comm, grads, seconds), cap)
    if not isinstance(out, dict):
        raise TypeError(f"bucketed_grad_sync returned {type(out).__name__}; it must return a "
                        f"dict {{name: averaged gradient}}, like model.named_grads()")
    missing = [n for n in params if n not in out]
    if missing:
        raise TypeError(f"bucketed_grad_sync returned no gradient for {', '.join(missing)}: "
                        f"unpack every bucket back into its parameters")
    return [out[n] for n in params]


def check(program, case, backend="sim"):
    run = functools.partial(_train, learner=program)
    kw = {"network": NETWORK} if backend == "sim" else {}
    result, failure = run_case(run, case, backend, **kw)
    if failure:
        return failure
    # Backward first: gradients that are right without it came from somewhere else.
    failure = (_returned(result.outputs, case)
               or (_backward_ran(result.trace, case) if backend == "sim" else None)
               or _values(result, case))
    if failure or backend != "sim":
        return failure
    return (_stream(result.trace, case) or _buckets(result.trace, case)
            or _payloads(result, case) or _overlap(result.trace, case))


def _payloads(result, case):
    """Each bucket's AllReduce carries the ranks' gradients of that bucket (laid
    out in bucket order or in forward order; divided by P before or not)."""
    p, params = case.world_size, case.info["params"]
    operands = []
    for names in case.info["buckets"]:
        layouts = [names, sorted(names, key=list(params).index)]
        operands.append([[np.concatenate([case.inputs[r][n].ravel() for n in layout])
                          for r in range(p)] for layout in layouts])
    return payloads.check_allreduces(
        result, case, payloads.messages_by_rank(result.trace, p, stream=1), operands,
        scales=(1.0, 1.0 / p), what="the bucket's gradients",
        hint="AllReduce each bucket's real gradients, as float64. The grader reads every "
             "message; zeros, stand-ins or gradients shared outside the messages do not pass.")


def _returned(outputs, case):
    for r, out in enumerate(outputs):          # _train made it a list in params order
        for (name, shape), value in zip(case.info["shapes"], out):
            failure = plain_array(case, f"rank {r}'s gradient {name!r}", value,
                                  f"a numpy array of shape {shape}")
            if failure:
                return failure
            if not isinstance(value, np.ndarray) or value.shape != shape:
                return Failure(case.label, "returns {name: averaged gradient}",
                               f"rank {r}: gradient {name!r} has the wrong shape or type",
                               expected=f"a numpy array of shape {shape}",
                               got=f"{type(value).__name__} of shape {np.shape(value)}",
                               hint="Unpack every bucket back into its parameters' shapes.")
    return None


def _layers(layers):
    return f"layer {layers[0]}" if len(layers) == 1 else (
        "layers " + ", ".join(map(str, layers[:-1])) + f" and {layers[-1]}")


def _backward_ran(trace, case):
    """Every rank ran every layer's backward (the hidden iterator's compute events):
    a program that skips it, or stops early, has no real gradients to sync."""
    layers = len(case.info["seconds"])
    for r in range(case.world_size):
        ran = [c.get("layer") for c in trace.computes
               if c.rank == r and c.label == "backward" and not c.stream]
        if len(ran) < layers:
            missing = [i for i in reversed(range(layers)) if i not in ran]
            return Failure(case.label, "backward runs, every layer",
                           f"rank {r} ran the backward of {len(ran)} of the {layers} layers: "
                           + (f"{_layers(ran)}; not {_layers(missing)}" if ran else "none"),
                           expected=f"{layers} layers' backward on every rank, layer "
                                    f"{layers - 1} first: every next(backward), to the end",
                           got=f"{len(ran)} layers",
                           hint="Loop over the backward iterator to its end (for ready in "
                                "backward: ...): each next(backward) computes one layer's "
                                "gradients; a gradient is real only once it has run.")
        # Exactly the hidden backward's events: backward events the program wrote itself
        # (a layer's time moved to another, so that buckets look ready early) are not it.
        seconds = case.info["seconds"]
        hidden = [(i, seconds[i]) for i in reversed(range(layers))]
        got = [(c.get("layer"), c.end - c.start) for c in trace.computes
               if c.rank == r and c.label == "backward" and not c.stream]
        bad = next((k for k, (g, h) in enumerate(zip(got, hidden))
                    if g[0] != h[0] or abs(g[1] - h[1]) > 1e-9 * h[1]), len(hidden))
        if len(got) != layers or bad < layers:
            what = (f"rank {r} has {len(got)} backward compute events for {layers} layers"
                    if bad == layers else
                    f"rank {r}'s backward event {bad} is layer {got[bad][0]}, "
                    f"{got[bad][1] * 1e3:.6g} ms; the hidden backward's is layer "
                    f"{hidden[bad][0]}, {hidden[bad][1] * 1e3:.6g} ms")
            return Failure(case.label, "backward runs, every layer",
                           what + ": the program wrote backward events of its own",
                           expected=f"the hidden backward's {layers} events, layer "
                                    f"{layers - 1} first, each as long as its layer's backward",
                           got=f"{len(got)} events",
                           hint="Only next(backward) runs a layer's backward: do not call "
                                "comm.compute(..., \"backward\") yourself.")
    return None


def _values(result, case):
    p = case.world_size
    total = {n: sum(case.inputs[r][n] for r in range(p)) for n, _ in case.info["shapes"]}
    mean = {n: t / p for n, t in total.items()}
    for r, out in enumerate(result.outputs):
        for (name, _), got in zip(case.info["shapes"], out):
            if np.array_equal(got, mean[name]):
                continue
            fail = Failure(case.label, "the averaged gradients are exact",
                           f"rank {r}, gradient {name!r}: not the mean over the {p} ranks",
                           expected=f"{mean[name].ravel()[:4]}...", got=f"{got.ravel()[:4]}...",
                           hint="AllReduce every bucket, then divide by the world size once.")
            own = case.inputs[r][name]
            if np.array_equal(got, own) or np.array_equal(got, own / p):
                fail.what += ": it is this rank's own gradient (perhaps / P): no AllReduce"
                fail.hint = "Every bucket must be AllReduced (comm.start(ring_allreduce, ...))."
            elif np.array_equal(got, total[name]):
                fail.what += ": it is the sum, not the mean"
                fail.hint = "ring_allreduce sums; divide by comm.world_size once."
            elif np.allclose(got, mean[name] / p):
                fail.what += ": it is averaged twice (divided by P twice)"
                fail.hint = ("Divide by the world size once: before the AllReduce or after, "
                             "not both.")
            elif (misplaced := _unpacked_from(got, name, mean, case)) is not None:
                fail.what += (f": its values are elements {misplaced[0]}..{misplaced[1]} of its "
                              f"bucket's averaged vector, where {name!r} is elements "
                              f"{misplaced[2]}..{misplaced[3]}: unpacked from the wrong place")
                fail.hint = ("Unpack each bucket in the order you packed it, advancing the "
                             "offset by each tensor's size.")
            elif (np.any((got == 0) & (mean[name] != 0))
                  and np.all((got == 0) | (got == mean[name]))):
                fail.what += (": some entries are 0, as if the bucket was sent before its "
                              "gradient was in it")
                fail.hint = ("Start a bucket's AllReduce only when its last gradient has been "
                             "copied in: the AllReduce sends what the buffer holds then.")
            return fail
    return None


def _unpacked_from(got, name, mean, case):
    """(first, last, own first, own last) when ``got`` is a run of elements of its
    bucket's averaged vector (packed in bucket or in forward order) other than its
    own: an unpacking bug. None otherwise."""
    params = list(case.info["params"])
    bucket = next(b for b in case.info["buckets"] if name in b)
    k = got.size
    for layout in (bucket, sorted(bucket, key=params.index)):
        flat = np.concatenate([mean[n].ravel() for n in layout])
        own = sum(mean[n].size for n in layout[:layout.index(name)])
        for o in range(flat.size - k + 1):
            if o != own and np.array_equal(flat[o:o + k], got.ravel()):
                return o, o + k - 1, own, own + k - 1
    return None


def _stream(trace, case):
    on_program = [e for e in trace if e.stream == 0]
    if on_program:
        e = on_program[0]
        return Failure(case.label, "AllReduces run on the communication stream",
                       f"at step {e.step} rank {e.src} sent rank {e.dst} a message from the "
                       f"program itself, not from a work started with comm.start",
                       expected="every message on stream 1 (comm.start)",
                       hint="Launch each bucket's AllReduce with work = comm.start(ring_allreduce, "
                            "bucket) and work.wait() only after backward: a direct call blocks "
                            "backward until the AllReduce is done.")
    return None


def _calls(trace):
    """The AllReduce calls on the communication stream, in start order: (elements, t_starts)."""
    p = trace.world_size
    rows = [r for r in trace.collectives() if r["span"] == "ring_allreduce"]
    starts = {}
    for s in trace.spans:
        if s.path == "ring_allreduce" and s.stream == 1:
            starts.setdefault(s.rank, []).append(s.t_start)
    return [(row["bytes"] // (16 * (p - 1)), [starts[r][k] for r in range(p)])
            for k, row in enumerate(rows)]


def _buckets(trace, case):
    info = case.info
    params, want, calls = info["params"], info["buckets"], _calls(trace)

    def sizes(buckets):                     # elements per bucket
        return [sum(params[n].size for n in b) for b in buckets]
    want_sizes, got_sizes = sizes(want), [n for n, _ in calls]
    if len(trace) and not calls:
        return Failure(case.label, "buckets: reverse layer order, closed at the cap",
                       "messages were sent, but no ring_allreduce call was found",
                       hint="AllReduce each bucket with ringlab.collectives.ring_allreduce, so the "
                            "trace shows one call per bucket.")
    if got_sizes == want_sizes:
        return None
    forward = sizes(assign_buckets(dict(reversed(list(params.items()))), info["cap"]))
    fail = Failure(case.label, "buckets: reverse layer order, closed at the cap",
                   f"{len(calls)} bucket AllReduce(s) of {got_sizes} elements",
                   expected=f"{len(want)} buckets of {want_sizes} elements: "
                            + "; ".join(", ".join(b) for b in want),
                   got=f"buckets of {got_sizes} elements")
    if got_sizes == forward and forward != want_sizes:
        fail.what += ": the buckets were filled in forward order"
        fail.hint = ("Backward makes the last layer's gradients first: fill buckets walking the "
                     "parameters in reverse (reversed(list(params))).")
    # closing at size > cap_bytes (bytes are whole numbers: >= cap_bytes + 1)
    elif got_sizes == sizes(assign_buckets(params, info["cap"] + 1)):
        fail.what += (f": a bucket that holds exactly cap_bytes ({info['cap']} bytes) was kept "
                      f"open, as if the size were compared with > instead of >=")
        fail.hint = ("Close a bucket as soon as the bytes in it reach cap_bytes: size >= "
                     "cap_bytes, as torch's compute_bucket_assignment_by_size does.")
    elif len(calls) == len(params):
        fail.what += ": one AllReduce per parameter"
        fail.hint = "Pack parameters into a bucket until it holds cap_bytes or more."
    elif len(calls) == 1:
        fail.what += ": everything in one AllReduce"
        fail.hint = "Close a bucket as soon as it holds cap_bytes or more, and start the next."
    elif sum(got_sizes) == sum(want_sizes):
        fail.hint = ("Close a bucket as soon as the bytes in it reach cap_bytes (>=), after adding "
                     "the tensor that takes it there; not before (that leaves it under the cap).")
    else:
        fail.hint = "Every gradient must be AllReduced exactly once, in exactly one bucket."
    return fail


def _overlap(trace, case):
    calls, buckets = _calls(trace), case.info["buckets"]
    # Buckets holding a gradient of layer 0 are ready only when backward ends
    # (the last bucket, and with a tiny cap also the one before it): exempt.
    early = [not any(n.startswith("0.") for n in b) for b in buckets]
    for r in range(case.world_size):
        back = [c for c in trace.computes if c.rank == r and c.label == "backward" and not c.stream]
        end = max(c.end for c in back)
        done = {c.get("layer"): c.end for c in back}     # when each layer's gradients exist
        for k, (size, starts) in enumerate(calls):
            ready = max(done.get(int(n.split(".")[0]), end) for n in buckets[k])
            if starts[r] < ready - 1e-12:
                # A gradient read before backward made it (e.g. from the backward
                # generator's frame): no real DDP can send what does not exist yet.
                return Failure(
                    case.label, "buckets start when their gradients are ready",
                    f"rank {r}: bucket {k} ({size} elements) started its AllReduce at "
                    f"{starts[r] * 1e3:.3f} ms, before its last gradient was computed "
                    f"({ready * 1e3:.3f} ms)",
                    expected="each bucket's AllReduce starts after the backward of its layers",
                    hint="Take gradients only from what the backward loop has yielded so far.")
            if early[k] and starts[r] >= end - 1e-12:
                return Failure(
                    case.label, "buckets overlap backward",
                    f"rank {r}: bucket {k} ({size} elements) started its AllReduce at "
                    f"{starts[r] * 1e3:.3f} ms, when backward had ended ({end * 1e3:.3f} ms)",
                    expected="every bucket but the last starts while backward still runs",
                    hint="Start each bucket's AllReduce inside the backward loop, as soon as its "
                         "last gradient has arrived; wait for the works after the loop.")
        if gap := first_wait(back):
            before, after = gap
            return Failure(
                case.label, "backward never waits for the network",
                f"rank {r}: layer {after.get('layer')}'s backward started at "
                f"{after.start * 1e3:.3f} ms, {(after.start - before.end) * 1e6:.1f} us after "
                f"layer {before.get('layer')}'s ended",
                expected="each layer's backward starts when the previous one ends",
                hint="Do not call work.wait() inside the backward loop: that waits for the "
                     "AllReduce. Collect the works and wait after backward.")
    return None
