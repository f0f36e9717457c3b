"""``slurm-ft bench lab``: recovery overhead against training throughput on the real lab cluster, vs the baselines.

It starts its own lab (``slurm-ft lab``, with slurm-ft's prolog, epilog and SPANK plugin, and the monitor in a
thread) and runs the same workload (``slurm_ft.train.example``, one rank per node, FSDP2 over gloo) under three
systems (:mod:`slurm_ft.bench.lab_jobs`): slurm-ft, ``slurm --requeue`` and ``torchrun --max-restarts``.

1. ``throughput``: per model size and job size, fault-free runs without checkpoints (the reference), with
   slurm-ft's asynchronous saves and with the baselines' synchronous ones: steps per second, the stall per
   save, the throughput lost at the benchmark's interval and at the Young/Daly interval for the measured cost.
2. ``faults``: per job size, fault and system, one run with the fault injected from outside once the first
   attempt has passed ``fault_step``: ``kill-rank`` (SIGKILL of the last rank), ``hang`` (SIGSTOP of it),
   ``node-death`` (the node of the last rank: its slurmd, stepds and ranks). Detection (fault -> every rank of
   the faulted attempt gone), recovery (fault -> first step of the next attempt), steps and seconds of work
   lost, and whether the final parameters equal the fault-free run's.
3. ``ettr``: the three systems side by side, at the same time, each under a fault every ``fault_every_s`` of
   wall time (the faults in turn; one due while the job is down hits nothing and is skipped): ETTR (productive
   step time over wall time) with where the rest went, and the checkpoint interval slurm-ft chose
   (``--ft-ckpt-every=auto``). The baselines checkpoint synchronously at the Young/Daly interval for their
   measured cost and the true fault rate: their best case.

Output: a table per phase on stdout (progress on stderr), ``lab.json`` with every figure, ``recovery_vs_size.png``
and the targets of issue 7 checked. Timings on a small host are noisy; compare figures within one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from slurm_ft.bench import timeline as tl
from slurm_ft.bench.ettr import Overhead, Span, ettr
from slurm_ft.bench.lab_jobs import JobSpec, SlurmFtKnobs, System, Workload, batch_script, sbatch_argv
from slurm_ft.core.errors import SlurmFtError
from slurm_ft.lab.interrupt import run_to_the_end, teardown
from slurm_ft.slurm.types import JobState
from slurm_ft.train.interval import young_daly_interval

SCHEMA = "slurm-ft.bench-lab/1"
PHASES = ("throughput", "faults", "ettr")
FAULTS = ("kill-rank", "hang", "node-death")
QUEUED = {JobState.PENDING, JobState.REQUEUED, JobState.REQUEUE_HOLD, JobState.EXPEDITING}
FINAL = {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.OUT_OF_MEMORY}
SETTLE_S = 3.0  # a job must stay ended this long (the monitor may still requeue it) before it counts as done
TARGETS = {"crash_recovery_speedup": 5.0, "crash_recovery_growth": 2.0, "hang_detection_slack_s": 5.0, "ettr": 0.95}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LabBenchConfig:
    """One benchmark run. ``nodes``: job sizes; ``models``: size presets (the first one runs the fault and ETTR
    phases); ``workload``: steps, step time, interval and collective timeout of the throughput and fault runs;
    ``ettr_*``: the side-by-side run under a fault every ``fault_every_s``."""

    dir: Path
    out: Path
    phases: tuple[str, ...] = PHASES
    nodes: tuple[int, ...] = (1, 2, 4, 8)
    models: tuple[str, ...] = ("medium", "large")
    faults: tuple[str, ...] = FAULTS
    systems: tuple[System, ...] = tuple(System)
    workload: Workload = Workload()
    knobs: SlurmFtKnobs = SlurmFtKnobs()
    fault_step: int = 16
    ettr_nodes: int = 2
    ettr_minutes: float = 15.0
    fault_every_s: float = 300.0
    ettr_step_time_s: float = 0.5
    revive_after_s: float = 30.0
    run_timeout_s: float = 600.0
    stall_cancel_s: float = 600.0  # a running job with no new timeline record this long is hung: cancelled
    keep_lab: bool = False

    def __post_init__(self) -> None:
        _check_subset("phases", self.phases, PHASES)
        _check_subset("faults", self.faults, FAULTS)
        if not self.nodes or any(n < 1 for n in self.nodes):
            raise ValueError(f"nodes: job sizes must be >= 1 (--nodes), got {list(self.nodes)}")
        if not self.models or not self.systems:
            raise ValueError("models, systems: give at least one each")
        for model in self.models:
            dataclasses.replace(self.workload, model=model)  # validates the name
        if not 1 <= self.fault_step < self.workload.steps:
            raise ValueError(f"fault_step: must be within 1..{self.workload.steps - 1} (--fault-step), "
                             f"got {self.fault_step}")
        if self.ettr_nodes < 1 or not self.ettr_minutes > 0 or not self.fault_every_s > 0:
            raise ValueError(f"ettr_nodes >= 1, ettr_minutes > 0 and fault_every_s > 0, got {self.ettr_nodes}, "
                             f"{self.ettr_minutes}, {self.fault_every_s}")
        if not self.stall_cancel_s > 0:
            raise ValueError(f"stall_cancel_s: must be > 0, got {self.stall_cancel_s}")
        if self.run_timeout_s <= 0 or self.revive_after_s < 0:
            raise ValueError(f"run_timeout_s > 0 and revive_after_s >= 0, got {self.run_timeout_s}, "
                             f"{self.revive_after_s}")

    @property
    def lab_nodes(self) -> int:
        """Enough nodes for the biggest job with its spare and a dead node, or the three ETTR jobs at once."""
        spare = self.knobs.spare_nodes
        biggest = max(self.nodes) + spare + 1 if {"throughput", "faults"} & set(self.phases) else 0
        ettr_need = len(self.systems) * self.ettr_nodes + spare + 1 if "ettr" in self.phases else 0
        return max(biggest, ettr_need, 2)


def _check_subset(name: str, given: Sequence[str], known: Sequence[str]) -> None:
    bad = [g for g in given if g not in known]
    if bad or not given:
        raise ValueError(f"{name}: unknown {bad[0]!r} (known: {', '.join(known)})" if bad
                         else f"{name}: give at least one")


# --- one job under the benchmark's eye ------------------------------------------------------------------------
@dataclasses.dataclass(slots=True)
class Injected:
    """One fault as the driver injected it, and when the faulted attempt's last rank was seen gone."""

    kind: str
    time: float
    rank: int
    node: str
    pids: tuple[int, ...]
    torn_down_at: float | None = None


