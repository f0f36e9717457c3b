"""Plain input records for the classifier: everything known about one failed job, gathered elsewhere.

``Evidence`` is what ``classify()`` judges. The monitor builds it from one poll (``JobEnd.from_job_info``,
``NodeEvent.from_node_info``) and the epilog's node reports (``Evidence.from_node_reports``); the CLI builds it
from files. Nothing here does I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from slurm_ft.classify.collectives import RankTrace
from slurm_ft.core.rundir import ErrorRecord, RankEnd, RankState
from slurm_ft.health.links import LinkLoss
from slurm_ft.health.records import GpuHold, NodeReport, NvmlSnapshot, XidEvent
from slurm_ft.slurm.types import JobInfo, NodeInfo

LOG_KINDS = ("log", "kmsg")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobEnd:
    """How Slurm ended the job: state (``FAILED``, ``NODE_FAIL`` ...), reason, exit code and signal."""

    state: str = ""
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    nodes: tuple[str, ...] = ()  # the job's nodes; node events outside them are ignored
    job_id: int | None = None

    def __post_init__(self) -> None:
        # "CANCELLED by 1000" (squeue), "CANCELLED+" (sacct) -> "CANCELLED"
        words = str(self.state).strip().upper().split()
        object.__setattr__(self, "state", words[0].rstrip("+") if words else "")
        object.__setattr__(self, "nodes", tuple(self.nodes))

    @classmethod
    def from_job_info(cls, info: JobInfo) -> "JobEnd":
        return cls(state=info.state.value, reason=info.reason, exit_code=info.exit_code, signal=info.exit_signal,
                   nodes=info.nodes, job_id=info.job_id)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeEvent:
    """A node's Slurm state flags (``DOWN``, ``NOT_RESPONDING``, ``DRAIN`` ...) and reason at job end."""

    name: str
    state: frozenset[str] = frozenset()
    reason: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", frozenset(str(s).strip().upper() for s in self.state))

    @classmethod
    def from_node_info(cls, info: NodeInfo) -> "NodeEvent":
        return cls(name=info.name, state=info.state, reason=info.reason)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LogTail:
    """The tail of one log. ``source`` is a global rank (int) or a node name (str, a node-wide log).

    ``node`` says where a rank's log was written, when known. ``kind="kmsg"`` marks a kernel log.
    A node-wide log may carry per-line rank prefixes (``[rank3]:`` from torchrun, ``3: `` from ``srun -l``).
    """

    source: int | str
    text: str
    node: str = ""
    kind: str = "log"

    def __post_init__(self) -> None:
        if isinstance(self.source, bool) or not isinstance(self.source, (int, str)):
            raise ValueError(f"source: must be a rank (int) or a node name (str), got {self.source!r}")
        if self.kind not in LOG_KINDS:
            raise ValueError(f"kind: must be one of {', '.join(LOG_KINDS)}, got {self.kind!r}")

    @property
    def rank(self) -> int | None:
        return self.source if isinstance(self.source, int) else None

    @property
    def node_name(self) -> str:
        return self.source if isinstance(self.source, str) else self.node


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """Everything the classifier may judge. Every field is optional; more evidence, better verdicts.

    ``kmsg`` holds Xid events already parsed from kernel logs; raw kernel log text goes in ``logs`` as
    ``LogTail(source=node, kind="kmsg", ...)`` (its Xid, OOM-killer and MCE lines are read there).
    ``in_allocation`` is True when the allocation is still alive (the launcher asking): recoverable
    categories then prefer ``restart_in_place``. ``ends`` says how each rank's process ended (the launcher's
    per-rank wrapper); ``hang`` is set only for an attempt the launcher found hung: every rank's state then.
    ``held_gpus``: GPUs that still held the failed attempt's processes when the launcher's wait for their release
    ended (NVML, read on their nodes: ``slurm_ft.launch.reclaim``).
    ``traces`` are the ranks' flight-recorder dumps (``slurm_ft.classify.collectives``), the job's word: they may
    name its ranks and nodes, never strike a node.
    ``links``: links of the job's nodes that went down while an attempt ran, from their counters as the launcher's
    steps read them on the nodes (``slurm_ft.launch.links``): ``network`` on that node, the job's own nodes only.
    """

    job: JobEnd | None = None
    nodes: tuple[NodeEvent, ...] = ()
    nvml: tuple[NvmlSnapshot, ...] = ()
    kmsg: tuple[XidEvent, ...] = ()
    errors: tuple[ErrorRecord, ...] = ()
    logs: tuple[LogTail, ...] = ()
    ends: tuple[RankEnd, ...] = ()
    hang: tuple[RankState, ...] = ()
    traces: tuple[RankTrace, ...] = ()
    in_allocation: bool = False
    held_gpus: tuple[GpuHold, ...] = ()
    links: tuple[LinkLoss, ...] = ()

    def __post_init__(self) -> None:
        for name in ("nodes", "nvml", "kmsg", "errors", "logs", "ends", "hang", "held_gpus", "traces", "links"):
            value = getattr(self, name)
            if not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))

    @classmethod
    def from_node_reports(cls, job_end: JobEnd | None, reports: Iterable[NodeReport], *,
                          node_events: Iterable[NodeEvent] = (), in_allocation: bool = False) -> "Evidence":
        """Merge the epilog's per-node reports (NVML, kmsg Xids, error files, log tails) into one Evidence.

        Error files read by several nodes' epilogs (a shared run directory) are kept once. A report's exit code
        fills in the job's when Slurm did not give one.
        """
        reports = list(reports)
        nvml, kmsg, logs = [], [], []
        errors: dict[tuple[Any, ...], ErrorRecord] = {}
        for report in reports:
            if report.nvml is not None:
                nvml.append(report.nvml)
            kmsg.extend(report.kmsg_xids)
            for data in report.error_files:
                record = error_record_from_dict(data, default_host=report.node)
                if record is not None:
                    errors.setdefault((record.rank, record.time, record.exc_type, record.pid), record)
            logs.extend(_report_logs(report))
        if job_end is not None and job_end.exit_code is None:
            codes = [r.exit_code for r in reports if r.exit_code is not None]
            if codes:
                job_end = dataclasses.replace(job_end, exit_code=codes[0])
        return cls(job=job_end, nodes=tuple(node_events), nvml=tuple(nvml), kmsg=tuple(kmsg),
                   errors=tuple(sorted(errors.values(), key=lambda r: (r.time, r.rank))), logs=tuple(logs),
                   in_allocation=in_allocation)


