"""Grader for exercise ``moe_dispatch_combine``: a mixture-of-experts layer's
dispatch and combine over expert-parallel ranks.

Signature: ``moe_dispatch_combine(comm, tokens, gates, expert) -> array``. The
E experts sit on the e ranks of the world, E/e consecutive ones each (rank r:
experts r*E/e .. (r+1)*E/e - 1). ``tokens`` is this rank's (n, d) float64
tokens (n differs from rank to rank, and may be 0); ``gates`` (n, E) their
gates, 0 where a token does not go (not among its top k, or dropped by the
capacity: the gates come from ``ringlab.nn.moe.route(...).dense_gates()``,
capacity already applied); ``expert(i, x)`` applies expert i, one of this
rank's, to rows x (m, d). Every rank returns (n, d):
``y[t] = sum_i gates[t, i] * expert_i(tokens[t])``; a token that every expert
dropped gets 0.

Checks, on world sizes 1 to 8 with one or two experts per rank, top-1 and
top-2 gates (both gatings of ``ringlab.nn.moe``), with and without capacity
(the cases with capacity overflow it: assignments are dropped, some tokens
entirely), uneven token counts (a rank with no tokens, a rank nobody routes
to, pairs of ranks with nothing between them), fresh random data:

1. it runs: no exception, deadlock, endless loop or unreceived message; a rank
   calls ``expert`` only for its own experts, on float64 (m, d) arrays;
2. every rank returns a plain float64 (n, d) array equal, to rounding, to the
   same MoE computed here in one process (numpy); a wrong row is explained
   (no gate weighting, outputs put back on the wrong tokens, a dropped token
   that is not 0, the gates renormalised, a missing expert). Before the values,
   tokens and outputs travel as float64 (float32 on the way rounds y); and a wrong
   result whose counts are wrong names the counts, its cause (a total instead of
   one count per expert, rows of gate 0 counted, rows of a small gate left out),
   one whose tokens arrived right names the expert given a token not routed to it;
3. the messages, read from the recorded payloads (the tokens are random, so
   each row is known by its values): from every rank s to every rank d != s,
   first a **counts** message, the integers saying how many of s's rows go to
   each of d's experts (d's E/e counts, or all E of s's counts), even when
   they are 0; then at most one message of **tokens**, exactly s's rows routed
   to d's experts (a token once per expert of d it goes to, in any order,
   unchanged), and at most one message of **outputs**, exactly s's experts'
   outputs for d's tokens routed to them; nothing else (an empty block may
   travel or not). So: no token goes to a rank that does not hold its expert,
   nor a dropped one; no rank sends all its tokens everywhere; two AlltoAlls
   of uneven sizes after the counts;
4. every expert computes exactly the rows routed to it (tokens per expert).

Part 1's collectives are tools here (``alltoall`` for the counts, or the
blocks); ``ringlab.frontier.expert_parallel`` (the reference, its
``alltoallv``, ``dispatch`` and ``combine``) is not, under ``ringlab grade``.
"""

import functools
import itertools
from collections import Counter

import numpy as np

from ..kit import checks
from ..kit.driver import callable_learner
from ..kit.frames import without_grader_frames
from ..kit.report import Case, Failure, numbers
from ..kit.running import plain_array, run_case
from ...frontier import expert_parallel  # experts_of; importing it registers its answers
from ...nn.moe import route

NAME = "moe_dispatch_combine"
# Part 1's collectives are helpers here (an AlltoAll of the counts, or of the blocks).
USES = ("collectives",)
# Not DEPENDS_ON_ALL: a rank whose tokens go to no expert of rank j rightly
# ignores j's input. The causality check still reads every message.
TOL = 1e-10
MISUSE = "expert() misused"
# (ranks e, experts per rank, top k, capacity factor, gating, what is special)
SHAPES = ((4, 2, 2, 1.0, "topk_softmax", ""),
          (1, 2, 2, None, "topk_softmax", ""),
          (2, 1, 1, None, "softmax_topk", ""),
          (2, 2, 2, 1.25, "topk_softmax", "empty"),
          (3, 2, 2, 0.5, "topk_softmax", ""),
          (5, 1, 1, 1.0, "softmax_topk", "empty"),
          (6, 1, 2, None, "topk_softmax", "shunned"),
          (7, 1, 1, 1.25, "topk_softmax", "shunned"),
          (8, 2, 2, 1.0, "softmax_topk", "empty"))
BROADCAST_HINT = ("Sending every token to every rank (a broadcast, or an AllGather of tokens and "
                  "gates) moves e times the bytes of a dispatch. Send rank d only the tokens "
                  "whose gates for rank d's experts are nonzero, and keep the gates home.")
COUNTS_HINT = ("Before any token moves, every rank tells every other rank, directly, how "
               "many of its rows go to each of that rank's experts (an AlltoAll of counts: "
               "alltoall(comm, [counts for rank d's experts, for each d])), zeros included: "
               "the receiver needs them to size its buffers and to split what arrives by "
               "expert, since routing changes every step.")