@dataclasses.dataclass(slots=True)
class Run:
    spec: JobSpec
    job_id: int = 0
    state: JobState = JobState.PENDING
    restarts: int = 0
    ran: bool = False
    ended_at: float | None = None  # when the job was first seen in a final state (None again if requeued)
    faults: list[Injected] = dataclasses.field(default_factory=list)
    pending_spans: list[list[float | None]] = dataclasses.field(default_factory=list)  # queue waits after a run
    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    result: dict[str, Any] | None = None
    timed_out: bool = False
    stalled: bool = False  # cancelled: running, but no new timeline record within ``stall_cancel_s``
    skipped: int = 0  # scheduled faults that came while the job was down (ETTR phase)
    progress: tuple[int, float] | None = None  # (records seen, when that count last grew) while running

    @property
    def done(self) -> bool:
        return self.timed_out or (self.ended_at is not None and
                                  (self.state is JobState.COMPLETED or time.time() - self.ended_at >= SETTLE_S))

    def refresh_timeline(self) -> None:
        if self.spec.timeline.exists():
            self.records = tl.read_timeline(self.spec.timeline)

    def stalled_for(self, now: float) -> float:
        """Seconds this running job has gone without a new timeline record (0 while it is not running)."""
        if self.state is not JobState.RUNNING:
            self.progress = None
        elif self.progress is None or len(self.records) != self.progress[0]:
            self.progress = (len(self.records), now)
        return 0.0 if self.progress is None else now - self.progress[1]

    def first_step_time(self) -> float | None:
        return next((r["t1"] for r in self.records if r["ev"] == "step"), None)

    def stepping(self) -> bool:
        """The newest attempt has done a step and no fault is pending against it."""
        starts = [r for r in self.records if r["ev"] == "start"]
        if not starts or (self.faults and self.faults[-1].time >= starts[-1]["t"]):
            return False
        return any(r["ev"] == "step" and r["t0"] >= starts[-1]["t"] for r in self.records)


