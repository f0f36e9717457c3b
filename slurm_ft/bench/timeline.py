"""Reading a training run's timeline (``slurm_ft.train.timeline``, written by the benchmark workload's rank 0):
pure functions from its records to steps, attempts, faults and their recoveries."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurm_ft.bench.ettr import EttrResult, Overhead, Span, StepRecord, ettr, mark_lost


def read_timeline(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a timeline file; a torn last line (the writer was killed) is skipped."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "ev" in record:
            records.append(record)
    return records


# --- pure readings --------------------------------------------------------------------------------------------
def step_records(records: Sequence[dict[str, Any]]) -> list[StepRecord]:
    """One StepRecord per executed step, numbered by attempt (each ``start``), with rolled-back steps marked."""
    attempt, steps = 0, []
    for rec in records:
        if rec["ev"] == "start":
            attempt += 1
        elif rec["ev"] == "step":
            steps.append(StepRecord(attempt=max(attempt, 1), step=rec["step"], start=rec["t0"], end=rec["t1"]))
    return mark_lost(steps)


def save_spans(records: Sequence[dict[str, Any]]) -> list[Span]:
    return [Span(kind=Overhead.CHECKPOINT_STALL, start=r["t0"], end=r["t1"]) for r in records if r["ev"] == "save"]


def timeline_ettr(records: Sequence[dict[str, Any]], wall_start: float, wall_end: float) -> EttrResult:
    """ETTR over ``[wall_start, wall_end]`` (the job's start and end): productive steps over wall time, with the
    checkpoint stalls and the rolled-back steps named; the rest (start-up, detection, recovery, queue) is
    ``other`` unless the caller splits it."""
    return ettr(step_records(records), wall_start, wall_end, save_spans(records))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Throughput:
    """Steady-state figures of one fault-free run (the first ``warmup`` steps left out)."""

    steps: int
    step_s: float  # median step time, save stalls excluded
    steps_per_s: float  # steps over the window's wall time, save stalls included
    saves: int
    stall_s: float | None  # median time one save blocked the loop
    startup_s: float | None  # process launch -> first step done


def throughput(records: Sequence[dict[str, Any]], *, warmup: int = 3) -> Throughput:
    steps = [r for r in records if r["ev"] == "step"]
    window = steps[warmup:] if len(steps) > warmup + 1 else steps
    if not window:
        raise ValueError("records: no steps in the timeline")
    saves = [r for r in records if r["ev"] == "save" and window[0]["t0"] <= r["t0"] <= window[-1]["t1"]]
    wall = window[-1]["t1"] - window[0]["t0"]
    launch = next((r["t"] for r in records if r["ev"] == "launch"), None)
    return Throughput(steps=len(window), step_s=statistics.median(r["t1"] - r["t0"] for r in window),
                      steps_per_s=len(window) / wall if wall > 0 else float("nan"), saves=len(saves),
                      stall_s=statistics.median(r["t1"] - r["t0"] for r in saves) if saves else None,
                      startup_s=None if launch is None else steps[0]["t1"] - launch)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FaultOutcome:
    """One fault at ``fault_time`` as the timeline and the driver saw it. ``None``: not seen."""

    fault_step: int | None  # the last step done before the fault
    detection_s: float | None  # fault -> every rank of the faulted attempt gone (noticed and torn down)
    recovery_s: float | None  # fault -> the first step done by the attempt after it
    resume_step: int | None  # where that attempt resumed
    steps_lost: int | None  # fault_step - resume_step: work done twice
    lost_work_s: float | None  # the time those steps had taken
    relaunch_s: float | None = None  # fault -> the next attempt's rank 0 process running the script (``launch``)
    resume_s: float | None = None  # that launch -> ready to step (process group, model, checkpoint loaded)
    restart_cpu_s: float | None = None  # rank 0's CPU seconds from that launch to its first step's end


def fault_outcome(records: Sequence[dict[str, Any]], fault_time: float,
                  torn_down_at: float | None = None) -> FaultOutcome:
    """Detection, recovery and lost work of the fault injected at ``fault_time``; ``torn_down_at``: when the
    driver saw the faulted attempt's last rank process exit. The faulted attempt is the one running at
    ``fault_time``; its steps count up to its end (a step in flight may still finish after the fault)."""
    faulted = [r for r in _attempt_at(records, fault_time) if r["ev"] == "step"]
    fault_step = faulted[-1]["step"] if faulted else None
    start = next((r for r in records if r["ev"] == "start" and r["t"] > fault_time), None)
    first = None if start is None else next(
        (r for r in records if r["ev"] == "step" and r["t0"] >= start["t"]), None)
    resume_step = None if start is None else int(start.get("resumed_from") or 0)
    launch = None if start is None else next(
        (r for r in records if r["ev"] == "launch" and fault_time < r["t"] <= start["t"]), None)
    lost = lost_s = None
    if fault_step is not None and resume_step is not None:
        lost = max(0, fault_step - resume_step)
        lost_s = sum(r["t1"] - r["t0"] for r in faulted if r["step"] > resume_step)
    return FaultOutcome(fault_step=fault_step,
                        detection_s=None if torn_down_at is None else max(0.0, torn_down_at - fault_time),
                        recovery_s=None if first is None else first["t1"] - fault_time,
                        resume_step=resume_step, steps_lost=lost, lost_work_s=lost_s,
                        relaunch_s=None if launch is None else launch["t"] - fault_time,
                        resume_s=None if launch is None else start["t"] - launch["t"],
                        restart_cpu_s=_cpu_between(launch, first))


def _cpu_between(begin: dict[str, Any] | None, end: dict[str, Any] | None) -> float | None:
    """CPU seconds one process spent between two of its records (None: a record or its ``cpu`` is missing)."""
    if begin is None or end is None or "cpu" not in begin or "cpu" not in end:
        return None
    return end["cpu"] - begin["cpu"]


def _attempt_at(records: Sequence[dict[str, Any]], when: float) -> list[dict[str, Any]]:
    """The records of the attempt that had started by ``when`` (from its ``start`` to the next one)."""
    starts = [i for i, r in enumerate(records) if r["ev"] == "start"]
    begin = max((i for i in starts if records[i]["t"] <= when), default=None)
    if begin is None:
        return []
    end = min((i for i in starts if i > begin), default=len(records))
    return list(records[begin:end])


def last_step(records: Sequence[dict[str, Any]]) -> int:
    """The newest step any attempt reached (0 before the first)."""
    return max((r["step"] for r in records if r["ev"] == "step"), default=0)


def attempts(records: Sequence[dict[str, Any]]) -> int:
    return sum(1 for r in records if r["ev"] == "start")
