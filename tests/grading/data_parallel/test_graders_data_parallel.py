"""The data-parallel graders: correct variants pass; the real mistakes (no sync,
averaging twice, the wrong thing all-reduced, data instead of gradients, no
overlap, ...) fail with the specific check and words that say what to fix."""

import numpy as np
import pytest

import ringlab
from ringlab.collectives import ring_allgather, ring_allreduce
from ringlab.data_parallel import ddp_sync, sync_sgd_step
from ringlab.data_parallel.buckets import accumulate, assign_buckets
from ringlab.nn import FlatBuffer, flatten, mse

SEED = 3


def grade(exercise, fn):
    return ringlab.grade(exercise, fn, seed=SEED, log=False)


# ============================================================== sync_sgd_step
def local_grad(model, x, y):
    model.zero_grad()
    loss, d = mse(model.forward(x), y)
    model.backward(d)
    return loss, flatten(model.named_grads())


def sgd_sum_then_divide(comm, model, opt, x, y, batch_size):
    """Right: weight by n_r (sum of sample gradients), AllReduce, divide by B after."""
    loss, g = local_grad(model, x, y)
    g.data *= len(x)
    ring_allreduce(comm, g.data, out=g.data)
    g.data /= batch_size
    opt.step(g.views)
    return loss


def sgd_own_ring(comm, model, opt, x, y, batch_size):
    """Right: a hand-written ring AllReduce (no span names), isend/irecv."""
    loss, g = local_grad(model, x, y)
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    chunks = np.array_split(g.data * (len(x) / batch_size), n)
    for k in range(n - 1):
        chunks[(r - k - 1) % n] = chunks[(r - k - 1) % n] + comm.sendrecv(
            chunks[(r - k) % n], right, left)
    for k in range(n - 1):
        chunks[(r - k) % n] = comm.sendrecv(chunks[(r + 1 - k) % n], right, left)
    total = np.concatenate(chunks)
    g.data[...] = total
    opt.step(g.views)
    return loss


def sgd_accumulate(comm, model, opt, x, y, batch_size):
    """Right: two micro-batches, no_sync for the first, one AllReduce at the end."""
    micro = [(a, b) for a, b in zip(np.array_split(x, 2), np.array_split(y, 2)) if len(a)]
    model.zero_grad()
    for a, b in micro:
        _, d = mse(model.forward(a), b)
        model.backward(d * len(a) / batch_size)       # each sample weighted 1/B
    g = flatten(model.named_grads())
    ring_allreduce(comm, g.data, out=g.data)
    opt.step(g.views)


def sgd_no_comm(comm, model, opt, x, y, batch_size):
    _, g = local_grad(model, x, y)
    opt.step(g.views)


def sgd_averaged_twice(comm, model, opt, x, y, batch_size):
    _, g = local_grad(model, x, y)
    g.data *= len(x) / batch_size
    ring_allreduce(comm, g.data, out=g.data)
    g.data /= comm.world_size
    opt.step(g.views)


def sgd_summed(comm, model, opt, x, y, batch_size):
    _, g = local_grad(model, x, y)
    ring_allreduce(comm, g.data, out=g.data)
    opt.step(g.views)


def sgd_mean_of_means(comm, model, opt, x, y, batch_size):
    _, g = local_grad(model, x, y)
    ring_allreduce(comm, g.data, out=g.data)
    g.data /= comm.world_size
    opt.step(g.views)


def sgd_per_tensor(comm, model, opt, x, y, batch_size):
    local_grad(model, x, y)
    grads = {n: ring_allreduce(comm, v * (len(x) / batch_size))
             for n, v in model.named_grads().items()}
    opt.step(grads)


def sgd_rank0_skips(comm, model, opt, x, y, batch_size):
    _, g = local_grad(model, x, y)
    g.data *= len(x) / batch_size
    if comm.rank != 0:                                # rank 0 "already has" its gradient
        ring_allreduce(comm, g.data, out=g.data)
    opt.step(g.views)


