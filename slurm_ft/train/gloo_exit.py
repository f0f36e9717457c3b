"""Let gloo's worker threads finish before the interpreter finalizes, so a finished run does not abort at exit.

ProcessGroupGloo runs each collective on a worker thread, which keeps the work until the collective is done and
then frees it; a work holds tensors, and freeing a tensor's Python object takes the GIL. When a script ends
right after its last collective, that worker can still be waiting for the GIL when the interpreter starts to
finalize. A thread that asks for the GIL then exits, the exit unwinds through the work's destructor, and the
process aborts ("terminate called without an active exception", SIGABRT, exit 134) after everything was saved:
the launcher sees a failed rank and restarts a finished job. Seen in 7 of 66 two-rank runs of the example
trainer here (torch 2.13; the core dump shows ``AsyncAllgatherCoalescedWork``'s destructor in
``ProcessGroupGloo::runLoop``; pytorch/pytorch#179291 describes the same crash).

``install()`` (the checkpoint manager calls it in a distributed run) registers an exit hook that releases the
GIL for ``DRAIN_S``: atexit hooks run before finalization starts, so a waiting worker takes the GIL and
finishes. Once per process; it costs each rank ``DRAIN_S`` at exit.
"""

from __future__ import annotations

import atexit
import time

DRAIN_S = 0.1
_installed: list[bool] = []


def drain() -> None:
    """Release the GIL for ``DRAIN_S`` (a sleep does), so threads waiting for it run."""
    time.sleep(DRAIN_S)


def install(register=atexit.register) -> bool:
    """Register :func:`drain` to run at exit, once per process; True when this call registered it."""
    if _installed:
        return False
    register(drain)
    _installed.append(True)
    return True
