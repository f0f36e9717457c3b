"""A training run's timeline for the benchmarks: what rank 0 did and when, appended as JSON lines.

The benchmark workload (``slurm_ft.train.example --timeline FILE``) writes, on rank 0 only:

- ``{"ev": "launch", "t": ...}`` when the script's ``main`` starts (its imports done; before the process group),
- ``{"ev": "process_group", "t": ...}`` once the process group has formed (not with one rank),
- ``{"ev": "built", "t": ...}`` once the model, optimizer and checkpoint manager are built, before the resume,
- ``{"ev": "start", "t": ..., "resumed_from": S, "world": W, "pid": P}`` when it is ready to step,
- ``{"ev": "step", "step": N, "t0": ..., "t1": ...}`` for every step (compute, heartbeat, the step's sleep),
- ``{"ev": "save", "step": N, "t0": ..., "t1": ...}`` for the time a checkpoint save blocked the loop,
- ``{"ev": "end", "t": ..., "step": N}`` after the last step.

Times are ``time.time()`` so they compare with the benchmark driver's fault times on the same host. Every record
also carries ``cpu``: the process's CPU seconds so far (``time.process_time()``), so a restart's wall time can be
told from the CPU it needed (on the lab's shared cores, the rest is waiting for a core). Every
process start opens a new *attempt*, whoever restarted it (slurm-ft's launcher, torchrun, a Slurm requeue), so
one reading covers every system alike.
The readers are in ``slurm_ft.bench.timeline``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class TimelineWriter:
    """Appends records to ``path`` with one ``write`` each (O_APPEND: a killed process loses at most a line)."""

    def __init__(self, path: str | os.PathLike[str], clock=time.time, cpu_clock=time.process_time) -> None:
        self.clock, self.cpu_clock = clock, cpu_clock
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, ev: str, **fields: Any) -> None:
        record = {"ev": ev, **fields}
        if "t" not in record and "t0" not in record:
            record["t"] = round(self.clock(), 4)
        record["cpu"] = round(self.cpu_clock(), 3)
        os.write(self._fd, (json.dumps(record) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)