# -- cases --------------------------------------------------------------------------------

def cases(rng):
    for e, per, k, cap, gating, special in SHAPES:
        yield _case(rng, e, per, k, cap, gating, special)


def _case(rng, e, per, k, cap, gating, special):
    """Tokens, gates (skewed logits: popular experts overflow) and experts."""
    E, d, h = e * per, int(rng.integers(3, 6)), int(rng.integers(4, 7))
    counts = [int(c) for c in rng.integers(2, 11, size=e)]
    if special == "empty":
        counts[int(rng.integers(0, e))] = 0          # a rank without tokens
    bias = rng.normal(0, 1.5, size=E)
    shunned = int(rng.integers(0, e)) if special == "shunned" else None
    if shunned is not None:                          # nobody routes to this rank's experts
        bias[shunned * per:(shunned + 1) * per] = -50.0
    w1, w2 = rng.standard_normal((E, d, h)) / np.sqrt(d), rng.standard_normal((E, h, d))
    inputs, info = [], dict(experts=(w1, w2), per=per, top_k=k, dropped=[])
    for r, n in enumerate(counts):
        x = rng.standard_normal((n, d))
        routing = route(rng.standard_normal((n, E)) + bias, k, cap, gating)
        info["dropped"].append([(int(t), int(routing.expert[t, j]))
                                for t, j in zip(*np.nonzero(~routing.kept))])
        inputs.append((x, routing.dense_gates(), w1[r * per:(r + 1) * per].copy(),
                       w2[r * per:(r + 1) * per].copy()))
    label = (f"{e} rank{'s' * (e > 1)} x {per} expert{'s' * (per > 1)}, top-{k} {gating}, "
             f"capacity factor {cap}, tokens per rank {counts}, d={d}")
    return Case(e, inputs, label, args=(per,), info=info)


def expert_rows(w1, w2, x):
    """One expert, row by row: tanh(x W1) W2."""
    return np.tanh(x @ w1) @ w2


def expected(case):
    """Each rank's y, computed here in one process: sum_i gates[:, i] * E_i(x)."""
    w1, w2 = case.info["experts"]
    return [sum((gates[:, i:i + 1] * expert_rows(w1[i], w2[i], x)
                 for i in range(gates.shape[1])), np.zeros_like(x))
            for x, gates, *_ in case.inputs]


# -- what every rank runs ---------------------------------------------------------------

def drive(comm, inp, per, learner):
    """Rank r's experts as ``expert(i, x)``, the learner's function, and what the
    experts computed: returns (y, rows computed by each of my experts)."""
    learner = callable_learner(learner)
    x, gates, w1, w2 = inp
    first, d = comm.rank * per, x.shape[1]
    rows = np.zeros(per, dtype=np.int64)

    def expert(i, block):
        if not isinstance(i, (int, np.integer)) or not first <= i < first + per:
            i = int(i) if isinstance(i, (int, np.integer)) else repr(i)[:40]
            raise ValueError(f"{MISUSE}: rank {comm.rank} called expert({i}, ...), but it "
                             f"holds experts {first}..{first + per - 1} only: send the tokens "
                             f"to the rank that holds expert {i}")
        if (type(block) is not np.ndarray or block.dtype != np.float64 or block.ndim != 2
                or block.shape[1] != d):
            raise ValueError(f"{MISUSE}: rank {comm.rank} called expert({i}, x) with "
                             f"{type(block).__name__} {getattr(block, 'shape', '')} "
                             f"{getattr(block, 'dtype', '')}: x must be a float64 array of "
                             f"shape (rows, {d})")
        rows[i - first] += len(block)
        return expert_rows(w1[i - first], w2[i - first], block)
    return learner(comm, x, gates, expert), rows


def check(program, case, backend="sim"):
    result, failure = run_case(functools.partial(drive, learner=program), case, backend)
    if failure:
        failure.got = without_grader_frames(failure.got)
        if MISUSE in failure.what:
            failure.check = "each rank applies only its own experts"
            failure.hint = ("expert(i, x) runs only on the rank that holds expert i: rank r "
                            "holds experts r*E/e .. (r+1)*E/e - 1. Send each token there "
                            "(dispatch), and its output back (combine).")
        return failure
    outputs = [out[0] for out in result.outputs]
    # (run_case records every message's payload: the checks below read them)
    plan, sent = Plan(case), _sent(result)
    failure = _returned(outputs, case) or _wire(result, case, plan, sent)
    if failure:
        return failure
    wrong = _values(outputs, case)
    if wrong:
        # Counts that do not say how many rows go to each expert make the receiver split
        # what arrives wrongly: that message is the cause of the wrong result.
        # So do right rows given to the wrong experts, where they arrive.
        return _all_counts(result, case, plan, sent) or _misapplied(result, case, plan, sent) \
            or wrong
    return (messages(result, case, plan, sent)
            or _computed([out[1] for out in result.outputs], case, plan))


# -- 2. the result ------------------------------------------------------------------------