class Bench:
    """The lab, the monitor and the helpers every phase uses."""

    def __init__(self, config: LabBenchConfig, say: Callable[[str], None]) -> None:
        self.config, self.say = config, say
        self.lab: Any = None
        self.monitor: Any = None
        self.revivals: list[tuple[float, str]] = []
        self.jobs_dir = config.dir / "jobs"

    # -- lab ----------------------------------------------------------------------------------------------------
    def __enter__(self) -> "Bench":
        from slurm_ft.bench.demo import MonitorThread
        from slurm_ft.lab.cluster import LabCluster, LabConfig

        self.lab = LabCluster(LabConfig(dir=self.config.dir / "lab", nodes=self.config.lab_nodes))
        self.say(f"lab: starting a {self.config.lab_nodes}-node Slurm cluster in {self.lab.dir}")
        try:  # a signal while the lab comes up (slurm_ft.lab.interrupt) takes it down too
            self.lab.up(progress=lambda m: self.say(f"lab: {m}"))
            self.jobs_dir = jobs_dir(self.config.dir, self.lab.dir, hosts=self.lab.mode.value == "hosts")
            state = self.lab.state_dir
            self.jobs_dir.mkdir(parents=True, exist_ok=True)
            _open_up(self.config.dir)
            self.monitor = MonitorThread(self.lab, state, self.config.dir / "monitor.log", lambda line: None)
            self.monitor.__enter__()
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.monitor is not None:
                self.monitor.__exit__(*exc)
            if self.lab is not None:
                self._revive_all()
        finally:
            with teardown():
                if self.lab is not None and not self.config.keep_lab:
                    self.lab.down()

    def env(self) -> dict[str, str]:
        return {**os.environ, **self.lab.env()}

    # -- jobs ---------------------------------------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> Run:
        if spec.dir.exists():
            shutil.rmtree(spec.dir)
        spec.dir.mkdir(parents=True)
        _open_up(spec.dir)
        spec.script_path.write_text(batch_script(spec))
        done = subprocess.run(sbatch_argv(spec), env=self.env(), capture_output=True, text=True, timeout=30,
                              check=False)
        if done.returncode != 0:
            raise SlurmFtError(f"bench lab: sbatch for {spec.name} failed: {done.stderr.strip()}")
        run = Run(spec=spec, job_id=int(done.stdout.strip().split(";")[0]))
        return run

    def drive(self, runs: Sequence[Run], inject: Callable[[Run], None], *, timeout_s: float) -> None:
        """Poll until every run is done: job states (one squeue per poll), timelines, fault teardown, node
        revivals, and ``inject`` deciding on each run's next fault."""
        client = self.lab.client()
        deadline = time.monotonic() + timeout_s
        last_poll = 0.0
        while not all(r.done for r in runs):
            now = time.monotonic()
            if now - last_poll >= 0.5:
                jobs = {j.job_id: j for j in client.jobs()}
                for run in runs:
                    _observe(run, jobs.get(run.job_id))
                last_poll = now
            for run in runs:
                if run.done:
                    continue
                run.refresh_timeline()
                _check_teardown(run)
                if run.stalled_for(now) > self.config.stall_cancel_s:
                    self._cancel(run, f"running without a new timeline record for {self.config.stall_cancel_s:g} "
                                      "s (hung)")
                    run.stalled = True
                elif run.state is JobState.RUNNING:
                    inject(run)
            self._revive_due()
            if now > deadline:
                for run in runs:
                    if not run.done:
                        self._cancel(run, f"not done within {timeout_s:.0f} s")
            time.sleep(0.1)
        for run in runs:
            run.refresh_timeline()
            run.result = _result(run)

    def _cancel(self, run: Run, why: str) -> None:
        run.timed_out = True
        subprocess.run(["scancel", str(run.job_id)], env=self.env(), check=False, timeout=30)
        self.say(f"{run.spec.name}: job {run.job_id} {why}: cancelled")

    def run_one(self, spec: JobSpec, inject: Callable[[Run], None] | None = None) -> Run:
        run = self.submit(spec)
        self.drive([run], inject or (lambda _run: None), timeout_s=self.config.run_timeout_s)
        self._revive_all()
        return run

    # -- faults -------------------------------------------------------------------------------------------------
    def inject(self, run: Run, kind: str) -> None:
        """Inject ``kind`` into ``run``'s current attempt, aimed at its last rank (or that rank's node)."""
        import signal

        from slurm_ft.lab.faults import crash_node, training_processes

        ranks = training_processes(self.lab, run.job_id)
        if not ranks:
            return  # between attempts: try again on the next poll
        victim = max(ranks, key=lambda p: p.rank)
        fault = Injected(kind=kind, time=time.time(), rank=victim.rank, node=victim.node,
                         pids=tuple(p.pid for p in ranks))
        if kind == "kill-rank":
            os.kill(victim.pid, signal.SIGKILL)
        elif kind == "hang":
            os.kill(victim.pid, signal.SIGSTOP)
        elif kind == "node-death":
            crash_node(self.lab, victim.node)
            self.revivals.append((time.monotonic() + self.config.revive_after_s, victim.node))
        else:
            raise ValueError(f"fault: unknown {kind!r}")
        run.faults.append(fault)
        self.say(f"{run.spec.name}: {kind} on rank {victim.rank} ({victim.node}) at step "
                 f"{tl.last_step(run.records)}")

    def _revive_due(self) -> None:
        now = time.monotonic()
        due = [node for when, node in self.revivals if when <= now]
        self.revivals = [(when, node) for when, node in self.revivals if when > now]
        for node in due:
            self._revive(node)

    def _revive_all(self) -> None:
        for _, node in self.revivals:
            self._revive(node)
        self.revivals = []

    def _revive(self, node: str) -> None:
        """The dead node comes back (its slurmd restarted) and, if slurm-ft quarantined it, is released."""
        self.lab.start_node(node)
        if self.monitor is not None and self.monitor.quarantine.is_quarantined(node):
            self.monitor.quarantine.release(node, by="bench")
        self.say(f"lab: node {node} back in service")


def jobs_dir(bench_dir: Path, lab_dir: Path, *, hosts: bool) -> Path:
    """Where the jobs' scripts, output and checkpoints go: next to the lab, or (its nodes hosts of their own, each
    with its own /tmp) inside the lab dir, the one directory every node shares."""
    return lab_dir / "jobs" if hosts else bench_dir / "jobs"


def _open_up(path: Path) -> None:
    path.chmod(0o755)


def _observe(run: Run, job: Any) -> None:
    """Track state, requeues and the queue waits after the job first ran (pending again: requeued)."""
    if job is None:
        return
    run.state, run.restarts = job.state, job.restart_count
    now = time.time()
    waiting = bool(run.pending_spans) and run.pending_spans[-1][1] is None
    if job.state in QUEUED and run.ran:
        if not waiting:
            run.pending_spans.append([now, None])
    elif waiting:
        run.pending_spans[-1][1] = now
    if job.state is JobState.RUNNING:
        run.ran = True
    run.ended_at = (run.ended_at or now) if job.state in FINAL else None


def _check_teardown(run: Run) -> None:
    from slurm_ft.lab.faults import alive

    for fault in run.faults:
        if fault.torn_down_at is None and not any(alive(pid) for pid in fault.pids):
            fault.torn_down_at = time.time()


