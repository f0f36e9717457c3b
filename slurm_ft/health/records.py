"""Plain health records: what probes gather and the classifier judges (torch-free, NVML-free).

A node report (written by the epilog, read by the monitor) lives at
``<state_dir>/reports/<job_id>/<node>.json`` and is ``NodeReport.to_dict()``. The prolog leaves
``<state_dir>/prolog/<job_id>/<node>.json``: ``{"job_id", "node", "time", "passed", "findings": [...], "notes",
"links"}`` (``links``: the node's link counters as the job started, ``slurm_ft.health.links.LinkSnapshot``).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class XidEvent:
    """One Xid: from the NVML event set (XidCriticalError) or a kernel log line."""

    node: str
    xid: int
    gpu_index: int | None = None
    pci_bus: str = ""  # e.g. "0000:3b:00"
    time: float | None = None
    text: str = ""  # the raw line or NVML description
    source: str = "nvml"  # "nvml" | "kmsg"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GpuHealth:
    """One GPU's counters at probe time. ``None`` means NVML could not tell (unsupported field)."""

    index: int
    uuid: str = ""
    pci_bus: str = ""
    ecc_volatile_uncorrected: int | None = None
    ecc_volatile_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    nvlink_down: tuple[int, ...] = ()  # link ids that are supported but inactive
    nvlink_errors: int | None = None  # sum of replay/recovery/CRC error counters
    temperature_c: int | None = None
    nvlink_up: int | None = None  # number of active links (None: no NVLink or not supported)
    error: str = ""  # why NVML could not read this GPU at all (e.g. "GPU is lost"); empty when it could
    # What the driver says the GPU needs (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, R550+): 0 none, 1 GPU reset,
    # 2 node reboot, 3 drain P2P, 4 drain and reset, ... (RECOVERY_ACTIONS); None: the driver lacks the field.
    recovery_action: int | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NvmlSnapshot:
    """Everything NVML said about one node. ``available=False`` with ``error`` when NVML or GPUs are absent."""

    node: str
    time: float
    available: bool
    error: str = ""
    driver_version: str = ""
    gpus: tuple[GpuHealth, ...] = ()
    xids: tuple[XidEvent, ...] = ()

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GpuUse:
    """Who holds one GPU now (NVML ``nvmlDeviceGetComputeRunningProcesses`` and ``nvmlDeviceGetMemoryInfo``).
    ``pids`` None: the process list was not readable; ``used_mb`` None: the memory was not readable."""

    index: int
    uuid: str = ""
    pci_bus: str = ""
    pids: tuple[int, ...] | None = None
    used_mb: int | None = None
    error: str = ""  # why NVML could not read this GPU at all


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GpuHold:
    """A GPU that still held processes (or memory) of a failed attempt's ranks when the launcher's bounded wait for
    their release ended: node evidence read through NVML on that node (``slurm_ft.launch.reclaim``)."""

    node: str
    gpu_index: int
    uuid: str = ""
    pci_bus: str = ""
    pids: tuple[int, ...] = ()  # the attempt's processes NVML still listed on it
    used_mb: int | None = None
    waited_s: float = 0.0

    def describe(self) -> str:
        """``n2 GPU 1 (0000:2a:00): 30000 MiB of the killed attempt's pid 4242 not released after 30 s``."""
        where = f"{self.node} GPU {self.gpu_index}" + (f" ({self.pci_bus})" if self.pci_bus else "")
        who = (f"pid{'s' if len(self.pids) > 1 else ''} {', '.join(map(str, self.pids))}" if self.pids
               else "its processes")
        memory = f"{self.used_mb} MiB of " if self.used_mb is not None else ""
        return f"{where}: {memory}the failed attempt's {who} not released after {self.waited_s:.0f} s"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeReport:
    """What the epilog gathered on one node at job end."""

    job_id: int
    node: str
    time: float
    nvml: NvmlSnapshot | None = None
    kmsg_xids: tuple[XidEvent, ...] = ()
    error_files: tuple[dict[str, Any], ...] = ()  # records.ErrorRecord dicts found for this job
    log_tails: dict[str, str] = dataclasses.field(default_factory=dict)  # "rank:N" or "node:NAME" -> tail text
    exit_code: int | None = None  # SLURM_JOB_EXIT_CODE seen by the epilog, if any
    notes: tuple[str, ...] = ()  # what could not be gathered, and why
    exit_signal: int | None = None  # the signal that ended the job script (SLURM_JOB_EXIT_CODE2 "<exit>:<sig>")
    health: tuple[dict[str, str], ...] = ()  # the epilog's own node-health findings: {category, check, evidence}
    link_losses: tuple[dict[str, Any], ...] = ()  # links that went down while the job ran (health.links.LinkLoss)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "NodeReport":
        nvml = data.get("nvml")
        return cls(
            job_id=int(data["job_id"]),
            node=str(data["node"]),
            time=float(data["time"]),
            nvml=snapshot_from_dict(nvml) if nvml else None,
            kmsg_xids=tuple(XidEvent(**x) for x in data.get("kmsg_xids", ())),
            error_files=tuple(data.get("error_files", ())),
            log_tails=dict(data.get("log_tails", {})),
            exit_code=data.get("exit_code"),
            notes=tuple(data.get("notes", ())),
            exit_signal=data.get("exit_signal"),
            health=tuple(dict(h) for h in data.get("health", ())),
            link_losses=tuple(dict(x) for x in data.get("link_losses", ())),
        )


def normalize_pci_bus(text: str) -> str:
    """``00000000:3B:00.0`` (NVML) and ``0000:3b:00`` (kernel) -> ``0000:3b:00``; unparsable text unchanged."""
    parts = text.strip().lower().split(":")
    if len(parts) != 3:
        return text.strip().lower()
    domain, bus, dev = parts
    try:
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev.split('.')[0], 16):02x}"
    except ValueError:
        return text.strip().lower()


RECOVERY_ACTIONS = {0: "NONE", 1: "GPU_RESET", 2: "NODE_REBOOT", 3: "DRAIN_P2P", 4: "DRAIN_AND_RESET",
                    5: "RECOVER_IMEX_DOMAIN", 6: "BUS_RESET", 7: "SYSTEM_REBOOT"}  # nvmlDeviceGpuRecoveryAction_t


def recovery_action_name(action: int) -> str:
    return RECOVERY_ACTIONS.get(action, f"action {action}")


def snapshot_from_dict(data: dict[str, Any]) -> NvmlSnapshot:
    """Inverse of ``dataclasses.asdict(NvmlSnapshot)`` (used for recorded snapshots too)."""
    gpus = tuple(GpuHealth(**{**g, "nvlink_down": tuple(g.get("nvlink_down", ()))}) for g in data.get("gpus", ()))
    return NvmlSnapshot(
        node=str(data.get("node", "")),
        time=float(data.get("time", 0.0)),
        available=bool(data.get("available", False)),
        error=str(data.get("error", "")),
        driver_version=str(data.get("driver_version", "")),
        gpus=gpus,
        xids=tuple(XidEvent(**x) for x in data.get("xids", ())),
    )
