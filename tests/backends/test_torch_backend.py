"""The torch backend: the same programs on real processes (gloo on CPU).

Every check compares the real run with the simulator, which the other test
files check against numpy and hand-derived values: same outputs, same trace
event for event, same errors, same grades. Worker processes are reused
across tests (starting one costs seconds), and killed ones are replaced.
"""

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest

import ringlab
import ringlab.collectives
import ringlab.grading
from ringlab.errors import CommError, DeadlockError, ProgramTimeout, RankError, UnreceivedMessagesError

from support.both_backends import assert_same_run, same

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="backend='torch' needs PyTorch: pip install 'ringlab[torch]'")

PY = sys.executable
TORCHRUN = os.path.join(os.path.dirname(PY), "torchrun")


@pytest.fixture(scope="module", autouse=True)
def pool():
    yield
    from ringlab.backends.torch import pool
    pool.shutdown()
    assert _ours(_descendants(os.getpid())) == [], "worker processes left behind after shutdown()"


def _ours(pids):
    """The pids that are ringlab workers or their zygote (other tests may have children too)."""
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"ringlab.backends.torch.worker" in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def _descendants(pid):
    """Live (non-zombie) descendants of ``pid``, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _worker_pids():
    from ringlab.backends.torch import pool
    return [w.pid for w in pool.get_pool().workers]


# -- every reference collective ----------------------------------------------------
def _variants(n):
    """Inputs that fit the usual collective signatures: a vector per rank (whole
    numbers, so every summation order gives the same floats), a (world_size, 3)
    block matrix per rank (AlltoAll), data on rank 0 only (broadcast)."""
    rng = np.random.default_rng(n)
    yield [rng.integers(-100, 100, 3 * n + 1).astype(np.float64) for _ in range(n)]
    yield [rng.integers(-100, 100, (n, 3)).astype(np.float64) for _ in range(n)]
    yield [np.arange(3 * n + 1.0)] + [None] * (n - 1)


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("name", ringlab.collectives.__all__)
def test_reference_collective_same_outputs_and_trace(name, world_size):
    program = getattr(ringlab.collectives, name)
    for inputs in _variants(world_size):
        try:
            ringlab.run(program, inputs)
        except RankError:
            continue                       # this input shape doesn't fit; try the next
        sim, real = assert_same_run(program, inputs)
        assert len(sim.trace) > 0
        return
    pytest.fail(f"no input in _variants fits ringlab.collectives.{name}; add one")


def test_bus_bandwidth_as_nccl_tests_defines_it():
    from ringlab.backends.torch.timing import bandwidths
    assert bandwidths(1e9, 0.5, 8) == pytest.approx((2.0, 2.0 * 2 * 7 / 8))   # algbw S/t; busbw x 2(n-1)/n
    assert bandwidths(3e9, 1.5, 2) == pytest.approx((2.0, 2.0))
    # The factor is what a ring AllReduce sends per rank, in units of the vector: 2(n-1)/n.
    n, length = 4, 1024
    real = ringlab.run(ringlab.collectives.ring_allreduce, [np.ones(length, np.float32)] * n, backend="torch")
    assert real.trace.bytes_sent() == [2 * (n - 1) * length * 4 // n] * n


def test_timing_harness_runs_every_contender_and_checks_the_sums():
    from ringlab.backends.torch.timing import measure
    table = measure(world_size=2, sizes=[4096, 12345 * 4], repeats=2)
    assert sorted(table) == [4096, 12345 * 4]
    for row in table.values():
        assert row["ok"] is True
        assert all(0 < row[k] < 60 for k in ("ring", "ring_copy", "torch_ring", "torch"))


def test_in_place_ring_allreduce_on_real_processes():
    # out=x is what the benchmark times: same trace as the copying call, x holds the sum.
    def in_place(comm, x):
        result = ringlab.collectives.ring_allreduce(comm, x, out=x)
        return result is x, x
    xs = [np.arange(10.0) * (r + 1) for r in range(3)]
    real = ringlab.run(in_place, xs, backend="torch")
    assert all(same and np.array_equal(x, np.sum(xs, axis=0)) for same, x in real.outputs)
    assert real.trace == ringlab.run(ringlab.collectives.ring_allreduce, xs).trace


def test_kwargs_args_and_odd_arrays_travel():
    from ringlab.collectives import chain_broadcast
    assert_same_run(chain_broadcast, [np.arange(10.0), None, None], kwargs={"segments": 3})

    def odd(comm, x, scale):
        right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
        for a in (x[::2] * scale, np.zeros((0, 3), np.int32), np.array(5, np.int16),
                  np.arange(6, dtype=np.float32).reshape(2, 3).T, np.array([True, False]),
                  np.ones(20000, np.complex64), np.arange(7, dtype=np.uint8)):
            comm.send(a, right, chunk=(1, 2), op="copy", tag=3)
        got = [comm.recv(left, tag=3) for _ in range(7)]
        out = np.empty(20000, np.complex64)
        req = comm.irecv(left, out=out, tag=4)
        comm.isend(got[5] * 2, right, tag=4).wait()
        assert req.wait() is out
        with comm.span("inner"):
            got.append(comm.sendrecv(x, right, left, chunk=0))
        return got + [out, comm.step]

    assert_same_run(odd, [np.arange(5.0) + r for r in range(3)], args=(2.0,))


def test_buffered_sends_and_unwaited_irecvs_as_in_the_simulator():
    def everyone_sends_first(comm, x):       # fine with buffered sends, as in the simulator
        n = comm.world_size
        comm.send(x, (comm.rank + 1) % n)
        return comm.recv((comm.rank - 1) % n)

    assert_same_run(everyone_sends_first, [np.full(300_000, r, float) for r in range(3)])

    def posts_more_than_it_waits(comm, x):   # the simulator counts posted irecvs as received
        if comm.rank == 0:
            comm.send(x, 1)
            comm.send(x + 1, 1, tag=2)
            return x
        first, _, _ = comm.irecv(0), comm.irecv(0, tag=2), comm.irecv(0)
        return first.wait()

    assert_same_run(posts_more_than_it_waits, [np.arange(3.0), np.zeros(3)])


def test_received_arrays_the_program_keeps_are_never_overwritten():
    # The backend reuses a channel's receive buffer once nobody refers to it; an array
    # the program kept (or a view of one, or a tensor sharing its memory) must stay intact.
    def keep_some(comm, x):
        if comm.rank == 0:
            for k in range(6):
                comm.send(np.full(200_000, float(k)), 1)      # 1.6 MB: a "big" message
            return None
        import torch
        kept = [comm.recv(0)]                                  # k = 0, kept as is
        view = comm.recv(0)[::2]                               # k = 1, only a view kept
        tensor = torch.from_numpy(comm.recv(0))                # k = 2, kept as a tensor
        dropped = [float(comm.recv(0)[0]) for _ in range(3)]   # k = 3..5, let go at once
        return [float(kept[0].max()), float(kept[0].min()), float(view.max()), float(view.min()),
                float(tensor.max()), float(tensor.min())] + dropped

    res = ringlab.run(keep_some, [None, None], backend="torch")
    assert res.outputs[1] == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 4.0, 5.0]


# -- programs from __main__ ----------------------------------------------------------
def test_program_defined_in_python_c_runs_on_real_processes():
    code = textwrap.dedent("""
        import numpy as np, ringlab

        def neighbour(comm):
            return (comm.rank + 1) % comm.world_size

        @ringlab.collective
        def pass_on(comm, x):
            comm.send(x * SCALE, neighbour(comm), chunk=0, op="copy")
            return comm.recv((comm.rank - 1) % comm.world_size)

        def crash(comm, x):
            raise KeyError("from __main__")

        SCALE = 3.0
        inputs = [np.arange(4.0) + r for r in range(3)]
        sim, real = ringlab.run(pass_on, inputs), ringlab.run(pass_on, inputs, backend="torch")
        print("same", real.trace == sim.trace, real.trace.spans == sim.trace.spans,
              all(np.array_equal(a, b) for a, b in zip(sim.outputs, real.outputs)))
        try:
            ringlab.run(crash, inputs, backend="torch")
        except ringlab.RankError as e:
            print("error", e.rank, type(e.exc).__name__, "in crash" in e.program_traceback)
    """)
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    assert "same True True True" in out.stdout
    assert "error 0 KeyError True" in out.stdout


def test_importing_ringlab_does_not_import_torch():
    code = ("import sys, numpy as np, ringlab, ringlab.collectives, ringlab.backends, ringlab.backends.torch.pool\n"
            "ringlab.run(ringlab.collectives.ring_allreduce, [np.ones(3)] * 2)\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- grading ----------------------------------------------------------------------------
def test_grades_are_the_same_on_both_backends():
    import programs.ring_variants as v
    for program in (ringlab.collectives.ring_allreduce, v.leftward_send_recv, v.accumulates_in_all_gather,
                    v.receives_first_deadlock, v.one_step_too_many, v.not_implemented):
        sim = ringlab.grade("ring_allreduce", program, seed=7, log=False)
        real = ringlab.grade("ring_allreduce", program, seed=7, backend="torch", log=False)
        # The same report, but for the Reproduce line, which names the backend.
        assert (real.passed, real.not_implemented) == (sim.passed, sim.not_implemented)
        assert str(real).replace(", backend='torch')", ")") == str(sim)
        assert real.passed or real.not_implemented or "backend='torch')" in str(real)
    assert ringlab.grade("ring_allreduce", v.leftward_send_recv, seed=7, backend="torch", log=False).passed
    assert not ringlab.grade("ring_allreduce", v.accumulates_in_all_gather, seed=7, backend="torch",
                             log=False).passed


@pytest.mark.parametrize("exercise", sorted(set(ringlab.grading.GRADERS) & set(ringlab.collectives.__all__)
                                             - {"ring_allreduce"}))
def test_other_graders_pass_the_reference_on_both_backends(exercise):
    program = getattr(ringlab.collectives, exercise)
    sim = ringlab.grade(exercise, program, seed=3, log=False)
    real = ringlab.grade(exercise, program, seed=3, backend="torch", log=False)
    assert sim.passed and (real.passed, str(real)) == (sim.passed, str(sim))


# -- faults ---------------------------------------------------------------------------
def crash_on_rank_1(comm, x):
    if comm.rank == 1:
        raise ValueError("rank 1 gives up")
    return comm.recv(1)


def test_a_rank_that_raises_stops_the_run_and_names_rank_and_line():
    ringlab.run(ringlab.collectives.ring_allreduce, [np.ones(4)] * 3, backend="torch")
    before = _worker_pids()[:3]
    with pytest.raises(RankError) as err:
        ringlab.run(crash_on_rank_1, [np.ones(2)] * 3, backend="torch")
    e = err.value
    assert (e.rank, e.step, type(e.exc)) == (1, 0, ValueError)
    assert e.trace is not None and len(e.trace) == 0      # nobody had sent anything
    assert "crash_on_rank_1" in e.program_traceback
    assert 'raise ValueError("rank 1 gives up")' in e.program_traceback   # the learner's own line
    assert not any(_alive(p) for p in before), "the run's processes must be gone"
    # ... and the next run works on fresh workers
    assert_same_run(ringlab.collectives.ring_allreduce, [np.arange(5.0)] * 3)


def bad_dst(comm, x):
    comm.send(x, comm.world_size)


def not_an_array(comm, x):
    comm.send([1, 2], (comm.rank + 1) % comm.world_size)


def wrong_shape(comm, x):
    if comm.rank == 0:
        comm.send(np.zeros(3), 1, chunk=2)
    else:
        comm.recv(0, shape=(4,))


@pytest.mark.parametrize("program", [bad_dst, not_an_array, wrong_shape])
def test_comm_errors_are_the_simulators(program):
    errors = []
    for backend in ("sim", "torch"):
        with pytest.raises(RankError) as err:
            ringlab.run(program, [np.ones(2)] * 2, backend=backend)
        assert isinstance(err.value.exc, CommError)
        errors.append((err.value.rank, str(err.value.exc)))
    assert errors[0] == errors[1]


def ring_deadlock(comm, x):
    return comm.recv((comm.rank + 1) % comm.world_size)


def wrong_tag(comm, x):
    if comm.rank == 0:
        comm.send(x, 1, tag=1)
    else:
        comm.recv(0, tag=0)


def wrong_peer(comm, x):
    if comm.rank == 0:
        comm.send(x, 2)
        return comm.recv(2)
    return comm.recv(0 if comm.rank == 1 else 1)


def test_deadlock_is_found_at_once_and_named_like_the_simulator():
    sim = pytest.raises(DeadlockError, ringlab.run, ring_deadlock, [np.ones(2)] * 4).value
    t = time.monotonic()
    real = pytest.raises(DeadlockError, ringlab.run, ring_deadlock, [np.ones(2)] * 4,
                         backend="torch", timeout=30).value
    assert time.monotonic() - t < 15, "found by watching the ranks, not by the timeout"
    assert (real.waiting, real.finished) == (sim.waiting, sim.finished)
    assert "rank 3: waits in recv(src=0)" in str(real)
    assert real.trace is not None and len(real.trace) == 0
    # A message in flight to the wrong rank: the error's trace shows it, as the simulator's does.
    sim = pytest.raises(DeadlockError, ringlab.run, wrong_peer, [np.ones(2)] * 3).value
    real = pytest.raises(DeadlockError, ringlab.run, wrong_peer, [np.ones(2)] * 3, backend="torch").value
    assert (real.waiting, real.finished) == (sim.waiting, sim.finished)
    assert real.trace == sim.trace and real.trace.unreceived == sim.trace.unreceived
    assert [(e.src, e.dst, e.step) for e in real.trace.unreceived] == [(0, 2, 1)]
    # A message on the wrong tag is in flight, so only the timeout can tell:
    sim = pytest.raises(DeadlockError, ringlab.run, wrong_tag, [np.ones(2)] * 2).value
    real = pytest.raises(DeadlockError, ringlab.run, wrong_tag, [np.ones(2)] * 2,
                         backend="torch", timeout=2).value
    assert (real.waiting, real.finished) == (sim.waiting, sim.finished)


def test_deadlock_rule_on_hand_made_status_blocks():
    from ringlab.backends.torch import status as st
    from ringlab.backends.torch.supervisor import _deadlock

    def block(state, peer=-1, sent=(), received=()):
        words = np.zeros(8 + 2 * st.MAX_RANKS, np.int64)
        words[:4] = state, peer, 0, 3
        for r, k in sent:
            words[8 + r] = k
        for r, k in received:
            words[8 + st.MAX_RANKS + r] = k
        return words

    # rank 0 waits for rank 1, which has finished and sent it nothing more: deadlock
    from ringlab.errors import Wait
    assert _deadlock([block(st.RECV, 1, received=[(1, 2)]), block(st.DONE, sent=[(0, 2)])]) == {
        0: Wait("recv", 1, "waits in recv(src=1) (its clock: step 3)")}
    # ... but not if a message from rank 1 is still on its way
    assert _deadlock([block(st.RECV, 1, received=[(1, 2)]), block(st.DONE, sent=[(0, 3)])]) is None
    # a rank finishing a send that its receiver already has is about to move on
    assert _deadlock([block(st.DONE, received=[(1, 4)]), block(st.SEND, 0, sent=[(0, 4)])]) is None
    # a send to a finished rank that never took it can't complete
    assert 1 in _deadlock([block(st.DONE, received=[(1, 3)]), block(st.SEND, 0, sent=[(0, 4)])])
    # anyone running can still change everything
    assert _deadlock([block(st.RECV, 1), block(st.RUNNING)]) is None


def spins_on_rank_0(comm, x):
    if comm.rank == 0:
        while True:
            pass
    return comm.recv(0)


def test_a_hang_ends_at_the_timeout_naming_the_ranks():
    pids = _worker_pids()[:3]
    t = time.monotonic()
    with pytest.raises(ProgramTimeout) as err:
        ringlab.run(spins_on_rank_0, [np.ones(2)] * 3, backend="torch", timeout=2)
    assert time.monotonic() - t < 15
    text = str(err.value)
    assert err.value.rank == 0 and "within 2 s" in text
    assert "while True" in text                          # where rank 0 was
    assert "rank 1: waits in recv(src=0)" in text and "rank 2: waits in recv(src=0)" in text
    assert not any(_alive(p) for p in pids)


def sends_one_too_many(comm, x):
    if comm.rank == 0:
        comm.send(x, 1, chunk=0)
        comm.send(x, 1, chunk=1)
    else:
        comm.recv(0)
    return x


def dies(comm, x):
    if comm.rank == 1:
        os._exit(7)
    return comm.recv(1)


def test_unreceived_messages_and_a_dying_process():
    sim = pytest.raises(UnreceivedMessagesError, ringlab.run, sends_one_too_many, [np.ones(2)] * 2).value
    real = pytest.raises(UnreceivedMessagesError, ringlab.run, sends_one_too_many, [np.ones(2)] * 2,
                         backend="torch").value
    assert real.leftovers == sim.leftovers and len(real.leftovers) == 1
    assert_same_run(sends_one_too_many, [np.ones(2)] * 2, check_unreceived=False)
    with pytest.raises(RankError, match="the process of rank 1 died"):
        ringlab.run(dies, [np.ones(2)] * 2, backend="torch")


def test_nccl_runs_on_gpus_or_says_why_not():
    inputs = [np.arange(6.0)] * 2
    try:
        real = ringlab.run(ringlab.collectives.ring_allreduce, inputs, backend="nccl", timeout=60)
    except RankError as e:                  # this machine has no 2 GPUs (the usual case here)
        assert "needs one CUDA GPU per rank" in str(e)
        return
    assert real.trace == ringlab.run(ringlab.collectives.ring_allreduce, inputs).trace


def _with_device_framing(program):
    """``program``, run with the message framing used for GPUs (header, then a
    payload of exactly its size, received into a device tensor), the device
    being the CPU: the NCCL code path of wire.py, minus NCCL."""
    def framed(comm, x, *args, **kwargs):
        import torch
        from ringlab.backends.torch import framing as wire, world as protocol
        world = protocol.current_world
        world.device = torch.device("cpu")
        world.wire = wire.Wire(device=world.device)
        return program(comm, x, *args, **kwargs)
    return framed


@pytest.mark.parametrize("name", ["ring_allreduce", "binomial_broadcast", "pairwise_alltoall"])
def test_gpu_framing_gives_the_same_outputs_and_trace(name):
    program = getattr(ringlab.collectives, name)
    for inputs in _variants(4):
        try:
            sim = ringlab.run(program, inputs)
        except RankError:
            continue
        real = ringlab.run(_with_device_framing(program), inputs, backend="torch")
        assert all(same(a, b) for a, b in zip(sim.outputs, real.outputs))
        assert real.trace == sim.trace, sim.trace.diff(real.trace)
        return
    pytest.fail(f"no input in _variants fits {name}")


def test_gpu_framing_carries_big_and_changing_messages():
    # Sizes above and below the eager limit, growing and shrinking, empty and 0-d arrays.
    def sizes(comm, x):
        right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
        got = []
        for n in (10, 200_000, 3, 50_000, 0):
            got.append(comm.sendrecv(np.arange(n, dtype=np.float32) + comm.rank, right, left))
        got.append(comm.sendrecv(np.array(7, np.int16), right, left))
        return got
    sim = ringlab.run(sizes, [None] * 3)
    real = ringlab.run(_with_device_framing(sizes), [None] * 3, backend="torch")
    for a, b in zip(sim.outputs, real.outputs):
        assert all(x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b))
    assert real.trace == sim.trace


def earlier_irecv_then_sendrecv(comm, x):
    # A receive posted before the sendrecv, on the same channel, gets the earlier message.
    right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
    comm.send(x * 10, right, chunk=0)
    first = comm.irecv(left)
    second = comm.sendrecv(x + 1, right, left, chunk=1)
    return first.wait(), second, comm.step


def sendrecv_to_nobody(comm, x):
    return comm.sendrecv(x, comm.world_size, 0)


def sendrecv_from_nobody(comm, x):
    return comm.sendrecv(x, 0, -1)


def test_gpu_framing_sendrecv_keeps_channel_order_and_errors():
    inputs = [np.arange(4.0) + r for r in range(3)]
    sim = ringlab.run(earlier_irecv_then_sendrecv, inputs)
    real = ringlab.run(_with_device_framing(earlier_irecv_then_sendrecv), inputs, backend="torch")
    for (a1, a2, a3), (b1, b2, b3) in zip(sim.outputs, real.outputs):
        assert np.array_equal(a1, b1) and np.array_equal(a2, b2) and a3 == b3
    assert real.trace == sim.trace
    for program in (sendrecv_to_nobody, sendrecv_from_nobody):
        errors = []
        for backend, prog in (("sim", program), ("torch", _with_device_framing(program))):
            with pytest.raises(RankError) as err:
                ringlab.run(prog, [np.ones(2)] * 2, backend=backend)
            assert isinstance(err.value.exc, CommError)
            errors.append((err.value.rank, str(err.value.exc)))
        assert errors[0] == errors[1]


def test_a_busy_port_is_no_obstacle(monkeypatch):
    from ringlab.backends.torch import pool
    pool.shutdown()                               # start from scratch, with the usual port taken
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(s.getsockname()[1]))
        assert_same_run(ringlab.collectives.ring_allreduce, [np.arange(6.0)] * 2)


def test_killing_the_parent_takes_the_workers_with_it():
    code = ("import numpy as np, ringlab\n"
            "import ringlab.collectives\n"
            "from ringlab.backends.torch import pool\n"
            "ringlab.run(ringlab.collectives.ring_allreduce, [np.ones(3)] * 2, backend='torch')\n"
            "print(*[w.pid for w in pool.get_pool().workers], pool.get_pool().zygote.proc.pid, flush=True)\n"
            "import time; time.sleep(60)\n")
    proc = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 3
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), "workers outlived their parent"


# -- the multi-node launcher, on one machine ---------------------------------------------
LAUNCHED = textwrap.dedent("""
    import numpy as np
    from ringlab.collectives import ring_allreduce

    def inputs(world_size):
        return [np.arange(10.0) * (r + 1) for r in range(world_size)]

    def crash(comm, x):
        if comm.rank == 1:
            raise ValueError("rank 1 gives up")
        return comm.recv(1)

    def stuck(comm, x):
        return comm.recv((comm.rank + 1) % comm.world_size)
