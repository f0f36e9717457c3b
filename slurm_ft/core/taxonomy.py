"""The failure vocabulary shared by every component (names fixed by the design doc)."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class Category(str, enum.Enum):
    """Why a job or node failed."""

    HARDWARE_GPU = "hardware_gpu"  # Xid/ECC/remapped-row/NVLink evidence on a GPU
    HARDWARE_NODE = "hardware_node"  # node died or misbehaves (NODE_FAIL, BOOT_FAIL, host faults)
    NETWORK = "network"  # NCCL/gloo transport errors, fabric faults
    HANG = "hang"  # no progress within the hang timeout, collective watchdog timeouts
    PREEMPTION = "preemption"  # PREEMPTED, or SIGTERM/SIGUSR1 ahead of preemption
    STORAGE = "storage"  # ENOSPC, EIO, stale NFS handle, checkpoint write failures
    USER_CODE = "user_code"  # Python exceptions in the training code
    OOM_GPU = "oom_gpu"  # CUDA out of memory
    OOM_HOST = "oom_host"  # kernel OOM killer, Slurm OUT_OF_MEMORY
    NUMERICAL = "numerical"  # NaN/Inf loss
    CONFIG = "config"  # bad job configuration (missing files, bad flags, topology mismatch)
    TIME_LIMIT = "time_limit"  # TIMEOUT, DEADLINE
    CANCELLED = "cancelled"  # scancel by a user or admin
    UNKNOWN = "unknown"  # no rule matched


class Action(str, enum.Enum):
    """What the monitor does about a verdict."""

    REQUEUE = "requeue"  # requeue the job as it is
    REQUEUE_EXCLUDE = "requeue_exclude"  # quarantine culprit nodes, requeue with them in ExcNodeList
    RESTART_IN_PLACE = "restart_in_place"  # restart the ranks inside the allocation
    STOP = "stop"  # non-recoverable: leave the job ended and say why
    NONE = "none"  # nothing to do (finished, cancelled, not ours)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Culprit:
    """Who is to blame: node names and global ranks (either may be empty)."""

    nodes: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, list[Any]]:
        return {"nodes": list(self.nodes), "ranks": list(self.ranks)}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """The classifier's answer: ``{category, recoverable, action, culprit, evidence, confidence}``."""

    category: Category
    recoverable: bool
    action: Action
    culprit: Culprit = Culprit()
    evidence: tuple[str, ...] = ()
    confidence: float = 0.5
    # The culprit nodes whose blame rests on the node's own evidence (NVML, kernel log, Slurm's node state): only
    # these may be struck or drained. Other culprit nodes come from the job's word (its error files and logs) and
    # may only keep this job off them (design.md, Trust).
    attested_nodes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.confidence <= 1.0:
            raise ValueError(f"confidence: must be within [0, 1], got {self.confidence}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category.value,
            "recoverable": self.recoverable,
            "action": self.action.value,
            "culprit": self.culprit.to_dict(),
            "evidence": list(self.evidence),
            "confidence": self.confidence,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Verdict":
        culprit = data.get("culprit") or {}
        return cls(
            category=Category(data["category"]),
            recoverable=bool(data["recoverable"]),
            action=Action(data["action"]),
            culprit=Culprit(nodes=tuple(culprit.get("nodes", ())),
                            ranks=tuple(int(r) for r in culprit.get("ranks", ()))),
            evidence=tuple(data.get("evidence", ())),
            confidence=float(data.get("confidence", 0.5)),
        )


def culprit_text(verdict: dict[str, Any]) -> str:
    """``rank 1 on n2``, ``n3``, or ``-``: who failed first, as a verdict dict (``Verdict.to_dict``) names them."""
    culprit = verdict.get("culprit") or {}
    ranks, nodes = list(culprit.get("ranks", ())), list(culprit.get("nodes", ()))
    if ranks:
        return ", ".join(f"rank {r}" for r in ranks) + (f" on {', '.join(nodes)}" if nodes else " (node unknown)")
    return ", ".join(nodes) or "-"
