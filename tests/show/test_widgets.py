"""ringlab.show.widgets: the live control panel reruns the chosen algorithm and redraws."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

import ringlab.collectives  # noqa: E402
from ringlab.show.widgets import algorithms, example_inputs, explorer  # noqa: E402


def test_algorithms_are_looked_up_at_call_time(monkeypatch):
    assert "ring_allreduce" in algorithms()

    def my_collective(comm, x):
        return x
    monkeypatch.setattr(ringlab.collectives, "my_collective", my_collective, raising=False)
    monkeypatch.setattr(ringlab.collectives, "__all__", [*ringlab.collectives.__all__, "my_collective"])
    assert algorithms()["my_collective"] is my_collective


def test_example_inputs():
    assert [x is None for x in example_inputs("tree_broadcast", 3, 4)] == [False, True, True]
    assert all(x.shape == (4,) for x in example_inputs("ring_reduce_scatter", 3, 4))


def test_panel_reruns_and_redraws():
    panel = explorer("ring_allreduce", world_size=4, length=8)
    assert panel.trace.steps == 6                       # 2(N-1)
    assert "srcdoc=" in panel.frame.value and panel.output.children == (panel.frame,)
    panel.world_size.value = 5
    assert panel.trace.steps == 8 and panel.trace.world_size == 5
    for view in ("holdings", "space-time", "bytes"):
        panel.view.value = view
        assert panel.output.children == (panel.image,)
        assert panel.image.value[:8] == b"\x89PNG\r\n\x1a\n"
    assert "updated in" in panel.status.value


def test_panel_shows_errors():
    def broken(comm, x):
        raise RuntimeError("boom")
    panel = explorer("ring_allreduce", world_size=2, length=2)
    panel.algorithms["broken"] = broken
    panel.algorithm.options = list(panel.algorithms)
    panel.algorithm.value = "broken"
    assert panel.trace is None and "boom" in panel.frame.value
    with pytest.raises(ValueError, match="unknown algorithm"):
        explorer("nope")