""")


def _torchrun(tmp_path, nproc, *args):
    (tmp_path / "launched.py").write_text(LAUNCHED)
    mark = uuid.uuid4().hex
    env = dict(os.environ, RINGLAB_TEST_MARK=mark, PYTHONPATH=str(tmp_path))
    out = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), "-m", "ringlab.launch",
                          *args], capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    left = [p for p in _marked(mark) if _alive(p)]
    assert left == [], f"processes left behind: {left}"
    return out


def _marked(mark):
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if mark.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            pass
    return found


@pytest.mark.skipif(not os.path.exists(TORCHRUN), reason="torchrun not found next to python")
def test_launcher_under_torchrun(tmp_path):
    out = _torchrun(tmp_path, 4, "launched:ring_allreduce", "--inputs", "launched:inputs",
                    "--compare-sim", "--out", str(tmp_path / "result"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "on 4 ranks (gloo): 6 steps, 24 messages" in out.stdout
    assert "same outputs as the simulator: True; same trace: True" in out.stdout
    trace = ringlab.Trace.from_json((tmp_path / "result" / "trace.json").read_text())
    assert trace == ringlab.run(ringlab.collectives.ring_allreduce,
                                [np.arange(10.0) * (r + 1) for r in range(4)]).trace

    out = _torchrun(tmp_path, 2, "launched:crash", "--inputs", "random:4")
    assert out.returncode != 0
    assert "rank 1 raised ValueError at step 0: rank 1 gives up" in out.stderr
    assert 'raise ValueError("rank 1 gives up")' in out.stderr

    out = _torchrun(tmp_path, 2, "launched:stuck", "--inputs", "random:4", "--timeout", "3")
    assert out.returncode != 0
    assert "did not finish within 3 s; it waits in recv(src=" in out.stderr


@pytest.mark.skipif(not os.path.exists(TORCHRUN), reason="torchrun not found next to python")
def test_launcher_as_two_nodes_on_one_machine(tmp_path):
    # The README's two-machine command, with both "machines" here: two torchrun
    # agents (node ranks 0 and 1, 2 processes each) meeting at one master address.
    (tmp_path / "launched.py").write_text(LAUNCHED)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mark = uuid.uuid4().hex
    env = dict(os.environ, RINGLAB_TEST_MARK=mark, PYTHONPATH=str(tmp_path))
    nodes = [subprocess.Popen([TORCHRUN, "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(node),
                               "--master-addr", "127.0.0.1", "--master-port", str(port),
                               "-m", "ringlab.launch", "launched:ring_allreduce", "--inputs", "launched:inputs",
                               "--compare-sim"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
             for node in (0, 1)]
    try:
        outs = [p.communicate(timeout=240) for p in nodes]
    finally:
        for p in nodes:
            p.kill()
    assert [p.returncode for p in nodes] == [0, 0], [err[-2000:] for _, err in outs]
    assert "on 4 ranks (gloo): 6 steps, 24 messages" in outs[0][0]        # rank 0 lives on node 0
    assert "same outputs as the simulator: True; same trace: True" in outs[0][0]
    assert "same trace" not in outs[1][0]                                  # node 1 only takes part
    assert [p for p in _marked(mark) if _alive(p)] == [], "processes left behind"


def print_then_maybe_fail(comm, x):
    print(f"rank {comm.rank} was here")
    if comm.rank == 1:
        raise ValueError("rank 1 gives up")
    return x


def test_prints_of_finished_ranks_are_shown_when_the_run_fails(capsys):
    # As in the simulator, where they are printed as the program runs (there rank 2
    # never starts: rank 1's error ends the run first).
    for backend in ("sim", "torch"):
        with pytest.raises(RankError):
            ringlab.run(print_then_maybe_fail, [np.ones(1)] * 3, backend=backend)
        out = capsys.readouterr().out
        assert "rank 0 was here" in out and "rank 1 was here" in out, (backend, out)


def test_payloads_are_recorded_on_real_processes_and_graders_check_them():
    from grading.test_grader_cheats import a2a_hides_a_block, ar_negated
    inputs = [np.arange(4.0) + 10 * r for r in range(2)]
    real = ringlab.run(ringlab.collectives.ring_allreduce, inputs, backend="torch",
                       record_payloads=True)
    sim = ringlab.run(ringlab.collectives.ring_allreduce, inputs, record_payloads=True)
    assert all(np.array_equal(real.payload(e), sim.payload(e)) for e in sim.trace)
    # Wrong programs whose messages have the right sizes but the wrong contents
    # fail on real processes as in the simulator (the payload checks run there too).
    for exercise, program in (("ring_allreduce", ar_negated), ("alltoall", a2a_hides_a_block)):
        report = ringlab.grade(exercise, program, seed=0, backend="torch", log=False)
        assert not report.passed and not report.not_implemented, str(report)