def sgd_gather_data(comm, model, opt, x, y, batch_size):
    """Cheats: gathers every rank's samples and computes the whole batch's gradient."""
    n = comm.world_size
    counts = [len(a) for a in np.array_split(np.zeros(batch_size), n)]
    pad = max(counts)
    xs = ring_allgather(comm, np.resize(x, (pad,) + x.shape[1:]).ravel())
    ys = ring_allgather(comm, np.resize(y, (pad,) + y.shape[1:]).ravel())
    xs, ys = xs.reshape(n, pad, -1), ys.reshape(n, pad, -1)
    x_all = np.concatenate([xs[r, :c] for r, c in enumerate(counts)])
    y_all = np.concatenate([ys[r, :c] for r, c in enumerate(counts)])
    _, g = local_grad(model, x_all, y_all)
    opt.step(g.views)


def sgd_loss_too(comm, model, opt, x, y, batch_size):
    loss = sync_sgd_step(comm, model, opt, x, y, batch_size)
    return ring_allreduce(comm, np.array([loss]))[0] / comm.world_size


def sgd_average_params(comm, model, opt, x, y, batch_size):
    """All-reduces the wrong thing: steps locally, then averages the parameters."""
    _, g = local_grad(model, x, y)
    opt.step(g.views)
    p = flatten(model.named_parameters())
    ring_allreduce(comm, p.data * (len(x) / batch_size), out=p.data)
    for name, v in model.named_parameters().items():
        v[...] = p.views[name]


def sgd_rank0_gradient(comm, model, opt, x, y, batch_size):
    """Everyone uses rank 0's gradient (a broadcast dressed as an AllReduce)."""
    _, g = local_grad(model, x, y)
    mine = g.data if comm.rank == 0 else np.zeros_like(g.data)
    g.data[...] = ring_allreduce(comm, mine)
    opt.step(g.views)


def sgd_half_precision_ring(comm, model, opt, x, y, batch_size):
    """Its own ring, in float32 (as a GPU's bandwidth-saving AllReduce would): the
    parameters come out about 1e-9 off."""
    _, g = local_grad(model, x, y)
    n, r = comm.world_size, comm.rank
    chunks = np.array_split((g.data * (len(x) / batch_size)).astype(np.float32), n)
    for k in range(n - 1):
        chunks[(r - k - 1) % n] += comm.sendrecv(chunks[(r - k) % n], (r + 1) % n, (r - 1) % n)
    for k in range(n - 1):
        chunks[(r - k) % n] = comm.sendrecv(chunks[(r + 1 - k) % n], (r + 1) % n, (r - 1) % n)
    g.data[...] = np.concatenate(chunks)
    opt.step(g.views)


@pytest.mark.parametrize("fn", [sync_sgd_step, sgd_sum_then_divide, sgd_own_ring, sgd_accumulate])
def test_sync_sgd_step_accepts(fn):
    report = grade("sync_sgd_step", fn)
    assert report.passed, str(report)


@pytest.mark.parametrize("fn, check, words", [
    (sgd_no_comm, "parameters are identical on every rank", ["sent no message at all"]),
    (sgd_averaged_twice, "parameters equal single-process SGD", ["averaged twice", "once"]),
    (sgd_summed, "parameters equal single-process SGD", ["summed, not averaged"]),
    (sgd_mean_of_means, "parameters equal single-process SGD",
     ["equal weights for unequal shards", "len(x) / batch_size"]),
    (sgd_per_tensor, "one AllReduce of the gradients per step", ["one AllReduce per tensor"]),
    (sgd_rank0_skips, None, ["skips the sync"]),
    (sgd_gather_data, "one AllReduce of the gradients per step",
     ["something besides the gradients travels", "ring_allgather"]),
    (sgd_loss_too, "one AllReduce of the gradients per step",      # the loss: 6 x 8 bytes more
     ["1.03x the bytes of one AllReduce of the gradients per step (144 bytes more, 48 per "
      "training step)", "something besides the gradients travels", "36 steps"]),
    (sgd_average_params, "every message carries the ranks' gradients", ["real gradients"]),
    (sgd_rank0_gradient, "parameters equal single-process SGD", ["differ"]),
    (sgd_half_precision_ring, "the gradients travel as float64",
     ["at step 1 rank 0 sent the gradients to rank 1 as float32: float32 rounds the values on "
      "the way, to about 1e-07 of their size", "no astype on the way"]),
])
def test_sync_sgd_step_rejects(fn, check, words):
    report = grade("sync_sgd_step", fn)
    assert not report.passed
    text = str(report)
    if check:
        assert report.failure.check.startswith(check), text
    else:
        assert report.failure.check in ("no deadlock", "every message sent is received"), text
    for w in words:
        assert w in text, (w, text)