def _returned(outputs, case):
    for r, out in enumerate(outputs):
        shape = case.inputs[r][0].shape
        failure = plain_array(case, f"rank {r}", out, f"a numpy array of shape {shape}")
        if failure:
            return failure
        if not isinstance(out, np.ndarray) or out.shape != shape:
            what = (f"an array of shape {out.shape}" if isinstance(out, np.ndarray)
                    else type(out).__name__)
            return Failure(case.label, "every rank returns its result",
                           f"rank {r} returned {what}",
                           expected=f"a float64 array of shape {shape}: one row per token of "
                                    f"this rank, in the order of `tokens`",
                           got=what if isinstance(out, np.ndarray) else repr(out)[:200],
                           hint="Return y with y[t] = sum_i gates[t, i] * expert_i(tokens[t]): "
                                "start from np.zeros_like(tokens) and add each expert's gated "
                                "output into the rows of its tokens.")
    return None


def _values(outputs, case):
    wrong = [(r, out, want, _wrong_rows(out, want))
             for r, (out, want) in enumerate(zip(outputs, expected(case)))]
    wrong = [w for w in wrong if len(w[3])]
    if not wrong:
        return None
    # The explanation most wrong tokens share, shown on the first token it explains. A
    # token may fit several (with one expert left after a drop, the gates renormalised
    # and no gates at all give the same row): it counts for each, on every rank.
    said = [[(int(t), _explanations(case, r, int(t), out[t], want[t])) for t in bad[:12]]
            for r, out, want, bad in wrong]
    votes = Counter(h for rank in said for _, found in rank for h in {h for _, h in found})
    t, words, hint = max(((t, w, h) for t, found in said[0] for w, h in found),
                         key=lambda x: votes[x[2]])
    r, out, want, bad = wrong[0]
    return Failure(case.label, "every rank returns y = sum_i gates[t, i] * expert_i(x_t)",
                   f"rank {r}: {len(bad)} of {len(out)} tokens wrong, the first token "
                   f"{t}: {words}",
                   expected=f"token {t}: {numbers(want[t])}", got=numbers(out[t]), hint=hint)


def _wrong_rows(out, want):
    # "not within", so that a NaN (every comparison False) is wrong too
    return np.flatnonzero(~(np.abs(out - want) <= TOL * (1 + np.abs(want))).all(axis=1))


def _same(a, got):
    return np.allclose(a, got, rtol=1e-9, atol=1e-12)


def _explanations(case, r, t, got, want):
    """[(what token t's wrong row is, what to try)], each one that fits, most specific
    first; at least one."""
    x, gates = case.inputs[r][0], case.inputs[r][1]
    w1, w2 = case.info["experts"]
    mine = np.flatnonzero(gates[t])
    outs = {i: expert_rows(w1[i], w2[i], x[t]) for i in mine}
    dropped = [i for s, i in case.info["dropped"][r] if s == t]
    if not len(mine):
        why = (f"its assignments to experts {', '.join(map(str, dropped))} were all dropped "
               f"by capacity" if dropped else "it goes to no expert")
        if _same(x[t], got):
            return [(f"{why}, and it got the token itself",
                     "A token that every expert dropped gets 0 from this layer (in a "
                     "transformer the residual connection carries it past): do not fill it "
                     "in.")]
        return [(f"{why} (all its gates are 0), so its output is 0",
                 "Send a token only to the experts whose gate is nonzero, and leave the rows "
                 "of tokens that go nowhere at 0.")]
    found, total = [], gates[t, mine].sum()
    if (dropped and not np.isclose(total, 1)
            and _same(sum(gates[t, i] / total * outs[i] for i in mine), got)):
        found.append((f"the gates renormalised over the experts it reached (its assignment "
                      f"to expert {dropped[0]} was dropped by capacity)",
                      "Use the gates as they are: a dropped assignment's gate is 0 and the "
                      "others keep theirs (nothing is renormalised)."))
    if _same(sum(outs.values()), got):
        found.append(("the experts' outputs summed without their gates",
                      "Weight each expert's output by the token's gate for that expert: "
                      "y[t] += gates[t, i] * out_i[t]. (The gates are the router's weights.)"))
    for i in mine:
        if _same(want - gates[t, i] * outs[i], got):
            owner = i // case.info["per"]
            own = " (one of this rank's own experts: its rows never travel, but count)" \
                if owner == r else ""
            found.append((f"it lacks expert {i}'s share, on rank {owner}{own}",
                          f"Every expert with a nonzero gate adds gates[t, i] * out_i[t]; "
                          f"expert {i}'s output for this token never reached y."))
            break
    return found or [_mixed_up(case, r, t, got, mine)]


