"""Grader for exercise ``ring_attention``: attention over a sequence split over c ranks.

Signature: ``ring_attention(comm, q, k, v, causal) -> array``. The sequence of
s tokens is laid out contiguously: rank r holds tokens r*n .. (r+1)*n - 1
(n = s/c). ``q``, ``k`` and ``v`` are this rank's blocks, float64 arrays of
shape (batch, heads, n, head_dim); the rank returns its queries' output
block, (batch, heads, n, head_dim), of softmax(q K^T / sqrt(head_dim)) V over
the whole sequence's K and V, with the causal mask (a query at position i
sees keys at positions <= i) when ``causal`` is true.

Checks, on world sizes 1 to 8, causal and not, random data and shapes drawn
from the seed (except the first case), one case of large scores (|q.k| in
the thousands: exp overflows without the max) and one case that measures
memory (16 ranks, n large next to head_dim: a block's n x n scores outweigh its
K/V, the shape drawn too):

1. it runs: no exception, deadlock, endless loop or unreceived message;
2. every rank returns its output block, a plain float64 array, equal to
   attention over the whole sequence computed here in numpy (one softmax,
   no blocks) to 1e-9; a wrong one is diagnosed against the usual mistakes
   (no rescaling when merging blocks, the running max not corrected, the
   mask from local instead of global positions, future blocks not skipped,
   the blocks' origins counted the wrong way round the ring, no
   1/sqrt(head_dim), the last block only);
3. alone (c = 1) nothing is sent; K/V never travel in an AllGather;
4. messages only between ring neighbours;
5. what messages carry, read from the recorded payloads (every value of
   every q, k and v is a different random float, so a payload reads back as
   the blocks it holds): whole K and/or V blocks of exactly one rank, and
   nothing else (no queries, no partial outputs, no second rank's block);
6. causality of contents: each block a message carries is one its sender
   holds (its own, or one it received before) and its receiver lacks;
7. volume: every rank sends the K and V of c - 1 blocks (its own and the
   c - 2 it received before the last hop), 2(c-1) b h n d x 8 bytes, causal
   or not (the ring moves in lock-step), and so receives every other rank's;
8. memory, measured per rank with tracemalloc (``ringlab.real_memory``, as for ZeRO),
   on 16 ranks: at most 14 K/V blocks and 4 blocks of scores (b h n n) above
   the inputs (the ring's programs hold about 8 and 3, whatever c), while a
   rank that keeps its queries' whole row of scores (b h n s: 16 blocks of
   scores, two passes round the ring, one softmax), every V block that
   arrives (c - 1 = 15), or every K and V block (a gather, 2c = 32) holds
   more.

Any correct ring passes: blocks passed right or left, K and V stacked in one
message or sent as two, sendrecv, isend/irecv or ``comm.start``.
"""

import functools
import math
import types

import numpy as np

from ..kit import blocks, checks, sharded
from ..kit.driver import callable_learner
from ..kit.frames import without_grader_frames
from ..kit.report import Case, Failure, numbers
from ..kit.running import check_outputs_shape, run_case
from ...real_memory import Ledger, MemoryProbe, tampered
from ...frontier import layout

NAME = "ring_attention"
# Every rank's result needs every rank's data in the non-causal case, which the
# causality check runs (``causality_case``; see kit/causality.py).
DEPENDS_ON_ALL = True
TOLERANCE = 1e-9
CHECK = "every rank's output equals attention over the whole sequence"
WORLDS = (4, 3, 5, 6, 7, 8, 2, 1)
MEASURED = 16                           # ranks of the measured case; its shape from the seed
# K/V blocks' worth a rank may hold at its peak: the ring's programs hold about 8
# whatever c (a block, the next, the output and the merge's temporaries); keeping
# every V block that arrives (scores kept, one softmax at the end) holds c - 1 = 15
# and more, gathering K and V 2c = 32. On 8 ranks keeping V alone (11-12) fitted.
MEMORY_BLOCKS = 14
# and blocks of scores (b h n n): a block's scores, its exp and the merge's product
# (the ring's programs hold about 3); the whole row of scores is c = 16 of them.
SCORE_BLOCKS = 4
LARGE = 400.0                           # q scaled so that scores reach the thousands


