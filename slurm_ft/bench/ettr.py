"""ETTR (effective training time ratio) from a measured timeline: productive step time over wall time.

Inputs are plain records: one :class:`StepRecord` per executed step of each attempt, and :class:`Span` records for
the time that was not spent stepping (checkpoint stalls, detection, recovery, queue wait). A step is *productive*
unless a later rollback threw its work away (``lost``), in which case its time counts as *rework*. Whatever wall
time no record explains is reported as ``other`` rather than hidden.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence
from typing import Any


class Overhead(str, enum.Enum):
    """Where non-productive wall time went (the same names as the simulator's breakdown)."""

    CHECKPOINT_STALL = "checkpoint_stall"  # training blocked by a save
    DETECTION = "detection"  # fault happened -> fault noticed (crash exit, hang timeout, node loss)
    RECOVERY = "recovery"  # fault noticed -> training stepping again (restart, spare swap, job start, load)
    QUEUE_WAIT = "queue_wait"  # a requeued job waiting for its nodes
    REWORK = "rework"  # steps that ran and were then rolled back (derived from lost steps, never a span)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """One executed step of one attempt; ``lost`` when a later rollback threw its work away."""

    attempt: int
    step: int
    start: float
    end: float
    lost: bool = False

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"end: step {self.step} of attempt {self.attempt} ends before it starts "
                             f"({self.start} > {self.end})")

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """Wall time spent on one kind of overhead."""

    kind: Overhead
    start: float
    end: float

    def __post_init__(self) -> None:
        if self.kind is Overhead.REWORK:
            raise ValueError("kind: rework is derived from lost steps, not given as a span")
        if self.end < self.start:
            raise ValueError(f"end: {self.kind.value} span ends before it starts ({self.start} > {self.end})")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EttrResult:
    ettr: float
    wall_s: float
    productive_s: float
    productive_steps: int
    lost_steps: int
    overhead_s: dict[str, float]  # every Overhead value, plus "other" (wall time no record explains)

    @property
    def lost_work_s(self) -> float:
        return self.overhead_s[Overhead.REWORK.value]

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "lost_work_s": self.lost_work_s}


def mark_lost(steps: Sequence[StepRecord]) -> list[StepRecord]:
    """A step's work is lost when a later attempt ran the same step again (it resumed from before it)."""
    last_attempt: dict[int, int] = {}
    for rec in steps:
        last_attempt[rec.step] = max(last_attempt.get(rec.step, rec.attempt), rec.attempt)
    return [dataclasses.replace(r, lost=r.lost or r.attempt < last_attempt[r.step]) for r in steps]


def ettr(steps: Iterable[StepRecord], wall_start: float, wall_end: float,
         overheads: Iterable[Span] = ()) -> EttrResult:
    """ETTR over ``[wall_start, wall_end]``; records are clipped to that window."""
    if not wall_end > wall_start:
        raise ValueError(f"wall_end: must be after wall_start, got {wall_start} .. {wall_end}")
    wall = wall_end - wall_start

    def clipped(start: float, end: float) -> float:
        return max(0.0, min(end, wall_end) - max(start, wall_start))

    steps = list(steps)
    productive = sum(clipped(s.start, s.end) for s in steps if not s.lost)
    totals = {k.value: 0.0 for k in Overhead}
    totals[Overhead.REWORK.value] = sum(clipped(s.start, s.end) for s in steps if s.lost)
    for span in overheads:
        totals[span.kind.value] += clipped(span.start, span.end)
    totals["other"] = max(0.0, wall - productive - sum(totals.values()))
    return EttrResult(ettr=productive / wall, wall_s=wall, productive_s=productive,
                      productive_steps=sum(1 for s in steps if not s.lost),
                      lost_steps=sum(1 for s in steps if s.lost), overhead_s=totals)