def _mixed_up(case, r, t, got, mine):
    """Token t's row as gated outputs of *other* (token, expert) pairs of rank r:
    the outputs came back and were added to the wrong rows, or gated wrongly."""
    x, gates = case.inputs[r][0], case.inputs[r][1]
    w1, w2 = case.info["experts"]
    values = {(int(s), int(i)): expert_rows(w1[i], w2[i], x[s])
              for s, i in zip(*np.nonzero(gates))}
    for combo in itertools.product(values, repeat=len(mine)):
        wrong = [(c, i) for i, c in zip(mine, combo) if c != (t, i)]
        if wrong and _same(sum(gates[t, i] * values[c] for i, c in zip(mine, combo)), got):
            (s, j), i = wrong[0]
            who = f"token {s}" if s != t else "this token"
            return (f"its share of expert {i} (gate {gates[t, i]:.6g}) is expert {j}'s output "
                    f"for {who}",
                    "The outputs came back in the order they were sent (by destination rank, "
                    "expert by expert, and in each the rows in the order you sent them), not "
                    "in token order: remember which token each sent row was and add each "
                    "returned row to that token's y, times that token's gate for that expert.")
    return ("a row that is no gated sum of this rank's experts' outputs",
            "y[t] = sum over the experts i with gates[t, i] != 0 of gates[t, i] * "
            "expert_i(tokens[t]): check which rows you send to whom and which rows come back.")


# -- 3. the messages ----------------------------------------------------------------------

class Plan:
    """What must travel in a case: ``counts[s]`` (E,) rows of rank s per expert;
    ``tokens[s][d]``, the token numbers (one per assignment) of rank s routed to
    rank d's experts; ``outputs[s][d]``, rank s's experts' outputs for them, as
    rank s sends them back to d: ``outputs[d][s]`` answers ``tokens[s][d]``."""

    def __init__(self, case):
        e, per = case.world_size, case.info["per"]
        w1, w2 = case.info["experts"]
        gates = [inp[1] for inp in case.inputs]
        self.e, self.per, self.x = e, per, [inp[0] for inp in case.inputs]
        self.counts = [(g != 0).sum(axis=0) for g in gates]
        self.tokens = [[[int(t) for i in self.owned(d) for t in np.flatnonzero(g[:, i])]
                        for d in range(e)] for g in gates]
        self.outputs = [[[expert_rows(w1[i], w2[i], self.x[d][t])
                          for i in self.owned(s) for t in np.flatnonzero(gates[d][:, i])]
                         for d in range(e)] for s in range(e)]
        self.gates, self.dropped = gates, case.info["dropped"]

    def owned(self, d):
        """Rank d's experts: ``expert_parallel.experts_of``, the layout of the part."""
        return expert_parallel.experts_of(d, self.e * self.per, self.e)


def messages(result, case, plan, sent):
    """Check 3: per ordered pair of ranks, the counts, then the tokens and the outputs
    (``sent``: ``_sent(result)``)."""
    e = case.world_size
    pairs = [(s, d) for s in range(e) for d in range(e) if s != d]
    failure = _broadcast(result, case, plan) or _all_counts(result, case, plan, sent)
    if failure:
        return failure
    later = sorted((ev for s, d in pairs for ev in sent[s, d][1:]), key=lambda ev: ev.step)
    used = set()
    for ev in later:
        failure = _rows_message(result, case, plan, ev, used)
        if failure:
            return failure
    return next((_missing(case, plan, s, d, kind) for s, d in pairs
                 for kind, rows in (("tokens", plan.tokens[s][d]), ("outputs", plan.outputs[s][d]))
                 if len(rows) and (s, d, kind) not in used), None)


def _sent(result):
    """{(s, d): the messages from rank s to rank d, in the order they were sent}."""
    sent = {}
    for ev in sorted(result.trace, key=lambda ev: (ev.step, ev.seq)):
        sent.setdefault((ev.src, ev.dst), []).append(ev)
    return sent


def _all_counts(result, case, plan, sent):
    """The first pair of ranks whose first message is not the counts, or None; the
    first whose counts are not all 0 if there is one, so the report shows real ones."""
    first, e = None, case.world_size
    for s, d in itertools.permutations(range(e), 2):
        failure = _counts(result, case, plan, s, d, sent.get((s, d), []))
        if failure and plan.counts[s][plan.owned(d)].any():
            return failure
        first = first or failure
    return first