def _result(run: Run) -> dict[str, Any] | None:
    """The trainer's final JSON line (rank 0 prints it last) from the job's output files."""
    for path in sorted(run.spec.dir.glob("slurm-*.out")):
        for line in reversed(path.read_text(errors="replace").splitlines()):
            if line.startswith("{") and "param_sha256" in line:
                try:
                    return json.loads(line)
                except ValueError:
                    break
    return None


# --- phase 1: throughput and checkpoint overhead ---------------------------------------------------------------
def run_throughput(bench: Bench) -> list[dict[str, Any]]:
    cfg = bench.config
    rows = []
    for model in cfg.models:
        workload = dataclasses.replace(cfg.workload, model=model)
        for nodes in cfg.nodes:
            runs = {}
            for label, system, checkpoint in (("reference", System.SLURM_REQUEUE, False),
                                              ("slurm-ft", System.SLURM_FT, True),
                                              ("sync", System.SLURM_REQUEUE, True)):
                spec = JobSpec(system=system, workload=workload, nodes=nodes, checkpoint=checkpoint,
                               knobs=dataclasses.replace(cfg.knobs, spare_nodes=0),
                               dir=bench.jobs_dir / f"tput-{model}-{nodes}n-{label}", name=f"tput-{label}")
                runs[label] = bench.run_one(spec)
            rows.append(throughput_row(model, nodes, runs, cfg.fault_every_s))
            bench.say(f"throughput {model} {nodes}n: " + ", ".join(
                f"{k} {rows[-1][k + '_steps_per_s']:.2f} steps/s" for k in ("reference", "slurm-ft", "sync")
                if rows[-1].get(k + "_steps_per_s")))
    return rows


def throughput_row(model: str, nodes: int, runs: dict[str, Run], mtbf_s: float) -> dict[str, Any]:
    """One model and job size: steps/s of each run, stalls, and the throughput lost to checkpoints at the
    benchmark's interval and at the Young/Daly interval for the measured stall and ``mtbf_s``."""
    row: dict[str, Any] = {"model": model, "nodes": nodes}
    figures = {}
    for label, run in runs.items():
        try:
            figures[label] = tl.throughput(run.records)
        except ValueError:
            continue
        t = figures[label]
        row.update({f"{label}_steps_per_s": t.steps_per_s, f"{label}_step_s": t.step_s,
                    f"{label}_stall_s": t.stall_s, f"{label}_startup_s": t.startup_s})
        row[f"{label}_sha256"] = (run.result or {}).get("param_sha256")
    ref = figures.get("reference")
    for label in ("slurm-ft", "sync"):
        t = figures.get(label)
        if ref is None or t is None:
            continue
        row[f"{label}_loss"] = 1.0 - t.steps_per_s / ref.steps_per_s
        if t.stall_s:
            interval = young_daly_interval(t.stall_s, mtbf_s)
            row[f"{label}_yd_interval_s"] = interval
            row[f"{label}_yd_loss"] = t.stall_s / (interval + t.stall_s)
    return row


# --- phase 2: one fault per run --------------------------------------------------------------------------------
def run_faults(bench: Bench, references: dict[tuple[str, int], str]) -> list[dict[str, Any]]:
    cfg = bench.config
    workload = dataclasses.replace(cfg.workload, model=cfg.models[0])
    rows = []
    for nodes in cfg.nodes:
        for fault in cfg.faults:
            for system in cfg.systems:
                spec = JobSpec(system=system, workload=workload, nodes=nodes, knobs=cfg.knobs,
                               dir=bench.jobs_dir / f"fault-{nodes}n-{fault}-{system.slug}",
                               name=f"{system.slug}-{fault}")
                run = bench.run_one(spec, _at_step(bench, fault, cfg.fault_step))
                rows.append(fault_row(run, fault, references.get((workload.model, nodes))))
                bench.say(f"fault {nodes}n {fault} {system.value}: detection {_s(rows[-1]['detection_s'])}, "
                          f"recovery {_s(rows[-1]['recovery_s'])}, {rows[-1]['steps_lost']} steps lost")
    return rows


def _at_step(bench: Bench, fault: str, step: int) -> Callable[[Run], None]:
    def inject(run: Run) -> None:
        if not run.faults and tl.attempts(run.records) == 1 and tl.last_step(run.records) >= step:
            bench.inject(run, fault)
    return inject


def fault_row(run: Run, fault: str, reference: str | None) -> dict[str, Any]:
    """What one run with one injected fault shows."""
    spec = run.spec
    row: dict[str, Any] = {"nodes": spec.nodes, "fault": fault, "system": spec.system.value,
                           "job_id": run.job_id, "final_state": run.state.value, "requeues": run.restarts,
                           "attempts": tl.attempts(run.records), "completed": tl.last_step(run.records)
                           >= spec.workload.steps and run.state is JobState.COMPLETED}
    injected = run.faults[0] if run.faults else None
    outcome = tl.fault_outcome(run.records, injected.time, injected.torn_down_at) if injected else None
    for key in ("fault_step", "detection_s", "recovery_s", "resume_step", "steps_lost", "lost_work_s", "relaunch_s",
                "resume_s", "restart_cpu_s"):
        row[key] = getattr(outcome, key) if outcome else None
    row["queue_wait_s"] = _queue_wait(run)
    sha = (run.result or {}).get("param_sha256")
    row["params_equal"] = None if reference is None or sha is None else sha == reference
    return row