def causality_case(cases):
    """The smallest non-causal world of 4 ranks or more: there every rank's
    output needs every rank's K and V (under the mask rank 0 needs only its own)."""
    fit = [c for c in cases if not c.info["causal"] and c.world_size >= 4
           and not c.info["measure"]]
    return min(fit, key=lambda c: c.world_size, default=None)


def make_case(rng, c, dims, causal, *, scale=1.0, measure=False, note=""):
    b, h, n, d = dims
    q, k, v = rng.standard_normal((3, b, h, c * n, d))
    q = q * scale
    assert len(np.unique(np.concatenate([q.ravel(), k.ravel(), v.ravel()]))) == 3 * q.size
    inputs = [[a[:, :, r * n:(r + 1) * n].copy() for a in (q, k, v)] for r in range(c)]
    label = (f"world_size={c}, causal={causal}, blocks (batch={b}, heads={h}, n={n}, "
             f"head_dim={d}): s = {c * n} tokens{note}")
    return Case(c, inputs, label, args=(bool(causal),),
                info=dict(dims=dims, causal=bool(causal), measure=measure))


def cases(rng):
    # 4 ranks, causal, first: small enough to read, every kind of block (past,
    # diagonal, future). The others' shapes come from the seed.
    yield make_case(rng, 4, (1, 2, 3, 4), True)
    for c, causal in ((c, x) for c in WORLDS for x in (True, False) if (c, x) != (4, True)):
        dims = tuple(int(rng.integers(1, top)) for top in (3, 4, 5)) + (int(rng.integers(2, 7)),)
        yield make_case(rng, c, dims, causal)
    yield make_case(rng, 4, (1, 2, 4, 4), True, scale=LARGE,
                    note=f", large scores (q x {LARGE:g}: exp overflows without the max)")
    # n large next to head_dim: a block's scores (16-36 KiB) outweigh its K/V (6-12.5
    # KiB each), so that keeping a query's whole row of scores shows as well as
    # keeping every K/V block.
    dims = (1, 2, int(rng.integers(32, 49)), int(rng.integers(12, 17)))
    yield make_case(rng, MEASURED, dims, False, measure=True, note=", memory measured")


def drive(comm, qkv, causal, learner, measure=False):
    """What every rank runs: the learner's function on its blocks; measured,
    ``[out, [peak bytes]]`` (peak -1: the measurement was tampered with)."""
    learner = callable_learner(learner)
    q, k, v = qkv
    if not measure:
        return learner(comm, q, k, v, causal)
    ledger = Ledger()
    probe = MemoryProbe(comm, ledger)
    ledger.step_begin()
    out = learner(probe, q, k, v, causal)
    peak, _ = ledger.step_end()
    return [out, np.array([-1.0 if tampered(ledger) else float(peak)])]


def run(program, case, backend):
    """``run_case`` of the driver; a measured one as ``run_measured`` runs it (tracing
    memory, here, stops after it)."""
    measure = case.info["measure"]
    program = functools.partial(drive, learner=program, measure=measure)
    if measure:
        return sharded.run_measured(program, case, backend)
    return run_case(program, case, backend, timeout=10.0)


def check(program, case, backend="sim"):
    result, failure = run(program, case, backend)
    if failure:
        failure.got = without_grader_frames(failure.got)
        return failure
    outputs, peaks = result.outputs, None
    if case.info["measure"]:
        pair = [isinstance(o, list) and len(o) == 2 for o in outputs]
        outputs = [o[0] if p else o for o, p in zip(result.outputs, pair)]
        peaks = [o[1][0] if p else None for o, p in zip(result.outputs, pair)]
    shaped = types.SimpleNamespace(outputs=outputs, trace=result.trace)
    failure = check_outputs_shape(shaped, case, case.info["dims"])
    if failure:
        return failure
    want = expected(case)
    neighbours = functools.partial(checks.ring_neighbours, result.trace, case, "ring",
                                   "a gather to one rank (its links carry every block)")
    for r, out in enumerate(outputs):
        if not close(out, want[r]):
            # Blocks that came from a rank other than the left (or right) neighbour are
            # why the origins, and so the output, are wrong: say so first.
            return neighbours() or wrong_output(case, r, outputs, want)
    return (alone(result.trace, case) or gathered(result.trace, case) or neighbours()
            or contents(result, case) or volume(result.trace, case)
            or memory(peaks, case))


# -- 2. the result, computed here: one softmax over the whole sequence ----------------------

