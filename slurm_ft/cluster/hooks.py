"""The prolog health gate and the epilog evidence gatherer (run as root by slurmd on every node of a job).

``slurm-ft prolog``: gather (quarantine record, NVML snapshot, free space in the job's checkpoint directory),
judge, and on a node failure quarantine the node (drain reason ``slurm-ft: <category>: <evidence>``) and exit 1
so Slurm requeues the job. Trust: only the node's own evidence (NVML, kernel log, the quarantine record, Slurm's
node state) fails the node. What the job names (its checkpoint dir: missing, under /proc, full, over quota) is
the job's word: it stops that job (Comment ``slurm-ft: stopped cause=storage by=prolog ...``, then scancel) and the node
passes. A quarantine store that cannot be read is logged as an ERROR with how to repair it; the node's own
checks still decide. A healthy node passes fast. ``slurm-ft prolog --health-check`` runs the same checks
without a job (as Slurm's ``HealthCheckProgram``): a pass moves a quarantined node towards probation.

``slurm-ft epilog``: gather NVML, kernel-log Xids since the prolog ran, the ranks' error files, the node's links
that went down while the job ran (its link counters against the prolog's reading: ``slurm_ft.health.links``) and
the job's exit status into ``<state_dir>/reports/<job_id>/<node>.json`` for the monitor; hardware evidence
quarantines the node at once, so the next job does not land on it; a link that went down gives the node one
``network`` strike (soft: a first flap never drains it). It also removes the job's memory-tier directory
(``/dev/shm/slurm-ft-<job_id>``, :mod:`slurm_ft.core.shmdir`) when it is a directory of the job's uid, never
through a symlink: the backstop for ranks and a launcher that did not end cleanly. The epilog always exits 0: a bug
here must not drain a healthy cluster.

Both: no shell, no user-controlled symlinks followed, job files read only when owned by the job's uid, every
step bounded in time. The prolog also leaves ``<state_dir>/prolog/<job_id>/<node>.json`` (when it ran, what it
found) and, for an ``--ft`` job, the monitor's registry entry ``<state_dir>/jobs/<job_id>.json``. State and store:

- ``state_dir`` (top-level key of the site config): where ``reports/`` and ``quarantine.db`` live.
- ``[hooks] use_quarantine_store``: set it false where ``state_dir`` is not local to the node (SQLite WAL
  must not be shared over NFS); the hooks then drain with the tagged reason directly and the monitor adopts
  the drain into its store (``Quarantine.reconcile``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from slurm_ft.core import comment as job_comment
from slurm_ft.core import env, registry, shmdir
from slurm_ft.core.config import SiteConfig, load_site_config, require, state_dir
from slurm_ft.core.errors import SlurmFtError
from slurm_ft.core.taxonomy import Category
from slurm_ft.health import checks
from slurm_ft.health.checks import Finding, HealthConfig
from slurm_ft.health.links import LinkLoss, LinkSnapshot, link_losses, losses_text, read_links
from slurm_ft.health.records import NodeReport, NvmlSnapshot, XidEvent

T = TypeVar("T")
_NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
PROLOG_FAILED = 1


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HooksConfig:
    """``[hooks]``: limits and switches of the prolog and epilog."""

    min_free_gb: float = 1.0
    """The job's checkpoint dir needs this many GiB free; 0 disables the check."""
    nvml_timeout_s: float = 10.0
    """An NVML probe that hangs longer counts as a GPU fault."""
    space_timeout_s: float = 5.0
    """A statvfs of the checkpoint dir that hangs longer counts as a storage fault."""
    files_timeout_s: float = 10.0
    """Seconds the epilog may spend reading the ranks' error files."""
    slurm_timeout_s: float = 10.0
    """Seconds each sinfo/scontrol call may take."""
    budget_s: float = 45.0
    """Seconds for the whole hook; keep it under slurm.conf's ``PrologEpilogTimeout``."""
    max_error_file_bytes: int = 262_144
    """A rank error file larger than this is skipped with a note."""
    max_error_files: int = 256
    """At most this many rank error files are read per job."""
    kmsg_lookback_s: float = 3_600.0
    """An epilog without its prolog's record counts kernel-log Xids this many seconds back."""
    use_quarantine_store: bool = True
    """False where ``state_dir`` is shared (NFS): drain directly instead of through the SQLite quarantine store."""
    log_file: str = ""
    """The hooks' log; empty: ``<state_dir>/log/hooks.log``."""

    def __post_init__(self) -> None:
        for name in ("min_free_gb", "nvml_timeout_s", "space_timeout_s", "files_timeout_s", "slurm_timeout_s",
                     "budget_s", "kmsg_lookback_s"):
            value = getattr(self, name)
            require(isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0, name,
                    f"must be a non-negative number, got {value!r}")
        require(self.budget_s > 0, "budget_s", "must be positive")
        for name in ("max_error_file_bytes", "max_error_files"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value > 0, name,
                    f"must be a positive integer, got {value!r}")
        require(isinstance(self.use_quarantine_store, bool), "use_quarantine_store", "must be true or false")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobContext:
    """What slurmd tells a prolog/epilog through its environment."""

    node: str
    job_id: int | None = None
    uid: int | None = None
    user: str = ""
    settings: Mapping[str, str] = dataclasses.field(default_factory=dict)  # env.job_settings()
    exit_code: int | None = None  # the job script's exit status (epilog only)
    exit_signal: int | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], *, node: str | None = None) -> "JobContext":
        name = node or environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        if not _NODE_RE.match(name):
            raise SlurmFtError(f"node name {name!r} is not a valid Slurm node name")
        exit_code, exit_signal = _exit_status(environ)
        return cls(node=name, job_id=_int(environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")),
                   uid=_int(environ.get("SLURM_JOB_UID")), user=environ.get("SLURM_JOB_USER", ""),
                   settings=env.job_settings(environ), exit_code=exit_code, exit_signal=exit_signal)

    @property
    def ckpt_dir(self) -> str | None:
        return self.settings.get(env.CKPT_DIR)

    @property
    def run_dir(self) -> str | None:
        if self.settings.get(env.RUN_DIR):
            return self.settings[env.RUN_DIR]
        return os.path.join(self.ckpt_dir, ".slurm-ft") if self.ckpt_dir else None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text not in (None, "") else None
    except ValueError:
        return None


def _exit_status(environ: Mapping[str, str]) -> tuple[int | None, int | None]:
    """(exit status, signal) from ``SLURM_JOB_EXIT_CODE2`` ("<exit>:<sig>") or the wait status in ``..._CODE``."""
    two = environ.get("SLURM_JOB_EXIT_CODE2", "")
    if re.fullmatch(r"\d+:\d+", two):
        code, sig = (int(x) for x in two.split(":"))
        return code, sig or None
    status = _int(environ.get("SLURM_JOB_EXIT_CODE"))
    if status is None:
        return None, None
    return (None, status & 0x7F) if status & 0x7F else (status >> 8, None)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Everything a hook reads from the site config."""

    health: HealthConfig
    hooks: HooksConfig
    quarantine: Any  # QuarantineConfig (imported lazily: the fast path does not need it)
    state_dir: Path

    @classmethod
    def load(cls, site: SiteConfig) -> "Settings":
        from slurm_ft.cluster.quarantine import QuarantineConfig

        return cls(health=site.build("health", HealthConfig), hooks=site.build("hooks", HooksConfig),
                   quarantine=site.build("quarantine", QuarantineConfig), state_dir=state_dir(site))

    @property
    def db_path(self) -> Path:
        return self.state_dir / "quarantine.db"

    def report_dir(self, job_id: int) -> Path:
        return self.state_dir / "reports" / str(int(job_id))

    def prolog_record_path(self, job_id: int, node: str) -> Path:
        return self.state_dir / "prolog" / str(int(job_id)) / f"{node}.json"

    def registry_path(self, job_id: int) -> Path:
        """The monitor's job registry entry."""
        return registry.registry_path(self.state_dir, job_id)


@dataclasses.dataclass(slots=True)
class Deps:
    """The side effects a hook has, injectable for tests."""

    probe: Callable[[str], NvmlSnapshot]
    client: Callable[[], Any]  # -> SlurmClient
    clock: Callable[[], float] = time.time
    statvfs: Callable[[str], os.statvfs_result] = os.statvfs
    kmsg_sources: Iterable[Any] | None = None  # None: /dev/kmsg, then dmesg
    links: Callable[[str], LinkSnapshot] = read_links  # the node's link counters (slurm_ft.health.links)
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)
    shm_root: str = shmdir.SHM_ROOT  # where the jobs' memory-tier dirs are

    @classmethod
    def real(cls, settings: Settings) -> "Deps":
        def probe(node: str) -> NvmlSnapshot:
            from slurm_ft.health.nvml import NvmlProbe

            return NvmlProbe(xid_wait_ms=settings.health.xid_wait_ms).snapshot(node)

        def client() -> Any:
            from slurm_ft.slurm.cli_backend import CliSlurmClient

            return CliSlurmClient(timeout=settings.hooks.slurm_timeout_s)

        return cls(probe=probe, client=client, log=_file_logger(settings))


