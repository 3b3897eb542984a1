"""The worker processes of the local pool.

``python -m ringlab.backends.torch.worker SOCKET_FD`` starts the *zygote*: it imports
torch once (about 2 s) and then forks a worker whenever the parent asks (a few
milliseconds), so a pool of 8 ranks, or a replacement for a killed rank, costs
one import, not one per process.

A worker serves runs until told to stop: for each run it joins a fresh
process group (a new FileStore file, so no TCP port is needed and a busy port
can't get in the way), runs its rank of the program, reports the outcome,
and leaves the group. The parent kills it when a run goes wrong (a rank
blocked in ``dist.recv`` cannot be interrupted any other way).

The zygote is started with ``subprocess``, not ``multiprocessing``, so it never
re-imports the parent's ``__main__`` (a notebook, a ``python -c``, or a script
without an ``if __name__ == "__main__"`` guard).
"""

import contextlib
import datetime
import importlib
import io
import os
import pickle
import signal
import socket
import sys
import threading
import time
from multiprocessing.connection import Connection


def _watch_parent(ppid):
    # If the parent dies (even by SIGKILL) nobody would stop us: exit too.
    # A thread, because the main thread may be blocked inside gloo.
    while True:
        time.sleep(0.3)
        if os.getppid() != ppid:
            os._exit(1)


@contextlib.contextmanager
def _capture():
    out, saved = io.StringIO(), (sys.stdout, sys.stderr)
    sys.stdout = sys.stderr = out
    try:
        yield out
    finally:
        sys.stdout, sys.stderr = saved


def dumps(obj):
    try:
        import cloudpickle
        return cloudpickle.dumps(obj)
    except ImportError:
        return pickle.dumps(obj)


def _answer_inspections(conn):
    # When a run goes wrong the parent asks every rank for the messages it has
    # sent and received so far (a rank blocked in gloo can't answer itself).
    from . import world as protocol
    while True:
        try:
            conn.recv_bytes()
        except (EOFError, OSError):
            return
        world = protocol.current_world
        conn.send_bytes(dumps(world.report() if world is not None else None))


def _device(backend, rank, world_size):
    """None for gloo (CPU); for NCCL, this rank's GPU (one GPU per rank)."""
    if backend != "nccl":
        return None
    import torch
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < world_size:
        raise RuntimeError(f"backend='nccl' needs one CUDA GPU per rank: {world_size} ranks, "
                           f"{gpus} GPU(s) here. Use backend='torch' (gloo, CPU) instead.")
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    return device


def main(conn_fd, status_fd, side_fd):
    ppid = os.getppid()
    threading.Thread(target=_watch_parent, args=(ppid,), daemon=True).start()
    threading.Thread(target=_answer_inspections, args=(Connection(side_fd),), daemon=True).start()
    conn = Connection(conn_fd)
    import torch.distributed as dist       # already imported by the zygote
    from . import status as st
    from .outcome import Outcome
    from . import world as protocol
    from .world import error_report, run_rank, stack_report
    status = st.Status.attach(status_fd)

    # On SIGUSR1 (sent by the parent at a timeout) write where the program is.
    signal.signal(signal.SIGUSR1, lambda sig, frame: status.write_text(stack_report(frame)))
    conn.send_bytes(pickle.dumps(("ready", os.getpid())))
    while True:
        try:
            msg = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        if msg[0] == "stop":
            return
        _, run_id, rank, world_size, backend, store_path, sys_path, blob, timeout = msg
        status.reset()
        protocol.current_world = None
        for p in reversed(sys_path):       # find the modules the parent can import
            if p not in sys.path:
                sys.path.insert(0, p)
        try:
            program, x, args, kwargs, record_payloads = pickle.loads(blob)
        except BaseException as e:  # noqa: BLE001 - e.g. the program's module is not importable here
            conn.send_bytes(dumps(("outcome", Outcome(rank, **error_report(e)))))
            continue
        try:
            device = _device(backend, rank, world_size)
            store = dist.FileStore(store_path, world_size)
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                    timeout=datetime.timedelta(seconds=max(60.0, 2 * (timeout or 0))))
        except Exception as e:  # noqa: BLE001 - e.g. no GPU for NCCL: say so, as this rank's error
            conn.send_bytes(dumps(("outcome", Outcome(rank, **error_report(e)))))
            continue
        conn.send_bytes(pickle.dumps(("started", rank)))
        with _capture() as printed:        # what the program prints goes back with the outcome
            world, outcome = run_rank(program, x, args, kwargs, rank, world_size, device, status,
                                      record_payloads)
        outcome.printed = printed.getvalue()
        try:
            data = dumps(("outcome", outcome))
        except BaseException as e:  # noqa: BLE001 - the result (or the exception) cannot be pickled
            err = TypeError(f"rank {rank}: the program's {'exception' if outcome.error else 'return value'} "
                            f"cannot be sent back to the parent process: {e}")
            data = dumps(("outcome", Outcome(rank, step=outcome.step, **error_report(err))))
        conn.send_bytes(data)
        if outcome.error is not None:
            continue                       # the parent kills us: peers may still wait on us
        msg = pickle.loads(conn.recv_bytes())   # ("finish", drain) once all ranks are done
        world.finish(msg[1])
        dist.barrier()                     # nobody leaves while a peer still talks to it
        dist.destroy_process_group()
        del store
        status.set(st.IDLE, -1, 0, 0)
        conn.send_bytes(pickle.dumps(("idle", rank)))


def zygote(sock_fd):
    """Import torch, then fork one worker per request ``(conn_fd, status_fd, side_fd)``."""
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    # The slow imports, done once here and shared by every worker forked from here.
    for name in ("torch.distributed", "ringlab.backends.torch.world", "cloudpickle"):
        try:
            importlib.import_module(name)
        except ImportError:
            if name != "cloudpickle":
                raise
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)     # the kernel reaps our children: no zombies
    sock = socket.socket(fileno=sock_fd)
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 16, 3)
        except OSError:
            msg = b""
        if not msg:                                   # the parent closed the socket (or died)
            os._exit(0)
        pid = os.fork()
        if pid == 0:
            sock.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                main(*fds)
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        sock.sendall(pid.to_bytes(8, "little"))


if __name__ == "__main__":
    zygote(int(sys.argv[1]))