def _misapplied(result, case, plan, sent):
    """A Failure if rank d, whose tokens from rank s arrived right, sends back an
    expert's output for one of them that does not go to that expert: d split what
    arrived among its experts wrongly."""
    w1, w2 = case.info["experts"]
    back = sorted((ev for events in sent.values() for ev in events[1:]), key=lambda ev: ev.step)
    for ev in back:
        d, s, p = ev.src, ev.dst, result.payload(ev)
        x, mine = plan.x[s], plan.owned(d)
        came = next((t for t in sent.get((s, d), [])[1:] if plan.tokens[s][d] and _same_rows(
            result.payload(t), x[plan.tokens[s][d]], exact=True)), None)
        if came is None or type(p) is not np.ndarray or p.ndim != 2 or not len(p) \
                or p.shape[1:] != x.shape[1:]:
            continue
        outs = {i: expert_rows(w1[i], w2[i], x) for i in mine}
        found = [[(u, i) for i in mine for u in range(len(x)) if _same(outs[i][u], row)]
                 for row in p]
        if not all(found):
            continue                      # not (only) outputs of d's experts for s's tokens
        wrong = next((pairs[0] for pairs in found if not any(plan.gates[s][u, i]
                                                             for u, i in pairs)), None)
        if wrong is None:
            continue
        u, i = wrong
        goes = [int(j) for j in np.flatnonzero(plan.gates[s][u])]
        routed = "; ".join(f"expert {j}: tokens {np.flatnonzero(plan.gates[s][:, j]).tolist()}"
                           for j in mine)
        return Failure(case.label, "every expert computes exactly its tokens",
                       f"rank {d} applied expert {i} to rank {s}'s token {u}, which goes to "
                       f"expert(s) {goes} only: rank {s}'s tokens reached rank {d} right at "
                       f"step {came.step}, but rank {d} split them among its experts wrongly "
                       f"(at step {ev.step} it sent that output back to rank {s})",
                       expected=f"rank {d}'s experts get rank {s}'s rows routed to them: "
                                f"{routed}",
                       got=f"expert {i}'s output for token {u}",
                       hint="What arrives from rank s holds its rows for each of your experts, "
                            "one expert after the other, in the order rank s put them "
                            "together; the counts it sent say how many for each. Split by "
                            "them in that order (np.split(block, np.cumsum(counts)[:-1])) and "
                            "give the j-th piece to your j-th expert.")
    return None


def _wire(result, case, plan, sent):
    """Tokens and outputs travel as float64 (the counts, a pair's first message of whole
    numbers, may be of any type): float32 on the way rounds y to about 1e-7."""
    rows = sorted((ev for events in sent.values() for j, ev in enumerate(events)
                   if j or not _whole(result.payload(ev))), key=lambda ev: (ev.step, ev.seq))
    return checks.narrow_floats(
        result, case, events=rows, check="tokens and outputs travel as float64",
        carried=lambda ev: _rows_carried(plan, ev.src, ev.dst, result.payload(ev)),
        hint="Send the float64 arrays as they are, the tokens there and the experts' "
             "outputs back: no astype on the way (the grader compares y to 1e-10).")


def _whole(p):
    return isinstance(p, np.ndarray) and p.dtype.kind in "iuf" and np.array_equal(p, np.round(p))


def _rows_carried(plan, s, d, p):
    """What the rows from s to d are, to a float32's rounding: for a report."""
    width = plan.x[s].shape[1]
    tokens = plan.x[s][plan.tokens[s][d]]
    outputs = np.array(plan.outputs[s][d]).reshape(-1, width)
    for want, words in ((tokens, f"its tokens for rank {d}'s experts"),
                        (outputs, f"its experts' outputs for rank {d}'s tokens")):
        if p.ndim == 2 and p.shape[1] == width and len(want) and len(p):
            near = np.abs(p[:, None, :] - want[None]).max(axis=2)
            if (near.min(axis=1) <= 1e-5 * (1 + np.abs(want).max())).all():
                return words
    return "rows"


def _counts(result, case, plan, s, d, events):
    """The first message from s to d: s's counts for d's experts (or all E)."""
    mine, every = plan.owned(d), plan.counts[s]
    want, p = every[mine], events and result.payload(events[0])
    if not events:
        return Failure(case.label, "a counts exchange first",
                       f"rank {s} sent rank {d} nothing: not even how many rows go to its "
                       f"experts ({len(plan.tokens[s][d])})",
                       expected=f"first a message of rank {s}'s counts for rank {d}'s experts "
                                f"{', '.join(map(str, mine))}: {want.tolist()}",
                       got="no message", hint=COUNTS_HINT)
    if _is_counts(p, want, every):
        return None
    ev, lost, width = events[0], case.info["dropped"][s], plan.x[s].shape[1]
    late = every + np.bincount([i for _, i in lost], minlength=len(every))
    if lost and _is_counts(p, late[mine], late):
        u, i = next((x for x in lost if x[1] in mine), lost[0])
        return Failure(case.label, "dropped tokens are not sent",
                       f"at step {ev.step} rank {s} told rank {d} the counts "
                       f"{numbers(p, 8)}: they count the assignments the capacity dropped "
                       f"(gate 0), e.g. token {u}'s to expert {i}", got=f"{numbers(p, 8)}",
                       expected=f"rank {s}'s counts for rank {d}'s experts: {want.tolist()}",
                       hint="A token over its expert's capacity is dropped: its gate for that "
                            "expert is 0. Route by the nonzero gates, not by the k largest "
                            "(np.argsort): a dropped token does not travel, nor is it counted.")
    failure = _miscounted(result, case, plan, s, d, events, p, want, every)
    if failure:
        return failure
    array = isinstance(p, np.ndarray)
    if array and p.size == 1 and len(want) > 1 and p.item() == want.sum():
        what = (f"one number, {numbers(p.reshape(-1))[1:-1]} (shape {p.shape}): the total "
                f"of its rows for rank {d}, not one count per expert of rank {d} "
                f"(experts {', '.join(map(str, mine))}), so rank {d} cannot split what arrives by "
                f"expert")
    elif array and p.dtype.kind == "f" and p.ndim == 2 and p.shape[1] == width \
            and len(p) and not np.array_equal(p, np.round(p)):
        what = (f"rows (shape {p.shape}) before any counts: the counts exchange was "
                f"skipped")
    elif array and p.ndim == 2 and len(p) > 1 and p.shape[1] == len(want):
        what = (f"{numbers(p, 8)} (shape {p.shape}): the counts of several ranks, as a ring "
                f"AlltoAll forwards them, not straight from rank {s} to rank {d}")
    else:
        what = f"{numbers(p, 8)} (shape {np.shape(p)}), not its counts"
    return Failure(case.label, "a counts exchange first",
                   f"at step {ev.step} rank {s}'s first message to rank {d} carries {what}",
                   expected=f"rank {s}'s counts for rank {d}'s experts "
                            f"{', '.join(map(str, mine))}: {want.tolist()} "
                            f"(or all {len(every)} of its counts, {every.tolist()})",
                   got=f"{numbers(p, 8)}, shape {np.shape(p)}", hint=COUNTS_HINT)