def _file_logger(settings: Settings) -> Callable[[str], None]:
    path = Path(settings.hooks.log_file or settings.state_dir / "log" / "hooks.log")

    def log(line: str) -> None:
        stamp = dt.datetime.now().astimezone().isoformat(timespec="seconds")
        print(line, file=sys.stderr)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
            # a job's path may hold bytes that are no UTF-8 (os.environ keeps them as surrogates): escaped, so
            # the line is written and the hook goes on to act on the node's own evidence
            with os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace") as fh:
                fh.write(f"{stamp} {line}\n")
        except OSError as exc:
            print(f"slurm-ft: cannot write {path}: {exc}", file=sys.stderr)

    return log


def bounded(fn: Callable[[], T], seconds: float, what: str) -> tuple[T | None, str | None]:
    """``(fn(), None)``, or ``(None, why)`` when it raised or ran past ``seconds`` (left running, daemonic)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except Exception as exc:  # noqa: BLE001 - reported as a gathering failure, never a crash
            box["error"] = f"{what} failed: {type(exc).__name__}: {exc}"

    worker = threading.Thread(target=run, name=f"slurm-ft {what}", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        return None, f"{what} timed out after {seconds:g} s"
    return box.get("value"), box.get("error")


# --- prolog ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PrologFacts:
    """What the prolog gathered."""

    node: str
    time: float
    snapshot: NvmlSnapshot | None = None
    quarantined: str | None = None  # the store's reason when the node is quarantined
    quarantine_category: str = ""
    space: tuple[str, int] | None = None  # (path checked, free bytes)
    links: LinkSnapshot | None = None  # the node's link counters as the job starts: the epilog compares its own
    failures: tuple[Finding, ...] = ()  # gathering steps that hung or crashed
    notes: tuple[str, ...] = ()


def gather_prolog(ctx: JobContext, settings: Settings, deps: Deps, *, with_job: bool = True) -> PrologFacts:
    now = deps.clock()
    notes: list[str] = []
    failures: list[Finding] = []
    reason, category = _quarantine_check(ctx.node, settings, deps, notes)
    snap, why = bounded(lambda: checks.nvml_snapshot(ctx.node, settings.health, now=now,
                                                     probe=lambda: deps.probe(ctx.node)),
                        settings.hooks.nvml_timeout_s, "nvml probe")
    if why:
        failures.append(Finding(category=Category.HARDWARE_GPU, check="nvml", evidence=why))
    else:
        snap, snap_notes = snap  # type: ignore[misc]
        notes.extend(snap_notes)
        if not snap.available:
            notes.append(snap.error)
    space = None
    if with_job and ctx.ckpt_dir and settings.hooks.min_free_gb > 0:
        path = ctx.ckpt_dir
        space, why = bounded(lambda: checks.free_bytes_at(path, deps.statvfs), settings.hooks.space_timeout_s,
                             f"free-space check of {path}")
        if why:
            failures.append(Finding(category=Category.STORAGE, check="space", evidence=why))
    links = _read_links(ctx, settings, deps, notes) if with_job else None
    return PrologFacts(node=ctx.node, time=now, snapshot=snap if isinstance(snap, NvmlSnapshot) else None,
                       quarantined=reason, quarantine_category=category, space=space, failures=tuple(failures),
                       notes=tuple(notes), links=links)


def _read_links(ctx: JobContext, settings: Settings, deps: Deps, notes: list[str]) -> LinkSnapshot | None:
    """The node's link counters now (bounded; a node whose counters cannot be read just has none)."""
    snap, why = bounded(lambda: deps.links(ctx.node), settings.hooks.files_timeout_s, "link counters read")
    if why:
        notes.append(why)
    return snap if isinstance(snap, LinkSnapshot) else None


