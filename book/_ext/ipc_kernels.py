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
"""
import functools
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
