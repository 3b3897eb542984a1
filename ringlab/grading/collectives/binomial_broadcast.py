"""Grader for exercise ``binomial_broadcast``.

Signature: ``program(comm, x, root) -> array``, as for ``tree_broadcast``:
``x`` is the data (a float64 vector) on rank ``root`` and ``None`` elsewhere;
every rank returns the data.

Checks, on the cases of ``tree_broadcast`` (world sizes 1 to 8 and 12, roots 0
and a random other rank, fresh random data):

1. it runs: no exception, deadlock, endless loop or unreceived message;
2. every rank returns exactly the root's data;
3. the root receives nothing, every other rank receives exactly one message;
4. at most ceil(log2 N) steps;
5. every message carries the root's data, all of it, unchanged (read from
   the recorded payloads, in the simulator).

With one send per step, a broadcast can at best double the number of ranks
that have the data in every step, so ceil(log2 N) steps is the minimum, and
for N a power of two only a binomial tree reaches it: every rank that has the
data sends in every step until the end. Either binomial labelling passes
(parent = position minus its highest set bit, or minus its lowest), as does
any other tree that reaches everyone in ceil(log2 N) steps (for N <= 6 the
binary heap does too).
"""

from ..kit import broadcast
from ..kit.report import Failure
from ...cost import ceil_log2

NAME = "binomial_broadcast"

HINTS = {
    "flat": "The root sends to every rank itself: N-1 steps. Let every rank that already has the "
            "data send it on too.",
    "chain": "Each rank passes the data to the next one: N-1 steps. Let every rank that already "
             "has the data keep sending, in every step.",
    "binary tree": "That is a binary tree: with one send per step a node needs two steps for its two "
                   "children and then stops, so the tree takes up to 2 log2 N steps. In a binomial tree "
                   "a rank keeps sending in every step until the end.",
    "binomial tree": "The tree is binomial, but the sends come in the wrong order: the nearest child "
                     "first keeps the biggest subtree waiting. Send to the farthest child first; or, "
                     "simplest, in step k+1 let every position i < 2^k send to position i + 2^k.",
}
DOUBLING = "the number of ranks with the data can double every step"
GENERIC = ("In step k+1 (k = 0, 1, ...) every rank that has the data, the positions i < 2^k counted "
           "from the root, sends it to position i + 2^k. The number of ranks with the data doubles "
           "every step.")


cases = broadcast.cases       # the same as tree_broadcast's


def check(program, case, backend="sim"):
    return broadcast.check(program, case, backend, _explain_run_failure, _steps)


def _steps(result, case):
    """Checks 3-5."""
    n, root, trace = case.world_size, case.info["root"], result.trace
    failure = broadcast.receives(trace, case, root)
    if failure:
        return failure
    k = ceil_log2(n)
    if trace.steps > k:
        last = max(trace, key=lambda e: e.step)
        return Failure(case.label, "at most ceil(log2 N) steps",
                       f"the broadcast took {trace.steps} steps: rank {last.dst} received the data "
                       f"only at step {last.step}",
                       expected=f"ceil(log2 {n}) = {k} steps: {DOUBLING}", got=f"{trace.steps} steps",
                       hint=HINTS.get(broadcast.shape(trace, n, root), GENERIC))
    return broadcast.payloads(result, case)


def _explain_run_failure(failure, case):
    """A send to a rank that does not exist, or to itself: a position past the end, wrapped."""
    if broadcast.bad_peer(failure.error):
        n = case.world_size
        failure.hint = (f"A child position i + 2^k exists only below N = {n}: positions past N - 1 = {n - 1} "
                        f"are not in the tree, and wrapping them around with % N makes them real ranks "
                        f"(the root, or the sender itself). Send only if i + 2^k < N.")
