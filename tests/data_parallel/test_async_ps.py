"""Asynchronous SGD with a parameter server: the library and the ``async_ps`` grader."""

import inspect
import math
import time

import numpy as np
import pytest

import ringlab
from ringlab.sim.budget import WALL_FACTOR
from ringlab.data_parallel import async_ps as ps
from ringlab.data_parallel.async_ps import PSTask, async_ps, max_clock_gap, run_async_ps, sync_sgd


@pytest.fixture(scope="module")
def task():
    return PSTask.make(workers=4, updates=40, seed=3)


# -- the library ---------------------------------------------------------------------------

def test_s0_is_synchronous_sgd_bit_for_bit(task):
    run = run_async_ps(task, s=0)
    P = task.workers
    # Every gradient of round k was computed from version k * P: all from the same parameters.
    assert [v for _, v in run.log] == [P * (i // P) for i in range(task.updates)]
    assert run.pushes == [10] * P
    orders = [[w for w, _ in run.log[k * P:(k + 1) * P]] for k in range(10)]
    assert np.array_equal(run.params, sync_sgd(task, 10, orders))
    # In rank order the sums round differently, in the last bits only.
    plain = sync_sgd(task, 10)
    assert not np.array_equal(run.params, plain)
    assert np.allclose(run.params, plain, rtol=0, atol=1e-12)


@pytest.mark.parametrize("s", [0, 1, 2, 3, math.inf])
def test_staleness_bound_and_replay(task, s):
    run = run_async_ps(task, s)
    assert len(run.log) == task.updates and sum(run.pushes) == task.updates
    gap = max_clock_gap(task, run.log)
    assert gap <= s
    # In updates, staleness is at most (2s + 1)(P - 1) (see the chapter).
    assert max(run.staleness) <= (2 * s + 1) * (task.workers - 1)
    _, states = ps.replay(task, run.grads)
    assert np.array_equal(run.params, states[-1])


def test_throughput_grows_with_s_and_async_beats_sync(task):
    times = [run_async_ps(task, s).time for s in (0, 1, 4, math.inf)]
    assert times == sorted(times, reverse=True)
    assert times[0] / times[-1] > 1.5      # the straggler no longer sets the pace


def test_determinism(task):
    a, b = run_async_ps(task, 1), run_async_ps(task, 1)
    assert a.log == b.log and a.time == b.time and np.array_equal(a.params, b.params)
    assert a.trace == b.trace


def test_fewer_updates_than_workers_and_task_copies():
    import copy
    small = PSTask.make(workers=4, updates=3, seed=1)
    run = run_async_ps(small, 0)
    assert sorted(run.pushes) == [0, 1, 1, 1] and len(run.log) == 3
    twin = copy.deepcopy(small)
    p = small.init + 0.1
    assert np.array_equal(twin.gradient(p, 2, 5), small.gradient(p, 2, 5))


# -- the grader: right programs ----------------------------------------------------------------

def variant(old, new, fn=ps.ps_server):
    """``fn`` with one line changed, as an ``async_ps`` program."""
    src = inspect.getsource(fn)
    assert src.count(old) == 1, old
    ns = dict(vars(ps))
    exec(src.replace(old, new), ns)                  # noqa: S102 - our own text
    server = ns["ps_server"] if fn is ps.ps_server else ps.ps_server
    worker = ns["ps_worker"] if fn is ps.ps_worker else ps.ps_worker

    def program(comm, spec, s=math.inf):
        task = PSTask.from_spec(spec)
        return server(comm, task, s) if comm.rank == 0 else worker(comm, task)
    return program


def other_server(comm, task, s):
    """Written differently: isend replies, held workers as a set released in rank order."""
    params, log, reqs = task.init.copy(), [], []
    clock = np.zeros(comm.world_size, dtype=int)
    clock[0] = 10**9                                 # rank 0 is no worker
    read, held, handed = {}, set(), 0

    def answer(w):
        nonlocal handed
        if handed == task.updates:
            reqs.append(comm.isend(np.empty(0), w))
            return
        read[w] = len(log)
        handed += 1
        reqs.append(comm.isend(params.copy(), w))

    for w in range(1, comm.world_size):
        answer(w)
    while len(log) < handed:
        w, g = comm.recv_any()
        log.append((w, read.pop(w)))
        params = params - task.lr * g
        clock[w] += 1
        held.add(w)
        for v in sorted(held):
            if handed == task.updates or clock[v] - clock.min() <= s:
                held.discard(v)
                answer(v)
    for r in reqs:
        r.wait()
    return params, np.array(log)


def other_program(comm, spec, s=math.inf):
    task = PSTask.from_spec(spec)
    if comm.rank:
        k = 0
        while (params := comm.recv(0)).size:
            comm.send(task.work(comm, params, k), 0)
            k += 1
        return None
    return other_server(comm, task, s)


RIGHT = {
    "reference": async_ps,
    "isend, rank order, params = params - lr * g": other_program,
    "g * lr": variant("params -= task.lr * grad", "params -= grad * task.lr"),
}


@pytest.mark.parametrize("name", RIGHT)
def test_right_programs_pass(name):
    for seed in (0, 7):
        report = ringlab.grade("async_ps", RIGHT[name], seed=seed, log=False)
        assert report.passed, str(report)


def test_grade_time_and_not_implemented():
    # The target (under 2 s) is bench/grade_data_parallel.py's; here, on a machine
    # that may be busy with other tests, up to WALL_FACTOR times as long (sim/budget.py).
    t = time.perf_counter()
    assert ringlab.grade("async_ps", async_ps, seed=5, log=False).passed
    assert time.perf_counter() - t < 2.0 * WALL_FACTOR

    def stub(comm, task, s):
        raise NotImplementedError
    assert ringlab.grade("async_ps", stub, log=False).not_implemented


# -- the grader: wrong programs ------------------------------------------------------------------

def first_sends(comm, task):
    """How the wrong servers below start: the initial parameters to every worker
    (all read version 0). Returns (params, log, read, issued)."""
    params, read = task.init.copy(), {}
    for w in range(1, comm.world_size):
        read[w] = 0
        comm.send(params, w)
    return params, [], read, len(read)


def reply_or_stop(comm, task, w, params, read, issued, version):
    """Worker w's next parameters (it reads ``version``) while fewer than
    ``task.updates`` are handed out, else STOP (an empty message); returns
    how many are handed out now."""
    if issued < task.updates:
        read[w] = version
        comm.send(params, w)
        return issued + 1
    comm.send(np.empty(0), w)
    return issued


def round_robin(comm, task, s):
    """Waits for worker 1, then 2, ...: applies in rank order, not arrival order."""
    params, log, read, issued = first_sends(comm, task)
    active = list(range(1, comm.world_size))
    while active:
        for w in list(active):
            grad = comm.recv(w)                       # BUG: not whoever is first
            log.append((w, read[w]))
            params -= task.lr * grad
            if issued >= task.updates:                # w gets STOP now
                active.remove(w)
            issued = reply_or_stop(comm, task, w, params, read, issued, len(log))
    return params, log


def returns_sync(comm, task, s):
    params, log = ps.ps_server(comm, task, s)
    return sync_sgd(task, task.updates // task.workers), log   # BUG: someone else's params


def pipelined_worker(comm, task):
    """Pushes two gradients per pull: never waits for the fresh parameters."""
    k = 0
    while (params := comm.recv(0)).size:
        comm.send(task.work(comm, params, k), 0)
        k += 1
        comm.send(task.work(comm, params, k), 0)      # BUG: from the same, older params
        k += 1
        if not comm.recv(0).size:
            break
    return k


def slow_worker(comm, task):
    k = 0
    while (params := comm.recv(0)).size:
        comm.compute(0.05, "checkpoint")              # BUG: work nobody asked for
        comm.send(task.work(comm, params, k), 0)
        k += 1
    return k


def with_worker(worker):
    def program(comm, spec, s=math.inf):
        task = PSTask.from_spec(spec)
        return ps.ps_server(comm, task, s) if comm.rank == 0 else worker(comm, task)
    return program


def with_server(server):
    def program(comm, spec, s=math.inf):
        task = PSTask.from_spec(spec)
        return server(comm, task, s) if comm.rank == 0 else ps.ps_worker(comm, task)
    return program


def reply_first(comm, task, s):
    """Replies with the parameters before applying the gradient that just arrived."""
    params, log, read, issued = first_sends(comm, task)
    while len(log) < issued:
        w, grad = comm.recv_any()
        log.append((w, read[w]))
        # BUG: replies first ...
        issued = reply_or_stop(comm, task, w, params, read, issued, len(log) - 1)
        params -= task.lr * grad                      # ... applies after
    return params, log


def next_pair(comm, log, issued):
    """The next two arrivals, (w, grad) each, or the last one alone."""
    got = [comm.recv_any()]
    if len(log) + 1 < issued:
        got.append(comm.recv_any())
    return got


def swaps_pairs(comm, task, s):
    """Receives with recv_any, but applies each pair of arrivals the other way round."""
    params, log, read, issued = first_sends(comm, task)
    while len(log) < issued:
        got = next_pair(comm, log, issued)
        for w, grad in reversed(got):                 # BUG: the later one first
            log.append((w, read[w]))
            params -= task.lr * grad
        for w, _ in got:
            issued = reply_or_stop(comm, task, w, params, read, issued, len(log))
    return params, log


def swaps_pairs_quietly(comm, task, s):
    """Swaps pairs too, but logs them in arrival order, as if it did not."""
    params, log, read, issued = first_sends(comm, task)
    while len(log) < issued:
        got = next_pair(comm, log, issued)
        for w, _ in got:
            log.append((w, read[w]))
        for w, grad in reversed(got):                 # BUG: the later one first
            params -= task.lr * grad
        for w, _ in got:
            issued = reply_or_stop(comm, task, w, params, read, issued, len(log))
    return params, log


WRONG = {
    "drops a gradient": (
        variant("params -= task.lr * grad", "params -= task.lr * grad * (len(log) != 5)"),
        "the server applies every gradient once", ["without gradient 4: dropped?"]),
    "applies one twice": (
        variant("params -= task.lr * grad",
                "params -= task.lr * grad * (1 + (len(log) == 3))"),
        "the server applies every gradient once", ["gradient 2 applied twice"]),
    "round robin": (
        with_server(round_robin), "gradients are applied in the order they arrive",
        ["but gradient", "to arrive came from worker", "recv_any"]),
    "swaps pairs": (
        with_server(swaps_pairs), "gradients are applied in the order they arrive",
        ["log entry 0 is a gradient of worker"]),
    "swaps pairs, logs arrival order": (
        with_server(swaps_pairs_quietly), "the server applies every gradient once",
        ["up to rounding: applied in another order"]),
    "ignores s (never waits)": (
        variant("clock[v] - slowest <= s", "True"), "staleness never above s",
        ["s = 0", "Hold a worker's reply back"]),
    "always waits": (
        variant("clock[v] - slowest <= s", "clock[v] - slowest <= 0"),
        "no worker waits when it need not", ["could start clock", "s = inf"]),
    "fakes its log": (
        variant("log.append((w, read[w]))", "log.append((w, len(log)))"),
        "the log records the version each worker read", ["says worker", "read version"]),
    "returns other parameters": (
        with_server(returns_sync), "the final parameters are the replay",
        ["every arrived gradient applied once"]),
    "stops by applied, not handed out": (
        variant("if issued < task.updates:", "if len(log) < task.updates:"),
        "the server applies exactly task.updates gradients", ["gradients were pushed in all",
                                                              "STOP"]),
    "worker never waits": (
        with_worker(pipelined_worker), "each gradient is computed from the parameters the worker",
        ["parameters of pull 0", "without waiting for fresh ones"]),
    "slow worker": (
        with_worker(slow_worker), "no worker idles", ["computed 'checkpoint' for 50.0 ms"]),
    "slow server": (
        variant("        params -= task.lr * grad ",
                "        comm.compute(0.01, 'apply')\n        params -= task.lr * grad "),
        "the server never idles", ["could send worker", "but they left at"]),
    "float32 parameters": (
        variant("comm.send(params, w, op=\"copy\")",
                "comm.send(params.astype(np.float32), w, op=\"copy\")"),
        "parameters and gradients travel as float64",
        ["at step 1 the server sent the parameters to worker 1 as float32: float32 rounds the "
         "values on the way, to about 1e-07 of their size", "no astype on the way"]),
    "float32 gradients": (
        variant("comm.send(grad, 0, op=\"apply\")",
                "comm.send(grad.astype(np.float16), 0, op=\"apply\")", fn=ps.ps_worker),
        "parameters and gradients travel as float64",
        ["sent its gradient to the server as float16: float16 rounds the values on the way, "
         "to about 1e-03 of their size"]),
    "replies before applying": (
        with_server(reply_first),
        "the server sends the current parameters", ["without its own gradient"]),
}


@pytest.mark.parametrize("name", WRONG)
def test_wrong_programs_fail_with_the_right_check(name):
    program, check, phrases = WRONG[name]
    report = ringlab.grade("async_ps", program, seed=0, log=False)
    assert not report.passed and not report.not_implemented, name
    assert report.failure.check.startswith(check), str(report)
    text = str(report)
    assert all(p in text for p in phrases), text


def test_trusted_grading_spots_the_reference_but_not_the_task():
    import cloudpickle
    from ringlab.grading.trusted import reference_in
    assert "answer to async_ps (ringlab.data_parallel.async_ps" in reference_in(
        cloudpickle.dumps(async_ps))

    def mine(comm, spec, s):                    # a learner's program uses the task only
        return PSTask.from_spec(spec).init
    cloudpickle.register_pickle_by_value(__import__(__name__))
    assert reference_in(cloudpickle.dumps(mine)) is None


def test_isolated_grading_passes_the_reference_program_as_a_learner_would():
    import importlib
    from ringlab.backends.isolated import runner
    from ringlab.grading.kit.loop import grade_cases
    module = importlib.import_module("ringlab.grading.data_parallel.async_ps")
    assert grade_cases("async_ps", module, other_program, seed=2, runner=runner()).passed


def test_a_worker_cannot_fake_its_compute_time():
    """Found by a red team: the right gradient, but a 'gradient' compute shorter than
    the task's hidden time, so the worker looks faster than it is."""
    from ringlab.data_parallel.ps_task import PSTask
    from ringlab.data_parallel.async_ps import ps_server

    def fast_workers(comm, spec, s=math.inf):
        task = PSTask.from_spec(spec)
        if comm.rank == 0:
            return ps_server(comm, task, s)
        k = 0
        while True:
            params = comm.recv(0)
            if params.size == 0:
                return None
            comm.compute(1e-9, "gradient", k=k)
            comm.send(task.gradient(params, comm.rank, k), 0)
            k += 1
    report = ringlab.grade("async_ps", fast_workers, seed=0, log=False)
    assert not report.passed and report.failure.check == "one gradient computed per push"
    assert "but that gradient takes" in str(report)
