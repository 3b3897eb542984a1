"""How values cross the pipe between a rank's process and the grading process.

A grader must never unpickle what a learner's program made: unpickling runs
code. So values travel as a small JSON header plus raw array bytes, and only
these kinds exist on the wire:

* ``None``, ``bool``, ``int``, ``float``, ``str`` (JSON's own);
* lists and tuples of values; dicts with ``str`` keys (a case's named gradients);
* numpy arrays of a plain numeric dtype, sent as bytes + dtype + shape and
  rebuilt with ``numpy.frombuffer`` (an exact ``ndarray``; a subclass's name
  travels with it, and it comes back as an empty subclass of that name);
* a *handle*: the number of an object that lives on the other side
  (a ``Comm``, a ``Request``), so a rank can name it in later calls.

Anything else is sent as an ``Opaque`` stand-in that carries only its type's
name, so ``comm.send({"a": 1}, 1)`` still fails with "got dict".
"""

from __future__ import annotations

import json
import math

import numpy as np

# Plain numbers only: no object arrays (they hold Python objects) and no
# structured dtypes. Either byte order: a program's ">f8" array arrives as
# ">f8", as it does in one process.
DTYPES = frozenset(np.dtype(t).newbyteorder(order).str for t in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128") for order in "<>")
MAX_DEPTH = 8                  # lists in lists: enough for any exercise, bounded for safety
MAX_BYTES = 256 * 2**20        # one message on the pipe: a value, its arrays included


class WireError(Exception):
    """Bytes that do not decode to an allowed value."""


class Handle:
    """An object on the other side of the pipe, known by its number."""

    __slots__ = ("id", "info")

    def __init__(self, id, info=None):
        self.id, self.info = id, info


def opaque(type_name):
    """A stand-in for a value that cannot travel: an instance of an empty class
    with the original type's name (so error messages name the right type)."""
    name = type_name if type_name.isidentifier() and len(type_name) <= 60 else "object"
    return type(name, (Opaque,), {})()


class Opaque:
    def __repr__(self):
        return f"<a {type(self).__name__}>"


def send(conn, value):
    """Write ``value`` to ``conn`` (a ``multiprocessing`` connection) as one message:
    a line of sizes, a line of JSON, then each array's bytes. One message, not one
    per array: a call is a round trip, and every message costs system calls on
    both sides.

    >>> from multiprocessing import Pipe
    >>> a, b = Pipe(); send(a, [1, np.zeros(2)]); recv(b)
    [1, array([0., 0.])]
    """
    arrays = []
    header = json.dumps(_encode(value, arrays, 0)).encode()
    sizes = json.dumps({"n": len(arrays), "b": [a.nbytes for a in arrays]}).encode()
    conn.send_bytes(b"".join([sizes, b"\n", header, b"\n",
                              *(memoryview(a).cast("B") for a in arrays if a.size)]))


def recv(conn):
    """Read one value written by ``send``. Never unpickles anything."""
    raw = conn.recv_bytes(MAX_BYTES)
    try:
        end_sizes = raw.index(b"\n")
        end_tree = raw.index(b"\n", end_sizes + 1)
        sizes = json.loads(raw[:end_sizes])
        count, lengths = int(sizes["n"]), [int(b) for b in sizes["b"]]
        tree = json.loads(raw[end_sizes + 1:end_tree])
    except (ValueError, KeyError, TypeError) as e:
        raise WireError(f"bad header: {e}") from None
    if not 0 <= count <= 100_000 or len(lengths) != count or min(lengths, default=0) < 0:
        raise WireError("too many arrays")
    start, data = end_tree + 1, memoryview(raw)          # slices of it, not copies
    if start + sum(lengths) != len(raw):
        raise WireError("array bytes do not match the header")
    buffers = []
    for length in lengths:
        buffers.append(data[start:start + length])
        start += length
    return _decode(tree, buffers, 0)


_SCALARS = (bool, int, float, str)    # JSON's own values, as json.loads makes them


def _encode(v, arrays, depth):
    if depth > MAX_DEPTH:
        return {"o": "object"}
    if v is None or type(v) in _SCALARS:
        return v
    if isinstance(v, (np.bool_, np.integer, np.floating)):
        return v.item()            # a numpy scalar travels as the Python number
    if isinstance(v, np.ndarray) and v.dtype.str in DTYPES:
        arrays.append(np.ascontiguousarray(v).view(np.ndarray))
        out = {"a": len(arrays) - 1, "d": v.dtype.str, "s": list(v.shape)}
        if type(v) is not np.ndarray:      # a subclass: its name travels, not its code
            out["c"] = type(v).__name__
        return out
    if type(v) in (list, tuple):
        deep = depth >= MAX_DEPTH             # then every item, a scalar too, is too deep
        return {"l" if type(v) is list else "t": [
            x if not deep and (x is None or type(x) in _SCALARS) else _encode(x, arrays, depth + 1)
            for x in v]}
    if type(v) is dict and all(type(k) is str for k in v):
        return {"m": [[k, _encode(x, arrays, depth + 1)] for k, x in v.items()]}
    if isinstance(v, Handle):
        return {"h": v.id, "i": v.info}
    return {"o": type(v).__name__}


def _decode(t, buffers, depth):
    if depth > MAX_DEPTH:
        raise WireError("nested too deep")
    if t is None or type(t) in _SCALARS:
        return t
    if type(t) is not dict:
        raise WireError("unknown value")
    if "a" in t:
        return _array(t, buffers)
    if "l" in t or "t" in t:
        listed = t.get("l") or t.get("t") or []
        if listed and depth >= MAX_DEPTH:      # its items would be nested too deep
            raise WireError("nested too deep")
        # Scalars, most of a call's arguments, without a call each (a round trip
        # decodes about 20 values on each side).
        items = [x if x is None or type(x) in _SCALARS else _decode(x, buffers, depth + 1)
                 for x in listed]
        return items if "l" in t else tuple(items)
    if "m" in t:
        pairs = t["m"] if isinstance(t["m"], list) else []
        if not all(isinstance(kv, list) and len(kv) == 2 and isinstance(kv[0], str) for kv in pairs):
            raise WireError("bad dict")
        return {k: _decode(x, buffers, depth + 1) for k, x in pairs}
    if "h" in t:
        return Handle(int(t["h"]), t.get("i"))
    if "o" in t:
        return opaque(str(t["o"]))
    raise WireError("unknown value")


def _array(t, buffers):
    try:
        dtype, shape, buf = t["d"], tuple(int(d) for d in t["s"]), buffers[t["a"]]
    except (KeyError, TypeError, ValueError, IndexError):
        raise WireError("bad array header") from None
    if dtype not in DTYPES or any(d < 0 for d in shape):
        raise WireError(f"array dtype {dtype!r} is not allowed")
    dtype = np.dtype(dtype)
    if math.prod(shape) * dtype.itemsize != len(buf):
        raise WireError("array bytes do not match its shape")
    # .copy(): frombuffer over bytes is read-only; the program may write to what it received.
    array = np.frombuffer(buf, dtype=dtype).reshape(shape).copy()
    if "c" in t:
        # A subclass of the program's: an empty one of the same name, so that the
        # grader's checks say "returned a MaskedArray" as in one process. No code
        # of the program's runs here.
        name = str(t["c"]) if str(t["c"]).isidentifier() and len(str(t["c"])) <= 60 else "subclass"
        array = array.view(type(name, (np.ndarray,), {}))
    return array
