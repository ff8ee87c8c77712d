"""Stopping a run at a safe point: Ctrl-C (SIGINT) and SIGTERM (``kill``, a scheduler's
preemption) become a request that the training loop honours between two steps, and are
held back while an epoch's files are written.

Python raises KeyboardInterrupt wherever SIGINT lands; landing inside a finalizer or a
weakref callback it is printed as "Exception ignored" and lost, and SIGTERM by default ends
the process with no clean-up at all. Here the handlers only record the request, and the
loop raises ``StopSignal`` (a KeyboardInterrupt) where it is safe to.
"""

from __future__ import annotations

import contextlib
import signal
import threading

__all__ = ["StopRequest", "StopSignal", "hold_interrupts", "interrupt_between_steps",
           "sigterm_as_interrupt"]


class StopSignal(KeyboardInterrupt):
    """A stop request raised at a safe point; ``signum`` is the signal that asked for it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


def _signals_to_handle() -> tuple:
    """The stop signals this code may take over now. Only the main thread can install
    handlers; SIGINT unless the process ignores it (``nohup``, a script's background job),
    which it must go on doing; SIGTERM only at its default, so a handler someone else
    installed (a scheduler's, the user's) stays in charge."""
    if threading.current_thread() is not threading.main_thread():
        return ()
    taken = []
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        taken.append(signal.SIGINT)
    term = signal.getsignal(signal.SIGTERM)
    if term is signal.SIG_DFL or getattr(term, "_fuseflow_stop", False):  # or one of ours
        taken.append(signal.SIGTERM)
    return tuple(taken)


@contextlib.contextmanager
def _blocked(signals):
    """Hold ``signals`` back at the OS level for the block (where the platform can), so
    that handlers are swapped as one step: a signal arriving in between waits, then goes to
    the handlers in place after."""
    if not signals or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


@contextlib.contextmanager
def _installed(handler, signals):
    """``handler`` for ``signals`` during the block, the previous handlers after; marked as
    fuseflow's, so that an inner block (``hold_interrupts`` in the loop) may take over."""
    handler._fuseflow_stop = True
    with _blocked(signals):
        previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        with _blocked(signals):
            for s, old in previous.items():
                signal.signal(s, old)


def _handling(handler):
    """``handler`` for the stop signals ``_signals_to_handle`` allows, during the block."""
    return _installed(handler, _signals_to_handle())


def sigterm_as_interrupt():
    """For a whole command: SIGTERM raises ``StopSignal`` wherever it lands, as Python's
    default handler does for Ctrl-C, so that clean-up in ``finally`` blocks runs (``fit``
    takes it over while it trains). Left alone if someone else handles SIGTERM."""
    def handler(signum, frame):
        raise StopSignal(signum)

    ours = (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    return _installed(handler, (signal.SIGTERM,) if ours else ())


@contextlib.contextmanager
def hold_interrupts(stop=None):
    """Hold back SIGINT and SIGTERM until the block ends, then raise ``StopSignal`` for the
    first that arrived, or, given the loop's ``stop`` request, record it there (the loop
    then stops at its next check, after what it does at every epoch end). Where a signal
    cannot be handled here (``_signals_to_handle``) it acts as it would anyway (each file
    write is still atomic on its own)."""
    caught = []
    with _handling(lambda signum, frame: caught.append(signum)):
        yield
    if caught and stop is not None:
        stop.signum = stop.signum or caught[0]
    elif caught:
        raise StopSignal(caught[0])


class StopRequest:
    """A stop asked for by a signal (``signum``), acted on at ``check()``."""

    signum = None

    def check(self):
        """Raise ``StopSignal`` here, at a safe point, if a stop was requested."""
        if self.signum is not None:
            raise StopSignal(self.signum)


@contextlib.contextmanager
def interrupt_between_steps():
    """Turn SIGINT and SIGTERM into a request that the loop honours between steps
    (``stop.check()``); a second signal stops at once."""
    stop = StopRequest()

    def handler(signum, frame):
        if stop.signum is not None:
            raise StopSignal(signum)
        stop.signum = signum

    with _handling(handler):
        yield stop