def _report_logs(report: NodeReport) -> list[LogTail]:
    tails = []
    for key, text in sorted(report.log_tails.items()):
        if not isinstance(text, str):
            continue
        kind, _, name = str(key).partition(":")
        if kind == "rank" and name.strip().isdigit():
            tails.append(LogTail(source=int(name), text=text, node=report.node))
        elif kind == "kmsg":
            tails.append(LogTail(source=name or report.node, text=text, kind="kmsg"))
        else:  # "node:NAME", or a key we do not know: a node-wide log of this node
            tails.append(LogTail(source=name if kind == "node" and name else report.node, text=text))
    return tails


_ERROR_FIELDS = frozenset(f.name for f in dataclasses.fields(ErrorRecord))


UNKNOWN_RANK = -1  # an error file that does not say whose it is (torch elastic's): no rank is blamed for it


def error_record_from_dict(data: Mapping[str, Any], *, default_host: str = "",
                           default_rank: int = UNKNOWN_RANK) -> ErrorRecord | None:
    """An ``ErrorRecord`` from its JSON dict; ``None`` when the dict is not one (foreign or torn file).

    Reads slurm-ft's own error files and torch elastic's (``@record`` / ``TORCHELASTIC_ERROR_FILE``); those carry
    no rank or host, so ``default_rank`` / ``default_host`` say whose they are (``UNKNOWN_RANK``: nobody's).
    """
    if not isinstance(data, Mapping):
        return None
    if "rank" not in data and "message" in data:
        data = elastic_error_dict(data, rank=default_rank)
        if data is None:
            return None
    try:
        values = {k: v for k, v in data.items() if k in _ERROR_FIELDS}
        record = ErrorRecord(**values)
        rank, when = int(record.rank), float(record.time)
        pid = int(record.pid or 0)
    except (TypeError, ValueError, OverflowError):
        return None
    if isinstance(record.rank, bool) or when != when:  # a bool is not a rank, NaN is not a time
        return None
    return dataclasses.replace(record, rank=rank, time=when, pid=pid, exc_type=str(record.exc_type),
                               message=str(record.message), traceback=str(record.traceback or ""),
                               host=str(record.host or default_host))


def elastic_error_dict(data: Mapping[str, Any], *, rank: int = UNKNOWN_RANK) -> dict[str, Any] | None:
    """A torch elastic error file as slurm-ft's error dict, or ``None`` when it is not one. Both forms:

    - ``{"message": {"message": "Type: text", "extraInfo": {"py_callstack": "...", "timestamp": "1700000000"}}}``
      (``ErrorHandler.record_exception``, written by ``@record``);
    - ``{"message": "text", "timestamp": "1700000000"}`` (the string form ``ProcessFailure`` also accepts).
    """
    message = data.get("message")
    if isinstance(message, Mapping):
        extra = message.get("extraInfo") if isinstance(message.get("extraInfo"), Mapping) else {}
        text, stamp, stack = message.get("message"), extra.get("timestamp"), extra.get("py_callstack", "")
    else:
        text, stamp, stack = message, data.get("timestamp"), ""
    if not isinstance(text, str) or not isinstance(stack, str):
        return None
    try:
        when = float(stamp) if stamp not in (None, "") else math.inf  # no time: it sorts after those with one
    except (TypeError, ValueError):
        return None
    exc_type, sep, rest = text.partition(": ")
    if not sep or " " in exc_type.strip():  # "Signal 9 (SIGKILL) received by PID 12": no exception type
        exc_type, rest = "", text
    return {"rank": rank, "time": when, "exc_type": exc_type.strip(), "message": rest, "traceback": stack}
