"""SIGTERM, SIGHUP and SIGINT end a lab run the way Ctrl-C does: as an exception, so the run's ``finally`` and
``__exit__`` code (``LabCluster.down``: cancel the jobs, stop munged, slurmctld and every slurmd) runs before the
process ends.

A signal's default action ends the process on the spot and leaves every daemon the run started behind. Inside
``signals_end_the_run()`` the first of those signals raises ``Interrupted`` (a ``KeyboardInterrupt``: code and
tools that stop on Ctrl-C, pytest among them, stop on it and run their teardown); later ones are noted and
ignored, so a second Ctrl-C or a supervisor's repeated SIGTERM does not cut the teardown short, and one that
arrives inside ``teardown()`` (the lab going down anyway) waits until it is done. ``run_to_the_end``
wraps a CLI command: on ``Interrupted`` it prints one line and answers ``128 + signo``, the shell's convention.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TextIO

ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """The run was ended by ``signum``; raised once, in the main thread, where the signal arrived."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _Run:
    """The signals of the one run in progress (signal handlers are the process's: one run at a time)."""

    raised: int | None = None  # the signal that raised Interrupted
    pending: int | None = None  # a signal that arrived during a teardown, raised when it is done
    shields = 0  # teardowns under way


@contextlib.contextmanager
def signals_end_the_run(signals: tuple[int, ...] = ENDING_SIGNALS) -> Iterator[None]:
    """Within the block, the first of ``signals`` raises ``Interrupted``; the handlers before it come back after."""
    _Run.raised = _Run.pending = None
    previous = {signum: signal.signal(signum, _end) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def teardown() -> Iterator[None]:
    """A teardown (``LabCluster.down``) that a signal must not cut short: a signal arriving during it raises
    ``Interrupted`` once it is done."""
    _Run.shields += 1
    try:
        yield
    finally:
        _Run.shields -= 1
    if _Run.shields == 0 and _Run.pending is not None and _Run.raised is None:
        _Run.raised, _Run.pending = _Run.pending, None
        raise Interrupted(_Run.raised)


def _end(signum: int, frame: FrameType | None) -> None:
    if _Run.raised is not None:
        return  # the run is ending: let its teardown finish
    if _Run.shields:
        _Run.pending = _Run.pending or signum
        return
    _Run.raised = signum
    raise Interrupted(signum)


def run_to_the_end(what: str, body: Callable[[], int], err: TextIO | None = None) -> int:
    """``body()`` inside ``signals_end_the_run``; ended by a signal: one line naming it, and ``128 + signo``."""
    try:
        with signals_end_the_run():
            return body()
    except Interrupted as exc:
        print(f"slurm-ft: {what} ended by {exc.name}", file=err or sys.stderr, flush=True)
        return exc.exit_code