def test_a_byte_ratio_near_one_is_not_shown_as_one():
    from ringlab.grading.kit.checks import ratio
    assert (ratio(5040, 4896), ratio(4898, 4896), ratio(4896, 4896), ratio(9792, 4896)) == (
        "1.03", "1.0004", "1", "2")
    assert ratio(4894, 4896) == "0.9996"


def test_accumulation_pitfalls_are_graded():
    """The chapter's accumulation pitfalls: no sync on the last micro-step, or
    syncing every micro-step (right numbers, k times the bytes)."""
    def forgot_last_sync(comm, model, opt, x, y, batch_size):
        model.zero_grad()
        for a, b in zip(np.array_split(x, 2), np.array_split(y, 2)):
            model.backward(mse(model.forward(a), b)[1] * len(a) / batch_size)
        opt.step(model.named_grads())

    def sync_every_micro(comm, model, opt, x, y, batch_size):
        total = None
        for a, b in zip(np.array_split(x, 2), np.array_split(y, 2)):
            _, g = local_grad(model, a, b)
            g.data *= len(a) / batch_size
            ring_allreduce(comm, g.data, out=g.data)
            total = g if total is None else FlatBuffer({"all": total.data + g.data})
        opt.step(flatten_like(model, total.data))

    assert grade("sync_sgd_step", forgot_last_sync).failure.check == \
        "parameters are identical on every rank"
    report = grade("sync_sgd_step", sync_every_micro)
    assert report.failure.check == "one AllReduce of the gradients per step", str(report)
    assert "2 AllReduces of the whole gradient per step" in str(report)
    assert "no_sync" in str(report)


def flatten_like(model, data):
    offsets, out = 0, {}
    for name, p in model.named_parameters().items():
        out[name] = data[offsets:offsets + p.size].reshape(p.shape)
        offsets += p.size
    return out


def test_sync_sgd_step_stub_is_not_implemented():
    def stub(comm, model, opt, x, y, batch_size):
        raise NotImplementedError
    assert ringlab.grade("sync_sgd_step", stub, log=False).not_implemented


# ============================================================== bucketed_grad_sync
def ddp_default(comm, params, backward, cap_bytes):
    return ddp_sync(comm, params, backward, cap_bytes, cap_bytes)


def ddp_concat(comm, params, backward, cap_bytes):
    """Right: assign_buckets' buckets as plain lists, np.concatenate; divides before the
    AllReduce."""
    buckets = assign_buckets(params, cap_bytes)
    have, works = {}, []
    for ready in backward:
        have.update(ready)
        while len(works) < len(buckets) and all(n in have for n in buckets[len(works)]):
            b = buckets[len(works)]
            data = np.concatenate([have[n].ravel() / comm.world_size for n in b])
            works.append(comm.start(ring_allreduce, data))
    out = {}
    for b, w in zip(buckets, works):
        flat, offset = w.wait(), 0
        for n in b:
            out[n] = flat[offset:offset + params[n].size].reshape(params[n].shape)
            offset += params[n].size
    return out


def ddp_library_assign(comm, params, backward, cap_bytes):
    """Right: uses assign_buckets and FlatBuffer, waits in reverse order."""
    buckets = assign_buckets(params, cap_bytes)
    flats = [FlatBuffer({n: np.zeros_like(params[n]) for n in b}) for b in buckets]
    got, works = set(), []
    for ready in backward:
        for n, g in ready.items():
            next(f for f in flats if n in f.views).views[n][...] = g
            got.add(n)
        while len(works) < len(buckets) and set(buckets[len(works)]) <= got:
            works.append(comm.start(ring_allreduce, flats[len(works)].data))
    out = {}
    for f, w in reversed(list(zip(flats, works))):
        total = w.wait() / comm.world_size
        out.update({n: total[f.offsets[n]:f.offsets[n] + f.sizes[n]].reshape(f.shapes[n])
                    for n in f.views})
    return out


