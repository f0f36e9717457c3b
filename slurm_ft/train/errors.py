"""Per-rank error files: ``record_errors`` writes error.rank<R>.json (slurm_ft.core.rundir) and re-raises; with torch's
flight recorder on, the rank's collectives go to trace.rank<R>.json first (``slurm_ft.train.traces``)."""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from collections.abc import Callable, Iterator

from slurm_ft.core import rundir as records
from slurm_ft.train import traces


class StepTracker:
    """Mutable holder for the current step, so the error file can say where the rank died."""

    __slots__ = ("step",)

    def __init__(self) -> None:
        self.step: int | None = None


@contextlib.contextmanager
def record_errors(run_dir: str | os.PathLike[str], rank: int, *, step: StepTracker | None = None,
                  clock: Callable[[], float] = time.time) -> Iterator[StepTracker]:
    """Context manager (and decorator via ``contextlib``): an exception escaping it leaves an error file."""
    tracker = step or StepTracker()
    try:
        yield tracker
    except (Exception, KeyboardInterrupt) as exc:  # SystemExit(0) is a clean exit, not an error
        traces.dump(run_dir, rank, reason="error", keep=True)  # before the error file: the launcher acts on that
        records.write_error(run_dir, records.ErrorRecord(
            rank=rank, time=clock(), exc_type=type(exc).__name__, message=str(exc)[:4000],
            traceback="".join(traceback.format_exception(exc))[-16000:], host=records.node_name(),
            step=tracker.step, pid=os.getpid()))
        raise