def _quarantine_check(node: str, settings: Settings, deps: Deps, notes: list[str]) -> tuple[str | None, str]:
    """The store's reason if ``node`` is quarantined (after reconciling with Slurm), else None. A corrupt store
    is logged loudly and skipped: it neither opens the gate for a bad GPU (the node's own checks still run) nor
    drains anything by itself."""
    from slurm_ft.cluster.quarantine import StoreCorrupt

    if not settings.hooks.use_quarantine_store:
        return None, ""
    if not settings.db_path.exists():
        notes.append(f"no quarantine store at {settings.db_path}")
        return None, ""
    try:
        quarantine = _quarantine(settings, deps, with_client=False)
        record = quarantine.record(node)
        if record.state.value != "quarantined":
            return None, ""
        quarantine.client = deps.client()  # rare path: let Slurm's view win (an admin may have resumed it)
        notes.extend(quarantine.reconcile())
        record = quarantine.record(node)
    except StoreCorrupt as exc:
        deps.log(f"slurm-ft prolog node={node}: ERROR {exc}")
        return None, ""
    except SlurmFtError as exc:
        notes.append(f"quarantine check failed: {exc}")
        return None, ""
    if record.state.value != "quarantined":
        return None, ""
    return record.reason or "quarantined", record.category


def judge_prolog(facts: PrologFacts, settings: Settings) -> list[Finding]:
    """Why this node must not run the job (empty: it may)."""
    findings: list[Finding] = []
    if facts.quarantined:
        cat = facts.quarantine_category or Category.UNKNOWN.value
        findings.append(Finding(category=Category(cat), check="quarantine",
                                evidence=f"node is quarantined ({facts.quarantined})"))
    findings.extend(facts.failures)
    if facts.snapshot is not None:
        findings.extend(checks.judge_nvml(facts.snapshot, settings.health, drains))
    if facts.space is not None:
        path, free = facts.space
        found = checks.judge_free_space(path, free, settings.hooks.min_free_gb)
        if found:
            findings.append(found)
    return findings


