"""The job monitor: one batched poll of Slurm, then classify and act on every --ft job that ended.

Which jobs: those with ``<state_dir>/jobs/<job_id>.json`` (``{ckpt_dir, run_dir, max_restarts, user_id,
no_requeue}``), written by the prolog (root, from the SPANK options; preferred) or else by ``slurm-ft launch``;
read without following symlinks, owned by root, us or the job's user, uid checked. A Comment starting with
``slurm-ft:`` marks a job too (no checkpoint dir known then).

Each poll is one ``jobs()`` and one ``nodes()`` call, whatever the number of jobs. For a job that ended: gather
node reports (``<state_dir>/reports/<job_id>/*.json``), the ranks' error files and the node states of the same
poll; classify; decide (budget ``max_restarts``, crash loop = no newer checkpoint than at the last requeue,
``--ft-no-requeue``, the launcher's own stop); then either requeue it (held, ExcNodeList += culprits, Comment
``slurm-ft: restart=K resume_step=S cause=C``, released) or leave it ended with the verdict in the log and the
state DB (``slurm-ft status``). Slurm 22.05 refuses to change the Comment of a finished job, so the launcher
writes its stop verdict (``slurm-ft: stopped cause=C by=launch ...``) while the job still runs.

Coexisting with Slurm's own requeue (JobRequeue=1 requeues a batch job that ends NODE_FAIL): the monitor leaves
a requeueable NODE_FAIL job to Slurm and *adopts* the requeue it sees (restart count up, pending): strike and
exclude the dead nodes, set the resume hint. Every other failure is requeued by the monitor. Nodes:

- culprits of a verdict named by their own evidence (Slurm's node states, the epilog's NVML and kernel-log
  findings: ``Verdict.attested_nodes``) get one quarantine strike per job; culprits named only by the job's
  word (its error files' hosts, its logs) are excluded from that job's next run if they are its own nodes,
  never struck;
- a node Slurm calls down or not responding under a running job (``--no-kill``: the job lives on, its launcher
  swaps in a spare) gets a hardware_node strike;
- nodes the launcher names in ``slurm-ft: tempfail bad_nodes=a+b`` (its probe failed them) are excluded from
  that job's next run, never struck: a user's Comment must not drain a node.

Every action is written to SQLite as ``intent`` before it is taken and ``done`` after, keyed by (job_id,
restart_count, action): a monitor killed in between reconciles on its next poll and never requeues twice.

Robustness: one monitor per state dir (``monitor.lock``); an error of one job or one poll is logged and the next
poll comes after a growing pause; only the monitor's own database breaking ends it. The job's checkpoint dir
(for the resume hint) is read through the safe reader (``health.jobfiles``): no symlinks, owner checked,
non-blocking, size-capped.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import fcntl
import json
import logging
import os
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from slurm_ft.classify import classify
from slurm_ft.classify.records import Evidence, JobEnd, NodeEvent, error_record_from_dict
from slurm_ft.cluster import stop_note
from slurm_ft.cluster.metrics import Metrics, serve
from slurm_ft.cluster.quarantine import (
    Quarantine,
    QuarantineConfig,
    QuarantineStore,
    StoreCorrupt,
    default_db_path,
    parse_slurm_user,
    require_privileged,
)
from slurm_ft.core import comment as job_comment
from slurm_ft.core import config as ft_config
from slurm_ft.core import env
from slurm_ft.core.budget import NOT_FAULTS, Budget
from slurm_ft.core.config import require
from slurm_ft.core.errors import SlurmCommandError, SlurmFtError
from slurm_ft.core.registry import FtJob, registry_path
from slurm_ft.core.taxonomy import Action, Verdict
from slurm_ft.health.jobfiles import latest_step, read_error_files, read_trusted_json
from slurm_ft.health.records import NodeReport
from slurm_ft.slurm.backend import make_client
from slurm_ft.slurm.types import JobInfo, JobState, NodeInfo, SlurmClient

log = logging.getLogger("slurm_ft.cluster.monitor")

DB_NAME = "monitor.db"


_REQUEUED = frozenset({JobState.PENDING, JobState.REQUEUED, JobState.REQUEUE_HOLD, JobState.EXPEDITING})


class JobStatus(str, enum.Enum):
    """What the monitor knows about one job."""

    WATCHING = "watching"  # running or pending; nothing to do yet
    REQUEUED = "requeued"  # requeued by us; waiting for it to run again
    STOPPED = "stopped"  # ended for good, with the reason in its Comment
    DONE = "done"  # completed successfully
    GONE = "gone"  # ended while the monitor was not watching, and Slurm no longer lists it: judged, not requeued


class ActionState(str, enum.Enum):
    INTENT = "intent"  # written before the Slurm call
    DONE = "done"  # written after it succeeded


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MonitorConfig:
    """``[monitor]``: the monitor daemon (``slurm-ft monitor``); flags override the file."""

    poll_interval_s: float = 30.0
    """Seconds between two polls of Slurm, each one ``squeue`` and one ``sinfo`` for every job (``--poll``); within (0,
    3600]."""
    state_dir: Path = Path("/var/lib/slurm-ft")
    """Where the monitor keeps ``monitor.db`` and reads the job registry and node reports (``--state-dir``; else the
    site config's ``state_dir``)."""
    default_max_restarts: int = 3
    """The restart budget of a job that registered none of its own (``--ft-max-restarts``); within [0, 1000]."""
    metrics_port: int = 0
    """Port of the Prometheus endpoint, bound to 127.0.0.1 (``--metrics-port``); 0 turns it off."""
    dry_run: bool = False
    """Decide and log every action, change nothing in Slurm (``--dry-run``)."""

    def __post_init__(self) -> None:
        require(isinstance(self.poll_interval_s, (int, float)) and 0 < self.poll_interval_s <= 3600,
                "poll_interval_s", f"must be within (0, 3600] seconds (--poll), got {self.poll_interval_s!r}")
        require(str(self.state_dir) != "", "state_dir", "must not be empty (--state-dir)")
        object.__setattr__(self, "state_dir", Path(self.state_dir))
        require(isinstance(self.default_max_restarts, int) and 0 <= self.default_max_restarts <= 1000,
                "default_max_restarts", f"must be an integer within [0, 1000], got {self.default_max_restarts!r}")
        require(isinstance(self.metrics_port, int) and 0 <= self.metrics_port <= 65535,
                "metrics_port", f"must be within [0, 65535] (--metrics-port), got {self.metrics_port!r}")


# --- the job registry (FtJob, registry_path, write_registration: slurm_ft.core.registry) -----------------------
def registered_but_unlisted(state_dir: Path, listed: set[int], closed: set[int]) -> list[int]:
    """Job ids with a registry entry that Slurm did not list and the monitor has not closed (names only: no
    file is read for a job the monitor is done with)."""
    try:
        names = os.listdir(Path(state_dir) / "jobs")
    except (FileNotFoundError, NotADirectoryError):
        return []
    ids = {int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit()}
    return sorted(ids - listed - closed)


def read_registration_file(state_dir: Path, job_id: int) -> FtJob:
    """The registry entry of a job Slurm no longer lists: trusted when root (the prolog) or its owner (the
    launcher, as the job's user) wrote it, the owner then being the job's uid."""
    owner = os.lstat(registry_path(state_dir, job_id)).st_uid
    user = None if owner in (0, os.geteuid()) else owner  # read_registration checks the entry names that uid
    found = read_registration(state_dir, JobInfo(job_id=job_id, user_id=user, state=JobState.UNKNOWN))
    if found is None:
        raise ValueError(f"registry entry of job {job_id} vanished")
    return found


def read_registration(state_dir: Path, job: JobInfo) -> FtJob | None:
    """The registry entry for ``job``, a bare entry when only its Comment marks it ours, else None."""
    trusted = {0, os.geteuid()} | ({job.user_id} if job.user_id is not None else set())
    data = read_trusted_json(registry_path(state_dir, job.job_id), trusted)
    if data is None:
        return FtJob(job_id=job.job_id, user_id=job.user_id) if job_comment.is_ours(job.comment) else None
    if not isinstance(data, dict):
        raise ValueError(f"registry entry of job {job.job_id} is not a JSON object")
    user_id = data.get("user_id")
    if job.user_id is not None and user_id is not None and int(user_id) != job.user_id:
        raise ValueError(f"registry entry of job {job.job_id} names uid {user_id}, the job runs as {job.user_id}")
    budget = data.get("max_restarts")
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 0):
        raise ValueError(f"registry entry of job {job.job_id}: max_restarts must be an integer >= 0, got {budget!r}")
    return FtJob(job_id=job.job_id, ckpt_dir=str(data.get("ckpt_dir") or ""), run_dir=str(data.get("run_dir") or ""),
                 max_restarts=budget, user_id=job.user_id if job.user_id is not None else user_id,
                 no_requeue=data.get("no_requeue") in (True, 1, "1"))


