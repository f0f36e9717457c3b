"""Per-rank heartbeat files (format in slurm_ft.train.records), rewritten atomically at most every ``interval_s``."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from slurm_ft.train import records


class HeartbeatWriter:
    """``beat(step)`` after each step; the monitor/launcher treat a stale file as a hung rank."""

    def __init__(self, run_dir: str | os.PathLike[str], rank: int, *, interval_s: float = 0.0,
                 clock: Callable[[], float] = time.time) -> None:
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        self.run_dir, self.rank, self.interval_s, self._clock = Path(run_dir), rank, interval_s, clock
        self._host, self._pid = records.node_name(), os.getpid()
        self._last = float("-inf")

    def beat(self, step: int, *, force: bool = False) -> bool:
        """Write the heartbeat for ``step``; returns False when skipped by the interval."""
        now = self._clock()
        if not force and now - self._last < self.interval_s:
            return False
        records.write_heartbeat(self.run_dir, records.Heartbeat(rank=self.rank, step=step, time=now,
                                                                host=self._host, pid=self._pid))
        self._last = now
        return True