# Checks of what the job names (its checkpoint dir): the job's word, so they fail the job, never the node.
JOB_SIDE_CHECKS = frozenset({"space"})


def run_prolog(ctx: JobContext, settings: Settings, deps: Deps) -> int:
    facts = gather_prolog(ctx, settings, deps)
    findings = judge_prolog(facts, settings)
    node_findings = [f for f in findings if f.check not in JOB_SIDE_CHECKS]
    job_findings = [f for f in findings if f.check in JOB_SIDE_CHECKS]
    label = f"slurm-ft prolog job={ctx.job_id} node={ctx.node}"
    for note in facts.notes:
        deps.log(f"{label}: note: {note}")
    if ctx.job_id is not None:
        if ctx.settings.get(env.ENABLED) == "1":
            _write_json(settings.registry_path(ctx.job_id), _registration(ctx), deps)
        _write_json(settings.prolog_record_path(ctx.job_id, ctx.node), {
            "job_id": ctx.job_id, "node": ctx.node, "time": facts.time, "passed": not node_findings,
            "findings": [f.to_dict() for f in node_findings], "job_findings": [f.to_dict() for f in job_findings],
            "notes": list(facts.notes), **({"links": facts.links.to_dict()} if facts.links is not None else {})},
            deps)
    for finding in job_findings:
        deps.log(f"{label}: JOB FAIL {finding.category.value}: {finding.evidence} (the job's own path: "
                 "the job is stopped, the node stays in service)")
    if not node_findings:
        if job_findings:
            _stop_job(ctx, job_findings, deps, label)
        else:
            deps.log(f"{label}: ok")
        return 0
    for finding in node_findings:
        deps.log(f"{label}: FAIL {finding.category.value}: {finding.evidence}")
    if not facts.quarantined:
        _quarantine_node(ctx, node_findings, settings, deps, source="prolog")
    return PROLOG_FAILED


def _stop_job(ctx: JobContext, findings: list[Finding], deps: Deps, label: str) -> None:
    """Stop the job (not the node) for a problem with what it named: its Comment says why, then scancel."""
    if ctx.job_id is None:
        return
    first = findings[0]
    reason = job_comment.stopped(first.category.value, "by=prolog: the job's checkpoint dir", [first.evidence])
    try:
        client = deps.client()
        client.update_job(ctx.job_id, comment=reason)
        client.cancel(ctx.job_id)
    except SlurmFtError as exc:
        deps.log(f"{label}: could not stop the job: {exc}")