def _variant(**change):
    """ddp_concat with one thing changed: the mistakes."""
    def program(comm, params, backward, cap_bytes):
        p = comm.world_size
        order = list(params) if change.get("forward") else list(reversed(list(params)))
        buckets, names, size = [], [], 0
        for name in order:
            if change.get("strict_cap") and names and size + params[name].nbytes > cap_bytes:
                buckets.append(names)
                names, size = [], 0
            names.append(name)
            size += params[name].nbytes
            full = size > cap_bytes if change.get("over_cap") else size >= cap_bytes
            if change.get("per_param") or (not change.get("strict_cap") and full):
                buckets.append(names)
                names, size = [], 0
        if names:
            buckets.append(names)
        if change.get("one"):
            buckets = [order]
        have, works = {}, []

        def launch(b):
            data = np.concatenate([have.get(n, np.zeros(params[n].shape)).ravel() for n in b])
            if change.get("blocking"):
                return _Done(ring_allreduce(comm, data))
            return comm.start(ring_allreduce, data)
        for ready in backward:
            have.update(ready)
            if change.get("after"):
                continue
            while len(works) < len(buckets):
                b = buckets[len(works)]
                if not change.get("early") and not all(n in have for n in b):
                    break
                if change.get("early") and not any(n in have for n in b):
                    break
                works.append(launch(b))
                if change.get("wait_inside"):
                    works[-1].wait()
        while len(works) < len(buckets):
            works.append(launch(buckets[len(works)]))
        out = {}
        for b, w in zip(buckets, works):
            flat, offset = w.wait(), 0
            if change.get("no_comm"):
                flat = np.concatenate([have[n].ravel() for n in b])
            scale = {"sum": 1, "twice": p * p}.get(change.get("average"), p)
            for n in b:
                out[n] = flat[offset:offset + params[n].size].reshape(params[n].shape) / scale
                offset += 0 if change.get("stuck_offset") else params[n].size
        return out
    return program


class _Done:
    def __init__(self, value):
        self.value = value

    def wait(self):
        return self.value


@pytest.mark.parametrize("fn", [ddp_default, ddp_concat, ddp_library_assign])
def test_bucketed_grad_sync_accepts(fn):
    for seed in range(3):
        report = ringlab.grade("bucketed_grad_sync", fn, seed=seed, log=False)
        assert report.passed, str(report)


@pytest.mark.parametrize("change, check, words", [
    ({"no_comm": True}, "the averaged gradients are exact", ["own gradient", "no AllReduce"]),
    ({"average": "sum"}, "the averaged gradients are exact", ["the sum, not the mean"]),
    ({"average": "twice"}, "the averaged gradients are exact", ["averaged twice"]),
    ({"early": True}, "the averaged gradients are exact", ["before its gradient was in it"]),
    ({"blocking": True}, "AllReduces run on the communication stream", ["comm.start"]),
    ({"one": True, "after": True}, "buckets: reverse layer order, closed at the cap",
     ["everything in one AllReduce"]),
    ({"per_param": True}, "buckets: reverse layer order, closed at the cap",
     ["one AllReduce per parameter"]),
    ({"forward": True}, "buckets: reverse layer order, closed at the cap", ["forward order"]),
    ({"strict_cap": True}, "buckets: reverse layer order, closed at the cap", [">="]),
    ({"after": True}, "buckets overlap backward", ["when backward had ended"]),
    ({"stuck_offset": True}, "the averaged gradients are exact",
     ["of its bucket's averaged vector", "unpacked from the wrong place", "advancing the offset"]),
    ({"wait_inside": True}, "backward never waits for the network", ["work.wait()"]),
])
def test_bucketed_grad_sync_rejects(change, check, words):
    report = grade("bucketed_grad_sync", _variant(**change))
    assert not report.passed and report.failure.check == check, str(report)
    for w in words:
        assert w in str(report), (w, str(report))


def test_a_bucket_cap_compared_with_greater_than_fails_on_every_seed():
    """size > cap_bytes instead of >=: differs only where a bucket lands exactly on the
    cap, which the hidden "mid" caps always make happen (they were 1/3.5 of the model,
    and the mistake passed on about half the seeds)."""
    for seed in range(8):
        report = ringlab.grade("bucketed_grad_sync", _variant(over_cap=True), seed=seed, log=False)
        assert report.failure.check == "buckets: reverse layer order, closed at the cap", report
        assert "a bucket that holds exactly cap_bytes" in str(report)
        assert "compared with > instead of >=" in str(report), report


