"""A deadlock in plain words: who waits for whom, and what to try.

``DeadlockError.waiting`` lists what each blocked rank waits in; this module
follows those waits from rank to rank ("rank 2 waits for rank 1, which has
finished") and reads the messages still in flight from the error's trace
(a message nobody receives, sent to a rank that waits for someone else).
Every ``DeadlockError`` says it: ``err.explain()`` (the graders' reports add it
to the error's own text)::

    >>> from ringlab.errors import DeadlockError, Wait
    >>> err = DeadlockError({2: Wait("recv", 1, "waits in recv(src=1) (its clock: step 0)")}, [0, 1, 3])
    >>> print(err.explain()[0])
    In plain words: rank 2 waits for a message from rank 1, which has finished without sending it.
"""


GENERIC = ("Every recv needs a matching send on the peer, in the same order. A rank waiting for a "
           "message nobody sends usually means the ranks disagree about the step or the peer.")
EVERYONE_RECEIVES = ("Every rank waits to receive before anyone sends: send first, or use "
                     "comm.sendrecv, which sends and receives at once.")

def waits_for(wait):
    """("recv", peer) or ("send", peer) from one ``DeadlockError.waiting`` entry
    (a ``Wait``), or None when it waits for something else (a barrier, a work)."""
    return (wait.kind, wait.peer) if wait.kind in ("recv", "send") else None


def explain(err):
    """(a "In plain words: ..." line, or "", and a hint) for a ``DeadlockError``."""
    waits = {r: waits_for(d) for r, d in err.waiting.items()}
    if not waits or None in waits.values():
        return "", GENERIC
    finished = set(err.finished)
    trace = getattr(err, "trace", None)
    in_flight = None if trace is None else list(trace.unreceived)
    # Without a trace, clocks at step 0 everywhere still say that nothing was sent (a send moves the clock).
    silent = (not len(trace)) if trace is not None else all("(its clock: step 0)" in str(d) for d in err.waiting.values())
    if (not finished and (in_flight == [] or silent)
            and all(kind == "recv" for kind, _ in waits.values())):
        # Nothing on its way and nobody left to send it: everyone receives first.
        nothing = "no rank has sent anything yet" if silent else "no message is on its way"
        return f"In plain words: every rank waits to receive, and {nothing}.", EVERYONE_RECEIVES
    start = min(waits)
    chain, end, last, waiter = _chain(start, waits, finished)
    words = "In plain words: " + chain + "."
    # A message for a waiting rank from someone else: the two sides disagree about the peer.
    stray = next((e for e in in_flight or () if e.dst in waits
                  and waits[e.dst] != ("recv", e.src) and waits[e.dst][0] == "recv"), None)
    # Whose side is wrong? If another rank waits for the sender, and the sender sent to that
    # rank before, the sender has changed its target: blame the send, not the receive.
    wanted_by = None if stray is None else next(
        (q for q, w in sorted(waits.items()) if w == ("recv", stray.src) and q != stray.dst
         and any(e.src == stray.src and e.dst == q for e in trace or ())), None)
    if stray is not None and wanted_by is not None:
        words += (f"\nMeanwhile rank {stray.src} sent rank {stray.dst} a message at step {stray.step} "
                  f"that was never received, while rank {wanted_by} waits for a message from rank {stray.src}.")
        hint = (f"Rank {stray.src} sent to rank {stray.dst}, but rank {wanted_by} (to which it sent before) "
                f"waits for it: a send names the wrong peer (dst). The rank you send to must be the rank "
                f"that receives from you; compute it on both sides with the same formula.")
    elif stray is not None:
        words += (f"\nMeanwhile rank {stray.src} sent rank {stray.dst} a message at step {stray.step} "
                  f"that was never received: rank {stray.dst} waits for rank {waits[stray.dst][1]} instead.")
        hint = (f"Rank {stray.dst}'s message comes from rank {stray.src}, but it receives from rank "
                f"{waits[stray.dst][1]}: a recv names the wrong peer. The rank you receive from must be "
                f"the rank that sends to you; compute it on both sides with the same formula.")
    elif end == "finished":
        hint = (f"Rank {last} has finished while rank {waiter} still waits for it: either rank {last} "
                f"stopped too soon (a loop one step short, a return before the end), or the two disagree "
                f"about who talks to whom at this step. The rank you receive from must be the rank that "
                f"sends to you.")
    elif end == "cycle":
        hint = ("The ranks wait for each other in a circle, so none can go first: send before you "
                "receive, or use comm.sendrecv, which does both at once.")
    else:
        hint = GENERIC
    return words, hint


def _chain(start, waits, finished):
    """("rank 2 waits for a message from rank 1, which ...", "finished" | "cycle" | "other",
    the rank the chain ends at, the last waiting rank before it)."""
    def wait(r):
        kind, peer = waits[r]
        return (f"rank {r} waits for a message from rank {peer}" if kind == "recv"
                else f"rank {r} waits for rank {peer} to receive what it sent")
    seen, r = [start], waits[start][1]
    while r in waits and r not in seen:
        seen.append(r)
        r = waits[r][1]
    if r in seen and len(seen) > 4:       # a long cycle: its first two links and its length
        return (f"{wait(start)}; {wait(seen[1])}; and so on round a cycle of "
                f"{len(seen) - seen.index(r)} ranks: none of them can go on"), "cycle", r, seen[-1]
    text = "; ".join(wait(q) for q in seen)
    if r in finished:
        done = "sending it" if waits[seen[-1]][0] == "recv" else "receiving it"
        return (text + (", which" if len(seen) == 1 else f"; rank {r}") + f" has finished without {done}",
                "finished", r, seen[-1])
    if r in seen:
        return text + ": a cycle, so none of them can go on", "cycle", r, seen[-1]
    return text, "other", r, seen[-1]