def _registration(ctx: JobContext) -> dict[str, Any]:
    """The monitor's registry entry (``registry.FtJob``) for an --ft job, from its SPANK options."""
    job = registry.FtJob.from_settings(ctx.job_id, ctx.settings, run_dir=ctx.run_dir or "",
                                       max_restarts=_int(ctx.settings.get(env.MAX_RESTARTS)), user_id=ctx.uid)
    return dataclasses.asdict(job)


def run_health_check(ctx: JobContext, settings: Settings, deps: Deps) -> int:
    """Slurm HealthCheckProgram mode: failing checks quarantine, a pass counts towards release."""
    facts = gather_prolog(ctx, settings, deps, with_job=False)
    findings = [f for f in judge_prolog(facts, settings) if f.check != "quarantine"]
    label = f"slurm-ft health-check node={ctx.node}"
    if findings:
        for finding in findings:
            deps.log(f"{label}: FAIL {finding.category.value}: {finding.evidence}")
        _quarantine_node(ctx, findings, settings, deps, source="health-check")
        return 1
    if settings.hooks.use_quarantine_store and settings.db_path.exists():
        state = _quarantine(settings, deps, with_client=True).health_passed(ctx.node)
        deps.log(f"{label}: ok ({state.value})")
    else:
        deps.log(f"{label}: ok")
    return 0


# --- epilog ----------------------------------------------------------------------------------------------


def gather_epilog(ctx: JobContext, settings: Settings, deps: Deps) -> NodeReport:
    from slurm_ft.health import jobfiles, kmsg

    now = deps.clock()
    notes: list[str] = []
    snap, why = bounded(lambda: checks.nvml_snapshot(ctx.node, settings.health, now=now,
                                                     probe=lambda: deps.probe(ctx.node)),
                        settings.hooks.nvml_timeout_s, "nvml probe")
    if why:
        notes.append(why)
        snap = NvmlSnapshot(node=ctx.node, time=now, available=False, error=f"nvml unavailable: {why}")
    else:
        snap, snap_notes = snap  # type: ignore[misc]
        notes.extend(snap_notes)
    since = _job_start(ctx, settings) or now - settings.hooks.kmsg_lookback_s
    found, why = bounded(lambda: kmsg.read_xids(ctx.node, since=since, sources=deps.kmsg_sources),
                         settings.hooks.nvml_timeout_s, "kernel log read")
    xids: list[XidEvent] = []
    if why:
        notes.append(why)
    else:
        xids, kmsg_notes = found  # type: ignore[misc]
        notes.extend(kmsg_notes)
    errors: list[dict[str, Any]] = []
    if ctx.run_dir and ctx.uid is not None:
        limits = jobfiles.FileLimits(max_bytes=settings.hooks.max_error_file_bytes,
                                     max_files=settings.hooks.max_error_files)
        run_dir, uid = ctx.run_dir, ctx.uid
        read, why = bounded(lambda: jobfiles.read_error_files(run_dir, uid, limits),
                            settings.hooks.files_timeout_s, f"reading error files in {run_dir}")
        if why:
            notes.append(why)
        else:
            errors, file_notes = read  # type: ignore[misc]
            notes.extend(file_notes)
    elif ctx.run_dir:
        notes.append("SLURM_JOB_UID not set: error files not read")
    losses = _link_losses(ctx, settings, deps, notes)
    return NodeReport(job_id=ctx.job_id or 0, node=ctx.node, time=now, nvml=snap, kmsg_xids=tuple(xids),
                      error_files=tuple(errors), exit_code=ctx.exit_code, exit_signal=ctx.exit_signal,
                      notes=tuple(notes), link_losses=tuple(loss.to_dict() for loss in losses))


def _link_losses(ctx: JobContext, settings: Settings, deps: Deps, notes: list[str]) -> tuple[LinkLoss, ...]:
    """The node's links that went down while the job ran: its counters now against the prolog's reading."""
    before = LinkSnapshot.from_dict(_prolog_record(ctx, settings).get("links"))
    if before is None:
        return ()
    after = _read_links(ctx, settings, deps, notes)
    return link_losses(before, after) if after is not None else ()


def _prolog_record(ctx: JobContext, settings: Settings) -> dict[str, Any]:
    """What this node's prolog recorded for the job (``{}`` when it left nothing readable)."""
    if ctx.job_id is None:
        return {}
    path = settings.prolog_record_path(ctx.job_id, ctx.node)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd) as fh:
            data = json.loads(fh.read(65_536))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _job_start(ctx: JobContext, settings: Settings) -> float | None:
    """When this node's prolog ran for the job, if it left a record."""
    try:
        return float(_prolog_record(ctx, settings)["time"])
    except (KeyError, TypeError, ValueError):
        return None