def _broadcast(result, case, plan):
    """A message that holds every token of its sender (in its first d columns),
    where fewer go to the receiver: everything sent everywhere."""
    every = {}                          # sender -> {receiver: a message with all its tokens}
    for ev in sorted(result.trace, key=lambda ev: ev.step):
        s, p = ev.src, result.payload(ev)
        x = plan.x[s]
        if (len(x) and isinstance(p, np.ndarray) and p.ndim == 2 and p.shape[1] >= x.shape[1]
                and all(any(np.array_equal(row, q) for q in p[:, :x.shape[1]]) for row in x)):
            every.setdefault(s, {}).setdefault(ev.dst, ev)
    for s, got in sorted(every.items()):
        (n, width), tokens = plan.x[s].shape, plan.tokens[s]
        over = [ev for ev in got.values() if len(tokens[ev.dst]) < n]
        if len(got) == case.world_size - 1 and over:
            d, p = over[0].dst, result.payload(over[0])
            extra = f" (and {p.shape[1] - width} more columns each: their gates?)" \
                if p.shape[1] > width else ""
            return Failure(case.label, "no token goes to a rank that does not hold its expert",
                           f"rank {s} sent every rank all its {n} tokens; at step {over[0].step} "
                           f"rank {d} got them{extra}: only {len(tokens[d])} row(s) go to rank "
                           f"{d}'s experts ({', '.join(map(str, plan.owned(d)))})",
                           expected=f"rank {s}'s tokens {tokens[d]} only, after the counts",
                           got=f"shape {p.shape}: {numbers(p)}", hint=BROADCAST_HINT)
    return None


def _miscounted(result, case, plan, s, d, events, p, want, every):
    """A Failure if the counts ``p`` from s to d are whole numbers, all at least or all
    at most the right ones: rows of gate 0 counted (routing by np.argsort), or rows of
    a nonzero gate left out (a threshold), named by a token so sent or not sent."""
    if not isinstance(p, np.ndarray) or p.dtype.kind not in "iuf":
        return None
    flat, mine = p.reshape(-1), plan.owned(d)
    ref = want if len(flat) == len(want) else every if len(flat) == len(every) else None
    if ref is None or np.array_equal(flat, ref) or not np.array_equal(flat, np.round(flat)):
        return None
    over, under = (flat >= ref).all(), (flat <= ref).all()
    if not (over or under):
        return None
    # The tokens message (after the counts): which rows it holds too many or too few of.
    ids = next(([_token_of(row, plan.x[s]) for row in q] for q in map(result.payload, events[1:])
                if type(q) is np.ndarray and q.ndim == 2 and q.shape[1:] == plan.x[s].shape[1:]
                and len(q)), [])
    ids = [] if None in ids else ids
    which = (f"rank {d}'s experts {', '.join(map(str, mine))}" if ref is want else
             "each expert")
    what = (f"at step {events[0].step} rank {s} told rank {d} the counts {numbers(p, 8)} for "
            f"{which}, but {ref.tolist()} of its rows have a nonzero gate for them")
    check = "a token goes to exactly the experts of its nonzero gates"
    if over:
        extra = _minus(ids, plan.tokens[s][d])
        if extra:
            u = extra[0]
            lost = [i for t, i in plan.dropped[s] if t == u]
            goes = [int(i) for i in np.flatnonzero(plan.gates[s][u])]
            what += (f": it sent token {u} there, which goes to "
                     + (f"expert(s) {goes} only" if goes else "no expert")
                     + (f" (its assignments to experts {', '.join(map(str, lost))} were "
                        f"dropped by the capacity)" if lost else ""))
            check = "dropped tokens are not sent" if lost else check
        hint = ("Route by the nonzero gates, not by the k largest (np.argsort): a gate of 0 "
                "(an expert not among the token's top k, or an assignment dropped by the "
                "capacity) means the token does not go to that expert: it is neither counted "
                "nor sent.")
    else:
        missing = _minus(plan.tokens[s][d], ids)
        if missing:
            u = missing[0]
            gate, i = min((plan.gates[s][u, i], int(i)) for i in mine if plan.gates[s][u, i])
            what += (f": it did not send token {u} there, whose gate for expert {i} is "
                     f"{gate:.3g}, nonzero")
        hint = ("Every expert with gates[t, i] != 0 gets token t, however small the gate (top "
                "k and the capacity are already applied to the gates): route by gates != 0.")
    return Failure(case.label, check, what, got=f"{numbers(p, 8)}", hint=hint,
                   expected=f"rank {s}'s counts for {which}: {ref.tolist()}")


