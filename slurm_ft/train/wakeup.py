"""The signals the launcher sends a rank, served by a thread of ours that holds the GIL while it works.

A rank blocked in a collective never runs a Python signal handler (its main thread waits in C++), and a C-level
handler that walks Python's frames (``faulthandler`` with ``all_threads``) reads other threads' frames without the
GIL: while one of them runs Python (a checkpoint thread, a data loader's thread) the walk reads freed frames and the
rank dies of SIGSEGV, taking the evidence of a hang with it (seen in CI; ``tests/unit/train/test_wakeup.py``
reproduces it in a second). So every such signal here has only a stub for its Python-level handler; Python's C-level
handler writes the signal's number to the process's wakeup fd (``signal.set_wakeup_fd``), and one daemon thread per
process, reading that fd, calls the callbacks registered for the number, under the GIL like any Python code.

A process has one wakeup fd: where another is in place (an asyncio loop in the main thread) it keeps it, ``serve``
returns None, and the rank announces no signal for that request (the launcher then tries ``py-spy``). ``serve``
needs the main thread, as ``signal.signal`` does. A rank that holds the GIL in native code for good answers nothing
here either: py-spy reads it from outside.

Once the interpreter starts to exit, the served signals are ignored (``ignore_at_exit``): finalization resets
Python-level handlers to the default, and the default of a real-time signal ends the process.
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import signal
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class WakeupServer:
    """The process's wakeup fd and the thread that dispatches what arrives on it."""

    def __init__(self) -> None:
        self._read = -1
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._lock = threading.Lock()

    def serve(self, signum: int, callback: Callable[[], None]) -> int | None:
        """Call ``callback`` from the server's thread whenever ``signum`` arrives; ``signum``, or None where this
        process cannot (not the main thread, another wakeup fd in place)."""
        try:
            if self._read < 0:
                self._start()
            signal.signal(signum, _stub)
        except ValueError as exc:
            log.info("slurm-ft: signal %d is not served here (%s)", signum, exc)
            return None
        with self._lock:
            self._callbacks[int(signum) & 0xFF] = callback
        atexit.register(ignore_at_exit, signum)
        return int(signum)

    def _start(self) -> None:
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        try:
            previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError:
            os.close(read)
            os.close(write)
            raise
        if previous != -1:
            signal.set_wakeup_fd(previous)  # someone else's (asyncio): theirs stays
            os.close(read)
            os.close(write)
            raise ValueError("a wakeup fd is in use")
        self._read = read
        threading.Thread(target=self._loop, name="slurm-ft-signals", daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                select.select([self._read], [], [])
                got = os.read(self._read, 512)
            except BlockingIOError:
                continue
            except OSError:
                return  # closed
            for number in dict.fromkeys(got):  # each signal once per wakeup, in arrival order
                with self._lock:
                    callback = self._callbacks.get(number)
                if callback is not None:
                    _call(callback)


def _call(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception as exc:  # noqa: BLE001 - one failed answer must not end the thread that answers the next
        log.warning("slurm-ft: answering a signal failed: %s", exc)


def ignore_at_exit(signum: int) -> None:
    """From here to the end of the process ``signum`` does nothing (see the module docstring)."""
    try:
        signal.signal(signum, signal.SIG_IGN)
    except (ValueError, OSError):
        return


def _stub(signum: int, frame: object) -> None:
    """The Python-level handler: the work happens in the server's thread (the wakeup fd woke it)."""


_server = WakeupServer()


def serve(signum: int, callback: Callable[[], None]) -> int | None:
    """``WakeupServer.serve`` on the process's one server."""
    return _server.serve(signum, callback)