def judge_epilog(report: NodeReport, settings: Settings) -> list[Finding]:
    """Hardware evidence in the report that must take the node out of service now."""
    findings = checks.judge_nvml(report.nvml, settings.health, drains) if report.nvml else []
    findings.extend(checks.judge_xids(report.kmsg_xids, settings.health, drains))
    return findings


def drains(xid: XidEvent) -> bool:
    """The classifier's Xid table (``slurm_ft.classify.rules.is_drain_xid``), loaded on the first Xid seen, not at
    every prolog's start-up."""
    from slurm_ft.classify.rules import is_drain_xid

    return is_drain_xid(xid)


def run_epilog(ctx: JobContext, settings: Settings, deps: Deps) -> int:
    label = f"slurm-ft epilog job={ctx.job_id} node={ctx.node}"
    if ctx.job_id is None:
        deps.log(f"{label}: SLURM_JOB_ID not set, nothing to report")
        return 0
    _remove_memory_tier(ctx, deps, label)
    report = gather_epilog(ctx, settings, deps)
    findings = judge_epilog(report, settings)
    report = dataclasses.replace(report, health=tuple(f.to_dict() for f in findings))
    _write_json(settings.report_dir(ctx.job_id) / f"{ctx.node}.json", report.to_dict(), deps)
    for note in report.notes:
        deps.log(f"{label}: note: {note}")
    if findings:
        for finding in findings:
            deps.log(f"{label}: FAIL {finding.category.value}: {finding.evidence}")
        if _prolog_record(ctx, settings).get("passed") is False:
            deps.log(f"{label}: the prolog already failed this node for the job: no second strike")
        else:
            _quarantine_node(ctx, findings, settings, deps, source="epilog")
    elif report.link_losses:
        _strike_link(ctx, tuple(LinkLoss.from_dict(d) for d in report.link_losses), settings, deps, label)
    deps.log(f"{label}: report written ({len(report.error_files)} error files, {len(report.kmsg_xids)} Xids)")
    return 0


def _remove_memory_tier(ctx: JobContext, deps: Deps, label: str) -> None:
    """The job's memory-tier dir on this node, if the job's uid owns it (a job that ended resumes from disk)."""
    if ctx.uid is None:
        return
    try:
        done = shmdir.remove_job_dir(deps.shm_root, str(ctx.job_id), ctx.uid)
    except (OSError, ValueError) as exc:  # never let cleanup fail the epilog
        done = f"left: {exc}"
    if not done.startswith("absent"):
        deps.log(f"{label}: memory tier: {done}")


# --- acting ----------------------------------------------------------------------------------------------


def _quarantine(settings: Settings, deps: Deps, *, with_client: bool) -> Any:
    from slurm_ft.cluster.quarantine import Quarantine, QuarantineStore

    return Quarantine(QuarantineStore(settings.db_path), settings.quarantine,
                      deps.client() if with_client else None, deps.clock)


def _quarantine_node(ctx: JobContext, findings: list[Finding], settings: Settings, deps: Deps, *,
                     source: str) -> None:
    """Take the node out of service: the store (which drains) or, without a local store, a direct drain."""
    from slurm_ft.cluster.quarantine import drain_reason, drain_tagged

    first = next((f for f in findings if f.category.value in settings.quarantine.hardware_categories), findings[0])
    evidence = "; ".join(dict.fromkeys(f.evidence for f in findings))
    try:
        if settings.hooks.use_quarantine_store:
            _quarantine(settings, deps, with_client=True).add(ctx.node, evidence, category=first.category,
                                                             by=source, job_id=ctx.job_id)
        else:
            reason = drain_reason(first.category.value, evidence, settings.quarantine.reason_max_chars)
            outcome = drain_tagged(deps.client(), ctx.node, reason)
            deps.log(f"slurm-ft {source} node={ctx.node}: {outcome.value}")
    except SlurmFtError as exc:
        deps.log(f"slurm-ft {source} node={ctx.node}: could not quarantine: {exc}")


