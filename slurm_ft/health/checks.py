"""Node checks: judging gathered health records (pure), plus the snapshot source with its TEST-ONLY override.

Judging is separate from gathering: ``judge_nvml`` turns an ``NvmlSnapshot`` into ``Finding`` records and
touches nothing; ``nvml_snapshot`` gathers (real probe, or a recorded file in test mode).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from slurm_ft.core import env
from slurm_ft.core.config import require
from slurm_ft.core.taxonomy import Category
from slurm_ft.health.records import NvmlSnapshot, XidEvent, recovery_action_name, snapshot_from_dict

# Xids that mean the GPU or its memory/fabric is faulty, so the node must leave service (NVIDIA's Xid
# catalogue: DBE, row-remap failure, NVLink, fallen off the bus, ECC rate/contained/uncontained, GSP, ...).
# Xids such as 13, 31, 43 are usually the application's fault and do not drain. The classifier's table
# (slurm_ft.classify.rules.is_drain_xid, extensible in rules.toml) is the authority, passed in by the hooks as
# ``drains``; this list is the fallback when it cannot be loaded, so that a broken rules file never opens the gate.
FALLBACK_DRAIN_XIDS = (48, 61, 62, 64, 74, 79, 92, 94, 95, 119, 120, 140)
_NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HealthConfig:
    """``[health]``: what a healthy GPU node looks like (the prolog's gate and the epilog's findings)."""

    expected_gpus: int | None = None
    """GPUs every node must show; unset: the count is not checked."""
    expected_gpus_by_node: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Per-node GPU counts by exact node name; they win over ``expected_gpus``."""
    max_temperature_c: int = 95
    """A GPU at or above this temperature fails the gate; within (0, 150)."""
    nvlinks_per_gpu: int | None = None
    """Active NVLinks each GPU must have; unset: only a partial outage (some links down) counts."""
    nvlink_error_limit: int | None = None
    """Summed NVLink error counters above this fail the gate; unset: not judged."""
    drain_xids: tuple[int, ...] | None = None
    """Xids that fail the gate; unset: the classifier's Xid table (``rules.toml`` ``[xid]``), with a built-in fallback
    list if it cannot be loaded."""
    xid_wait_ms: int = 0
    """How long the NVML probe waits on its event set for Xids."""
    test_mode: bool = False
    """TEST-ONLY: allows ``test_nvml_snapshot_dir``; never set it on a production cluster."""
    test_nvml_snapshot_dir: str = ""
    """TEST-ONLY (needs ``test_mode``): a file ``<dir>/<node>.json`` (an ``NvmlSnapshot``) replaces the real NVML probe
    on that node; the lab marks nodes bad with it."""

    def __post_init__(self) -> None:
        _non_negative("expected_gpus", self.expected_gpus)
        require(isinstance(self.expected_gpus_by_node, Mapping), "expected_gpus_by_node", "must be a table")
        for node, count in self.expected_gpus_by_node.items():
            _non_negative(f"expected_gpus_by_node.{node}", count)
        require(isinstance(self.max_temperature_c, int) and 0 < self.max_temperature_c < 150,
                "max_temperature_c", f"must be an integer in (0, 150), got {self.max_temperature_c!r}")
        _non_negative("nvlinks_per_gpu", self.nvlinks_per_gpu)
        _non_negative("nvlink_error_limit", self.nvlink_error_limit)
        if self.drain_xids is not None:
            require(isinstance(self.drain_xids, (list, tuple)) and all(isinstance(x, int) for x in self.drain_xids),
                    "drain_xids", f"must be a list of integers, got {self.drain_xids!r}")
            object.__setattr__(self, "drain_xids", tuple(self.drain_xids))
        _non_negative("xid_wait_ms", self.xid_wait_ms)
        require(isinstance(self.test_mode, bool), "test_mode", f"must be true or false, got {self.test_mode!r}")
        require(not self.test_nvml_snapshot_dir or self.test_mode, "test_nvml_snapshot_dir",
                "is TEST-ONLY and needs test_mode = true")

    def expected_gpus_on(self, node: str) -> int | None:
        return self.expected_gpus_by_node.get(node, self.expected_gpus)