def _is_counts(p, want, every):
    if not isinstance(p, np.ndarray) or p.dtype.kind not in "iuf":
        return False
    flat = p.reshape(-1)
    return any(len(flat) == len(w) and np.array_equal(flat, w) for w in (want, every))


def _rows_message(result, case, plan, ev, used):
    """A message after the counts: rank s's tokens for d, or s's outputs for d."""
    s, d = ev.src, ev.dst
    p = result.payload(ev)
    for kind, rows in (("tokens", plan.tokens[s][d]), ("outputs", plan.outputs[s][d])):
        want = plan.x[s][rows] if kind == "tokens" else \
            np.array(rows).reshape(-1, plan.x[s].shape[1])
        if (s, d, kind) not in used and _same_rows(p, want, exact=kind == "tokens"):
            used.add((s, d, kind))
            return None
    return _bad_rows(case, plan, ev, p, used)


def _same_rows(p, want, exact):
    """Whether ``p`` holds the rows of ``want``, in any order (a multiset)."""
    if type(p) is not np.ndarray or p.dtype != np.float64:
        return False
    if p.size == 0 or not len(want):        # an empty block may travel, of any shape
        return p.size == 0 and not len(want)
    if p.ndim != 2 or p.shape[1] != want.shape[1] or len(p) != len(want):
        return False
    left, same = list(range(len(want))), np.array_equal if exact else _same
    for row in p:
        hit = next((j for j in left if same(want[j], row)), None)
        if hit is None:
            return False
        left.remove(hit)
    return True


def _bad_rows(case, plan, ev, p, used):
    s, d = ev.src, ev.dst
    width, head = plan.x[s].shape[1], f"at step {ev.step} rank {s} sent rank {d} "
    expected = (f"after the counts, at most one message of rank {s}'s tokens routed to rank "
                f"{d}'s experts ({', '.join(map(str, plan.owned(d)))}): tokens "
                f"{plan.tokens[s][d]}, unchanged, and at most one of rank {s}'s experts' "
                f"outputs for rank {d}'s tokens ({len(plan.outputs[s][d])} rows)")
    if type(p) is np.ndarray and p.dtype == np.float64 and p.ndim != 2 and p.size \
            and p.size % width == 0:
        failure = _reshaped(case, plan, ev, p, used, expected)
        if failure:
            return failure
    if type(p) is not np.ndarray or p.dtype != np.float64 or p.ndim != 2 or p.shape[1] != width:
        words = f"an array of shape {np.shape(p)}, dtype {getattr(p, 'dtype', type(p).__name__)}"
        return Failure(case.label, "only tokens and their outputs travel, after the counts",
                       head + words, expected=expected, got=f"{words}: {numbers(p)}",
                       hint=f"Send rows of width d = {width} as they are (float64): the "
                            f"tokens there, the experts' outputs back. The gates stay where "
                            f"the tokens are: the weighting happens there, after the combine.")
    ids = [_token_of(row, plan.x[s]) for row in p]
    if all(t is not None for t in ids):
        return _bad_tokens(case, plan, ev, ids, head, expected, used)
    return Failure(case.label, "only tokens and their outputs travel, after the counts",
                   head + f"{len(p)} rows that are not exactly rank {s}'s tokens routed to "
                   f"rank {d}, nor rank {s}'s experts' outputs for rank {d}'s tokens routed "
                   f"to them" + (" (sent a second time)" if (s, d, "outputs") in used else ""),
                   expected=expected, got=f"shape {p.shape}: {numbers(p)}",
                   hint="Each expert output goes back, unchanged and ungated, to the rank "
                        "whose token it is, in one message per rank; tokens routed to no "
                        "expert of a rank are not sent there.")


