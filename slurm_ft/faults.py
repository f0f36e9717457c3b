"""Fault scenarios for the demo and benchmarks, and what one run's evidence says about its recovery.

Faults are injected by (rank, step) through the example trainer's flags, on the launcher's first attempt only
(``$SLURM_FT_ATTEMPT``), so a restarted attempt runs clean. ``summarize(run_dir)`` reads the launcher's
``events.jsonl`` and the first attempt's heartbeats (``attempt-1/``) and returns detection time, recovery time
and steps lost.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path

from slurm_ft.train.records import read_heartbeats


class Fault(str, enum.Enum):
    KILL_RANK = "kill-rank"  # SIGKILL one rank mid-step (--crash-at)
    HANG = "hang"  # one rank stops making progress (--hang-at)
    USER_ERROR = "user-error"  # an exception in the training code (--fail-at)


_FLAG = {Fault.KILL_RANK: "--crash-at", Fault.HANG: "--hang-at", Fault.USER_ERROR: "--fail-at"}


def trainer_flags(fault: Fault, rank: int, step: int) -> str:
    """The example trainer's flag injecting ``fault`` at ``rank``/``step``."""
    if rank < 0 or step < 1:
        raise ValueError(f"fault position: rank must be >= 0 and step >= 1, got {rank}:{step}")
    return f"{_FLAG[Fault(fault)]} {rank}:{step}"


def first_attempt_only(command: str, flags: str) -> str:
    """A shell command line that adds ``flags`` to ``command`` on the launcher's first attempt only."""
    return f"/bin/bash -c 'if [ \"$SLURM_FT_ATTEMPT\" = 1 ]; then x=\"{flags}\"; fi; exec {command} $x'"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    """One run's fault and recovery, from its evidence. ``None``: not seen (no fault, or no restart)."""

    attempts: int
    exit_code: int | None
    fault_kind: str | None = None
    detection_s: float | None = None  # last heartbeat progress -> fault detected by the launcher
    recovery_s: float | None = None  # fault detected -> first heartbeat of the next attempt (poll resolution)
    steps_lost: int | None = None  # steps done before the fault that were redone (last step - resume step)
    wall_s: float | None = None  # first attempt start -> exit


def read_events(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "events.jsonl"
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a torn last line is not an event
    return events


def summarize(run_dir: str | Path) -> Recovery:
    events = read_events(run_dir)
    starts = [e for e in events if e["event"] == "attempt_start"]
    end = next((e for e in reversed(events) if e["event"] == "exit"), None)
    fault = next((e for e in events if e["event"] == "fault_detected"), None)
    wall = end["time"] - starts[0]["time"] if end and starts else None
    result = Recovery(attempts=len(starts), exit_code=end["code"] if end else None, wall_s=wall)
    if fault is None:
        return result
    beats = read_heartbeats(Path(run_dir) / "attempt-1")
    last = max(beats, key=lambda b: b.time) if beats else None
    resumed = next((e for e in events if e["event"] == "first_step" and e.get("attempt") == 2), None)
    restart = next((e for e in starts if e.get("attempt") == 2), None)
    resume_step = restart.get("resume_step") if restart else None
    return dataclasses.replace(
        result, fault_kind=fault["kind"],
        detection_s=fault["time"] - last.time if last else None,
        recovery_s=resumed["time"] - fault["time"] if resumed else None,
        steps_lost=max(b.step for b in beats) - (resume_step or 0) if restart and beats else None)


def ettr(recovery: Recovery, clean_wall_s: float) -> float | None:
    """Effective training time ratio of a faulted run: the clean run's wall time over this run's."""
    if not recovery.wall_s or clean_wall_s <= 0:
        return None
    return min(1.0, clean_wall_s / recovery.wall_s)
