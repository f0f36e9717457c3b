"""The ranks' flight recorder from the launcher's side: on for every attempt, dumped before a failed attempt's kill.

``recorder_env`` is what the launcher adds to the ranks' environment, each variable only where the job's own
environment does not set it (the user's value wins), nothing with ``entries`` 0:

==============================  =====================================  ==============================================
variable                        value                                  why
==============================  =====================================  ==============================================
``TORCH_FR_BUFFER_SIZE``        ``entries`` (2000)                      a bounded ring buffer of the last collectives
``TORCH_NCCL_DUMP_ON_TIMEOUT``  ``1``                                  NCCL's watchdog dumps it on a timeout
``TORCH_FR_DUMP_TEMP_FILE``     ``<run_dir>/nccl_trace.rank``          ... into the run dir (NCCL appends the rank)
==============================  =====================================  ==============================================

(``TORCH_NCCL_TRACE_BUFFER_SIZE``, the older name of the buffer size, set by the job counts as the user's choice.)
A hung attempt's ranks dump when the per-node hang helper asks (``slurm_ft.launch.hang``); a failed attempt's ranks
when ``TraceRequest`` runs the same helper with ``--traces-only``, started as soon as a rank fails and waited for at
most ``wait_s`` before the launcher kills the step, or until every rank has a dump or has ended (the ranks that
raised dump on their way out): a rank that cannot dump delays the restart by ``wait_s`` at most.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from slurm_ft.core import env as ft_env
from slurm_ft.core.rundir import NCCL_TRACE_PREFIX
from slurm_ft.launch.hang import helper_argv

DEFAULT_ENTRIES = 2000  # torch's own example size; ~0.5 KiB an entry in a dump


def recorder_env(environ: Mapping[str, str], run_dir: Path, entries: int) -> dict[str, str]:
    """The flight-recorder variables to add for the ranks (see the table above)."""
    if entries <= 0:
        return {}
    wanted = {ft_env.NCCL_DUMP_ON_TIMEOUT: "1", ft_env.FR_DUMP_FILE: str(Path(run_dir) / NCCL_TRACE_PREFIX)}
    if not (environ.get(ft_env.FR_BUFFER_SIZE) or environ.get(ft_env.FR_BUFFER_SIZE_OLD)):
        wanted[ft_env.FR_BUFFER_SIZE] = str(entries)
    return {name: value for name, value in wanted.items() if not environ.get(name)}


class TraceRequest:
    """The ``--traces-only`` helpers over a failed attempt's nodes, in a process group of their own."""

    def __init__(self, nodes: Sequence[str], run_dir: Path, environ: Mapping[str, str], *,
                 popen: Callable[..., subprocess.Popen] = subprocess.Popen,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock, self.started = clock, clock()
        try:
            self.proc: subprocess.Popen | None = popen(
                helper_argv(nodes, run_dir, traces_only=True), env=dict(environ), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            self.why = ""
        except OSError as exc:
            self.proc, self.why = None, f"no srun to ask for the flight-recorder dumps: {exc}"

    def wait(self, wait_s: float, *, done: Callable[[], bool] = lambda: False,
             sleep: Callable[[float], None] = time.sleep) -> str:
        """Wait until ``wait_s`` after the start at most, or until ``done`` says every rank is accounted for (the
        ranks' own error-path dumps often come first), then stop the helpers: "" when they finished or were not
        needed, else why not (some dumps are then missing)."""
        if self.proc is None:
            return "" if done() else self.why
        while self.proc.poll() is None and self.clock() < self.started + wait_s:
            if done():
                self._stop()
                return ""
            sleep(0.05)
        if self.proc.poll() is None:
            self._stop()
            return "" if done() else f"the flight-recorder dumps were not all in within {wait_s:g} s"
        return "" if self.proc.returncode == 0 or done() else f"the dump helpers exited {self.proc.returncode}"

    def _stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        self.proc.wait()
