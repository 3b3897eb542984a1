"""The ``hierarchical_allreduce`` grader: right programs pass, each wrong one fails
the check that names its mistake, with the numbers; its constants are the
closed forms', checked against traces of the reference."""

import types

import cloudpickle
import numpy as np
import pytest

import ringlab
from ringlab import collectives as C
from ringlab.cost.hierarchical import hierarchical_allreduce
from ringlab.cost import AlphaBeta, TwoLevel, two_level_time
from ringlab.grading.cost import hierarchical_allreduce as HA
from ringlab.grading.kit.loop import grade_cases
from ringlab.grading.trusted import banned_answers, reference_in

import programs.hierarchical as H
from programs.reports import assert_fails

ID = "hierarchical_allreduce"


@pytest.mark.parametrize("program", H.RIGHT, ids=[p.__name__ for p in H.RIGHT])
@pytest.mark.parametrize("seed", [0, 7])
def test_right_programs_pass(program, seed):
    report = ringlab.grade(ID, program, seed=seed, log=False)
    assert report.passed, str(report)
    assert report.cases_total == 11 and report.world_sizes == (1, 4, 6, 8, 9)


# (program, check, phrases in the report)
WRONG = [
    (H.flat_ring, "only 1/G of the data per GPU crosses nodes",
     ["2 nodes x 4 GPUs, length=32", "rank 3 (node 0, GPU 3) sent 448 bytes between nodes",
      "7 times", "= 64 bytes per GPU", "one flat ring over all M*G ranks"]),
    (H.full_vector_across, "only 1/G of the data per GPU crosses nodes",
     ["rank 0 (node 0, GPU 0) sent 256 bytes between nodes, 4 times",
      "an AllReduce of all n elements over mesh.group('node')"]),
    (H.no_allgather, "every rank returns its result",
     ["rank 0 returned an array of shape (8,)", "shape (32,)", "AllGather inside the node"]),
    (H.rotated_rails, "between nodes, only GPUs with the same index talk",
     ["rank 0 (node 0, GPU 0) sent 32 bytes to rank 5 (node 1, GPU 1)", "GPU 0 -> GPU 1",
      "rail-optimised"]),
    (H.leader_per_node, "only 1/G of the data per GPU crosses nodes",
     ["rank 0 (node 0, GPU 0) sent 256 bytes between nodes, 4 times",
      "rank 1: 0 sent, 0 received", "Only GPU 0 of each node talks to other nodes",
      "a leader per node"]),
    (H.serialised_rails, "time within 1.05 x the closed form",
     ["the run took 46.01 us", "40.01 us from the first message between nodes",
      "the closed form's part between nodes: 10 us", "at most 1.05 x 16 us", "(2.87 x)",
      "Do not wait for other groups"]),
    (H.recursive_halving_across, "between nodes, a ring: each GPU sends to one neighbour",
     ["4 nodes x 2 GPUs", "rank 0 (node 0, GPU 0) sent to 2 GPUs on other nodes",
      "rank 2 (node 1, GPU 0), rank 4 (node 2, GPU 0)", "ring_allreduce on that group"]),
    (H.averaged, "every rank ends with the sum of all inputs",
     ["rank 0 (node 0, GPU 0) has wrong values at 32 of 32 elements",
      "the sum times 0.125 = 1/8: the average", "without dividing"]),
    (H.recv_first, "no deadlock", ["rank 0: waits in recv(src=4)", "every rank waits to receive"]),
    (H.allreduce_inside, "bytes inside a node: one ReduceScatter, one AllGather",
     ["rank 0 (node 0, GPU 0) sent 576 and received 576 bytes inside its node",
      "= 384 bytes per GPU", "1536 per node", "An AllReduce inside the node"]),
    (H.no_node_sum, "every rank ends with the sum of all inputs",
     ["holds the contributions of ranks 0, 4 only", "Only the GPUs with this rank's index",
      "ReduceScatter inside the node"]),
    (H.no_step_across, "every rank ends with the sum of all inputs",
     ["holds the contributions of ranks 0, 1, 2, 3 only", "the sum never crossed nodes"]),
]