def _queue_wait(run: Run) -> float:
    return sum((end or time.time()) - start for start, end in run.pending_spans)


# --- phase 3: ETTR side by side under a fault schedule ---------------------------------------------------------
def run_ettr(bench: Bench, stall_s: dict[str, float | None]) -> list[dict[str, Any]]:
    """The systems at once, each under a fault every ``fault_every_s`` of wall time after its first step."""
    cfg = bench.config
    period, step_s = cfg.fault_every_s, cfg.ettr_step_time_s
    steps = max(cfg.fault_step + 1, round(cfg.ettr_minutes * 60 / step_s))
    base = dataclasses.replace(cfg.workload, model=cfg.models[0], steps=steps, step_time_s=step_s)
    baseline_every = baseline_interval_steps(stall_s.get("sync"), period, step_s)
    specs = []
    for system in cfg.systems:
        every: int | str = "auto" if system is System.SLURM_FT else baseline_every
        specs.append(JobSpec(system=system, workload=dataclasses.replace(base, ckpt_every=every),
                             nodes=cfg.ettr_nodes, knobs=cfg.knobs, dir=bench.jobs_dir / f"ettr-{system.slug}",
                             name=f"ettr-{system.slug}"))
    runs = [bench.submit(spec) for spec in specs]
    bench.say(f"ettr: {len(runs)} jobs of {steps} steps on {cfg.ettr_nodes} nodes, a fault every {period:g} s "
              f"({', '.join(cfg.faults)} in turn); baselines checkpoint every {baseline_every} steps")
    kinds = list(cfg.faults)

    def inject(run: Run) -> None:
        first = run.first_step_time()
        if first is None:
            return
        due = first + period / 2 + (len(run.faults) + run.skipped) * period
        if time.time() < due:
            return
        if run.stepping():
            bench.inject(run, kinds[(len(run.faults) + run.skipped) % len(kinds)])
        else:  # the fault's time came while the job was down: it hit nothing of this job
            run.skipped += 1
            bench.say(f"{run.spec.name}: fault at {due - first:.0f} s skipped: the job was not running")

    budget = cfg.ettr_minutes * 60 * 4 + cfg.run_timeout_s
    bench.drive(runs, inject, timeout_s=budget)
    bench._revive_all()
    return [ettr_row(run, baseline_every) for run in runs]


def baseline_interval_steps(sync_stall_s: float | None, mtbf_s: float, step_s: float) -> int:
    """The baselines' checkpoint interval in steps: Young/Daly for their synchronous save and the true fault
    rate (their best case; a user picks one by hand)."""
    interval = young_daly_interval(sync_stall_s or 1.0, mtbf_s)
    return max(1, round(interval / step_s))


def ettr_row(run: Run, baseline_every: int) -> dict[str, Any]:
    records = run.records
    launches = [r["t"] for r in records if r["ev"] == "launch"]
    ends = [r["t"] for r in records if r["ev"] == "end"]
    row: dict[str, Any] = {"system": run.spec.system.value, "nodes": run.spec.nodes, "job_id": run.job_id,
                           "faults": [f.kind for f in run.faults], "faults_skipped": run.skipped,
                           "requeues": run.restarts, "stalled": run.stalled,
                           "completed": bool(ends) and run.state is JobState.COMPLETED}
    if not launches or not ends:
        return {**row, "ettr": None}
    spans = list(tl.save_spans(records)) + list(_fault_spans(run))
    result = ettr(tl.step_records(records), launches[0], ends[-1], spans)
    stats = (run.result or {}).get("checkpoint") or {}
    interval = stats.get("interval_s") if run.spec.system is System.SLURM_FT else None
    gaps = save_gaps(records)
    return {**row, **result.to_dict(), "lost_s": result.wall_s - result.productive_s,
            "interval_s": interval, "interval_steps": None if interval else baseline_every,
            "step_s": run.spec.workload.step_time_s, "final_mtbf_s": stats.get("mtbf_s"),
            "save_gap_first_s": gaps[0] if gaps else None, "save_gap_last_s": gaps[-1] if gaps else None}


def save_gaps(records: Sequence[dict[str, Any]]) -> list[float]:
    """Seconds between the starts of consecutive saves of the same attempt: the interval as it was lived."""
    gaps, last = [], None
    for rec in records:
        if rec["ev"] == "start":
            last = None
        elif rec["ev"] == "save":
            if last is not None:
                gaps.append(round(rec["t0"] - last, 3))
            last = rec["t0"]
    return gaps


def _fault_spans(run: Run) -> Iterable[Span]:
    """Detection (fault -> attempt torn down), queue waits, and recovery (the rest until the next step)."""
    queue = [(s, e) for s, e in run.pending_spans if e is not None]
    for fault in run.faults:
        outcome = tl.fault_outcome(run.records, fault.time, fault.torn_down_at)
        if fault.torn_down_at is None or outcome.recovery_s is None:
            continue
        yield Span(kind=Overhead.DETECTION, start=fault.time, end=fault.torn_down_at)
        resumed = fault.time + outcome.recovery_s
        waits = [(max(s, fault.torn_down_at), min(e, resumed)) for s, e in queue if s < resumed and e > fault.time]
        cursor = fault.torn_down_at
        for start, end in sorted(waits):
            if start > cursor:
                yield Span(kind=Overhead.RECOVERY, start=cursor, end=start)
            yield Span(kind=Overhead.QUEUE_WAIT, start=start, end=end)
            cursor = max(cursor, end)
        if resumed > cursor:
            yield Span(kind=Overhead.RECOVERY, start=cursor, end=resumed)


