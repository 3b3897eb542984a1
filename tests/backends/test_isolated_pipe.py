"""The isolated runs' wire (ringlab/backends/isolated/pipe.py): one message per value,
its arrays' bytes included, and nothing but well-formed messages decode."""

import json
import threading
from multiprocessing import Pipe

import numpy as np
import pytest

from ringlab.backends.isolated import pipe


def through(value):
    a, b = Pipe()
    sender = threading.Thread(target=pipe.send, args=(a, value))   # large values fill the pipe
    sender.start()
    got = pipe.recv(b)
    sender.join()
    assert not b.poll(0), "a value is one message: nothing may follow it"
    return got


def test_values_and_their_arrays_come_back_equal_and_writable():
    big = np.random.default_rng(0).random(1_450_000)          # ZeRO-3's measured model
    got = through({"w": big, "parts": [np.arange(6, dtype=np.int32).reshape(2, 3),
                                       (np.zeros(0), np.array(2.5), "a\nb", None, 3)]})
    assert np.array_equal(got["w"], big) and got["w"].flags.writeable
    part, (empty, scalar, text, none, three) = got["parts"]
    assert part.dtype == np.int32 and part.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert empty.shape == (0,) and scalar.shape == () and scalar == 2.5
    assert (text, none, three) == ("a\nb", None, 3)


def test_arrays_of_either_byte_order_arrive_as_they_were_sent():
    """A program's ">f8" array is a ">f8" array in one process: so it is on the pipe."""
    for dtype in (">f8", "<f8", ">i4", ">c16", "|b1"):
        a = np.arange(5).astype(dtype)
        got = through(a)
        assert type(got) is np.ndarray and got.dtype == np.dtype(dtype), dtype
        assert np.array_equal(got, a)


def raw(*frames):
    a, b = Pipe()
    a.send_bytes(b"".join(frames))
    return b


@pytest.mark.parametrize("frames, words", [
    ((b'{"n": 1, "b": [16]}\n{"a": 0, "d": "<f8", "s": [2]}\n', b"\0" * 15), "do not match"),
    ((b'{"n": 1, "b": [8]}\n{"a": 0, "d": "<f8", "s": [2]}\n', b"\0" * 8), "do not match"),
    ((b'{"n": 0, "b": []}\nnull\n', b"bytes no header owns"), "do not match the header"),
    ((b'{"n": 1, "b": [8]}\n{"a": 0, "d": "|O", "s": [1]}\n', b"\0" * 8), "not allowed"),
    ((b'{"n": 2, "b": [0]}\n[]\n',), "too many arrays"),
    ((b'{"n": 0, "b": []}\n',), "bad header"),
    ((b'not json\n[]\n',), "bad header"),
])
def test_malformed_messages_raise_wire_error(frames, words):
    with pytest.raises(pipe.WireError, match=words):
        pipe.recv(raw(*frames))


def nested(depth, leaf):
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def test_a_message_nested_past_the_limit_does_not_decode():
    def tree(depth, leaf):
        for _ in range(depth):
            leaf = {"l": [leaf]}
        return json.dumps(leaf).encode()
    limit = pipe.MAX_DEPTH
    assert through(nested(limit, 7)) == nested(limit, 7)
    assert pipe.recv(raw(b'{"n": 0, "b": []}\n', tree(limit, 7), b"\n")) == nested(limit, 7)
    for leaf in (7, None, "s", {"l": []}):
        with pytest.raises(pipe.WireError, match="nested too deep"):
            pipe.recv(raw(b'{"n": 0, "b": []}\n', tree(limit + 1, leaf), b"\n"))
