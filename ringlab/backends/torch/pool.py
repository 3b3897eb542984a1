"""The worker processes behind ``backend="torch"``, kept between runs.

Starting a process that imports torch takes a couple of seconds, so workers
are kept alive between runs (a grader runs dozens of small worlds); each run
makes a fresh process group among the first ``len(inputs)`` of them (see
``supervisor.py``). Workers are forked by a *zygote* that imported torch once
(see ``worker.py``). The parent never imports torch.

No process outlives its use: a worker that went wrong is killed and reaped
(``Pool.discard``), ``shutdown()`` (also run at exit) stops the rest, and if
the parent dies anyway, the zygote and the workers notice and exit.
"""

from __future__ import annotations

import atexit
import itertools
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection

from . import status as st

START_TIMEOUT = 180.0      # starting a worker means importing torch: slow on a busy machine


class _Zygote:
    """The process that imports torch once and forks workers (see worker.py)."""

    def __init__(self):
        ours, theirs = socket.socketpair()
        self.log = tempfile.TemporaryFile()        # its stderr (and its workers'): shown if it fails
        pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([pkg_parent] + [p for p in [env.get("PYTHONPATH")] if p])
        env.setdefault("OMP_NUM_THREADS", "1")     # many ranks share few cores
        if "GLOO_SOCKET_IFNAME" not in env and os.path.exists("/sys/class/net/lo"):
            env["GLOO_SOCKET_IFNAME"] = "lo"       # local ranks talk over loopback
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ringlab.backends.torch.worker", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        theirs.close()
        self.sock = ours
        self.sock.settimeout(START_TIMEOUT)        # the first answer comes after torch is imported

    def fork(self, fds):
        try:
            socket.send_fds(self.sock, [b"w"], list(fds))
            pid = b""
            while len(pid) < 8:
                more = self.sock.recv(8 - len(pid))
                if not more:
                    raise OSError("the zygote exited")
                pid += more
        except OSError as e:
            self.log.seek(0)
            raise RuntimeError(f"could not start a ringlab worker process ({e}):\n"
                               + self.log.read().decode(errors="replace")[-3000:]) from None
        return int.from_bytes(pid, "little")

    def stop(self):
        self.sock.close()                          # the zygote exits when its socket closes
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class _Worker:
    """One worker process (a child of the zygote), its connection and status block."""

    def __init__(self, zygote):
        ours, theirs = socket.socketpair()
        side_ours, side_theirs = socket.socketpair()   # for asking what it sent so far
        self.status = st.Status.create()
        self.pid = zygote.fork((theirs.fileno(), self.status.fd, side_theirs.fileno()))
        theirs.close()
        side_theirs.close()
        self.conn = Connection(ours.detach())
        self.side = Connection(side_ours.detach())
        self.ready = False

    def send(self, msg):
        self.conn.send_bytes(pickle.dumps(msg))

    def alive(self):
        try:
            os.kill(self.pid, 0)
            return True
        except ProcessLookupError:
            return False

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 5            # the zygote reaps it: wait until it is gone
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        self.conn.close()
        self.side.close()
        os.close(self.status.fd)


class Pool:
    def __init__(self):
        self.workers = []
        self.zygote = None
        self.tmpdir = tempfile.mkdtemp(prefix="ringlab-stores-")
        self.run_ids = itertools.count()

    def take(self, n):
        """The first ``n`` workers, started (in parallel) if needed."""
        self.discard([w for w in self.workers if not w.alive()])   # closes their pipes too
        self._start(n - len(self.workers))
        deadline = time.monotonic() + START_TIMEOUT
        for w in self.workers[:n]:
            while not w.ready:
                if not w.conn.poll(max(0.0, deadline - time.monotonic())):
                    self.discard([w])
                    raise RuntimeError(f"a ringlab worker did not start within {START_TIMEOUT:g} s")
                try:
                    w.ready = pickle.loads(w.conn.recv_bytes())[0] == "ready"
                except EOFError:
                    self.discard([w])
                    raise RuntimeError("a ringlab worker process ended while starting") from None
        return self.workers[:n]

    def _start(self, count):
        if count > 0 and self.zygote is None:
            self.zygote = _Zygote()
        self.workers += [_Worker(self.zygote) for _ in range(count)]

    def discard(self, workers, replace=False):
        """Kill ``workers`` (those still in the pool: a worker is killed only once);
        with ``replace``, start as many new ones right away, so that they import
        torch while the caller looks at the error."""
        workers = [w for w in workers if w in self.workers]
        for w in workers:
            w.kill()
        self.workers = [w for w in self.workers if w not in workers]
        if replace:
            self._start(len(workers))

    def shutdown(self):
        for w in self.workers:
            try:
                w.send(("stop",))
            except OSError:
                pass
        deadline = time.monotonic() + 5
        for w in self.workers:
            while w.alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            w.kill()
        self.workers = []
        if self.zygote is not None:
            self.zygote.stop()
            self.zygote = None
        shutil.rmtree(self.tmpdir, ignore_errors=True)


_pool = None


def get_pool():
    global _pool
    if _pool is None:
        _pool = Pool()
        atexit.register(shutdown)
    return _pool


def shutdown():
    """Stop every worker process (they are also stopped when Python exits)."""
    global _pool
    if _pool is not None:
        _pool.shutdown()
        _pool = None


def dumps_program(obj):
    """Pickle what goes to the workers. cloudpickle sends functions defined in a
    notebook or ``python -c`` (module ``__main__``) by value; without it only
    importable functions can travel."""
    try:
        import cloudpickle
    except ImportError:
        cloudpickle = None
    program = obj[0]
    if cloudpickle is None and getattr(program, "__module__", None) == "__main__":
        raise TypeError(f"{getattr(program, '__name__', program)!r} is defined in __main__ (a notebook or "
                        "`python -c`): to send it to other processes, install cloudpickle "
                        "(pip install 'ringlab[torch]'), or move it to an importable module.")
    try:
        return (cloudpickle or pickle).dumps(obj)
    except Exception as e:  # noqa: BLE001 - say what could not travel
        raise TypeError(f"backend='torch' sends the program and its inputs to other processes, but "
                        f"they cannot be pickled: {type(e).__name__}: {e}") from e