# --- targets, report, outputs ----------------------------------------------------------------------------------
def check_targets(payload: dict[str, Any], config: LabBenchConfig) -> list[dict[str, Any]]:
    """Issue 7's lab targets, each with the figures behind it and whether it held."""
    checks = []
    faults = payload.get("faults", [])
    by = {(r["nodes"], r["fault"], r["system"]): r for r in faults}
    for nodes in config.nodes:
        ours, theirs = by.get((nodes, "kill-rank", System.SLURM_FT.value)), \
            by.get((nodes, "kill-rank", System.SLURM_REQUEUE.value))
        if ours and theirs and ours["recovery_s"] and theirs["recovery_s"]:
            ratio = theirs["recovery_s"] / ours["recovery_s"]
            checks.append({"target": f"rank crash, {nodes} node(s): recovery >= "
                                     f"{TARGETS['crash_recovery_speedup']:g}x faster than slurm --requeue",
                           "value": round(ratio, 2), "met": ratio >= TARGETS["crash_recovery_speedup"]})
        hang = by.get((nodes, "hang", System.SLURM_FT.value))
        if hang and hang["detection_s"] is not None:
            limit = config.knobs.hang_timeout_s + TARGETS["hang_detection_slack_s"]
            checks.append({"target": f"hang, {nodes} node(s): detected within {limit:g} s (timeout + 5 s)",
                           "value": round(hang["detection_s"], 2), "met": hang["detection_s"] <= limit})
    checks += _growth_check(by, config.nodes)
    rows = {r["system"]: r for r in payload.get("ettr", [])}
    ours = rows.get(System.SLURM_FT.value)
    if ours and ours.get("ettr") is not None:
        checks.append({"target": f"lab ETTR under a fault every {config.fault_every_s:g} s >= {TARGETS['ettr']}",
                       "value": round(ours["ettr"], 4), "met": ours["ettr"] >= TARGETS["ettr"]})
        for name, other in rows.items():
            if name != System.SLURM_FT.value and other.get("ettr") is not None:
                checks.append({"target": f"less lost time than {name} in the same run",
                               "value": f"{ours['lost_s']:.0f} s vs {other['lost_s']:.0f} s",
                               "met": ours["lost_s"] < other["lost_s"]})
    return checks


def _growth_check(by: dict[tuple, dict[str, Any]], nodes: Sequence[int]) -> list[dict[str, Any]]:
    """slurm-ft's rank-crash recovery at the largest job size over the smallest's (none with one size)."""
    small, large = (by.get((n, "kill-rank", System.SLURM_FT.value)) for n in (min(nodes), max(nodes)))
    if min(nodes) == max(nodes) or not (small and large and small["recovery_s"] and large["recovery_s"]):
        return []
    growth = large["recovery_s"] / small["recovery_s"]
    return [{"target": f"rank crash: recovery grows at most {TARGETS['crash_recovery_growth']:g}x from "
                       f"{min(nodes)} to {max(nodes)} nodes", "value": round(growth, 2),
             "met": growth <= TARGETS["crash_recovery_growth"]}]


def render(payload: dict[str, Any]) -> str:
    from slurm_ft.bench.report import Column, records_table

    parts = []
    if payload.get("throughput"):
        parts += ["Throughput and checkpoint overhead (fault-free; slurm-ft saves asynchronously, the baselines "
                  "synchronously)", records_table(payload["throughput"], {
                      "model": "model", "nodes": "nodes", Column("steps/s", ".2f"): "reference_steps_per_s",
                      Column("ft steps/s", ".2f"): "slurm-ft_steps_per_s",
                      Column("sync steps/s", ".2f"): "sync_steps_per_s",
                      Column("ft stall ms", ".1f"): lambda r: _ms(r.get("slurm-ft_stall_s")),
                      Column("sync stall ms", ".1f"): lambda r: _ms(r.get("sync_stall_s")),
                      Column("ft loss", ".1%"): "slurm-ft_loss", Column("sync loss", ".1%"): "sync_loss",
                      Column("ft loss@YD", ".2%"): "slurm-ft_yd_loss", Column("sync loss@YD", ".2%"): "sync_yd_loss",
                      Column("startup s", ".1f"): "reference_startup_s"}), ""]
    if payload.get("faults"):
        parts += ["Faults (one per run; detection: fault -> the attempt's ranks all gone; recovery: fault -> "
                  "first step after, = relaunch (fault -> rank 0 runs again) + resume (process group, model, "
                  "checkpoint) + the first step; rank0 cpu: rank 0's CPU seconds from its relaunch to that step)",
                  records_table(payload["faults"], {
                      "nodes": "nodes", "fault": "fault", "system": "system",
                      Column("detect s", ".1f"): "detection_s", Column("recover s", ".1f"): "recovery_s",
                      Column("relaunch s", ".2f"): "relaunch_s", Column("resume s", ".2f"): "resume_s",
                      Column("rank0 cpu s", ".2f"): "restart_cpu_s",
                      Column("queue s", ".1f"): "queue_wait_s", "steps lost": "steps_lost",
                      Column("lost s", ".1f"): "lost_work_s", "requeues": "requeues", "completed": "completed",
                      "params": lambda r: {None: "-", True: "equal", False: "DIFFERENT"}[r["params_equal"]]}), ""]
    if payload.get("ettr"):
        parts += ["ETTR side by side under the fault schedule", records_table(payload["ettr"], {
            "system": "system", Column("ETTR", ".3f"): "ettr", Column("wall s", ".0f"): "wall_s",
            Column("lost s", ".0f"): "lost_s", "faults": lambda r: len(r["faults"]), "requeues": "requeues",
            **{Column(k.replace("checkpoint_", "ckpt_"), ".0f"): (lambda r, k=k: (r.get("overhead_s") or {}).get(k))
               for k in ("checkpoint_stall", "rework", "detection", "recovery", "queue_wait", "other")},
            "checkpoint interval": _interval_cell}), ""]
    for check in payload.get("targets", []):
        parts.append(f"{'met    ' if check['met'] else 'NOT met'}  {check['target']}: {check['value']}")
    return "\n".join(parts)


