"""A pytest plugin that fingerprints every simulated run, to check that a change
of the simulator keeps traces bit-identical across the test suite:

    TRACECAP=/tmp/old.pkl PYTHONPATH=$PWD:$PWD/tests python -m pytest -p support.tracecap tests/sim ...
    # ... change the simulator, run again into /tmp/new.pkl, then
    python tests/support/tracecap_compare.py /tmp/old.pkl /tmp/new.pkl

Per run (test id, n-th run of that test): hashes of the events in the order
sent and in trace order, spans, computes, memory, unreceived messages, groups,
recorded and handed payloads (bytes, shape, dtype, strides), outputs, and each
actor's final clock and time. Tests that draw examples at random (hypothesis)
run different worlds each time: compare those with tests/sim/test_fast_path.py.
Not collected as tests (no test_ prefix). The simulator is patched only when pytest
loads this file as a plugin (``-p``, ``pytest_configure``): ``--doctest-modules``
imports every file under tests/, and a patch made on import would fingerprint every
run of every test session.
"""
import hashlib, os, pickle, collections
import numpy as np
import pytest
from ringlab.sim import world as W

runs = collections.OrderedDict()
state = {"node": None, "k": 0}

def h(obj):
    try:
        b = pickle.dumps(obj, protocol=4)
    except Exception:
        b = repr(obj).encode()
    return hashlib.sha1(b).hexdigest()

def arr(a):
    a = np.asarray(a)
    return (a.shape, a.dtype.str, a.strides, a.tobytes())

orig_release = W.World.release
def release(self):
    try:
        t = self.trace()
        rec = {
            "events": [tuple(e) for e in self.events],
            "sorted": h([tuple(e) for e in t.events]),
            "spans": h(t.spans), "computes": h(t.computes), "memory": h(t.memory),
            "unreceived": h([tuple(e) for e in t.unreceived]), "groups": h(t.group_ranks),
            "payloads": None if self.payloads is None else h({k: arr(v) for k, v in self.payloads.items()}),
            "handed": None if self.handed is None else h([(tuple(e), arr(a)) for e, a in self.handed]),
            "outputs": h([me.result if not isinstance(me.result, np.ndarray) else arr(me.result) for me in self.actors]),
            "clocks": [(me.rank, me.stream, me.clock, me.time, me.finished) for me in self.all_actors()],
        }
        rec["events"] = h(rec["events"])
    except Exception as e:  # noqa
        rec = {"error": repr(e)}
    runs[(state["node"], state["k"])] = rec
    state["k"] += 1
    return orig_release(self)


def pytest_configure(config):
    W.World.release = release

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    state["node"], state["k"] = item.nodeid, 0
    yield

def pytest_sessionfinish(session):
    with open(os.environ["TRACECAP"], "wb") as f:
        pickle.dump(dict(runs), f)