@pytest.mark.parametrize("program, check, phrases", WRONG, ids=[w[0].__name__ for w in WRONG])
def test_wrong_programs_fail_with_the_mistake_named(program, check, phrases):
    assert_fails(ringlab.grade(ID, program, seed=0, log=False), check, phrases,
                 absent=["np.float64(", "hierarchical_allreduce.py"])


def test_flat_ring_fails_on_every_multi_node_mesh_and_passes_where_it_is_the_algorithm():
    """On 1 x G and M x 1 the flat ring is the hierarchical algorithm; elsewhere not."""
    rng = np.random.default_rng(3)
    for case in HA.cases(rng):
        m, g = case.info["nodes"], case.info["gpus"]
        failure = HA.check(H.flat_ring, case)
        if m == 1 or g == 1:
            assert failure is None, (case.label, failure)
        else:
            assert failure.check == "only 1/G of the data per GPU crosses nodes", case.label


def test_the_grader_counts_what_the_reference_sends():
    """Independent counts on the reference's trace: 2(M-1)/M n/G per GPU across
    nodes, 2(G-1)/G n inside, and its simulated time is the closed form's."""
    for m, g, n in [(2, 4, 64), (4, 2, 64), (3, 3, 90), (2, 3, 24)]:
        xs = [np.random.default_rng(r).standard_normal(n) for r in range(m * g)]
        net = HA.network(g)
        res = ringlab.run(_with_mesh(m, g), xs, network=net)
        for r in range(m * g):
            across = sum(e.nbytes for e in res.trace if e.src == r and e.src // g != e.dst // g)
            inside = sum(e.nbytes for e in res.trace if e.src == r and e.src // g == e.dst // g)
            assert across * m * g == 2 * (m - 1) * n * 8
            assert inside * g == 2 * (g - 1) * n * 8
        want = two_level_time("hierarchical_allreduce", m, g, n * 8, HA.INTRA, HA.INTER)
        assert res.time == pytest.approx(want, rel=1e-12)
        flat = ringlab.run(C.ring_allreduce, xs, network=net)
        assert flat.time > HA.SLACK * want        # the flat ring is too slow here as well


def _with_mesh(m, g):
    def program(comm, x):
        return H.reference(comm, x, ringlab.DeviceMesh(comm, (m, g), ("node", "gpu")))
    return program


def test_the_stated_network_is_what_the_notebook_says():
    assert (HA.INTRA.alpha, HA.INTER.alpha) == (1e-6, 5e-6)
    assert HA.INTRA.beta == pytest.approx(1 / 450e9, rel=1e-12)
    assert HA.INTER.beta == pytest.approx(1 / 50e9, rel=1e-12)
    net = HA.network(4)
    assert isinstance(net, TwoLevel) and net.between(3, 4) is HA.INTER
    # The try-it cell's numbers: 16 bytes from every GPU, a flat ring's 112 from the edges.
    M, G, n = 2, 4, 8
    xs = [np.arange(n) + 100.0 * r for r in range(M * G)]
    hier = ringlab.run(_with_mesh(M, G), xs).trace
    flat = ringlab.run(C.ring_allreduce, xs).trace

    def sent(trace):
        return [sum(e.nbytes for e in trace if e.src == r and e.src // G != e.dst // G)
                for r in range(M * G)]
    assert sent(hier) == [16] * 8 and sent(flat) == [0, 0, 0, 112, 0, 0, 0, 112]


def test_trusted_grading_allows_part1_collectives_but_not_the_reference():
    allowed = banned_answers(ID)
    assert reference_in(cloudpickle.dumps(hierarchical_allreduce), allowed)
    assert reference_in(cloudpickle.dumps(C.ring_allreduce), allowed) is None
    # Functions as a notebook defines them (in __main__: pickled by value).
    notebook = {"__name__": "__main__"}
    exec("from ringlab.cost.hierarchical import hierarchical_allreduce\n"
         "from ringlab.collectives import ring_allgather, ring_allreduce, ring_reduce_scatter\n"
         "def cheat(comm, x, mesh):\n    return hierarchical_allreduce(comm, x, mesh)\n"
         "def mine(comm, x, mesh):\n"
         "    part = ring_reduce_scatter(mesh.group('gpu'), x)\n"
         "    return ring_allgather(mesh.group('gpu'), ring_allreduce(mesh.group('node'), part))\n",
         notebook)
    assert "answer to hierarchical_allreduce (ringlab.cost.hierarchical" in reference_in(
        cloudpickle.dumps(notebook["cheat"]), allowed)
    assert reference_in(cloudpickle.dumps(notebook["mine"]), allowed) is None
    banned = banned_answers(ID)
    assert "ringlab.cost.hierarchical:hierarchical_allreduce" in banned
    assert "ringlab.collectives.allreduce:ring_allreduce" not in banned
    # ring_allreduce's learners may still use nothing of ringlab.collectives
    assert {"ringlab.collectives.allreduce:ring_allreduce",
            "ringlab.collectives.allgather:ring_allgather"} <= set(banned_answers("ring_allreduce"))


def test_isolated_runs_pass_part1_and_stop_the_reference():
    from ringlab.backends.isolated import runner
    first = next(HA.cases(np.random.default_rng(0)))
    module = types.SimpleNamespace(cases=lambda rng: [first], check=HA.check)
    run = runner(banned=banned_answers(ID))
    assert grade_cases(ID, module, H.part1_collectives, seed=0, runner=run).passed
    report = grade_cases(ID, module, H.reference, seed=0, runner=run)
    assert not report.passed and "own answer to hierarchical_allreduce" in str(report)


def test_cases_cover_the_promised_meshes_and_lengths():
    cases = list(HA.cases(np.random.default_rng(0)))
    shapes = {(c.info["nodes"], c.info["gpus"]) for c in cases}
    assert {(1, 4), (4, 1), (2, 4), (4, 2), (3, 3), (1, 1)} <= shapes
    assert any(len(c.inputs[0]) % c.info["gpus"] for c in cases)
    assert any(len(c.inputs[0]) % c.world_size and not len(c.inputs[0]) % c.info["gpus"]
               for c in cases)
    assert HA.BIG <= max(len(c.inputs[0]) for c in cases) < HA.BIG + 64
    # Lengths come from the seed (all but the first, the case the reports explain):
    # a program that knows the fixed cases cannot single them out.
    lengths = {s: [len(c.inputs[0]) for c in HA.cases(np.random.default_rng(s))]
               for s in range(4)}
    assert {v[0] for v in lengths.values()} == {32}
    assert len({tuple(v[1:]) for v in lengths.values()}) == 4
    assert all(x.dtype == np.float64 for c in cases for x in c.inputs)
    # Bandwidth sets the time of the big case: its beta terms exceed its alphas.
    big = cases[-1]
    m, g = big.info["nodes"], big.info["gpus"]
    alphas = two_level_time("hierarchical_allreduce", m, g, 0, HA.INTRA, HA.INTER)
    assert HA.closed_form(big) > 2 * alphas
    assert isinstance(HA.INTRA, AlphaBeta)


def test_isolated_ranks_cannot_share_data_through_files(tmp_path):
    """Rank processes are apart so that messages are their only channel: a file
    written by one rank and read by another is refused (a red team summed the
    vector that way, with no messages, and hid junk payloads behind it)."""
    from ringlab.backends.isolated import runner
    first = next(HA.cases(np.random.default_rng(0)))
    module = types.SimpleNamespace(cases=lambda rng: [first], check=HA.check)
    run = runner(banned=banned_answers(ID))
    report = grade_cases(ID, module, H.shared_through_files(str(tmp_path)), seed=0, runner=run)
    text = str(report)
    assert not report.passed and "NotAllowed" in text and "opened a file for writing" in text
    assert "share data only through messages" in text and not list(tmp_path.iterdir())