def _interval_cell(row: dict[str, Any]) -> str:
    """slurm-ft: the gap between saves at the start and at the end (auto); a baseline: its fixed interval."""
    if row.get("interval_s"):
        first, last = row.get("save_gap_first_s"), row.get("save_gap_last_s")
        lived = f"{first:.1f} s -> {last:.1f} s, " if first is not None and last is not None else ""
        return f"auto: {lived}now {row['interval_s']:.1f} s"
    if row.get("stalled"):
        return "hung: cancelled"
    return f"every {row['interval_steps']} steps" if row.get("interval_steps") else "-"


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000.0


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def measured_costs(payload: dict[str, Any], config: LabBenchConfig) -> dict[str, float]:
    """Lab-scale costs in the simulator's terms (``slurm-ft bench sim --costs lab.json``), from the largest job
    size measured: a projection of *this* lab's costs, not of a large GPU cluster's."""
    costs: dict[str, float] = {}
    faults = [r for r in payload.get("faults", []) if r["nodes"] == max(config.nodes)]

    def pick(fault: str, system: System, key: str) -> float | None:
        row = next((r for r in faults if r["fault"] == fault and r["system"] == system.value), None)
        return None if row is None else row.get(key)

    crash_detect, crash_recover = pick("kill-rank", System.SLURM_FT, "detection_s"), \
        pick("kill-rank", System.SLURM_FT, "recovery_s")
    if crash_detect is not None and crash_recover is not None:
        costs["detect_crash_s"] = crash_detect
        costs["restart_in_alloc_s"] = max(0.0, crash_recover - crash_detect)
    hang = pick("hang", System.SLURM_FT, "detection_s")
    if hang is not None:
        costs["detect_hang_s"] = hang
    for key, fault, system in (("baseline_detect_hang_s", "hang", System.SLURM_REQUEUE),
                               ("requeue_wait_s", "kill-rank", System.SLURM_REQUEUE)):
        value = pick(fault, system, "detection_s" if key.startswith("baseline") else "queue_wait_s")
        if value:
            costs[key] = value
    tput = [r for r in payload.get("throughput", []) if r["model"] == config.models[0]
            and r["nodes"] == max(config.nodes)]
    if tput and tput[0].get("slurm-ft_stall_s"):
        costs["checkpoint_stall_s"] = tput[0]["slurm-ft_stall_s"]
        if tput[0].get("sync_stall_s"):
            costs["checkpoint_write_s"] = tput[0]["sync_stall_s"]
    return {k: round(v, 3) for k, v in costs.items()}


def write_outputs(out: Path, payload: dict[str, Any]) -> list[str]:
    from slurm_ft.bench.plots import plot_recovery_vs_size

    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "lab.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    except OSError as exc:
        raise SlurmFtError(f"--out {str(out)!r}: {exc.strerror or exc}") from None
    notes = [f"wrote {out / 'lab.json'}"]
    if payload.get("faults"):
        plot = out / "recovery_vs_size.png"
        note = plot_recovery_vs_size(payload["faults"], plot)
        notes.append(note or f"wrote {plot}")
    return notes


def run_bench(config: LabBenchConfig, say: Callable[[str], None]) -> dict[str, Any]:
    started = time.monotonic()
    payload: dict[str, Any] = {"schema": SCHEMA, "config": config_dict(config)}
    with Bench(config, say) as bench:
        payload["lab"] = {"nodes": config.lab_nodes, "host_cpus": os.cpu_count()}
        if "throughput" in config.phases:
            payload["throughput"] = run_throughput(bench)
        references = {(r["model"], r["nodes"]): r.get("reference_sha256") for r in payload.get("throughput", [])}
        if "faults" in config.phases:
            payload["faults"] = run_faults(bench, references)
        if "ettr" in config.phases:
            stalls = _stalls_for(payload.get("throughput", []), config)
            payload["ettr"] = run_ettr(bench, stalls)
    payload["targets"] = check_targets(payload, config)
    payload["sim_costs"] = {**measured_costs(payload, config), "source": "slurm-ft bench lab (lab scale)"}
    payload["elapsed_s"] = round(time.monotonic() - started, 1)
    return payload