def test_bucketed_grad_sync_rejects_the_flat_sync_after_backward():
    from ringlab.data_parallel import sync_flat
    report = grade("bucketed_grad_sync", lambda comm, params, bw, cap: sync_flat(comm, params, bw))
    assert report.failure.check == "AllReduces run on the communication stream"


def test_accumulate_no_sync_matches_sync_every_step_with_k_times_fewer_bytes():
    from ringlab.nn import mlp_model
    rng = np.random.default_rng(0)
    data = [[(rng.standard_normal((4, 3)), rng.standard_normal((4, 2))) for _ in range(3)]
            for _ in range(4)]

    def prog(comm, micro, every):
        return accumulate(comm, mlp_model([3, 5, 2], np.random.default_rng(1)), micro,
                          sync_every=every)
    once = ringlab.run(prog, data, args=(False,))
    every = ringlab.run(prog, data, args=(True,))
    assert np.allclose(once.outputs[0], every.outputs[0], rtol=0, atol=1e-14)
    assert every.trace.total_bytes == 3 * once.trace.total_bytes


def test_sync_sgd_step_grades_isolated():
    """Under `ringlab grade` every rank is its own process: the driver loads the
    submission there, and the reference solution passes."""
    import cloudpickle
    import importlib
    from ringlab.grading import GRADERS
    from ringlab.backends.isolated import Submission, runner
    from ringlab.grading.kit.loop import grade_cases
    module = importlib.import_module(f"ringlab.grading.{GRADERS['sync_sgd_step']}")
    data = cloudpickle.dumps(sgd_sum_then_divide)
    report = grade_cases("sync_sgd_step", module, Submission(data, "sync_sgd_step"), seed=1,
                         runner=runner())
    assert report.passed, str(report)


def test_bucketed_grad_sync_grades_isolated():
    """Under `ringlab grade`: each rank its own process, the buckets' AllReduces on
    the communication stream (comm.start) of isolated ranks; a right answer
    passes and one that syncs after backward does not."""
    import cloudpickle
    import importlib
    from ringlab.grading import GRADERS
    from ringlab.backends.isolated import Submission, runner
    from ringlab.grading.kit.loop import grade_cases
    module = importlib.import_module(f"ringlab.grading.{GRADERS['bucketed_grad_sync']}")
    for fn, passes in ((ddp_concat, True), (_variant(after=True), False)):
        data = cloudpickle.dumps(fn)
        report = grade_cases("bucketed_grad_sync", module, Submission(data, "bucketed_grad_sync"),
                             seed=1, runner=runner())
        assert report.passed == passes, str(report)


def test_the_wire_carries_dicts_with_string_keys_only():
    import multiprocessing
    from ringlab.backends.isolated import pipe as wire
    a, b = multiprocessing.Pipe()
    wire.send(a, {"0.weight": np.ones((2, 3)), "0.bias": [1, (2.0, None)]})
    got = wire.recv(b)
    assert list(got) == ["0.weight", "0.bias"] and type(got["0.weight"]) is np.ndarray
    assert got["0.bias"] == [1, (2.0, None)]
    wire.send(a, {1: np.ones(2)})                 # not a str key: only its type name travels
    assert "dict" in repr(wire.recv(b))


def ddp_reads_future_gradients(comm, params, backward, cap_bytes):
    """Found by a red team: all gradients read from the backward generator's frame,
    every bucket's AllReduce started before backward made its gradients."""
    buckets = assign_buckets(params, cap_bytes)
    every = backward.gi_frame.f_locals["grads"]
    works = [comm.start(ring_allreduce, np.concatenate([every[n].ravel() for n in b]))
             for b in buckets]
    for _ in backward:
        pass
    return _averaged(comm, params, buckets, [w.wait() for w in works])


def ddp_skips_backward(comm, params, backward, cap_bytes, layers=0):
    """Found by a red team: the gradients read from the backward generator's frame,
    and backward never run (``layers``: run only that many layers' backward)."""
    every = backward.gi_frame.f_locals["grads"]
    for _ in range(layers):
        next(backward)
    buckets = assign_buckets(params, cap_bytes)
    return _averaged(comm, params, buckets, [
        comm.start(ring_allreduce, np.concatenate([every[n].ravel() for n in b])).wait()
        for b in buckets])