def whole(case):
    """q, k, v of the whole sequence, (b, h, s, d) each."""
    return [layout.unshard([x[i] for x in case.inputs], "contiguous", axis=2) for i in range(3)]


def attend(q, k, v, allowed, scale):
    """softmax(q k^T scale) v over the keys ``allowed`` (a (m, s) mask): a plain
    stable softmax, rows with no key get 0."""
    s = np.where(allowed, q @ k.swapaxes(-1, -2) * scale, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    total = p.sum(axis=-1, keepdims=True)
    return (p @ v) / np.where(total > 0, total, 1.0), total, m


def positions(case, r):
    """Rank r's tokens' positions in the sequence: the contiguous layout."""
    return layout.positions("contiguous", r, case.world_size, case.info["dims"][2])


def mask(case, r, rule="global"):
    """Which of the s keys rank r's n queries see: the causal mask by global
    positions ("global", "causal"), none ("all"), or, for the mistakes, "local"
    (positions inside each block), "local skipped" (later ranks' blocks skipped,
    the others masked locally), "strict" (key < query), "blocks" (whole blocks up
    to the rank's own, none masked), "future" (the diagonal block masked, every
    other block seen)."""
    c, n = case.world_size, case.info["dims"][2]
    if not case.info["causal"] and rule == "global":
        rule = "all"
    key = np.arange(c * n)[None, :]
    block, local, pos = key // n, key % n <= np.arange(n)[:, None], positions(case, r)[:, None]
    return {"all": np.ones((n, c * n), bool), "local": local,
            "local skipped": (block <= r) & local, "strict": key < pos,
            "blocks": np.repeat(block <= r, n, axis=0),
            "future": (block != r) | local}.get(rule, key <= pos)


def expected(case):
    q, k, v = whole(case)
    scale = 1 / math.sqrt(case.info["dims"][3])
    return [attend(x[0], k, v, mask(case, r), scale)[0] for r, x in enumerate(case.inputs)]


def close(out, want):
    return (isinstance(out, np.ndarray) and out.shape == want.shape
            and bool(np.all(np.abs(out - want) <= TOLERANCE * max(1.0, np.abs(want).max()))))


# -- 2. what a wrong output is: the usual mistakes, computed here ---------------------------

MERGE = ("Keep, per query, the log-sum-exp of the scores seen so far, lse, next to out. "
         "Merge a block's (out_b, lse_b) with new = logaddexp(lse, lse_b); out = exp(lse - new) "
         "* out + exp(lse_b - new) * out_b; lse = new.")
ORIGIN = ("Track whose block you hold: passing right, after t hops it is rank (rank - t) % c's; "
          "passing left, (rank + t) % c's. Its keys sit at positions origin*n .. origin*n + n-1.")
MASK = ("Compare global positions: rank r's query i is at r*n + i, the key j of rank o's block "
        "at o*n + j; a key is seen when its position <= the query's. Blocks of later ranks are "
        "wholly in the future, earlier ranks' blocks wholly in the past.")
SCALE = "Scale q k^T by 1 / sqrt(head_dim)."
# (kind of wrong merge, what it is, whether it is tried passing both ways); hint MERGE
MERGES = (
    ("sum", "the blocks' outputs added up, each normalised over its own keys: blocks merged "
            "without the log-sum-exp rescale", False),
    ("mean", "the average of the blocks' outputs: equal weights, where each block weighs "
             "exp(lse_b - lse), its share of the softmax (the log-sum-exp rescale)", False),
    ("no correction", "the running max went up without rescaling what was summed before: "
                      "forgot the factor exp(m_old - m_new) on the accumulated output and "
                      "denominator", True),
    ("lse kept", "each merge used the first block's lse: lse was never updated to "
                 "logaddexp(lse, lse_b) after a merge", True),
    ("last", "the last block's result only: each block's output replaced the one "
             "before instead of being merged into it", True))
# (mask rule, what it is, hint): without the causal flag, then with it
OPEN_MASKS = (
    ("causal", "a causal mask applied, with causal=False",
     "Mask only when causal is true; otherwise every query sees every key."),
    ("blocks", "later ranks' blocks skipped, with causal=False",
     "Only the causal mask makes a later rank's block all future; without it "
     "every query sees every block."))
CAUSAL_MASKS = (
    ("local", "the causal mask applied with positions inside each block (key j <= query i, "
              "local indices) instead of global positions", MASK),
    ("local skipped", "later ranks' blocks rightly skipped, but the others masked with "
                      "positions inside each block (key j <= query i, local indices): the "
                      "earlier ranks' blocks, wholly in the past, lost their later keys", MASK),
    ("future", "later ranks' blocks were attended to: they are wholly in the future, only the "
               "diagonal block is partly masked", MASK),
    ("strict", "each query's own key was masked (key < query): a query sees keys at positions "
               "<= its own", MASK),
    ("all", "no causal mask, with causal=True", MASK),
    ("blocks", "the rank's own block attended to without the mask: its queries saw the later "
               "keys of their own block", MASK))


def _block(case, r, j, rule="global"):
    """Rank r's queries on block j alone: (out, lse, mask of that block)."""
    n, d = case.info["dims"][2], case.info["dims"][3]
    allowed = mask(case, r, rule)[:, j * n:(j + 1) * n]
    out, total, m = attend(case.inputs[r][0], case.inputs[j][1], case.inputs[j][2], allowed,
                           1 / math.sqrt(d))
    with np.errstate(divide="ignore"):
        lse = (np.where(np.isfinite(m), m, 0.0) + np.log(total))[..., 0]
    return out, lse, allowed


def _order(case, r, way):
    """The blocks rank r holds, hop by hop, passing ``way`` (+1 right, -1 left),
    those with a key it sees only."""
    (c, n), seen = (case.world_size, case.info["dims"][2]), mask(case, r)
    return [j for j in ((r - way * t) % c for t in range(c)) if seen[:, j * n:(j + 1) * n].any()]


def _blockwise(case, r, kind, way):
    """Rank r's output merged block by block, wrongly: "sum", "mean", "last",
    "no correction" (running max raised, old sums not rescaled), "lse kept"
    (the merge's lse never updated)."""
    parts = [_block(case, r, j) for j in _order(case, r, way)]
    if kind in ("sum", "mean", "last"):
        outs = [p[0] for p in parts]
        return {"sum": sum(outs), "mean": sum(outs) / len(outs), "last": outs[-1]}[kind]
    if kind == "lse kept":
        out, lse = parts[0][0], parts[0][1]
        for out_b, lse_b, _ in parts[1:]:
            new = np.logaddexp(lse, lse_b)
            new = np.where(np.isfinite(new), new, 0.0)
            out = np.exp(lse - new)[..., None] * out + np.exp(lse_b - new)[..., None] * out_b
        return out
    q, (n, d) = case.inputs[r][0], case.info["dims"][2:]
    m, acc, total = -np.inf, 0.0, 0.0
    for j in _order(case, r, way):
        allowed = mask(case, r)[:, j * n:(j + 1) * n]
        s = np.where(allowed, q @ case.inputs[j][1].swapaxes(-1, -2) / math.sqrt(d), -np.inf)
        m = np.maximum(m, s.max(axis=-1, keepdims=True))
        p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
        acc, total = acc + p @ case.inputs[j][2], total + p.sum(axis=-1, keepdims=True)
    return acc / np.where(total > 0, total, 1.0)


def _masked(case, r, allowed, scale=None):
    q, k, v = whole(case)
    scale = 1 / math.sqrt(case.info["dims"][3]) if scale is None else scale
    return attend(case.inputs[r][0], k, v, allowed, scale)[0]


def _without(case, o, r):
    """Rank r's output without rank o's block (its own if o = r)."""
    n = case.info["dims"][2]
    allowed = mask(case, r).copy()
    allowed[:, o * n:(o + 1) * n] = False
    return _masked(case, r, allowed)


def _swapped_origins(case, r, way):
    """Blocks passed ``way`` but masked as if passed the other way: the block of
    rank (r - way t) masked with the positions of rank (r + way t)'s."""
    c, n = case.world_size, case.info["dims"][2]
    allowed = np.zeros((n, c * n), bool)
    for t in range(c):
        held, counted = (r - way * t) % c, (r + way * t) % c
        allowed[:, held * n:(held + 1) * n] = ((counted * n + np.arange(n))[None, :]
                                               <= positions(case, r)[:, None])
    return _masked(case, r, allowed)


def mistakes(case):
    """[(name, per-rank outputs as fn(r), what it is, hint)], the most telling first."""
    merged = lambda kind, way: functools.partial(_blockwise, case, kind=kind, way=way)  # noqa: E731
    masked = lambda rule: lambda r: _masked(case, r, mask(case, r, rule))  # noqa: E731
    found = [(kind, merged(kind, 1), words, MERGE) for kind, words, both in MERGES if not both]
    found += [(f"{kind} {side}", merged(kind, way), words, MERGE)
              for side, way in (("right", 1), ("left", -1)) for kind, words, both in MERGES
              if both]
    found.append(("own", lambda r: _block(case, r, r)[0],
                  "its own block's attention only: the blocks that arrived were not used",
                  "Attend your queries to every block you hold, hop by hop, and merge each."))
    found += [(rule, masked(rule), words, hint) for rule, words, hint
              in (CAUSAL_MASKS if case.info["causal"] else OPEN_MASKS)]
    if case.info["causal"]:
        # Passed right and counted left, or the other way: the same (held, counted)
        # pairs, and the merge does not depend on the order.
        found.append(("origins", functools.partial(_swapped_origins, case, way=1),
                      "each block masked with the positions of the block coming the other way "
                      "round the ring: its origin counted as rank + t where it is rank - t (or "
                      "the other way), the blocks passed one way and counted the other", ORIGIN))
    found += [(f"without {o}", functools.partial(_without, case, o),
               f"rank {o}'s block left out: never received (fewer than c - 1 hops?) or "
               f"not attended to",
               "Make c - 1 hops, and attend to every block you hold (in the causal case "
               "every block from an earlier rank, and your own).")
              for o in range(case.world_size)]
    d = case.info["dims"][3]
    return found + [
        ("no scale", lambda r: _masked(case, r, mask(case, r), scale=1.0),
         "scores not scaled by 1/sqrt(head_dim)", SCALE),
        ("scale 1/d", lambda r: _masked(case, r, mask(case, r), scale=1.0 / d),
         "scores scaled by 1/head_dim, not 1/sqrt(head_dim)", SCALE)]


def wrong_output(case, r, outputs, want):
    """The Failure for rank r's wrong output, naming the mistake when it is a known one."""
    out, n = outputs[r], case.info["dims"][2]
    right = [j for j, o in enumerate(outputs) if close(o, want[j])]
    also = (f"\nRanks with the right output: {', '.join(map(str, right))}." if right
            else "\nNo rank has the right output.")
    b, h, i, _ = np.unravel_index(int(np.argmax(np.where(np.isfinite(out), np.abs(out - want[r]),
                                                          np.inf))), out.shape)
    where = f"most at batch {b}, head {h}, query {i}: position {r * n + i} of the sequence"
    fail = Failure(case.label, CHECK, "", expected=numbers(want[r][b, h, i]),
                   got=numbers(out[b, h, i]))
    if not np.all(np.isfinite(out)):
        bad = int((~np.isfinite(out)).sum())
        fail.what = f"rank {r}'s output has {bad} values that are nan or inf{also}"
        fail.hint = ("exp of raw scores overflows (float64 stops at e^709): subtract the running "
                     "max before exp, and rescale what you summed when the max goes up. A query "
                     "with no key seen yet has lse = -inf: give its block weight 0, never "
                     "divide by a zero sum.")
        return fail
    known = [(words, hint, make) for _, make, words, hint in mistakes(case)
             if not close(make(r), want[r]) and close(out, make(r))]
    # The mistake that explains every rank's output, else the first that explains rank r's.
    every = [k for k in known if all(close(o, k[2](j)) for j, o in enumerate(outputs))]
    if known:
        words, fail.hint, _ = (every or known)[0]
        fail.what = f"rank {r}'s output is wrong ({where}): {words}{also}"
        return fail
    rows = np.any(np.abs(out - want[r]) > TOLERANCE, axis=(0, 1, 3))
    fail.what = (f"rank {r}'s output is wrong, {where}; wrong at {int(rows.sum())} of its "
                 f"{n} queries{also}")
    fail.hint = (f"Each block you hold is one rank's keys: attend to it (causal="
                 f"{case.info['causal']}, by global positions) and merge. " + MERGE)
    return fail


# -- 3.-7. the ring's messages ------------------------------------------------------------

def memory_bound(case):
    """Bytes a rank may hold at its peak above its inputs (check 8)."""
    return MEMORY_BLOCKS * block_bytes(case) + SCORE_BLOCKS * score_bytes(case)


def block_bytes(case):
    return 8 * int(np.prod(case.info["dims"]))


def score_bytes(case):
    """One block's scores, (b, h, n, n) float64."""
    b, h, n, _ = case.info["dims"]
    return 8 * b * h * n * n


def alone(trace, case):
    if case.world_size == 1 and len(trace):
        e = trace[0]
        return Failure(case.label, "alone on the ring, nothing travels",
                       f"with one rank the program sent {len(trace)} message(s), the first "
                       f"at step {e.step} from rank {e.src} to rank {e.dst}",
                       expected="no message: rank 0 holds the whole sequence", got=e.describe(),
                       hint="With world_size 1 the ring has no hop: c - 1 = 0 passes.")
    return None


def gathered(trace, case):
    """K/V in a library AllGather: every rank then holds the whole sequence."""
    e = next((e for e in trace if "allgather" in e.span.lower()), None)
    return None if e is None else Failure(
        case.label, "K/V travel one block per hop, never gathered",
        f"at step {e.step} rank {e.src} sent rank {e.dst} a message of "
        f"{e.span!r}: K/V gathered with an AllGather",
        expected="c - 1 hops, each rank passing on the one block it holds", got=e.describe(),
        hint="An AllGather leaves the whole sequence's K and V on every rank (all-gather "
             "context parallelism, as Llama 3 does it): that is not ring attention. Hold one "
             "foreign block at a time: attend to it, merge, pass it on.")


def index(case):
    """value -> (rank, "q"/"k"/"v", element): every value of every input, all different."""
    return {float(x): (r, kind, j) for r, qkv in enumerate(case.inputs)
            for kind, a in zip("qkv", qkv) for j, x in enumerate(a.ravel().tolist())}


def _carried(case, e, payload, idx):
    """(the blocks {(rank, "k"/"v")} a message carries, None) or (None, Failure)."""
    found = blocks.contents(payload, idx) if payload.dtype == np.float64 else {}
    size = int(np.prod(case.info["dims"]))
    where = f"at step {e.step} rank {e.src} sent rank {e.dst}"
    bad = functools.partial(Failure, case.label, "messages carry whole K/V blocks of one rank",
                            got=f"{e.describe()}: {numbers(payload, 6)}",
                            expected=f"rank o's k and/or v block ({size} values each), "
                                     f"unchanged, of a single rank o")
    queries = sorted(o for o, kind in found if kind == "q")
    origins = sorted({o for o, _ in found})
    unknown = payload.size - sum(found.values())
    part = next(((b, n) for b, n in found.items() if n != size), None)
    if queries:
        return None, bad(f"{where} queries (rank {queries[0]}'s q)",
                         hint="In ring attention the queries stay home; K and V travel.")
    if not found or (unknown > 0 and size not in found.values()):
        return None, bad(f"{where} {payload.size} values of dtype {payload.dtype} that are no "
                         f"K/V block (partial outputs, scores, a converted copy?)",
                         hint="Send K and V exactly as they are (np.stack([k, v]), or two "
                              "messages); what you compute stays home.")
    if len(origins) > 1:
        return None, bad(f"{where} blocks of ranks {', '.join(map(str, origins))} in one "
                         f"message: a gather of the sequence, not one block per hop",
                         hint="Each hop passes on exactly the one block you hold: the one "
                              "you received in the hop before (your own in the first).")
    if part or unknown:
        what = (f"{part[1]} of the {size} values of rank {part[0][0]}'s {part[0][1]}" if part
                else f"{unknown} values besides whole blocks")
        return None, bad(f"{where} {what}",
                         hint="Send each block whole, as it is: no pieces, headers or padding.")
    return set(found), None


def contents(result, case):
    """Checks 5-6: each message whole K/V blocks of one rank, which its sender
    holds and its receiver lacks (read from the recorded payloads)."""
    if result.payloads is None or not len(result.trace):
        return None
    idx = index(case)
    has = [{(r, "k"), (r, "v")} for r in range(case.world_size)]
    got = {}                                    # (rank, block) -> step it arrived
    for step in sorted({e.step for e in result.trace}):
        arrived = []
        for e in result.trace.at_step(step):
            held, failure = _carried(case, e, np.asarray(result.payload(e)), idx)
            failure = failure or next(filter(None, (_holds_and_lacks(case, e, o, kind, has, got)
                                                    for o, kind in sorted(held))), None)
            if failure:
                return failure
            arrived += [(e.dst, block) for block in sorted(held)]
        for r, block in arrived:
            has[r].add(block)
            got.setdefault((r, block), step)
    return None


def _holds_and_lacks(case, e, o, kind, has, got):
    what = f"rank {o}'s {kind}"
    if (o, kind) not in has[e.src]:
        return Failure(case.label, "each block sent is one its sender holds",
                       f"at step {e.step} rank {e.src} sent rank {e.dst} {what}, which rank "
                       f"{e.src} had not received",
                       expected=f"a block rank {e.src} holds: its own or one it received "
                                f"before step {e.step}", got=what,
                       hint="A rank can pass on only what has reached it through the ring.")
    if (o, kind) in has[e.dst]:
        whose = ("its own block" if o == e.dst else
                 f"{what}, which it received at step {got[e.dst, (o, kind)]}")
        return Failure(case.label, "each block reaches each rank once",
                       f"at step {e.step} rank {e.src} sent rank {e.dst} {whose}",
                       expected=f"a block rank {e.dst} does not hold yet", got=what,
                       hint="At every hop pass on the block you received in the hop before "
                            "(your own in the first): your neighbour has not seen that one.")
    return None


def volume(trace, case):
    """Check 7: 2(c-1) blocks sent by every rank, 2(c-1) b h n d x 8 bytes."""
    c, size = case.world_size, block_bytes(case)
    want = 2 * (c - 1) * size
    sent = [sum(e.nbytes for e in trace if e.src == r) for r in range(c)]
    r = next((r for r in range(c) if sent[r] != want), None)
    if r is None:
        return None
    what = (f"rank {r} sent nothing: the other ranks' outputs need its K and V, and only "
            f"messages can bring them" if not sent[r] else
            f"rank {r} sent {sent[r]} bytes, {sent[r] / size:g} blocks of {size} bytes")
    return Failure(case.label, "every rank passes on c - 1 K/V blocks", what,
                   expected=f"2(c-1) x b h n d x 8 = 2 x {c - 1} x {size} = {want} bytes: "
                            f"its K and V, then each block it received but the last, causal "
                            f"or not", got=f"bytes sent per rank: {sent}",
                   hint="Every rank makes c - 1 hops, each passing one K block and one V "
                        "block to the same neighbour: the ring moves in lock-step, so a "
                        "rank that stops early leaves its neighbours without blocks.")


def memory(peaks, case):
    """Check 8: a rank's peak above its inputs, at most MEMORY_BLOCKS K/V blocks
    and SCORE_BLOCKS blocks of scores."""
    size, c = block_bytes(case), case.world_size
    scores, bound = score_bytes(case), memory_bound(case)
    for r, peak in enumerate(peaks or ()):
        if peak is None or peak < 0:
            return Failure(case.label, "memory: peak per rank, measured",
                           f"rank {r}'s memory could not be measured: the grader's "
                           f"measurement was tampered with, or the driver changed")
        if peak > bound:
            return Failure(case.label, "memory: peak per rank, measured",
                           f"rank {r} held up to {int(peak)} bytes above its inputs: "
                           f"{peak / size:.1f} K/V blocks of {size} bytes (the whole "
                           f"sequence's K and V: {2 * c} blocks), or {peak / scores:.1f} "
                           f"blocks of scores of {scores} bytes (a query's whole row of "
                           f"scores: {c} blocks)",
                           expected=f"at most {MEMORY_BLOCKS} K/V blocks and {SCORE_BLOCKS} "
                                    f"blocks of scores, {bound} bytes: the block you attend "
                                    f"to, the one arriving, the output, one block's scores "
                                    f"and the merge's temporaries",
                           got=f"{int(peak)} bytes",
                           hint="Ring attention holds one foreign block at a time: attend "
                                "to it, merge, pass it on, and let it go. Keeping every "
                                "block that arrives (or gathering K and V first) holds the "
                                "whole sequence on every rank; keeping every block's scores "
                                "for one softmax at the end holds a query's whole row of "
                                "scores. Merge block by block with the log-sum-exp rule.")
    return None
