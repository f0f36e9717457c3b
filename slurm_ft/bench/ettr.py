"""ETTR from a measured timeline: productive step time over wall time, with what the rest went to."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence


class Overhead(str, enum.Enum):
    CHECKPOINT_STALL = "checkpoint_stall"
    DETECTION = "detection"
    RECOVERY = "recovery"
    QUEUE_WAIT = "queue_wait"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """One executed step of one attempt; ``lost`` when a later rollback threw its work away."""

    attempt: int
    step: int
    start: float
    end: float
    lost: bool = False

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    kind: Overhead
    start: float
    end: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EttrResult:
    ettr: float
    wall_s: float
    productive_s: float
    lost_work_s: float
    lost_steps: int
    overhead_s: dict[str, float]


def mark_lost(steps: Sequence[StepRecord]) -> list[StepRecord]:
    """A step's work is lost when a later attempt ran the same step again (it resumed from before it)."""
    last_attempt = {}
    for rec in steps:
        last_attempt[rec.step] = max(last_attempt.get(rec.step, rec.attempt), rec.attempt)
    return [dataclasses.replace(r, lost=r.lost or r.attempt < last_attempt[r.step]) for r in steps]


def ettr(steps: Iterable[StepRecord], wall_start: float, wall_end: float,
         overheads: Iterable[Span] = ()) -> EttrResult:
    if wall_end <= wall_start:
        raise ValueError(f"wall_end: must be after wall_start, got {wall_start} .. {wall_end}")
    steps = list(steps)
    wall = wall_end - wall_start
    productive = sum(s.duration for s in steps if not s.lost)
    lost = [s for s in steps if s.lost]
    totals = {k.value: 0.0 for k in Overhead}
    for span in overheads:
        totals[span.kind.value] += max(0.0, span.end - span.start)
    return EttrResult(ettr=productive / wall, wall_s=wall, productive_s=productive,
                      lost_work_s=sum(s.duration for s in lost), lost_steps=len(lost), overhead_s=totals)
