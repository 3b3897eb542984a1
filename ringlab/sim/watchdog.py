"""The watchdog: a program that never finishes is stopped, with a diagnosis.

All ranks run in one OS thread, so a rank stuck in an endless loop never
gives control back. A watchdog thread interrupts it after the time limit by
raising ``Interrupt`` in the running code.
"""

import contextlib
import ctypes
import os
import signal
import sys
import threading
import traceback

from ..comm import Comm
from ..errors import said
from .budget import Budget


class Interrupt(BaseException):
    """Thrown into the running code by the watchdog. A BaseException, so that a
    learner's ``except Exception`` cannot swallow it."""


def program_traceback(exc):
    """The traceback of ``exc`` without ringlab's scheduler frames."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _ours(f.filename)]
    text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
    if isinstance(exc, Interrupt):
        return text + "(stopped here by the time limit)"
    return text + f"{type(exc).__name__}: {said(exc)}\n"


_WAKE = getattr(signal, "SIGUSR2", None)    # None on Windows


# While a program keeps catching the interrupt: the run's ``give_up(frame)``
# (see ``World.give_up``), which the wake-up signal's handler calls.
_give_up = None


def _woken(signum, frame):
    """Running it is what lets the pending interrupt be raised. If the program
    keeps catching interrupts, the run gives up on the code running here (the
    signal lands wherever it is, in an ``except:`` handler too): a greenlet
    switch away from it, which no ``except`` can catch."""
    give_up = _give_up
    if give_up is not None:
        give_up(frame)


class Watchdog:
    """Interrupts the thread running the world after ``seconds`` of CPU time
    (at most four times as many of wall time: see ``budget.py``).

    The interrupt is an asynchronous exception, which Python raises between
    two bytecodes, so a program stuck in one long C call (``time.sleep(60)``,
    waiting on a lock) would only see it when that call returns. On the main
    thread the watchdog also sends a signal: it cuts the call short, Python
    runs the (empty) handler, and the interrupt is raised there. The signal is
    used only if nobody else handles it.

    A program can catch the interrupt (a bare ``except:`` in a retry loop), so
    the watchdog fires again every ``REPEAT`` seconds: usually one lands outside
    the ``try``, where nothing catches it. Not always: in ``while True: try:
    while True: pass / except: pass`` every one lands in the inner loop, inside
    the ``try``. So after ``STUBBORN`` interrupts, the signal's handler calls
    ``give_up`` instead, in the running code, which leaves that code for good.
    (Tracing each line to raise there does not work: Python removes a trace
    function as soon as it raises, so only one interrupt per signal, which the
    same ``try`` catches.) Off the main thread there is no signal, and only the
    repeated interrupts.
    """

    REPEAT = 0.05
    STUBBORN = 20            # after this many interrupts (1 s), give up on the running code

    def __init__(self, seconds, give_up=None):
        self.seconds, self.fired, self.wake, self.give_up = seconds, False, None, give_up
        self.thread_id = threading.get_ident()
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        global _give_up
        budget = Budget(self.seconds)   # CPU seconds, not wall seconds: see budget.py
        while not budget.over():
            if self.stop.wait(min(1.0, max(budget.left(), 0.001))):
                return
        wait, fires = 0.0, -1
        while not self.stop.wait(wait):
            wait, fires = self.REPEAT, fires + 1
            with self.lock:
                if self.stop.is_set():
                    return
                self.fired = True
                if fires >= self.STUBBORN and self.wake is not None and self.give_up:
                    # No pending interrupt now: it would stop the handler before
                    # it gives up (and the program would catch it).
                    _give_up = self.give_up
                    signal.pthread_kill(self.thread_id, self.wake)
                    continue
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self.thread_id), ctypes.py_object(Interrupt))
                # The signal cuts a blocking call short, but it also makes the
                # interrupt land right there, inside the program's try: so only
                # now and then; in between, the interrupt lands at the next
                # bytecode boundary, often outside the try.
                if self.wake is not None and fires % 10 == 0:
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
        global _give_up
        with self.lock:
            self.stop.set()
            _give_up = None      # a signal still on its way finds nothing to do
            if self.fired:   # fired but maybe not yet delivered: withdraw it
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id), None)
        if self.wake is not None and not self.fired:
            # Nothing was sent: put the default back. After a wake-up we keep the
            # empty handler, because a signal still on its way would otherwise
            # meet the default action, which ends the process.
            signal.signal(self.wake, signal.SIG_DFL)
        return False




class ExitCalled(Exception):
    """A rank called ``os._exit``: in a simulated world that would end the whole
    process (a notebook's kernel, the grader), so it is an error of that rank."""


@contextlib.contextmanager
def no_exit():
    """While ranks run, the process stays ringlab's: ``os._exit`` raises
    ``ExitCalled`` instead of ending it, and a program may not ignore, block
    or take over the watchdog's wake-up signal (it would make a rank stuck in
    a blocking call impossible to stop)."""
    real_exit, real_signal, real_mask = os._exit, signal.signal, signal.pthread_sigmask

    def refuse(status=0):
        raise ExitCalled(f"os._exit({status}) was called: a rank cannot end the process; "
                         f"return from the program instead")

    def guarded_signal(signum, handler):
        if signum == _WAKE:
            raise RuntimeError(f"signal {signal.Signals(signum).name} is ringlab's: its watchdog "
                               f"uses it to stop a rank stuck in a blocking call")
        return real_signal(signum, handler)

    def guarded_mask(how, mask):
        if _WAKE is not None and how != signal.SIG_UNBLOCK and _WAKE in set(mask):
            raise RuntimeError(f"signal {signal.Signals(_WAKE).name} is ringlab's: its watchdog "
                               f"uses it to stop a rank stuck in a blocking call")
        return real_mask(how, mask)

    os._exit, signal.signal, signal.pthread_sigmask = refuse, guarded_signal, guarded_mask
    try:
        yield
    finally:
        os._exit, signal.signal, signal.pthread_sigmask = real_exit, real_signal, real_mask


# The simulator's folder and Comm's file: their frames are ringlab's, not the program's.
_OURS = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
         os.path.abspath(sys.modules[Comm.__module__].__file__))


def _ours(filename):
    return os.path.abspath(filename).startswith(_OURS)