def _stalls_for(rows: list[dict[str, Any]], config: LabBenchConfig) -> dict[str, float | None]:
    row = next((r for r in rows if r["model"] == config.models[0] and r["nodes"] == config.ettr_nodes), None)
    if row is None and rows:
        row = min((r for r in rows if r["model"] == config.models[0]),
                  key=lambda r: abs(r["nodes"] - config.ettr_nodes), default=None)
    return {"sync": (row or {}).get("sync_stall_s"), "slurm-ft": (row or {}).get("slurm-ft_stall_s")}


def config_dict(config: LabBenchConfig) -> dict[str, Any]:
    data = dataclasses.asdict(config)
    data["systems"] = [s.value for s in config.systems]
    data["dir"], data["out"] = str(config.dir), str(config.out)
    return data


# --- CLI --------------------------------------------------------------------------------------------------------
QUICK = {"nodes": (1, 2), "models": ("medium",), "ettr_minutes": 4.0, "fault_every_s": 60.0}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="slurm-ft bench lab", description=__doc__.splitlines()[0],
                                epilog="Needs root (it starts a Slurm lab). The default run takes about 1 h 45 min "
                                       "on 2 cores; --quick about ten minutes.")
    p.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    p.add_argument("--nodes", type=int, nargs="+", help="job sizes (default 1 2 4 8; --quick: 1 2)")
    p.add_argument("--models", nargs="+", help="model sizes (default medium large; --quick: medium)")
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated subset of {','.join(FAULTS)}")
    p.add_argument("--systems", default=",".join(s.slug for s in System),
                   help=f"comma-separated subset of {','.join(s.slug for s in System)} (default all)")
    p.add_argument("--steps", type=int, default=40, help="steps of a throughput or fault run (default 40)")
    p.add_argument("--step-time", type=float, default=0.2, help="seconds of sleep per step (default 0.2)")
    p.add_argument("--ckpt-every", type=int, default=10, help="steps between saves, every system (default 10)")
    p.add_argument("--fault-step", type=int, default=16, help="inject once the first attempt passed it (16)")
    p.add_argument("--hang-timeout", type=float, default=5.0,
                   help="slurm-ft's --ft-hang-timeout (default 5: ten steps of the ETTR run)")
    p.add_argument("--mtbf-prior", type=float, default=3600.0,
                   help="slurm-ft's prior MTBF for --ft-ckpt-every=auto in the ETTR run (default 3600: a site's "
                        "rough guess, 12x the fault rate it then meets)")
    p.add_argument("--collective-timeout", type=float, default=60.0,
                   help="seconds a collective waits for a stuck peer, every system (default 60; NCCL's is 600)")
    p.add_argument("--ettr-minutes", type=float, help="fault-free length of the ETTR run (default 15)")
    p.add_argument("--fault-every", type=float, help="seconds between faults in the ETTR run (default 300)")
    p.add_argument("--ettr-nodes", type=int, default=2, help="nodes per ETTR job (default 2)")
    p.add_argument("--ettr-step-time", type=float, default=0.5, help="step time of the ETTR run (default 0.5)")
    p.add_argument("--quick", action="store_true", help="a short run: 1-2 nodes, one model, a 4-minute ETTR run")
    p.add_argument("--dir", type=Path, help="working directory (default: a new one under /tmp)")
    p.add_argument("--out", type=Path, default=Path("bench/results"), help="output directory (bench/results)")
    p.add_argument("--keep-lab", action="store_true", help="leave the lab running afterwards")
    return p.parse_args(list(argv))


def config_from_args(args: argparse.Namespace) -> LabBenchConfig:
    quick = QUICK if args.quick else {}
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="ftbench-", dir="/tmp"))
    try:
        systems = _systems(_split(args.systems))
        workload = Workload(steps=args.steps, step_time_s=args.step_time, ckpt_every=args.ckpt_every,
                            collective_timeout_s=args.collective_timeout)
        return LabBenchConfig(
            dir=workdir.absolute(), out=args.out, phases=_split(args.phases), faults=_split(args.faults),
            systems=systems,
            nodes=tuple(args.nodes or quick.get("nodes", (1, 2, 4, 8))),
            models=tuple(args.models or quick.get("models", ("medium", "large"))), workload=workload,
            knobs=SlurmFtKnobs(hang_timeout_s=args.hang_timeout, min_interval_s=2.0, mtbf_prior_s=args.mtbf_prior),
            fault_step=args.fault_step, ettr_nodes=args.ettr_nodes, ettr_step_time_s=args.ettr_step_time,
            ettr_minutes=args.ettr_minutes or quick.get("ettr_minutes", 15.0),
            fault_every_s=args.fault_every or quick.get("fault_every_s", 300.0), keep_lab=args.keep_lab)
    except ValueError as exc:
        raise SlurmFtError(f"bench lab: {exc}") from None


def _systems(slugs: Sequence[str]) -> tuple[System, ...]:
    by_slug = {s.slug: s for s in System}
    _check_subset("systems", slugs, list(by_slug))
    return tuple(by_slug[slug] for slug in slugs)


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def main(argv: Sequence[str] = ()) -> int:
    from slurm_ft.lab.cluster import LabError, check_prerequisites

    config = config_from_args(parse_args(argv))
    try:
        check_prerequisites()
    except LabError as exc:
        raise SlurmFtError(f"bench lab: {exc}") from None

    def say(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)

    def body() -> int:
        payload = run_bench(config, say)
        print(render(payload))
        for note in write_outputs(config.out, payload):
            print(note)
        return 0
    return run_to_the_end("bench lab", body)
