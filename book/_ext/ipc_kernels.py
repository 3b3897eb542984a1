"""Sphinx extension: the chapters' kernels talk over local (IPC) sockets, not TCP.

Why: ``make test`` builds the book while the unit tests run beside it, and those open
many TCP connections (torch's gloo, their own kernels). A TCP kernel is handed five
ports that were free when its manager looked, and binds them a moment later; a port
taken in between kills the kernel as it starts ("Address already in use") and fails
the build with no cell at fault. This happened in CI. An IPC socket is a file in a
folder of this build's own, so no other process can take it.

myst-nb runs each chapter through jupyter-cache's ``single_nb_execution``, which calls
``nbclient.execute`` with no way to configure the kernel; the wrapper below adds the
configuration that call accepts. Grading does the same (ringlab/grading/trusted.py).

The kernels also get one OpenBLAS thread each (``OPENBLAS_NUM_THREADS=1``, unless set
already), as the tests do (tests/conftest.py). The chapters' matrices are small, and
beside the unit tests OpenBLAS's thread per core fights them for the two cores (a
64 x 512 by 512 x 512 product took 15 to 100 ms instead of 1 on a loaded machine;
ddp_buckets.md took 100 s in CI). Set here, before any kernel starts: each kernel
inherits the build's environment. A product may differ in its last bits from a 2-thread
one; the chapters show the same outputs (rounded numbers, figures, players).
"""
import functools
import os
import tempfile
from pathlib import Path

from jupyter_cache.executors import utils
from traitlets.config import Config


def ipc_config(folder):
    """The nbclient configuration whose kernels bind sockets under ``folder``."""
    config = Config()
    config.KernelManager.transport = "ipc"
    # The sockets are <folder>/kernel-1 ... kernel-5, in a folder of one kernel's own.
    config.KernelManager.ip = str(Path(folder) / "kernel")
    return config


def setup(app):
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")     # read as a kernel's numpy loads
    execute = utils.executenb
    if not getattr(execute, "ringlab_ipc", False):     # Sphinx may call setup twice
        @functools.wraps(execute)
        def executenb(nb, *args, **kwargs):
            with tempfile.TemporaryDirectory(prefix="ringlab-kernel-") as folder:
                kwargs.setdefault("config", ipc_config(folder))
                return execute(nb, *args, **kwargs)
        executenb.ringlab_ipc = True
        utils.executenb = executenb
    return {"parallel_read_safe": True, "parallel_write_safe": True}