def _non_negative(field: str, value: Any) -> None:
    ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
    require(ok, field, f"must be a non-negative integer, got {value!r}")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One reason a node is not fit to run a job."""

    category: Category
    check: str  # nvml, gpu_count, xid, gpu_lost, ecc, remap, retired_pages, nvlink, temperature, space,
    # quarantine, recovery_action
    evidence: str

    def to_dict(self) -> dict[str, str]:
        return {"category": self.category.value, "check": self.check, "evidence": self.evidence}


XidJudge = Callable[[XidEvent], bool]  # whether an Xid takes its node out of service


def judge_nvml(snap: NvmlSnapshot, config: HealthConfig, drains: XidJudge | None = None) -> list[Finding]:
    """Everything wrong with ``snap`` under ``config``; empty when the node is healthy. ``drains`` judges an Xid
    where the site config names no ``drain_xids`` (the hooks pass the classifier's table; default the fallback)."""
    expected = config.expected_gpus_on(snap.node)
    if not snap.available:
        if expected:
            return [_gpu("nvml", f"expected {expected} GPUs, {snap.error}")]
        return []
    findings = []
    if expected is not None and snap.gpu_count != expected:
        findings.append(_gpu("gpu_count", f"expected {expected} GPUs, NVML sees {snap.gpu_count}"))
    findings.extend(judge_xids(snap.xids, config, drains))
    for gpu in snap.gpus:
        findings.extend(_judge_gpu(gpu, config))
    return findings


def judge_xids(xids: Iterable[XidEvent], config: HealthConfig, drains: XidJudge | None = None) -> list[Finding]:
    """A finding per Xid that means the node must leave service (NVML events or kernel-log lines): the site's
    ``drain_xids`` if set, else ``drains`` (``fallback_drains`` when None)."""
    judge = (lambda xid: xid.xid in config.drain_xids) if config.drain_xids is not None else (drains or fallback_drains)
    found = []
    for xid in xids:
        if judge(xid):
            where = f"gpu {xid.gpu_index}" if xid.gpu_index is not None else (xid.pci_bus or "a gpu")
            origin = " (kernel log)" if xid.source == "kmsg" else ""
            found.append(_gpu("xid", f"Xid {xid.xid} on {where}{origin}: {_xid_text(xid)}"))
    return found


def _xid_text(xid: XidEvent) -> str:
    text = xid.text.split("): ", 1)[-1] if "NVRM: Xid" in xid.text else xid.text
    return text.strip()[:160]


def fallback_drains(xid: XidEvent) -> bool:
    """The fallback judge of an Xid: ``FALLBACK_DRAIN_XIDS``."""
    return xid.xid in FALLBACK_DRAIN_XIDS


def _judge_gpu(gpu: Any, config: HealthConfig) -> list[Finding]:
    name = f"gpu {gpu.index}" + (f" ({gpu.pci_bus})" if gpu.pci_bus else "")
    if gpu.error:
        return [_gpu("gpu_lost", f"{name}: NVML cannot read it: {gpu.error}")]
    found = []
    if gpu.recovery_action:  # the driver's own word: the GPU needs a reset, the node a reboot or a drain
        found.append(_gpu("recovery_action", f"{name}: the driver asks for recovery action "
                                             f"{recovery_action_name(gpu.recovery_action)}"))
    if gpu.ecc_volatile_uncorrected:
        found.append(_gpu("ecc", f"{name}: {gpu.ecc_volatile_uncorrected} uncorrected ECC errors since reset"))
    if gpu.remap_failure:
        found.append(_gpu("remap", f"{name}: row remapping failed"))
    if gpu.remap_pending:
        found.append(_gpu("remap", f"{name}: row remap pending, GPU reset required"))
    if gpu.retired_pages_pending:
        found.append(_gpu("retired_pages", f"{name}: page retirement pending, GPU reset required"))
    found.extend(_judge_nvlink(gpu, name, config))
    if gpu.temperature_c is not None and gpu.temperature_c >= config.max_temperature_c:
        found.append(_gpu("temperature", f"{name}: {gpu.temperature_c} C >= {config.max_temperature_c} C"))
    return found


def _judge_nvlink(gpu: Any, name: str, config: HealthConfig) -> list[Finding]:
    up = gpu.nvlink_up or 0
    found = []
    if config.nvlinks_per_gpu is not None:
        if up < config.nvlinks_per_gpu:
            found.append(_gpu("nvlink", f"{name}: {up} NVLinks active, expected {config.nvlinks_per_gpu}"))
    elif gpu.nvlink_down and up:  # some links up, some down: a partial outage (all down = no NVLink bridge)
        found.append(_gpu("nvlink", f"{name}: NVLinks down: {', '.join(map(str, gpu.nvlink_down))}"))
    limit = config.nvlink_error_limit
    if limit is not None and gpu.nvlink_errors is not None and gpu.nvlink_errors > limit:
        found.append(_gpu("nvlink", f"{name}: {gpu.nvlink_errors} NVLink errors > {limit}"))
    return found


def _gpu(check: str, evidence: str) -> Finding:
    return Finding(category=Category.HARDWARE_GPU, check=check, evidence=evidence)


def judge_free_space(path: str, free_bytes: int | None, min_free_gb: float) -> Finding | None:
    """A storage finding when ``free_bytes`` at ``path`` is below ``min_free_gb`` (None: unknown, no finding)."""
    if free_bytes is None or min_free_gb <= 0 or free_bytes >= min_free_gb * 2**30:
        return None
    return Finding(category=Category.STORAGE, check="space",
                   evidence=f"checkpoint dir {path}: {free_bytes / 2**30:.1f} GiB free < {min_free_gb:g} GiB")


def free_bytes_at(path: str, statvfs: Callable[[str], os.statvfs_result] = os.statvfs) -> tuple[str, int]:
    """Free bytes (for unprivileged users) on the filesystem of ``path`` or its nearest existing ancestor."""
    probe = os.path.abspath(path)
    while True:
        try:
            st = statvfs(probe)
            return probe, st.f_bavail * st.f_frsize
        except FileNotFoundError:
            parent = os.path.dirname(probe)
            if parent == probe:
                raise
            probe = parent


def recorded_snapshot_path(node: str, config: HealthConfig, environ: Mapping[str, str] | None = None) -> Path | None:
    """TEST-ONLY: the recorded snapshot that replaces NVML on ``node``, if test mode names one that exists."""
    if not config.test_mode:
        return None
    environ = os.environ if environ is None else environ
    if environ.get(env.TEST_NVML_SNAPSHOT):
        return Path(environ[env.TEST_NVML_SNAPSHOT])
    if config.test_nvml_snapshot_dir and _NODE_NAME_RE.match(node):
        path = Path(config.test_nvml_snapshot_dir) / f"{node}.json"
        return path if path.is_file() else None
    return None


def load_snapshot(path: Path, *, node: str, now: float) -> NvmlSnapshot:
    """A recorded snapshot, re-addressed to ``node`` at ``now``; a bad file is an unavailable-NVML record."""
    try:
        data = json.loads(path.read_text())
        snap = snapshot_from_dict({**data, "node": node, "time": now})
    except (OSError, ValueError, TypeError) as exc:
        return NvmlSnapshot(node=node, time=now, available=False, error=f"nvml unavailable: bad test snapshot "
                            f"{str(path)!r}: {exc}")
    xids = tuple(dataclasses.replace(x, node=node) for x in snap.xids)
    return dataclasses.replace(snap, xids=xids)


def nvml_snapshot(node: str, config: HealthConfig, *, now: float,
                  probe: Callable[[], NvmlSnapshot]) -> tuple[NvmlSnapshot, list[str]]:
    """This node's snapshot (``probe()``, or the TEST-ONLY recorded file) and notes on where it came from."""
    path = recorded_snapshot_path(node, config)
    if path is not None:
        return load_snapshot(path, node=node, now=now), [f"TEST-ONLY: NVML snapshot read from {path}"]
    return probe(), []
