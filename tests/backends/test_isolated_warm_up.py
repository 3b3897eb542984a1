"""A rank process uses BLAS once before the grader first reads its memory (the warm-up),
and the grader reads its memory at each of its calls, only in the runs whose memory a
grader checks: the cases that measure it."""

import numpy as np

from ringlab.backends.isolated import run_isolated, runner, server
from ringlab.grading.kit import running
from ringlab.grading.kit.report import Case

MIB = 2**20


def two_products(comm, x):
    """Two 2 MiB arrays alive at a call, where the grader reads the memory."""
    a = np.ones((512, 512))
    b = a @ a
    comm.barrier()
    return b[0]


def test_the_warm_up_keeps_blas_s_pages_out_of_the_program_s_memory():
    warm, cold = (run_isolated(two_products, [None], warm_up=w).resident[0] for w in (True, False))
    grown = {name: (r["peak"] - r["before"]) / MIB for name, r in (("warm", warm), ("cold", cold))}
    # warmed: the two arrays (4 MiB); cold: OpenBLAS's buffer and code (about 4 MiB more) too
    assert 3.9 < grown["warm"] < 4.5 < grown["cold"] - 2, grown
    assert warm["before"] - cold["before"] > 2 * MIB, (warm, cold)


def test_only_a_case_that_measures_memory_warms_its_ranks_up(monkeypatch):
    asked = []

    def recorded(program, inputs, **kw):
        asked.append((kw["warm_up"], kw["reads_memory"]))
        return run_isolated(program, inputs, **kw)
    monkeypatch.setattr(server, "run_isolated", recorded)
    token = running._RUNNER.set(runner())
    try:
        for measure in (True, False, None):
            info = {} if measure is None else {"measure": measure}
            result, failure = running.run_case(two_products, Case(1, [None], "one rank", info=info))
            assert failure is None and result.resident[0]["before"], failure
            # the reading at each call (the barrier's, with the two arrays alive): only
            # where the case measures
            peak = result.resident[0]["peak"]
            assert peak > result.resident[0]["loaded"] + 3 * MIB if measure else peak is None
    finally:
        running._RUNNER.reset(token)
    assert asked == [(True, True), (False, False), (False, False)]
    assert server.MEASURES_MEMORY.get() is True        # outside a case: every run warms up


def test_the_causality_check_s_runs_skip_the_warm_up(monkeypatch):
    """Its 1 + N runs of a passed case read no memory (causality.py)."""
    from ringlab.grading.kit import loop
    asked = []
    monkeypatch.setattr(loop, "violation", lambda *a, **k: asked.append(
        server.MEASURES_MEMORY.get()))
    case = Case(2, [np.ones(2)] * 2, "two ranks")
    assert loop._causality(None, case, two_products, case.inputs, (), 10.0) is None
    assert asked == [False] and server.MEASURES_MEMORY.get() is True