# --- the SQLite state ------------------------------------------------------------------------------------------
class MonitorDb:
    """Jobs seen and actions taken, in ``<state_dir>/monitor.db`` (WAL)."""

    def __init__(self, path: Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        # one Monitor uses it from one thread at a time; it may be created in another (the demo's thread)
        self.conn = sqlite3.connect(str(path), timeout=15.0, isolation_level=None, check_same_thread=False)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.executescript("""
            CREATE TABLE IF NOT EXISTS jobs (
                job_id INTEGER PRIMARY KEY, restart_count INTEGER NOT NULL, last_resume_step INTEGER,
                status TEXT NOT NULL, requeued_at REAL, updated REAL NOT NULL, nodes TEXT);
            CREATE TABLE IF NOT EXISTS actions (
                job_id INTEGER NOT NULL, restart_count INTEGER NOT NULL, action TEXT NOT NULL,
                state TEXT NOT NULL, detail TEXT NOT NULL, time REAL NOT NULL,
                PRIMARY KEY (job_id, restart_count, action));
        """)

    def job(self, job_id: int) -> sqlite3.Row | None:
        return self.conn.execute("SELECT * FROM jobs WHERE job_id=?", (job_id,)).fetchone()

    def set_job(self, job_id: int, *, restart_count: int, status: JobStatus, now: float,
                last_resume_step: int | None = None, requeued_at: float | None = None,
                nodes: Iterable[str] | None = None) -> None:
        self.conn.execute(
            "INSERT INTO jobs (job_id, restart_count, last_resume_step, status, requeued_at, updated, nodes)"
            " VALUES (?,?,?,?,?,?,?) ON CONFLICT(job_id) DO UPDATE SET restart_count=excluded.restart_count,"
            " nodes=COALESCE(excluded.nodes, nodes),"
            " last_resume_step=COALESCE(excluded.last_resume_step, last_resume_step), status=excluded.status,"
            " requeued_at=COALESCE(excluded.requeued_at, requeued_at), updated=excluded.updated",
            (job_id, restart_count, last_resume_step, status.value, requeued_at, now,
             None if nodes is None else json.dumps(list(nodes))))

    def closed_ids(self) -> set[int]:
        """Jobs the monitor is done with (stopped, done, gone)."""
        closed = (JobStatus.STOPPED.value, JobStatus.DONE.value, JobStatus.GONE.value)
        return {r[0] for r in self.conn.execute("SELECT job_id FROM jobs WHERE status IN (?,?,?)", closed)}

    def action(self, job_id: int, restart_count: int, action: str) -> sqlite3.Row | None:
        return self.conn.execute("SELECT * FROM actions WHERE job_id=? AND restart_count=? AND action=?",
                                 (job_id, restart_count, action)).fetchone()

    def pending(self, job_id: int) -> list[sqlite3.Row]:
        return self.conn.execute("SELECT * FROM actions WHERE job_id=? AND state=? ORDER BY restart_count",
                                 (job_id, ActionState.INTENT.value)).fetchall()

    def intent(self, job_id: int, restart_count: int, action: str, detail: dict[str, Any], now: float) -> None:
        self.conn.execute("INSERT OR REPLACE INTO actions VALUES (?,?,?,?,?,?)",
                          (job_id, restart_count, action, ActionState.INTENT.value, json.dumps(detail), now))

    def done(self, job_id: int, restart_count: int, action: str, now: float) -> None:
        self.conn.execute("UPDATE actions SET state=?, time=? WHERE job_id=? AND restart_count=? AND action=?",
                          (ActionState.DONE.value, now, job_id, restart_count, action))

    def struck(self, job_id: int, node: str) -> bool:
        return self.conn.execute("SELECT 1 FROM actions WHERE job_id=? AND action=?",
                                 (job_id, f"strike:{node}")).fetchone() is not None

    def record_strike(self, job_id: int, restart_count: int, node: str, category: str, now: float) -> None:
        self.conn.execute("INSERT OR IGNORE INTO actions VALUES (?,?,?,?,?,?)",
                          (job_id, restart_count, f"strike:{node}", ActionState.DONE.value,
                           json.dumps({"node": node, "category": category}), now))

    def forget(self, job_id: int, restart_count: int, action: str) -> None:
        self.conn.execute("DELETE FROM actions WHERE job_id=? AND restart_count=? AND action=?",
                          (job_id, restart_count, action))

    def close(self) -> None:
        self.conn.close()


# --- evidence -------------------------------------------------------------------------------------------------
def load_reports(state_dir: Path, job_id: int) -> tuple[list[Any], list[str]]:
    """The epilog's node reports for ``job_id`` (files owned by root or us), plus notes on what was skipped."""
    folder = Path(state_dir) / "reports" / str(int(job_id))
    reports, notes = [], []
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    except FileNotFoundError:
        return [], [f"no node reports in {folder}"]
    for name in names:
        try:
            data = read_trusted_json(folder / name, {0, os.geteuid()})
            if data is not None:
                reports.append(NodeReport.from_dict(data))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            notes.append(f"{folder / name}: skipped: {exc}")
    return reports, notes


def load_errors(run_dir: str, uid: int | None) -> tuple[list[Any], list[str]]:
    """The ranks' error files in ``run_dir``, read as the job's uid would own them (no symlinks followed)."""
    if not run_dir:
        return [], []
    if uid is None:
        return [], [f"{run_dir}: job uid unknown, error files not read"]

    dicts, notes = read_error_files(run_dir, uid)
    return [r for r in (error_record_from_dict(d) for d in dicts) if r is not None], notes


def gather_evidence(state_dir: Path, job: JobInfo, ft: FtJob, nodes: dict[str, NodeInfo]) -> Evidence:
    reports, _ = load_reports(state_dir, job.job_id)
    errors, _ = load_errors(ft.run_dir, ft.user_id)
    events = [NodeEvent.from_node_info(nodes[n]) for n in job.nodes if n in nodes]
    evidence = Evidence.from_node_reports(JobEnd.from_job_info(job), reports, node_events=events)
    if errors:
        merged = {(e.rank, e.time, e.exc_type, e.pid): e for e in (*evidence.errors, *errors)}
        evidence = dataclasses.replace(evidence, errors=tuple(sorted(merged.values(), key=lambda e: (e.time, e.rank))))
    return evidence


# --- decisions ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """What to do about one ended job: requeue (with excluded nodes) or stop (with a reason).

    ``culprits`` get a quarantine strike (the classifier's nodes: Slurm's node states, the epilog's reports);
    ``exclude`` only keeps this job off nodes its own launcher found bad (``bad_nodes=`` in its Comment)."""

    requeue: bool
    category: str
    reason: str
    culprits: tuple[str, ...] = ()
    resume_step: int | None = None
    exclude: tuple[str, ...] = ()


def decide(job: JobInfo, ft: FtJob, verdict: Verdict, *, resume_step: int | None, budget: int,
           previous_resume_step: int | None, restarted_before: bool) -> Decision:
    """Pure: the verdict, the launcher's word (the job's Comment), the restart budget and checkpoint progress
    -> requeue or stop."""
    category = verdict.category.value
    culprits = struck_nodes(verdict, job)
    if not verdict.recoverable or verdict.action in (Action.STOP, Action.NONE):
        return Decision(requeue=False, category=category, reason="not recoverable", resume_step=resume_step)
    launcher_stop = job_comment.parse_launcher_stop(job.comment)
    if launcher_stop is not None and not culprits:  # it saw the same root cause at the same step twice
        return Decision(requeue=False, category=category, reason=f"stopped by slurm-ft launch ({launcher_stop})",
                        resume_step=resume_step)
    if ft.no_requeue:
        return Decision(requeue=False, category=category, reason="recoverable, but the job asked for no requeue "
                        "(--ft-no-requeue)", resume_step=resume_step)
    used = Budget(limit=budget, requeues=job.restart_count, **job_comment.counts(job.comment))  # in place and requeues
    if used.left == 0 and category not in NOT_FAULTS:
        return Decision(requeue=False, category=category, reason=f"restart budget exhausted ({used.used} of {budget} "
                        "restarts used, in place and requeues together)", resume_step=resume_step)
    if restarted_before and resume_step == previous_resume_step:
        return Decision(requeue=False, category=category,
                        reason=f"crash loop: no checkpoint progress since the last restart (step {resume_step})",
                        resume_step=resume_step)
    said = (*verdict.culprit.nodes, *job_comment.parse_bad_nodes(job.comment))  # the job's word: its own nodes only
    exclude = tuple(dict.fromkeys(n for n in said if n in job.nodes and n not in culprits))
    return Decision(requeue=True, category=category, reason="recoverable", culprits=culprits,
                    resume_step=resume_step, exclude=exclude)


def struck_nodes(verdict: Verdict, job: JobInfo) -> tuple[str, ...]:
    """The culprit nodes that get a quarantine strike: named by their own evidence, and nodes of this job."""
    return tuple(n for n in verdict.attested_nodes if n in verdict.culprit.nodes and (not job.nodes or n in job.nodes))


MAX_BACKOFF_S = 60.0


def backoff_s(interval: float, failures: int) -> float:
    """The pause before the next poll: the interval, doubled per consecutive failed poll, at most a minute."""
    return min(interval * 2 ** min(failures, 16), max(interval, MAX_BACKOFF_S))


def launcher_lost(job: JobInfo) -> bool:
    """A running job whose batch host is no longer among its nodes: Slurm removed the failed node from a
    ``--no-kill`` job, and the batch script (slurm-ft's launcher) with it."""
    return job.state is JobState.RUNNING and bool(job.batch_host) and bool(job.nodes) \
        and job.batch_host not in job.nodes


# --- the monitor ----------------------------------------------------------------------------------------------
class Monitor:
    """Polls Slurm, classifies ended --ft jobs and requeues or stops them. Survives one bad job."""

    def __init__(self, config: MonitorConfig, client: SlurmClient, classify_fn: Callable[[Evidence], Verdict],
                 quarantine: Any = None, clock: Callable[[], float] = time.time,
                 metrics: Metrics | None = None, tell_user: Callable[..., str] | None = None) -> None:
        self.config = config
        self.client = client
        self.classify_fn = classify_fn
        self.quarantine = quarantine
        self.clock = clock
        self.metrics = metrics or Metrics()
        self.tell_user = tell_user or stop_note.tell_user  # a stop's verdict to the run dir and output, as the user
        self.db = MonitorDb(Path(config.state_dir) / DB_NAME)

    # --- public ---------------------------------------------------------------------------------------------
    def poll_once(self) -> int:
        """One poll: one ``jobs()`` and one ``nodes()`` call, then each --ft job. Returns how many were acted on."""
        jobs = self.client.jobs()
        nodes = {n.name: n for n in self.client.nodes()}
        acted = 0
        for job in jobs:
            try:
                acted += self._handle(job, nodes)
            except Exception as exc:  # a daemon survives one bad job: log it, go on
                self._event("job_error", job_id=job.job_id, error=f"{type(exc).__name__}: {exc}")
        for job_id in registered_but_unlisted(self.config.state_dir, {j.job_id for j in jobs}, self.db.closed_ids()):
            try:
                acted += self._gone(job_id, nodes)
            except sqlite3.Error:
                raise
            except Exception as exc:  # noqa: BLE001 - one bad registry entry is logged once, never again
                self._event("job_error", job_id=job_id, error=f"{type(exc).__name__}: {exc}")
                self.db.set_job(job_id, restart_count=0, status=JobStatus.GONE, now=self.clock())
        if self.quarantine is not None:
            try:
                self.metrics.set_quarantined(sum(1 for r in self.quarantine.list()
                                                 if str(getattr(r, "state", "")).endswith("quarantined")))
                self.metrics.set_store_ok(True)
            except Exception as exc:
                self.metrics.set_store_ok(not isinstance(exc, StoreCorrupt))
                self._event("quarantine_error", error=f"{type(exc).__name__}: {exc}")
        return acted

    def run(self, *, stop: Callable[[], bool] = lambda: False, sleep: Callable[[float], None] = time.sleep) -> None:
        """Poll until ``stop``. One bad poll (slurmctld restarting, a malformed record) is logged and retried with
        a growing pause; only a broken invariant of the monitor's own state (its SQLite database) ends it."""
        failures = 0
        while not stop():
            try:
                self.poll_once()
                failures = 0
            except sqlite3.Error:
                raise
            except Exception as exc:  # noqa: BLE001 - a daemon survives one bad poll
                failures += 1
                self._event("poll_error", error=f"{type(exc).__name__}: {exc}", failures=failures)
            sleep(backoff_s(self.config.poll_interval_s, failures))

    def close(self) -> None:
        self.db.close()

    # --- one job --------------------------------------------------------------------------------------------
    def _handle(self, job: JobInfo, nodes: dict[str, NodeInfo]) -> int:
        ft = read_registration(self.config.state_dir, job)
        if ft is None:
            return 0
        self._reconcile(job)
        row = self.db.job(job.job_id)
        if self._requeued_by_slurm(job, row):
            return self._adopt(job, ft, nodes, row)
        if not job.state.finished:
            if job.state is JobState.RUNNING:
                self._lost_nodes(job, row, nodes)
                if launcher_lost(job) and not self._acted(job):
                    return self._orphaned(job, ft, nodes, row)
            self._watching(job, row)
            return 0
        if row is not None and row["status"] in (JobStatus.STOPPED.value, JobStatus.DONE.value) \
                and row["restart_count"] == job.restart_count:
            return 0
        if self._acted(job):
            return 0
        if job.state is JobState.NODE_FAIL and job.requeue:  # Slurm requeues it (JobRequeue=1): adopted then
            return 0
        if job.state is JobState.COMPLETED and not job.exit_code:
            self._set(job, JobStatus.DONE)
            self._event("job_completed", job_id=job.job_id, restart_count=job.restart_count)
            return 0
        return self._judge(job, ft, nodes, row)

    def _gone(self, job_id: int, nodes: dict[str, NodeInfo]) -> int:
        """A registered job Slurm no longer lists, which the monitor never closed: it ended while the monitor was
        down (and Slurm purged it after MinJobAge). It can no longer be requeued; it is judged on what is left
        (the epilog's node reports, the ranks' error files), the verdict goes where the user looks, and a failure
        is counted. Completed per the epilog's report (exit 0), it is done."""
        row = self.db.job(job_id)
        ft = read_registration_file(self.config.state_dir, job_id)
        job = JobInfo(job_id=job_id, user_id=ft.user_id, state=JobState.UNKNOWN,
                      nodes=tuple(json.loads(row["nodes"] or "[]")) if row is not None else (),
                      restart_count=row["restart_count"] if row is not None else 0)
        reports, _ = load_reports(self.config.state_dir, job_id)
        if reports and all(r.exit_code == 0 and not r.exit_signal for r in reports):
            self._set(job, JobStatus.DONE)
            self._event("job_completed", job_id=job_id, restart_count=job.restart_count, seen="after it was purged")
            return 0
        verdict = self.classify_fn(gather_evidence(self.config.state_dir, job, ft, nodes))
        self.metrics.failure(verdict.category.value)
        resume_step = latest_step(ft.ckpt_dir, ft.user_id)
        reason = (f"ended while the monitor was not watching and Slurm no longer lists it: not requeued; resubmit "
                  f"to resume from step {resume_step if resume_step is not None else 'none (no committed step)'}")
        self._event("job_gone", job_id=job_id, verdict=verdict.to_dict(), reason=reason, resume_step=resume_step,
                    dry_run=self.config.dry_run)
        if self.config.dry_run:
            return 1
        decision = Decision(requeue=False, category=verdict.category.value, reason=reason, resume_step=resume_step)
        self._tell_user(job, ft, decision, job_comment.stopped(decision.category, reason, verdict.evidence[:3]))
        self._set(job, JobStatus.GONE)
        return 1

    def _acted(self, job: JobInfo) -> bool:
        """Whether this run of the job (its restart count) was already requeued or stopped by us."""
        return any(self.db.action(job.job_id, job.restart_count, a) is not None for a in ("requeue", "stop"))

    def _orphaned(self, job: JobInfo, ft: FtJob, nodes: dict[str, NodeInfo], row: sqlite3.Row | None) -> int:
        """A ``--no-kill`` job whose batch host died: Slurm drops the node and keeps the job RUNNING, but the
        launcher died with the node and nothing will start the ranks again. Judged as a node failure of that
        host (requeued without it, or stopped and cancelled) rather than left idle until its time limit."""
        self._event("launcher_lost", job_id=job.job_id, restart_count=job.restart_count,
                    batch_host=job.batch_host, nodes=list(job.nodes))
        failed = dataclasses.replace(job, state=JobState.NODE_FAIL, nodes=(job.batch_host, *job.nodes))
        return self._judge(failed, ft, nodes, row, cancel_on_stop=True)

    def _requeued_by_slurm(self, job: JobInfo, row: sqlite3.Row | None) -> bool:
        """Slurm itself requeued the job (JobRequeue=1 after a node failure): pending at a higher restart count
        than we saw, with no requeue of ours behind it."""
        return (row is not None and job.state in _REQUEUED and job.restart_count > row["restart_count"]
                and row["status"] == JobStatus.WATCHING.value
                and self.db.action(job.job_id, job.restart_count, "adopt") is None)

    def _adopt(self, job: JobInfo, ft: FtJob, nodes: dict[str, NodeInfo], row: sqlite3.Row) -> int:
        """Judge a Slurm-requeued job on its last nodes; exclude and strike the culprits, set the resume hint.
        The launcher's own requeue after a preemption signal (its Comment says so) is recorded as it stands."""
        if job_comment.is_launcher_requeue(job.comment, job.restart_count):
            self.db.set_job(job.job_id, restart_count=job.restart_count, status=JobStatus.REQUEUED, now=self.clock(),
                            last_resume_step=job_comment.parse_resume_step(job.comment), requeued_at=self.clock())
            self._event("job_requeued", job_id=job.job_id, restart=job.restart_count, comment=job.comment,
                        by="launch")
            return 1
        previous = tuple(json.loads(row["nodes"] or "[]"))
        dead = {n for n in previous if n in nodes and (nodes[n].down or "NOT_RESPONDING" in nodes[n].state)}
        ended = dataclasses.replace(job, state=JobState.NODE_FAIL if dead else JobState.REQUEUED, nodes=previous)
        verdict = self.classify_fn(gather_evidence(self.config.state_dir, ended, ft, nodes))
        self.metrics.failure(verdict.category.value)
        resume_step = latest_step(ft.ckpt_dir, job.user_id)
        decision = Decision(requeue=True, category=verdict.category.value, reason="requeued by Slurm",
                            culprits=tuple(sorted(set(struck_nodes(verdict, ended)) | dead)), resume_step=resume_step)
        detail = {"excluded": sorted(set(job.excluded_nodes) | set(decision.culprits)),
                  "comment": job_comment.with_counts(
                      job_comment.requeue(job.restart_count, resume_step, decision.category),
                      **job_comment.counts(job.comment)),
                  "resume_step": resume_step}
        self._event("job_requeued_by_slurm", job_id=job.job_id, restart_count=job.restart_count,
                    last_nodes=list(previous), verdict=verdict.to_dict(), dry_run=self.config.dry_run)
        if self.config.dry_run:
            return 1
        self.db.intent(job.job_id, job.restart_count, "adopt", detail, self.clock())
        self._strike(job, verdict, decision)
        self.client.update_job(job.job_id, comment=detail["comment"], excluded_nodes=tuple(detail["excluded"]))
        now = self.clock()
        self.db.done(job.job_id, job.restart_count, "adopt", now)
        self.db.set_job(job.job_id, restart_count=job.restart_count, status=JobStatus.REQUEUED, now=now,
                        last_resume_step=resume_step, requeued_at=now)
        self.metrics.restart()
        self._event("job_requeued", job_id=job.job_id, restart=job.restart_count, excluded=detail["excluded"],
                    comment=detail["comment"], by="slurm")
        return 1

    def _watching(self, job: JobInfo, row: sqlite3.Row | None) -> None:
        """Record a job that is not over: first sight, running again after a requeue, the nodes it runs on
        (kept as a union while it runs: ``--no-kill`` drops a dead node from the list). The restart count moves
        only here on recovery; a requeue by Slurm is noticed by comparing it (``_requeued_by_slurm``)."""
        now = self.clock()
        if row is None:
            self.db.set_job(job.job_id, restart_count=job.restart_count, status=JobStatus.WATCHING, now=now,
                            nodes=job.nodes or None)
        elif job.state is not JobState.RUNNING:
            return
        elif row["status"] == JobStatus.REQUEUED.value and row["requeued_at"] is not None:
            self.metrics.recovery(now - row["requeued_at"])
            self._event("job_recovered", job_id=job.job_id, restart_count=job.restart_count,
                        recovery_s=round(now - row["requeued_at"], 3))
            self.db.set_job(job.job_id, restart_count=job.restart_count, status=JobStatus.WATCHING, now=now,
                            nodes=job.nodes)  # this run's nodes, not the last run's
        else:
            recorded = json.loads(row["nodes"] or "[]")
            if set(job.nodes) - set(recorded):
                self.db.set_job(job.job_id, restart_count=row["restart_count"], status=JobStatus(row["status"]),
                                now=now, nodes=list(dict.fromkeys([*recorded, *job.nodes])))

    def _judge(self, job: JobInfo, ft: FtJob, nodes: dict[str, NodeInfo], row: sqlite3.Row | None, *,
               cancel_on_stop: bool = False) -> int:
        if row is not None:  # a job run with --no-kill loses a dead node from its list: judge on all it had
            job = dataclasses.replace(job, nodes=tuple(dict.fromkeys([*json.loads(row["nodes"] or "[]"), *job.nodes])))
        evidence = gather_evidence(self.config.state_dir, job, ft, nodes)
        verdict = self.classify_fn(evidence)
        self.metrics.failure(verdict.category.value)
        budget = ft.max_restarts if ft.max_restarts is not None else self.config.default_max_restarts
        resume_step = latest_step(ft.ckpt_dir, job.user_id)
        decision = decide(job, ft, verdict, resume_step=resume_step, budget=budget,
                          previous_resume_step=row["last_resume_step"] if row is not None else None,
                          restarted_before=row is not None and row["requeued_at"] is not None)
        self._event("job_failed", job_id=job.job_id, state=job.state.value, restart_count=job.restart_count,
                    verdict=verdict.to_dict(), decision=decision.reason, requeue=decision.requeue,
                    resume_step=resume_step, dry_run=self.config.dry_run)
        if self.config.dry_run:
            return 1
        if decision.requeue:
            self._strike(job, verdict, decision)
            self._requeue(job, decision)
        else:
            self._stop(job, ft, decision, verdict, cancel=cancel_on_stop)
        return 1

    def _strike(self, job: JobInfo, verdict: Verdict, decision: Decision) -> None:
        for node in decision.culprits:
            self._strike_node(job, node, verdict.category.value, "; ".join(verdict.evidence)[:200])

    def _strike_node(self, job: JobInfo, node: str, category: str, evidence: str) -> None:
        """One quarantine strike per (job, node), however often the job's failure is looked at."""
        if self.quarantine is None or self.db.struck(job.job_id, node):
            return
        try:
            state = self.quarantine.strike(node, category, evidence, job.job_id)
        except Exception as exc:  # the quarantine store is another component: log, go on
            self._event("strike_error", job_id=job.job_id, node=node, error=f"{type(exc).__name__}: {exc}")
            return
        self.db.record_strike(job.job_id, job.restart_count, node, category, self.clock())
        self._event("node_strike", job_id=job.job_id, node=node, category=category,
                    state=str(getattr(state, "value", state)))

    def _lost_nodes(self, job: JobInfo, row: sqlite3.Row | None, nodes: dict[str, NodeInfo]) -> None:
        """A node of a running job that Slurm now calls down or not responding (with ``--no-kill`` the job lives
        on, its launcher swaps in a spare): a hardware_node strike, on Slurm's word."""
        if row is None or self.config.dry_run:
            return
        for name in json.loads(row["nodes"] or "[]"):
            info = nodes.get(name)
            if info is not None and (info.down or "NOT_RESPONDING" in info.state):
                self._strike_node(job, name, "hardware_node",
                                  f"{name}: node state {'+'.join(sorted(info.state))} under running job {job.job_id}")

    def _requeue(self, job: JobInfo, decision: Decision) -> None:
        carried = job_comment.counts(job.comment)  # the restart budget's counts; a requeue not for a fault is free
        carried["free"] += decision.category in NOT_FAULTS
        detail = {"excluded": sorted(set(job.excluded_nodes) | set(decision.culprits) | set(decision.exclude)),
                  "comment": job_comment.with_counts(
                      job_comment.requeue(job.restart_count + 1, decision.resume_step, decision.category), **carried),
                  "resume_step": decision.resume_step}
        self.db.intent(job.job_id, job.restart_count, "requeue", detail, self.clock())
        self.client.requeue(job.job_id, hold=True)
        self._finish_requeue(job.job_id, job.restart_count, detail)

    def _finish_requeue(self, job_id: int, restart_count: int, detail: dict[str, Any]) -> None:
        """After the (held) requeue: set ExcNodeList and the Comment, release, record done. Idempotent."""
        self.client.update_job(job_id, comment=detail["comment"], excluded_nodes=tuple(detail["excluded"]))
        try:
            self.client.release(job_id)
        except SlurmCommandError as exc:  # already released by an earlier try
            self._event("release_error", job_id=job_id, error=str(exc))
        now = self.clock()
        self.db.done(job_id, restart_count, "requeue", now)
        self.db.set_job(job_id, restart_count=restart_count + 1, status=JobStatus.REQUEUED, now=now,
                        last_resume_step=detail["resume_step"], requeued_at=now)
        self.metrics.restart()
        self._event("job_requeued", job_id=job_id, restart=restart_count + 1, excluded=detail["excluded"],
                    comment=detail["comment"])

    def _stop(self, job: JobInfo, ft: FtJob, decision: Decision, verdict: Verdict, *, cancel: bool = False) -> None:
        """Record the verdict (in the Comment where Slurm takes it); ``cancel``: end a job still holding nodes."""
        comment = job_comment.stopped(decision.category, decision.reason, verdict.evidence[:3])
        self.db.intent(job.job_id, job.restart_count, "stop", {"comment": comment}, self.clock())
        try:
            self.client.update_job(job.job_id, comment=comment)
        except SlurmCommandError as exc:  # Slurm 22.05 refuses updates to a finished job: the verdict stays here
            self._event("comment_refused", job_id=job.job_id, error=str(exc)[-200:])
        self._tell_user(job, ft, decision, comment)
        if cancel:
            self.client.cancel(job.job_id)
        self.db.done(job.job_id, job.restart_count, "stop", self.clock())
        self._set(job, JobStatus.STOPPED)
        self.metrics.stop()
        self._event("job_stopped", job_id=job.job_id, category=decision.category, reason=decision.reason,
                    comment=comment)

    def _tell_user(self, job: JobInfo, ft: FtJob, decision: Decision, comment: str) -> None:
        """The verdict where the user looks: the run dir's events (``slurm-ft report``) and the job's output file,
        written by a child running as the job's user (slurm_ft.cluster.stop_note)."""
        record = {"event": "stopped", "by": "monitor", "time": round(self.clock(), 3), "job_id": job.job_id,
                  "category": decision.category, "reason": decision.reason, "comment": comment}
        why = self.tell_user(uid=job.user_id, run_dir=ft.run_dir, output=job.std_out,
                             record=record)
        if why:
            self._event("stop_note_error", job_id=job.job_id, error=why)

    def _reconcile(self, job: JobInfo) -> None:
        """Finish or forget actions a killed monitor left as ``intent``."""
        for action in self.db.pending(job.job_id):
            count, detail = action["restart_count"], json.loads(action["detail"])
            if action["action"] == "requeue":
                # it happened if the count moved or the job is back in the queue (a job that lost its launcher
                # was RUNNING before the requeue: still RUNNING at the same count, it never happened)
                if job.restart_count > count or (not job.state.finished and job.state is not JobState.RUNNING):
                    self._event("reconcile", job_id=job.job_id, action="requeue", outcome="happened; finishing")
                    self._finish_requeue(job.job_id, count, detail)
                else:
                    self._event("reconcile", job_id=job.job_id, action="requeue", outcome="never happened; retry")
                    self.db.forget(job.job_id, count, "requeue")
            else:
                self.db.forget(job.job_id, count, action["action"])

    def _set(self, job: JobInfo, status: JobStatus) -> None:
        self.db.set_job(job.job_id, restart_count=job.restart_count, status=status, now=self.clock())

    def _event(self, event: str, **fields: Any) -> None:
        """One structured log line: a JSON object per line."""
        line = json.dumps({"time": round(self.clock(), 3), "event": event, **fields}, default=str)
        (log.warning if event.endswith("error") else log.info)(line)


# --- CLI ------------------------------------------------------------------------------------------------------
def register(subparsers: argparse._SubParsersAction, name: str = "monitor") -> None:
    parser = subparsers.add_parser(name, help="watch --ft jobs; requeue recoverable failures, stop the rest")
    parser.add_argument("--once", action="store_true", help="one poll, then exit")
    parser.add_argument("--config", help="site config (default $SLURM_FT_CONFIG or /etc/slurm-ft/config.toml)")
    parser.add_argument("--state-dir", help="state directory (default: $SLURM_FT_STATE_DIR, else [monitor] "
                                            "state_dir, else the site config's state_dir)")
    parser.add_argument("--poll", type=float, help="seconds between polls (default [monitor] poll_interval_s, 30)")
    parser.add_argument("--dry-run", action="store_true", help="decide and log, change nothing")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on 127.0.0.1:PORT (0 off)")
    parser.add_argument("--max-restarts", type=int, help="restart budget (in-place restarts and requeues together) "
                                                         "for jobs that set none ([monitor] default_max_restarts, 3)")
    parser.set_defaults(func=_main)


def config_from_args(args: argparse.Namespace, site: ft_config.SiteConfig) -> MonitorConfig:
    """Flags win over ``$SLURM_FT_STATE_DIR``, which wins over the site config's ``[monitor]`` and ``state_dir``."""
    section = site.section("monitor")
    state = args.state_dir or os.environ.get(env.STATE_DIR) or section.get("state_dir") or ft_config.state_dir(site)
    flags = {"poll_interval_s": args.poll, "default_max_restarts": args.max_restarts,
             "metrics_port": args.metrics_port, "dry_run": args.dry_run or None}
    return site.build("monitor", MonitorConfig, state_dir=Path(state),
                      **{k: v for k, v in flags.items() if v is not None})


def _slurm_user() -> str | None:
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_slurm_user(out.stdout)


LOCK_NAME = "monitor.lock"


def single_instance(state_dir: Path) -> Any:
    """An exclusive lock on ``<state_dir>/monitor.lock``: a second monitor on the same state refuses to start."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    handle = open(state_dir / LOCK_NAME, "a+")  # noqa: SIM115 - kept open: the lock lives as long as the process
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.close()
        raise SlurmFtError(f"another slurm-ft monitor holds {state_dir / LOCK_NAME}: one monitor per state dir",
                           exit_code=75) from exc
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def require_actor(dry_run: bool, *, euid: int | None = None,
                  slurm_user: Callable[[], str | None] = _slurm_user) -> None:
    """Acting (requeue, drain) needs root or the SlurmUser; --dry-run needs nothing."""
    uid = os.geteuid() if euid is None else euid
    if dry_run or uid == 0:
        return
    require_privileged(slurm_user(), euid=uid, action="monitor: requeueing and draining",
                       hint=" (use --dry-run to only watch)")


def _main(args: argparse.Namespace) -> int:

    site = ft_config.load_site_config(args.config)
    config = config_from_args(args, site)
    require_actor(config.dry_run)
    lock = single_instance(Path(config.state_dir))  # held until the process exits
    client = make_client()
    quarantine = None if config.dry_run else Quarantine(
        QuarantineStore(default_db_path(config.state_dir)), site.build("quarantine", QuarantineConfig), client=client)
    monitor = Monitor(config, client, classify, quarantine=quarantine)
    if config.metrics_port:
        serve(monitor.metrics, config.metrics_port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())  # systemd stop: finish the poll, exit
    try:
        if args.once:
            monitor.poll_once()
        else:
            monitor.run(stop=stop.is_set, sleep=stop.wait)
    finally:
        monitor.close()
    return 0
