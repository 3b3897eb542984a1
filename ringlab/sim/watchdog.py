"""The watchdog: a program that never finishes is stopped, with a diagnosis.

All ranks run in one OS thread, so a rank stuck in an endless loop never
gives control back. A watchdog thread interrupts it after the time limit by
raising ``Interrupt`` in the running code.
"""

import ctypes
import signal
import threading
import traceback


class Interrupt(BaseException):
    """Thrown into the running code by the watchdog. A BaseException, so that a
    learner's ``except Exception`` cannot swallow it."""


def program_traceback(exc):
    """The traceback of ``exc`` without ringlab's scheduler frames."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _ours(f.filename)]
    text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
    if isinstance(exc, Interrupt):
        return text + "(stopped here by the time limit)"
    return text + "".join(traceback.format_exception_only(type(exc), exc))


_WAKE = getattr(signal, "SIGUSR2", None)    # None on Windows


def _woken(signum, frame):
    """Does nothing: running it is what lets the pending interrupt be raised."""


class Watchdog:
    """Interrupts the thread running the world after ``seconds``.

    The interrupt is an asynchronous exception, which Python raises between
    two bytecodes, so a program stuck in one long C call (``time.sleep(60)``,
    waiting on a lock) would only see it when that call returns. On the main
    thread the watchdog also sends a signal: it cuts the call short, Python
    runs the (empty) handler, and the interrupt is raised there. The signal is
    used only if nobody else handles it.
    """

    def __init__(self, seconds):
        self.seconds, self.fired, self.wake = seconds, False, None
        self.thread_id = threading.get_ident()
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        if not self.stop.wait(self.seconds):
            with self.lock:
                if not self.stop.is_set():
                    self.fired = True
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(self.thread_id), ctypes.py_object(Interrupt))
                    if self.wake is not None:
                        signal.pthread_kill(self.thread_id, self.wake)

    def __enter__(self):
        if self.seconds is not None:
            if (_WAKE is not None and threading.current_thread() is threading.main_thread()
                    and signal.getsignal(_WAKE) in (signal.SIG_DFL, _woken)):
                signal.signal(_WAKE, _woken)
                self.wake = _WAKE
            self.thread.start()
        return self

    def __exit__(self, *exc):
        with self.lock:
            self.stop.set()
            if self.fired:   # fired but maybe not yet delivered: withdraw it
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id), None)
        if self.wake is not None and not self.fired:
            # Nothing was sent: put the default back. After a wake-up we keep the
            # empty handler, because a signal still on its way would otherwise
            # meet the default action, which ends the process.
            signal.signal(self.wake, signal.SIG_DFL)
        return False




def _ours(filename):
    path = filename.replace("\\", "/")
    return "/ringlab/sim/" in path or path.endswith("/ringlab/comm.py")