def _reshaped(case, plan, ev, p, used, expected):
    """A Failure if ``p`` (not 2-D) holds, reshaped to rows of width d, exactly the
    tokens or the outputs that go from s to d: the right rows in the wrong shape."""
    s, d = ev.src, ev.dst
    rows = p.reshape(-1, plan.x[s].shape[1])
    for kind, want in (("tokens", plan.x[s][plan.tokens[s][d]]),
                       ("outputs", np.array(plan.outputs[s][d]).reshape(-1, rows.shape[1]))):
        if (s, d, kind) not in used and _same_rows(rows, want, exact=kind == "tokens"):
            return Failure(case.label, "only tokens and their outputs travel, after the counts",
                           f"at step {ev.step} rank {s} sent rank {d} its {len(rows)} token row(s) "
                           f"for rank {d}'s experts as a {p.ndim}-D array of shape {p.shape}: "
                           f"the right rows, but not a 2-D array of shape {rows.shape}"
                           if kind == "tokens" else
                           f"at step {ev.step} rank {s} sent rank {d} its experts' {len(rows)} "
                           f"output row(s) for rank {d}'s tokens as a {p.ndim}-D array of shape "
                           f"{p.shape}: the right rows, but not a 2-D array of shape "
                           f"{rows.shape}",
                           expected=expected, got=f"shape {p.shape}: {numbers(p)}",
                           hint="Send each block as the 2-D (rows, d) array it is, one row per "
                                "token (no [None], reshape or stacking on the way): the "
                                "grader reads each message as rows, and the receiver "
                                "splits them by expert.")
    return None


def _token_of(row, x):
    hits = np.flatnonzero((x == row).all(axis=1)) if len(x) else []
    return int(hits[0]) if len(hits) else None


def _bad_tokens(case, plan, ev, ids, head, expected, used):
    """A message of rank s's own tokens that are not the ones routed to d."""
    s, d = ev.src, ev.dst
    want, n = plan.tokens[s][d], len(plan.x[s])
    extra, missing = _minus(ids, want), _minus(want, ids)
    got = f"tokens {sorted(ids)}"

    def fail(rule, what, hint):
        return Failure(case.label, rule, head + what, expected=expected, got=got, hint=hint)

    if (s, d, "tokens") in used:
        return fail("one message of tokens per pair of ranks",
                    f"a second message of tokens ({len(ids)} rows)",
                    "Send all of rank d's rows in one message (expert by expert): "
                    "one AlltoAll of uneven sizes, not one per expert or per token.")
    dropped = [(t, i) for t, i in case.info["dropped"][s] if t in extra and i in plan.owned(d)]
    if dropped:
        u, i = dropped[0]
        return fail("dropped tokens are not sent",
                    f"token {u}, whose assignment to expert {i} was dropped by the capacity "
                    f"(its gate is 0)",
                    "A token over its expert's capacity is dropped: its gate for that expert is "
                    "0. Route by the nonzero gates, not by the k largest (np.argsort): a dropped "
                    "token does not travel.")
    if sorted(ids) == list(range(n)) and n > len(want):
        return fail("no token goes to a rank that does not hold its expert",
                    f"all its {n} tokens: only {len(want)} go to rank {d}'s experts",
                    "Sending every token to every rank (a broadcast, or an AllGather) "
                    "moves e times the bytes. Send rank d only the tokens whose "
                    "gates for rank d's experts are nonzero.")
    if extra:
        goes = [int(i) for i in np.flatnonzero(plan.gates[s][extra[0]])]
        return fail("no token goes to a rank that does not hold its expert",
                    f"token {extra[0]}, which goes to expert(s) {goes} only, none of them on "
                    f"rank {d}",
                    "Rank d holds experts d*E/e .. (d+1)*E/e - 1: send it exactly the "
                    "tokens with a nonzero gate for one of those.")
    return fail("one message of tokens per pair of ranks",
                f"{len(ids)} of the {len(want)} rows routed to its experts: token {missing[0]} "
                f"is not in it",
                "Put every row for rank d in one message, expert by expert (a token "
                "that goes to two of rank d's experts is sent twice, once for each).")


def _minus(a, b):
    """The multiset a - b, sorted."""
    return sorted((Counter(a) - Counter(b)).elements())


def _missing(case, plan, s, d, kind):
    rows = plan.tokens[s][d] if kind == "tokens" else plan.tokens[d][s]
    what = (f"rank {s} never sent rank {d} its {len(rows)} token row(s) for rank {d}'s "
            f"experts (tokens {rows})" if kind == "tokens" else
            f"rank {s} never sent rank {d} its experts' outputs for rank {d}'s {len(rows)} "
            f"row(s) (tokens {rows})")
    return Failure(case.label, "dispatch and combine: tokens there, outputs back", what,
                   expected=f"one message from rank {s} to rank {d} with those rows",
                   got="no such message",
                   hint="After the counts, one AlltoAll of uneven sizes takes every token to "
                        "the ranks of its experts, and a second brings the outputs back.")


# -- 4. what the experts computed -----------------------------------------------------------

def _computed(rows, case, plan):
    per = case.info["per"]
    routed = np.sum(plan.counts, axis=0)
    wrong = ((r, r * per + j, m) for r, got in enumerate(rows)
             for j, m in enumerate(np.asarray(got).reshape(-1)) if m != routed[r * per + j])
    r, i, m = next(wrong, (None, None, None))
    return None if r is None else Failure(
        case.label, "every expert computes exactly its tokens",
        f"expert {i} (on rank {r}) computed {m} rows; {routed[i]} assignments go to it",
        expected=f"{routed[i]} rows: tokens per expert {routed.tolist()}", got=f"{m} rows",
        hint="Apply expert i once to the rows routed to it (from every rank), not to "
             "everything that arrived.")