def _strike_link(ctx: JobContext, losses: tuple[LinkLoss, ...], settings: Settings, deps: Deps, label: str) -> None:
    """A link of this node went down while the job ran (its own counters): one ``network`` strike, never a drain by
    itself (a soft strike: the quarantine drains only a node that keeps doing it). Without a local store there is
    nothing to count strikes in: the report keeps it."""
    evidence = losses_text(losses)
    if not settings.hooks.use_quarantine_store:
        deps.log(f"{label}: network: {evidence} (no local quarantine store: in the report only, no strike)")
        return
    try:
        state = _quarantine(settings, deps, with_client=True).strike(ctx.node, Category.NETWORK, evidence,
                                                                     ctx.job_id, source="epilog")
    except SlurmFtError as exc:
        deps.log(f"{label}: could not strike for {evidence}: {exc}")
        return
    deps.log(f"{label}: STRIKE network: {evidence} -> {state.value}")


def _write_json(path: Path, payload: dict[str, Any], deps: Deps) -> None:
    """Atomic write (temp file + rename) of a root-owned, world-readable report."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w") as fh:
            json.dump(payload, fh, sort_keys=True)
        os.replace(tmp, path)
    except OSError as exc:
        deps.log(f"slurm-ft: cannot write {path}: {exc}")


# --- entry points ----------------------------------------------------------------------------------------


def run_hook(kind: str, *, config: str | None, node: str | None = None, health_check: bool = False,
             environ: Mapping[str, str] | None = None, deps: Deps | None = None) -> int:
    """Run the prolog or epilog; never raises. The prolog fails only on a finding (exit 1)."""
    environ = os.environ if environ is None else environ
    try:
        settings = Settings.load(load_site_config(config))
        ctx = JobContext.from_environ(environ, node=node)
    except SlurmFtError as exc:
        print(f"slurm-ft {kind}: {exc}", file=sys.stderr)
        return 0 if kind == "epilog" else 2  # a broken config fails the gate loudly; it drains the node
    deps = deps or Deps.real(settings)
    _arm_budget(kind, settings.hooks.budget_s, deps)
    try:
        if kind == "epilog":
            return run_epilog(ctx, settings, deps)
        return run_health_check(ctx, settings, deps) if health_check else run_prolog(ctx, settings, deps)
    except Exception as exc:  # noqa: BLE001 - a bug must not drain healthy nodes: log it loudly, pass
        deps.log(f"slurm-ft {kind} node={ctx.node}: internal error, passing: {type(exc).__name__}: {exc}")
        return 0
    finally:
        signal.alarm(0)


def _arm_budget(kind: str, seconds: float, deps: Deps) -> None:
    """The last line of defence on time: past the budget the hook exits (prolog: fails) without cleanup."""
    if threading.current_thread() is not threading.main_thread():
        return

    def expire(signum: int, frame: Any) -> None:
        deps.log(f"slurm-ft {kind}: exceeded its {seconds:g} s budget")
        os._exit(PROLOG_FAILED if kind == "prolog" else 0)

    signal.signal(signal.SIGALRM, expire)
    signal.alarm(max(1, int(seconds + 0.999)))


def _add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--config", help=f"site config (default ${env.SITE_CONFIG} or {env.DEFAULT_SITE_CONFIG})")
    parser.add_argument("--node", help="node name (default $SLURMD_NODENAME, else the host name)")
    if name == "prolog":
        parser.add_argument("--health-check", action="store_true",
                            help="run the checks without a job (HealthCheckProgram mode)")


def register(subparsers: Any, name: str) -> None:
    helps = {"prolog": "the node health gate slurmd runs before a job (as root)",
             "epilog": "gather node evidence after a job for the monitor (as root)"}
    parser = subparsers.add_parser(name, help=helps[name], description=__doc__.split("\n\n")[0])
    _add_arguments(parser, name)
    parser.set_defaults(func=lambda args: run_hook(name, config=args.config, node=args.node,
                                                   health_check=getattr(args, "health_check", False)))


def main(argv: list[str] | None = None) -> int:
    """``python -m slurm_ft.cluster.hooks prolog|epilog [--config PATH]``: what the installed wrappers run."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="slurm-ft-hook")
    sub = parser.add_subparsers(dest="kind", required=True)
    for name in ("prolog", "epilog"):
        _add_arguments(sub.add_parser(name), name)
    args = parser.parse_args(argv)
    return run_hook(args.kind, config=args.config, node=args.node,
                    health_check=getattr(args, "health_check", False))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