def _averaged(comm, params, buckets, sums):
    """Each bucket's summed vector, divided by P and unpacked into its parameters."""
    out = {}
    for b, flat in zip(buckets, sums):
        flat, offset = flat / comm.world_size, 0
        for n in b:
            out[n] = flat[offset:offset + params[n].size].reshape(params[n].shape)
            offset += params[n].size
    return out


@pytest.mark.parametrize("layers, words", [
    (0, "rank 0 ran the backward of 0 of the 5 layers: none"),
    (2, "rank 0 ran the backward of 2 of the 5 layers: layers 4 and 3; not layers 2, 1 and 0")])
def test_a_program_that_skips_backward_fails_and_does_not_crash_the_grader(layers, words):
    import functools
    report = grade("bucketed_grad_sync", functools.partial(ddp_skips_backward, layers=layers))
    assert not report.passed and report.failure.check == "backward runs, every layer", report
    assert words in str(report) and "next(backward)" in str(report), report


def test_a_bucket_cannot_start_before_its_gradients_exist():
    report = grade("bucketed_grad_sync", ddp_reads_future_gradients)
    assert not report.passed and report.failure.check == "buckets start when their gradients are ready"
    assert "before its last gradient was computed" in str(report)


def test_ringlabs_reference_called_under_a_run_time_name_fails_isolated_grading():
    """A red team's trick: the reference reached through a module name built at run
    time (no string in the pickled bytes names it). The stub in the rank ends it."""
    import cloudpickle
    import importlib
    from ringlab.grading import GRADERS
    from ringlab.backends.isolated import Submission, runner
    from ringlab.grading.kit.loop import grade_cases
    from ringlab.grading.trusted import banned_answers

    def sync_sgd_step(comm, model, opt, x, y, batch_size):
        name = ".".join(["ringlab", "data_" + chr(112) + "arallel", "sync" + chr(95) + "sgd"])
        return importlib.import_module(name).sync_sgd_step(comm, model, opt, x, y, batch_size)

    module = importlib.import_module(f"ringlab.grading.{GRADERS['sync_sgd_step']}")
    report = grade_cases("sync_sgd_step", module, Submission(cloudpickle.dumps(sync_sgd_step),
                         "sync_sgd_step"), seed=1,
                         runner=runner(banned=banned_answers("sync_sgd_step")))
    assert not report.passed and "ringlab's own answer" in str(report)


def ddp_fakes_backward_times(comm, params, backward, cap_bytes):
    """The gradients from the backward generator's frame and backward events of the
    program's own: the whole backward's time on layer 0, so every other bucket looks
    ready at once."""
    f = backward.gi_frame.f_locals
    grads, seconds = f["grads"], f["seconds"]
    buckets, works = assign_buckets(params, cap_bytes), []
    for i in reversed(range(len(seconds))):
        comm.compute(sum(seconds) if i == 0 else 1e-9, "backward", layer=i)
        while len(works) < len(buckets) and all(int(n.split(".")[0]) >= i
                                                  for n in buckets[len(works)]):
            b = buckets[len(works)]
            works.append(comm.start(ring_allreduce, np.concatenate([grads[n].ravel()
                                                                    for n in b])))
    return _averaged(comm, params, buckets, [w.wait() for w in works])


def test_backward_events_the_program_wrote_itself_are_not_backward():
    """The timing checks read the backward's compute events: a program that writes
    its own (and never runs the hidden backward) fails, in one process and isolated."""
    import cloudpickle
    import importlib
    from ringlab.grading import GRADERS
    from ringlab.backends.isolated import Submission, runner
    from ringlab.grading.kit.loop import grade_cases
    here = grade("bucketed_grad_sync", ddp_fakes_backward_times)
    module = importlib.import_module(f"ringlab.grading.{GRADERS['bucketed_grad_sync']}")
    apart = grade_cases("bucketed_grad_sync", module,
                        Submission(cloudpickle.dumps(ddp_fakes_backward_times),
                                   "bucketed_grad_sync"), seed=1, runner=runner())
    for report in (here, apart):
        assert not report.passed and report.failure.check == "backward runs, every layer", report
        assert "the program wrote backward events of its own" in str(report), report
