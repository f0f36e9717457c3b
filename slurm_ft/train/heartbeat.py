"""Per-rank heartbeat files (format in slurm_ft.core.rundir): progress from the training loop, liveness from a
thread.

``beat(step)`` after each step records progress (``step``, ``time``; the file is rewritten at most every
``interval_s``). A daemon thread rewrites the same record with a fresh ``alive`` every ``liveness_s``, whatever the
loop does: a rank waiting in a collective for a stuck peer keeps beating, the stuck rank (stopped, in
uninterruptible sleep, holding the GIL in native code) does not. The launcher tells them apart that way.

``stacks`` (default on): the rank's Python stacks, every thread, go to ``stack.rank<R>.txt`` in the run dir on
``records.STACK_SIGNAL`` (``slurm_ft.train.stacks``, answered from a thread under the GIL, ``slurm_ft.train.wakeup``),
for the launcher to collect before it kills a hung attempt; ``faulthandler`` is enabled for fatal signals (SIGSEGV
...: the stack lands in the rank's stderr tail), never registered on the stack signal: from a signal handler it
walks threads that may be running Python, and crashes the rank it should describe.

``close()`` (also run at interpreter exit) writes a last record with ``done``: the rank has no more steps to make.
A process's exit can take long after its last step (freeing the interpreter, a communicator's teardown, a loaded
node), and the launcher must not call a finished rank hung for that (it gives it ``LaunchConfig.exit_grace_s``).
``traces`` (default on): with torch's flight recorder on (``slurm-ft launch`` sets ``TORCH_FR_BUFFER_SIZE``), the
rank dumps it to ``trace.rank<R>.json`` on ``records.TRACE_SIGNAL`` (``slurm_ft.train.traces``), and the heartbeat
announces that signal as it announces the stacks' one.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from slurm_ft.core import rundir as records
from slurm_ft.train import stacks, wakeup
from slurm_ft.train import traces as fr_traces

DEFAULT_LIVENESS_S = 2.0
log = logging.getLogger(__name__)


class HeartbeatWriter:
    """``beat(step)`` after each step; the launcher treats a rank without progress as hung, and among hung ranks
    the one whose liveness stopped as the stuck one."""

    def __init__(self, run_dir: str | os.PathLike[str], rank: int, *, interval_s: float = 0.0,
                 clock: Callable[[], float] = time.time, liveness_s: float = DEFAULT_LIVENESS_S,
                 stacks: bool = True, traces: bool = True) -> None:
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        if liveness_s < 0:
            raise ValueError(f"liveness_s must be >= 0 (0 = no liveness thread), got {liveness_s}")
        self.run_dir, self.rank, self.interval_s, self._clock = Path(run_dir), rank, interval_s, clock
        self.liveness_s = liveness_s
        self._host, self._pid = records.node_name(), os.getpid()
        self._last = float("-inf")
        self._write_failed = False
        self._lock = threading.Lock()
        self._progress: tuple[int, float] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stack_signal = self._register_stacks() if stacks else None
        self._done = False
        atexit.register(self.close)
        self._trace_signal = fr_traces.install(self.run_dir, rank) if traces else None

    def beat(self, step: int, *, force: bool = False) -> bool:
        """Record progress at ``step``; returns False when the file write was skipped by the interval."""
        now = self._clock()
        with self._lock:
            self._progress = (step, now)
        if not force and now - self._last < self.interval_s:
            return False
        try:
            self._write(now)
        except OSError as exc:  # a read-only or full run dir must not end training: said once, tried again later
            if not self._write_failed:
                log.warning("slurm-ft: rank %d cannot write its heartbeat in %s (%s); training goes on, the "
                            "launcher sees this rank's last beat", self.rank, self.run_dir, exc)
            self._write_failed = True
            return False
        self._write_failed = False
        self._last = now
        self._start_liveness()
        return True

    def close(self) -> None:
        """The loop is finished: stop the liveness thread and write a last record that says ``done`` (once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._done:
            return
        self._done = True
        with contextlib.suppress(OSError):  # the launcher then sees the last beat: a slow exit may be called hung
            self._write(self._clock())

    def _write(self, alive: float) -> None:
        with self._lock:
            if self._progress is None:
                return
            step, when = self._progress
            records.write_heartbeat(self.run_dir, records.Heartbeat(
                rank=self.rank, step=step, time=when, host=self._host, pid=self._pid,
                alive=alive if self.liveness_s > 0 else None, stack_signal=self._stack_signal,
                trace_signal=self._trace_signal, done=self._done))

    def _start_liveness(self) -> None:
        if self._thread is not None or self.liveness_s <= 0:
            return
        self._thread = threading.Thread(target=self._live, name=f"slurm-ft-liveness-rank{self.rank}", daemon=True)
        self._thread.start()

    def _live(self) -> None:
        while not self._stop.wait(self.liveness_s):
            try:
                self._write(self._clock())
            except OSError:
                continue  # a full or flaky run dir: the next beat tries again; the launcher sees a stale one

    def _register_stacks(self) -> int | None:
        try:
            if not faulthandler.is_enabled():
                faulthandler.enable()
            records.make_run_dir(self.run_dir)
        except (OSError, ValueError, RuntimeError, AttributeError):
            return None  # no stacks from this rank; the launcher then tries py-spy
        return wakeup.serve(records.STACK_SIGNAL, self._dump_stacks)  # None: the launcher tries py-spy

    def _dump_stacks(self) -> None:
        try:
            stacks.dump(self.run_dir, self.rank)
        except OSError as exc:
            log.warning("slurm-ft: rank %d cannot write its stacks to %s (%s)", self.rank, self.run_dir, exc)
