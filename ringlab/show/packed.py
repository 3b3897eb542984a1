"""Data for a kernel-free page: a JSON value gzipped and base64-encoded into the
HTML, and the JavaScript that unpacks it in the browser.

The static book has no kernel, so a panel that answers without one holds all its
answers in the page. Gzip keeps them small; ``mtime=0`` makes the bytes (and so
the built page) the same on every build.

    >>> data = {"a": [1, 2, 3]}
    >>> unpack(pack(data)) == data
    True
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json


def pack(value):
    """``value`` as compact JSON, gzipped (mtime 0) and base64: a str for the page."""
    raw = json.dumps(value, separators=(",", ":")).encode()
    return base64.b64encode(gzip.compress(raw, 9, mtime=0)).decode()


def unpack(packed):
    """The inverse of ``pack`` (what the page's script does, for tests)."""
    return json.loads(gzip.decompress(base64.b64decode(packed)))


def element_id(prefix, packed):
    """A page-unique id from the data itself: two panels on a page never clash,
    and the same data gives the same id on every build."""
    return f"{prefix}-{hashlib.sha1(packed.encode()).hexdigest()[:10]}"


def unpack_js(packed, then):
    """JavaScript that unpacks ``packed`` (DecompressionStream, in every current
    browser) and calls the function expression ``then`` with the value. Without
    DecompressionStream it does nothing: the page keeps what the HTML shows."""
    return (f"  if (!window.DecompressionStream) return;  // the static default stays\n"
            f"  var bytes = Uint8Array.from(atob('{packed}'),\n"
            f"    function (c) {{ return c.charCodeAt(0); }});\n"
            f"  var stream = new Blob([bytes]).stream()"
            f".pipeThrough(new DecompressionStream('gzip'));\n"
            f"  new Response(stream).json().then({then});\n")
