"""Typed records and the SlurmClient protocol. Every backend (CLI, pyslurm) returns these."""

from __future__ import annotations

import dataclasses
import enum
from typing import Protocol, runtime_checkable


class JobState(str, enum.Enum):
    """Slurm job states (base state, as squeue reports it)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    RESIZING = "RESIZING"
    REVOKED = "REVOKED"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    STOPPED = "STOPPED"
    CONFIGURING = "CONFIGURING"
    SIGNALING = "SIGNALING"
    STAGE_OUT = "STAGE_OUT"
    EXPEDITING = "EXPEDITING"  # 25.11: requeued ahead of the queue (expedited requeue)
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    UNKNOWN = "UNKNOWN"

    @classmethod
    def parse(cls, text: str) -> "JobState":
        try:
            return cls(text.strip().upper())
        except ValueError:
            return cls.UNKNOWN

    @property
    def finished(self) -> bool:
        return self not in _ACTIVE


_ACTIVE = frozenset(
    {JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED, JobState.COMPLETING, JobState.CONFIGURING,
     JobState.REQUEUED, JobState.REQUEUE_HOLD, JobState.REQUEUE_FED, JobState.RESIZING, JobState.SIGNALING,
     JobState.STAGE_OUT, JobState.STOPPED, JobState.SPECIAL_EXIT, JobState.EXPEDITING, JobState.RESV_DEL_HOLD}
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobInfo:
    """One job as seen in one poll."""

    job_id: int
    name: str = ""
    user_id: int | None = None
    state: JobState = JobState.UNKNOWN
    reason: str = ""
    nodes: tuple[str, ...] = ()
    batch_host: str = ""  # the node running the batch script (slurm-ft's launcher); "" while pending
    exit_code: int | None = None  # the script's exit status
    exit_signal: int | None = None  # the signal that ended it, if any
    restart_count: int = 0
    comment: str = ""
    excluded_nodes: tuple[str, ...] = ()
    requeue: bool = False  # whether the job may be requeued
    work_dir: str = ""
    std_err: str = ""
    std_out: str = ""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    """One node: base state plus flags (``IDLE``, ``DRAIN``, ``DOWN``, ``NOT_RESPONDING`` ...) and reason."""

    name: str
    state: frozenset[str] = frozenset()
    reason: str = ""

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.state or "DRAINED" in self.state or "DRAINING" in self.state

    @property
    def down(self) -> bool:
        return "DOWN" in self.state

    @property
    def idle(self) -> bool:
        return "IDLE" in self.state and not (self.drained or self.down or "NOT_RESPONDING" in self.state)


@runtime_checkable
class SlurmClient(Protocol):
    """What slurm-ft needs from Slurm. Reads are batched: one call returns every job / node."""

    def jobs(self) -> list[JobInfo]: ...

    def job(self, job_id: int) -> JobInfo | None: ...

    def nodes(self) -> list[NodeInfo]: ...

    def drain(self, node: str, reason: str) -> None: ...

    def resume(self, node: str) -> None: ...

    def requeue(self, job_id: int, *, hold: bool = False) -> None: ...

    def cancel(self, job_id: int) -> None: ...

    def release(self, job_id: int) -> None: ...

    def update_job(self, job_id: int, *, comment: str | None = None,
                   excluded_nodes: tuple[str, ...] | None = None) -> None: ...
