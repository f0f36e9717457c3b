"""``slurm-ft demo``: faults injected into real training jobs on a real local Slurm cluster, and their recovery.

It starts a 4-node lab (with slurm-ft's prolog, epilog and SPANK plugin), runs the monitor in a thread over the
lab's state dir, and submits the example FSDP trainer with ``sbatch --ft ... slurm-ft launch``, one 2-node job
per scenario (exclusive nodes), all at once (Slurm runs two at a time):

- ``clean``: no fault; its wall time and final parameters are the reference;
- ``kill-rank``: rank 1 is SIGKILLed mid-run: the launcher restarts the step in place;
- ``hang``: rank 1 is SIGSTOPped: no heartbeat within the hang timeout, killed, restarted in place; the ranks'
  flight-recorder dumps name it and the collective its peer waited for it in;
- ``stuck-loader``: rank 1 sleeps outside any collective (its data loader, say; ``--hang-at`` on the first
  attempt): its dump shows it never entered the collective rank 0 waits in; named, restarted in place;
- ``node-death``: the job's batch host dies (slurmd, stepds, ranks): Slurm ends the job NODE_FAIL and requeues it,
  the monitor classifies it, quarantines the node, excludes it and sets the resume hint; the job resumes elsewhere;
- ``user-error``: the training code raises: one attempt, no requeue, the verdict in the job's Comment;
- ``gpu-held``: rank 1 is SIGKILLed and its node's (fake, TEST-ONLY) GPU keeps the killed rank's memory for good:
  the launcher's wait for the GPUs to let go (``slurm_ft.launch.reclaim``) ends at its bound, the verdict is
  ``hardware_gpu`` naming that node and GPU, and the job swaps in its spare node (3 nodes, one spare) and finishes
  there. The lab's nodes get two fake GPUs each for it (``slurm_ft.lab.gpus``).
- ``link-down`` (hosts mode only, ``--hosts``): rank 1's node loses its network for good (its cable pulled,
  ``slurm_ft.lab.faults.link_down``) mid-step: the launcher's hang watch catches it within the hang timeout, its
  probe finds the node unreachable, the verdict names that node, and the job (3 nodes, one spare) swaps the spare
  in, or is requeued without the node;
- ``link-flap`` (hosts mode only): the same cable pulled for ``FLAP_S`` seconds, longer than the job's hang timeout
  (``FLAP_HANG_TIMEOUT``) and shorter than the lab's SlurmdTimeout (Slurm does not see it): the node's link
  counters name it (``network``), a restart in place on the same nodes, the node struck once by its epilog, never
  quarantined on its first flap;
- ``slow-link`` (hosts mode only): rank 1's node's link throttled to ``SLOW_RATE`` both ways (tbf) from the fault
  step on: training goes on, slower; no fault verdict while steps still complete;
- ``node-reboot`` (hosts mode only): the job's batch host dies as in ``node-death`` and boots again, empty (fresh
  ``/tmp``, ``/dev/shm``, ``/run``), ``REBOOT_DOWN_S`` seconds later (``slurm_ft.lab.faults.boot_node``); slurmctld
  sees its new boot time when its slurmd registers and ends the job NODE_FAIL (requeued, as for a dead host: the
  launcher died with it); the monitor names the node, quarantines and excludes it, and the job resumes from the
  shared checkpoint dir on other nodes, relying on nothing the node held;
- ``desync``: rank 1 calls an all-reduce the others do not (``--desync-at``, on every attempt: a bug): the ranks
  hang in different collectives at the same sequence number; the dumps show both calls, the verdict is
  ``user_code`` after one attempt, and no restart is taken from the budget.

The demo's lab is one whose nodes are hosts of their own (``slurm-ft lab up``'s default) wherever this machine
allows namespaces (``--hosts`` insists, ``--single-address`` forces all nodes onto 127.0.0.1): there ``node-death``
is the death of the whole host (every process on it, its link down), the jobs' directory lies inside the lab dir
(the cluster's shared filesystem: every node's ``/tmp`` is its own), and the default scenarios include
``link-down``; where the nodes are not hosts the demo says so in one line and skips it.

Then a table (fault, verdict, culprit, detection, recovery, steps lost, parameters equal to the clean run's, where
the restart's state came from: ``memory@N``, ``peer@N`` or ``disk@N``, the trainer's own ``resume`` event) and ETTR
(the clean run's wall time over each recovered run's). kill-rank and hang must resume from the memory tier and lose
at most one step. The verdict is the launcher's ``verdict`` event (the
monitor's for a job whose launcher died with its node), in the design's category words only; the culprit is the
rank and node that failed first. Exit 0 only when every check held.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurm_ft.classify import classify
from slurm_ft.cluster.monitor import Monitor, MonitorConfig
from slurm_ft.cluster.quarantine import Quarantine, QuarantineStore, default_db_path
from slurm_ft.core import comment as job_comment
from slurm_ft.core.comment import TAG
from slurm_ft.core.errors import SlurmFtError
from slurm_ft.core.rundir import read_events, read_heartbeats
from slurm_ft.core.taxonomy import Category, culprit_text
from slurm_ft.lab import faults as lab_faults
from slurm_ft.lab import gpus as lab_gpus
from slurm_ft.lab import hosts as lab_hosts
from slurm_ft.lab.cluster import LabCluster, LabConfig
from slurm_ft.lab.faults import crash_node, fault_timing, first_attempt_only, signal_rank
from slurm_ft.lab.interrupt import run_to_the_end, teardown
from slurm_ft.slurm.types import JobInfo, JobState

SCENARIOS = ("clean", "kill-rank", "hang", "stuck-loader", "node-death", "user-error", "desync", "gpu-held",
             "link-down", "link-flap", "slow-link", "node-reboot")
HOSTS_ONLY = ("link-down", "link-flap", "slow-link", "node-reboot")  # real network and host faults (--hosts)
DEFAULT_NETWORK = ("link-down",)  # the network faults the demo runs by default, where the nodes are hosts
INJECTED = ("kill-rank", "hang", "node-death", "gpu-held", *HOSTS_ONLY)  # the demo injects these from outside the job
NO_RESTART = ("slow-link",)  # injected, and nothing may be restarted for it
IN_TRAINER = ("stuck-loader", "desync")  # the trainer's own flags inject these; the demo says when they fire
RECOVERING = ("kill-rank", "hang", "stuck-loader", "node-death", "gpu-held", "link-down", "link-flap", "node-reboot")
HOST_LOST = ("node-death", "node-reboot")  # the job's batch host goes away with its launcher: Slurm's NODE_FAIL
RECLAIM_TIMEOUT = 5  # gpu-held: seconds the launcher waits for the killed rank's GPU
EVERY = 4  # checkpoint interval (steps)
# Memory snapshots every step: what ``auto`` picks for a job whose MTBF is the few seconds each demo run trains
# before its fault (Young's spacing from the stall and the MTBF), fixed here so the rows do not hang on a timing.
MEM_EVERY = 1
HANG_TIMEOUT = 10
MEMORY_RESUMES = ("kill-rank", "hang")  # restarted in place from the memory tier: <= 1 step lost (issue 32)
FLAP_HANG_TIMEOUT = 5  # link-flap's job: a stall this long is caught while the cable is still out
SLOW_RATE = "256kbit"  # slow-link: rank 1's node's link, both ways, from the fault step to the job's end
FLAP_S = 7.0  # link-flap: seconds the cable stays out: past the job's hang timeout, short of SlurmdTimeout (10 s)
REBOOT_DOWN_S = lab_faults.REBOOT_DOWN_S  # node-reboot: seconds the host stays down before it boots again, empty
ENDED = {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.OUT_OF_MEMORY}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DemoConfig:
    """``dir`` (--dir), ``scenarios`` (--scenarios; None: ``default_scenarios``), ``steps`` (--steps),
    ``fault_step`` (steps done before a fault), ``step_time_s``, ``timeout_s`` (--timeout: all jobs), ``keep_lab``
    (--keep-lab), ``hosts`` (every lab node a host of its own, which the network faults need: None where this
    machine allows namespaces, True insists (--hosts), False: all on 127.0.0.1 (--single-address)). ``auto``:
    ``hosts`` was None (the lab then chooses, and says why); ``refused``: why namespaces were refused, when that
    made ``hosts`` False; ``note``: the line that says a default scenario was skipped."""

    dir: Path
    scenarios: tuple[str, ...] | None = None
    steps: int = 24
    fault_step: int = 10
    step_time_s: float = 0.3
    timeout_s: float = 600.0
    keep_lab: bool = False
    hosts: bool | None = None
    auto: bool = dataclasses.field(default=False, init=False)
    refused: str | None = dataclasses.field(default=None, init=False)
    note: str = dataclasses.field(default="", init=False)

    def __post_init__(self) -> None:
        if self.hosts is None:
            object.__setattr__(self, "auto", True)
            object.__setattr__(self, "refused", lab_hosts.refusal())
            object.__setattr__(self, "hosts", self.refused is None)
        if self.scenarios is None:
            object.__setattr__(self, "scenarios", default_scenarios(self.hosts))
            if not self.hosts:
                why = f"namespaces refused: {self.refused}" if self.refused else "--single-address"
                object.__setattr__(self, "note", f"{', '.join(DEFAULT_NETWORK)} skipped: the lab's nodes are not "
                                                 f"hosts ({why})")
        unknown = [s for s in self.scenarios if s not in SCENARIOS]
        if unknown or not self.scenarios:
            raise ValueError(f"scenarios: unknown {unknown[0]!r} (known: {', '.join(SCENARIOS)}) (--scenarios)"
                             if unknown else "scenarios: give at least one (--scenarios)")
        needs_hosts = [s for s in self.scenarios if s in HOSTS_ONLY]
        if needs_hosts and not self.hosts:
            why = f"namespaces refused here: {self.refused}" if self.refused else "not with --single-address"
            raise ValueError(f"scenarios: {needs_hosts[0]!r} needs a lab whose nodes are hosts ({why})")
        if "clean" not in self.scenarios:  # the reference for the checksum and ETTR
            object.__setattr__(self, "scenarios", ("clean", *self.scenarios))
        if not 1 <= self.fault_step < self.steps - EVERY:
            raise ValueError(f"steps: must exceed the fault step ({self.fault_step}) by more than one checkpoint "
                             f"interval ({EVERY}) (--steps), got {self.steps}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s: must be positive (--timeout), got {self.timeout_s}")
        object.__setattr__(self, "dir", Path(self.dir).absolute())


@dataclasses.dataclass(slots=True)
class Run:
    """One scenario's job and what the demo saw of it."""

    name: str
    ckpt: Path
    job_id: int = 0
    fault_time: float | None = None
    fault_step: int | None = None
    detected_at: float | None = None  # node-death: when Slurm requeued the job (no launcher lived to see it)
    victim: str = ""
    held: tuple[str, int] | None = None  # gpu-held: the node and GPU that keep the killed rank's memory
    link_back: float | None = None  # link-flap: when the victim's cable was plugged back in
    booted: float | None = None  # node-reboot: when the victim's host was back (booted, its slurmd registered)
    held_files: list[str] | None = None  # node-reboot: the victim's /tmp and /dev/shm just before it died
    left_files: list[str] | None = None  # node-reboot: the same just after it booted again
    final: JobInfo | None = None
    result: dict[str, Any] | None = None
    printed: int = 0  # launcher events already shown

    @property
    def run_dir(self) -> Path:
        return self.ckpt / ".slurm-ft"


def default_scenarios(hosts: bool) -> tuple[str, ...]:
    """Every scenario but the network faults, and (where the nodes are hosts) ``DEFAULT_NETWORK`` too."""
    return tuple(s for s in SCENARIOS if s not in HOSTS_ONLY or (hosts and s in DEFAULT_NETWORK))


# --- jobs -------------------------------------------------------------------------------------------------------
def demo_lab_config(cfg: DemoConfig) -> LabConfig:
    """The demo's lab: 5 nodes where they are hosts (room for link-down's 3 nodes once node-death's host is
    quarantined), else 4; MinJobAge 1 h, since the checks read every job's final state after the last one ends
    (the full hosts matrix runs about 9 minutes, past Slurm's default 300 s, after which a job is gone)."""
    return LabConfig(dir=cfg.dir / "lab", nodes=5 if cfg.hosts else 4, hosts=None if cfg.auto else cfg.hosts,
                     min_job_age=3600)


def batch_script(cfg: DemoConfig, run: Run) -> str:
    py = shlex.quote(sys.executable)
    trainer = [py, "-m", "slurm_ft.train.example", "--steps", str(cfg.steps), "--seed", "3", "--sync",
               "--step-time", str(cfg.step_time_s)]
    if run.name == "user-error":  # a bug in the training code: it fails the same way on every attempt
        trainer += ["--fail-at", f"1:{cfg.fault_step}"]
    if run.name == "desync":  # likewise: a collective only rank 1 calls, on every attempt
        trainer += ["--desync-at", f"1:{cfg.fault_step}"]
    command = " ".join(trainer)
    if run.name == "stuck-loader":  # a fault of the moment: the restart runs clean
        command = first_attempt_only(command, f"--hang-at 1:{cfg.fault_step}")
    gpus, launch_flags = "", ""
    if run.name == "gpu-held":  # the step's GPUs (the lab's fake ones): what Slurm's --gres would give
        gpus, launch_flags = "export CUDA_VISIBLE_DEVICES=0\n", f"--gpu-reclaim-timeout {RECLAIM_TIMEOUT} "
    return (f"#!/bin/bash\n{gpus}exec {py} -m slurm_ft.cli launch --startup-grace 40 --probe-timeout 5 "
            f"--node-fail-wait 40 {launch_flags}-- {command}\n")


def ft_flags(run: Run) -> list[str]:
    spares = ["--ft-spare-nodes=1"] if run.name in ("gpu-held", "link-down") else []
    if run.name == "link-down":  # the allocation outlives the node (docs/ml-engineer.md: spares want --no-kill)
        spares.append("--no-kill")
    return ["--ft", f"--ft-ckpt-dir={run.ckpt}", f"--ft-ckpt-every={EVERY}", f"--ft-mem-every={MEM_EVERY}",
            "--ft-max-restarts=2", f"--ft-hang-timeout={hang_timeout(run.name)}", *spares]


def hang_timeout(scenario: str) -> int:
    return FLAP_HANG_TIMEOUT if scenario == "link-flap" else HANG_TIMEOUT


def node_count(run: Run) -> int:
    """2 nodes per job; gpu-held and link-down have a third, their spare."""
    return 3 if run.name in ("gpu-held", "link-down") else 2


def submit(run: Run, script: str, env: dict[str, str], workdir: Path) -> int:
    path = workdir / f"{run.name}.sh"
    path.write_text(script)
    # --exclusive: a dead node takes down every job on it; each scenario gets its own nodes
    done = subprocess.run(["sbatch", "--parsable", f"-N{node_count(run)}", "--exclusive", "-J", run.name,
                           *ft_flags(run), str(path)],
                          cwd=workdir,
                          env=env, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise SlurmFtError(f"demo: sbatch for {run.name} failed: {done.stderr.strip()}")
    return int(done.stdout.strip().split(";")[0])


def attempt_progress(run: Run) -> tuple[int, int] | None:
    """(launcher attempt, the slowest rank's step in it), or None before the first heartbeat of 2 ranks."""
    try:
        starts = [e for e in read_events(run.run_dir) if e["event"] == "attempt_start"]
    except FileNotFoundError:
        return None
    if not starts:
        return None
    beats = [b for b in read_heartbeats(run.run_dir) if b.time >= starts[-1]["time"] - 1]
    return (starts[-1]["attempt"], min(b.step for b in beats)) if len(beats) >= 2 else None


# --- faults -----------------------------------------------------------------------------------------------------
def inject(lab: Any, run: Run, job: JobInfo, say: Callable[[str], None]) -> None:
    """The scenario's fault, once the first attempt's ranks have all passed ``fault_step``."""
    if run.name == "kill-rank":
        signal_rank(lab, run.job_id, 1, signal.SIGKILL)
        say(f"{run.name}: rank 1 of job {run.job_id} killed (SIGKILL) at step {run.fault_step}")
    elif run.name == "hang":
        signal_rank(lab, run.job_id, 1, signal.SIGSTOP)
        say(f"{run.name}: rank 1 of job {run.job_id} stopped (SIGSTOP) at step {run.fault_step}")
    elif run.name == "node-death":
        run.victim = job.nodes[0]
        crash_node(lab, run.victim)
        what = "the whole host: every process on it, its link down" if lab.mode.value == "hosts" else \
            "slurmd, stepds, ranks"
        say(f"{run.name}: node {run.victim} (job {run.job_id}'s batch host) killed: {what}")
    elif run.name == "node-reboot":
        run.victim = job.nodes[0]
        run.held_files = lab_faults.node_local_files(lab, run.victim)
        lab.kill_host(run.victim)
        held = ", ".join(run.held_files or []) or "nothing"
        say(f"{run.name}: node {run.victim} (job {run.job_id}'s batch host) down, holding {held} in /tmp and /dev/shm;"
            f" it boots again, empty, in {REBOOT_DOWN_S:g} s")
    elif run.name == "slow-link":
        run.victim = rank_node(run, 1) or job.nodes[1]
        lab_faults.slow_link(lab, run.victim, SLOW_RATE)
        say(f"{run.name}: node {run.victim}'s link (rank 1 of job {run.job_id}) throttled to {SLOW_RATE} at step "
            f"{run.fault_step}")
    elif run.name in HOSTS_ONLY:
        run.victim = rank_node(run, 1) or job.nodes[1]
        lab_faults.link_down(lab, run.victim)
        say(f"{run.name}: node {run.victim}'s link (rank 1 of job {run.job_id}) down at step {run.fault_step}"
            + (" for good" if run.name == "link-down" else f" for {FLAP_S:g} s"))
    elif run.name == "gpu-held":
        _, node, gpu = lab_gpus.hold_and_kill(lab, run.job_id, 1, seconds=None)
        run.held = (node, gpu)
        say(f"{run.name}: rank 1 of job {run.job_id} killed (SIGKILL) at step {run.fault_step}; {node} GPU {gpu} "
            "keeps its memory for good (fake NVML)")
    elif run.name == "stuck-loader":
        say(f"{run.name}: rank 1 of job {run.job_id} sleeps outside any collective from step {run.fault_step + 1} "
            "on (--hang-at, first attempt only)")
    elif run.name == "desync":
        say(f"{run.name}: rank 1 of job {run.job_id} calls an all-reduce the others do not at step "
            f"{run.fault_step + 1} (--desync-at: a bug, on every attempt)")


def show_launcher_events(run: Run, say: Callable[[str], None]) -> None:
    try:
        events = read_events(run.run_dir)
    except FileNotFoundError:
        return
    for event in events[run.printed:]:
        kind = event["event"]
        if kind == "fault_detected":
            say(f"{run.name}: launcher detected the attempt {event['kind']} (exit {event['exit_code']}"
                + (f", no progress on ranks {event['hung_ranks']}" if event["hung_ranks"] else "") + ")")
        elif kind == "verdict":
            say(f"{run.name}: launcher verdict {event['verdict']['category']} "
                f"(recoverable={event['verdict']['recoverable']}), culprit {culprit_text(event['verdict'])}")
        elif kind in ("restart_in_place", "spare_swap"):
            say(f"{run.name}: launcher {kind.replace('_', ' ')}" + (f" (out: {', '.join(event['out'])})"
                                                                     if kind == "spare_swap" else ""))
        elif kind == "gpu_reclaim":
            held = ", ".join(f"{h['node']} GPU {h['gpu_index']}" for h in event["held"]) or "none"
            say(f"{run.name}: launcher waited for the GPUs of {', '.join(event['nodes'])} to let go: still held: "
                f"{held}")
        elif kind == "attempt_start" and event.get("resume_step") is not None:
            say(f"{run.name}: attempt {event['attempt']} on {','.join(event['nodes'])} resumes from step "
                f"{event['resume_step']}")
        elif kind == "exit":
            say(f"{run.name}: launcher exit {event['code']} ({event['why']})")
    run.printed = len(events)


# --- the demo ---------------------------------------------------------------------------------------------------
class MonitorThread:
    """The monitor polling every second over the lab's state dir, its log lines shown in short."""

    def __init__(self, lab: Any, state: Path, log_path: Path, say: Callable[[str], None]) -> None:

        self.quarantine = Quarantine(QuarantineStore(default_db_path(state)), client=lab.client())
        self.monitor = Monitor(MonitorConfig(state_dir=state, poll_interval_s=1.0), lab.client(), classify,
                               quarantine=self.quarantine)
        self.stop = threading.Event()
        self.verdicts: dict[int, dict[str, Any]] = {}  # job id -> the monitor's verdict on it
        self.thread = threading.Thread(target=self.monitor.run, daemon=True,
                                       kwargs={"stop": self.stop.is_set, "sleep": self.stop.wait})
        logger = self.logger = logging.getLogger("slurm_ft.cluster.monitor")
        self._saved_logger = (logger.propagate, logger.level, list(logger.handlers))
        logger.propagate = False
        logger.setLevel(logging.INFO)
        logger.handlers[:] = [logging.FileHandler(log_path), _ShortMonitorLines(say, self.verdicts)]

    def __enter__(self) -> "MonitorThread":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.monitor.close()
        for handler in self.logger.handlers:
            handler.close()
        propagate, level, handlers = self._saved_logger  # the demo runs in-process (tests): leave logging as found
        self.logger.propagate = propagate
        self.logger.setLevel(level)
        self.logger.handlers[:] = handlers


class _ShortMonitorLines(logging.Handler):
    def __init__(self, say: Callable[[str], None], verdicts: dict[int, dict[str, Any]]) -> None:
        super().__init__(logging.INFO)
        self.say, self.verdicts = say, verdicts

    def emit(self, record: logging.LogRecord) -> None:
        try:
            event = json.loads(record.getMessage())
        except ValueError:
            return
        kind, job = event.get("event"), event.get("job_id")
        if kind in ("job_failed", "job_requeued_by_slurm"):
            verdict = event["verdict"]
            if isinstance(job, int):
                self.verdicts[job] = verdict
            self.say(f"monitor: job {job} {event.get('state', 'requeued by Slurm')}: {verdict['category']} "
                     f"(culprit {culprit_text(verdict)}) -> {event.get('decision', 'adopt and exclude')}")
        elif kind == "node_strike":
            self.say(f"monitor: node {event['node']} struck ({event['category']}) -> {event['state']}")
        elif kind == "job_requeued":
            self.say(f"monitor: job {job} requeued, ExcNodeList={event['excluded']}, Comment '{event['comment']}'")
        elif kind == "job_stopped":
            self.say(f"monitor: job {job} stays ended: {event['reason']}")


def run_demo(cfg: DemoConfig, say: Callable[[str], None] = print,
             collect: dict[str, Any] | None = None) -> tuple[str, list[str]]:
    """Run the scenarios; return the summary table and the checks that failed (empty: all held). ``collect``
    receives the runs, the monitor's verdicts and the nodes quarantined at the end (``slurm-ft bench faults``)."""
    lab = LabCluster(demo_lab_config(cfg))
    nodes = lab.config.nodes
    say(f"lab: starting a {nodes}-node Slurm cluster in {lab.dir}" + (" (every node a host)" if cfg.hosts else ""))
    if cfg.note:
        say(f"demo: {cfg.note}")
    workdir = jobs_dir(cfg, lab.dir)
    runs = [Run(name=name, ckpt=workdir / f"ck-{name}") for name in
            sorted(cfg.scenarios, key=lambda n: (n != "node-death", SCENARIOS.index(n)))]  # longest first
    try:  # from the lab's start: a signal while it comes up takes it down too (slurm_ft.lab.interrupt)
        lab.up(progress=lambda m: say(f"lab: {m}"))
        state = lab.state_dir  # the lab's own, whatever $SLURM_FT_STATE_DIR says
        workdir.mkdir(parents=True, exist_ok=True, mode=0o755)
        env = {**os.environ, **lab.env()}
        if "gpu-held" in cfg.scenarios:
            say(f"lab: two fake GPUs per node (TEST-ONLY NVML in {lab_gpus.install(lab)})")
        with MonitorThread(lab, state, cfg.dir / "monitor.log", say) as monitor:
            for run in runs:
                run.job_id = submit(run, batch_script(cfg, run), env, workdir)
                say(f"{run.name}: submitted job {run.job_id}")
            _drive(cfg, lab, runs, say)
            _plug_back(lab, runs, say, force=True)
            _boot_back(lab, runs, say, force=True)
            time.sleep(2.5)  # the monitor's last polls over the ended jobs
            for run in runs:
                run.final = lab.client().job(run.job_id)
                run.result = _result(workdir / f"slurm-{run.job_id}.out")
            table, failed = summarize_runs(cfg, runs, lab, monitor.quarantine, monitor.verdicts)
            if collect is not None:
                collect.update(runs=runs, verdicts=dict(monitor.verdicts), failed=failed, quarantined=sorted(
                    n for n in lab.node_names if monitor.quarantine.is_quarantined(n)))
            for run in runs:
                if run.victim:
                    _restore(lab, monitor.quarantine, run.victim)
        return table, failed
    finally:
        with teardown():
            if "gpu-held" in cfg.scenarios:
                lab_gpus.remove(lab)
            if not cfg.keep_lab:
                lab.down()


def _drive(cfg: DemoConfig, lab: Any, runs: list[Run], say: Callable[[str], None]) -> None:
    client = lab.client()
    deadline = time.monotonic() + cfg.timeout_s
    pending = list(runs)
    while pending:
        if time.monotonic() > deadline:
            raise SlurmFtError(f"demo: {', '.join(r.name for r in pending)} did not finish within {cfg.timeout_s:g}s"
                               f" (evidence in {cfg.dir})")
        jobs = {j.job_id: j for j in client.jobs()}
        for run in list(pending):
            job = jobs.get(run.job_id)
            show_launcher_events(run, say)
            if job is None:
                continue
            if run.name in (*INJECTED, *IN_TRAINER) and run.fault_time is None:
                progress = attempt_progress(run)
                due = cfg.fault_step - 1 if run.name in IN_TRAINER else cfg.fault_step  # the trainer's fires next
                if progress is not None and progress[0] == 1 and progress[1] >= due:
                    run.fault_step, run.fault_time = progress[1], _fault_time(run, progress[1])
                    inject(lab, run, job, say)
            _plug_back(lab, [run], say)
            _boot_back(lab, [run], say)
            if run.name in HOST_LOST and run.victim and run.detected_at is None and (
                    job.restart_count > 0 or job.state is JobState.NODE_FAIL):
                run.detected_at = time.time()
                say(f"{run.name}: Slurm ended job {run.job_id} NODE_FAIL and requeued it")
            if job.state in ENDED:
                if run.name == "slow-link" and run.victim:
                    lab_faults.slow_link(lab, run.victim, None)  # the next job on the node runs at full speed
                show_launcher_events(run, say)
                say(f"{run.name}: job {run.job_id} {job.state.value}")
                pending.remove(run)
        time.sleep(0.3)


def jobs_dir(cfg: DemoConfig, lab_dir: Path) -> Path:
    """Where the jobs' scripts, output and checkpoints go: next to the lab, or (hosts mode) inside the lab dir,
    the one directory every node shares (their /tmp are their own)."""
    return lab_dir / "jobs" if cfg.hosts else cfg.dir / "jobs"


def _plug_back(lab: Any, runs: list[Run], say: Callable[[str], None], *, force: bool = False) -> None:
    """link-flap: plug the victim's cable back ``FLAP_S`` seconds after the fault (``force``: now)."""
    for run in _due_back(runs, "link-flap", "link_back", FLAP_S, force=force):
        lab_faults.link_up(lab, run.victim)
        run.link_back = time.time()
        say(f"{run.name}: node {run.victim}'s link up again after {run.link_back - run.fault_time:.1f} s")


def _boot_back(lab: Any, runs: list[Run], say: Callable[[str], None], *, force: bool = False) -> None:
    """node-reboot: boot the victim's host again ``REBOOT_DOWN_S`` seconds after the fault (``force``: now), empty,
    and wait until slurmctld has it back (``slurm_ft.lab.faults.boot_node``)."""
    for run in _due_back(runs, "node-reboot", "booted", REBOOT_DOWN_S, force=force):
        lab_faults.boot_node(lab, run.victim)
        run.booted = time.time()
        run.left_files = lab_faults.node_local_files(lab, run.victim)
        state = next(("+".join(sorted(n.state)) for n in lab.client().nodes() if n.name == run.victim), "?")
        say(f"{run.name}: node {run.victim} booted again after {run.booted - run.fault_time:.1f} s, "
            f"{len(run.left_files or [])} files in /tmp and /dev/shm, slurmd registered ({state})")


def _due_back(runs: list[Run], scenario: str, done: str, delay_s: float, *, force: bool) -> list[Run]:
    """The runs of ``scenario`` whose fault was injected ``delay_s`` ago or more (``force``: any) and not undone
    yet (their ``done`` field still None)."""
    return [run for run in runs if run.name == scenario and run.victim and getattr(run, done) is None
            and run.fault_time is not None and (force or time.time() >= run.fault_time + delay_s)]


def _fault_time(run: Run, step: int) -> float:
    """When the fault struck: now for one the demo injects; for one the trainer injects at the start of the step after
    ``step``, when rank 1 reached ``step`` (its heartbeat)."""
    if run.name not in IN_TRAINER:
        return time.time()
    beat = next((b for b in read_heartbeats(run.run_dir) if b.rank == 1 and b.step == step), None)
    return beat.time if beat is not None else time.time()


def _result(path: Path) -> dict[str, Any] | None:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("{") and "param_sha256" in line:
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def _restore(lab: Any, quarantine: Any, node: str) -> None:
    if lab.mode.value == "hosts":
        lab_faults.link_up(lab, node)
        lab_faults.slow_link(lab, node, None)
    lab.start_node(node)
    quarantine.release(node, by="demo")


# --- the summary ------------------------------------------------------------------------------------------------
def summarize_runs(cfg: DemoConfig, runs: list[Run], lab: Any, quarantine: Any,
                   monitor_verdicts: dict[int, dict[str, Any]] | None = None) -> tuple[str, list[str]]:
    clean = next(r for r in runs if r.name == "clean")
    clean_wall = fault_timing(read_events(clean.run_dir), fault_time=0.0, fault_step=0).wall_s or 0.0
    reference = (clean.result or {}).get("param_sha256")
    nodes = {n.name: n for n in lab.client().nodes()}
    rows = [("fault", "verdict", "culprit", "detection", "recovery", "steps lost", "requeues", "params", "ETTR",
             "resumed from")]
    failed: list[str] = []
    walls = []
    for run in sorted(runs, key=lambda r: SCENARIOS.index(r.name)):
        events = read_events(run.run_dir) if (run.run_dir / "events.jsonl").exists() else []
        timing = None if run.fault_time is None else fault_timing(
            events, fault_time=run.fault_time, fault_step=run.fault_step or 0, detected_at=run.detected_at)
        timing, source = resumed_state(run, timing, events)
        verdict = verdict_of(run, events, (monitor_verdicts or {}).get(run.job_id))
        checks = run_checks(cfg, run, timing, events, reference, nodes, quarantine)
        if run.name in MEMORY_RESUMES:
            checks += [("resumed from memory", source.startswith("memory")),
                       ("<= 1 step lost", timing is not None and timing.steps_lost is not None
                        and timing.steps_lost <= 1)]
        checks += culprit_checks(run, events, verdict)
        failed += [f"{run.name}: {what}" for what, held in checks if not held]
        wall = fault_timing(events, fault_time=0.0, fault_step=0).wall_s if events else None
        same = run.result is not None and run.result.get("param_sha256") == reference
        ratio = clean_wall / wall if wall and run.name in (*RECOVERING, *NO_RESTART) and same else None
        if ratio is not None:
            walls.append(wall)
        rows.append((run.name, verdict["category"] if verdict else "-", culprit_text(verdict) if verdict else "-",
                     _secs(timing and timing.detection_s),
                     _secs(timing and timing.recovery_s),
                     "-" if timing is None or timing.steps_lost is None else str(timing.steps_lost),
                     str(run.final.restart_count if run.final else "-"),
                     "-" if run.result is None else ("equal" if same else "DIFFERENT"),
                     "-" if ratio is None else f"{min(ratio, 1.0):.2f}", source))
    table = _table(rows)
    if walls:
        table += (f"\nETTR over the {len(walls)} recovered runs: {min(1.0, clean_wall * len(walls) / sum(walls)):.2f}"
                  f" (clean run {clean_wall:.1f} s of wall time per job; faults cost the rest)")
    return table, failed


def resumed_state(run: Run, timing: Any, events: list[dict]) -> tuple[Any, str]:
    """The restart's own ``resume`` event (rank 0 of the attempt after the fault; issue 32): where its state came
    from (``memory@9``, ``disk@8``) and, from memory or a peer, the steps lost counted from that step instead of
    the launcher's newest disk step (never below 0: the demo's fault step is the progress it saw just before)."""
    if timing is None or run.fault_time is None:
        return timing, "-"
    event = next((e for e in events if e.get("event") == "resume" and e.get("time", 0) >= run.fault_time), None)
    if event is None or not isinstance(event.get("step"), int):
        return timing, "-"
    source = f"{event.get('source')}@{event['step']}"
    if event.get("source") in ("memory", "peer"):
        timing = dataclasses.replace(timing, resume_step=event["step"],
                                     steps_lost=max(0, timing.fault_step - event["step"]))
    return timing, source


def run_checks(cfg: DemoConfig, run: Run, timing: Any, events: list[dict], reference: str | None,
               nodes: dict[str, Any], quarantine: Any) -> list[tuple[str, bool]]:
    """What must hold for ``run``'s scenario, as (description, held)."""
    final, result = run.final, run.result or {}
    state = final.state.value if final else "gone"
    comment = final.comment if final else ""
    if run.name in ("user-error", "desync"):
        attempts = sum(1 for e in events if e["event"] == "attempt_start")
        checks = [("ended FAILED", state == "FAILED"), ("one attempt", attempts == 1),
                  ("not requeued", final is not None and final.restart_count == 0),
                  ("verdict user_code in the Comment", comment.startswith("slurm-ft: stopped cause=user_code"))]
        if run.name == "desync":
            checks += [("fault injected", timing is not None),
                       ("no restart taken from the budget", job_comment.counts(comment).get("in_place", 0) == 0
                        and not any(e["event"] == "restart_in_place" for e in events)),
                       ("the attempt hung (both ranks waited)", any(e["event"] == "fault_detected"
                                                                    and e["kind"] == "hung" for e in events))]
        return checks
    checks = [("completed", state == "COMPLETED"), ("all steps", result.get("step") == cfg.steps)]
    if run.name == "clean":
        return checks
    checks += [("fault injected", timing is not None),
               ("params equal the clean run's", reference is not None and result.get("param_sha256") == reference),
               (f"<= {EVERY} steps lost", timing is not None and (
                   run.name in NO_RESTART or timing.steps_lost is not None and 0 <= timing.steps_lost <= EVERY))]
    if run.name in ("kill-rank", "hang", "stuck-loader"):
        checks.append(("recovered in place", final is not None and final.restart_count == 0))
    if run.name == "gpu-held":
        checks += gpu_held_checks(run, events)
    if run.name in ("hang", "stuck-loader"):
        checks.append((f"detected within the {HANG_TIMEOUT} s hang timeout (+5 s polling)",
                       timing is not None and timing.detection_s is not None
                       and timing.detection_s <= HANG_TIMEOUT + 5))
    if run.name in ("link-down", "link-flap"):
        checks += link_checks(run, timing, events, quarantine)
    if run.name == "slow-link":
        checks += [("no fault detected", not any(e["event"] == "fault_detected" for e in events)),
                   ("one attempt, not requeued", sum(e["event"] == "attempt_start" for e in events) == 1
                    and final is not None and final.restart_count == 0),
                   (f"{run.victim or '?'} not struck for this job", not any(  # another scenario may fault it
                       s.job_id == run.job_id for s in quarantine.strikes(run.victim or "")))]
    if run.name == "node-death":
        node = nodes.get(run.victim)
        checks += [("requeued once", final is not None and final.restart_count == 1),
                   ("classified hardware_node", "cause=hardware_node" in comment),
                   ("dead node in ExcNodeList", final is not None and run.victim in final.excluded_nodes),
                   ("dead node quarantined", bool(run.victim) and quarantine.is_quarantined(run.victim)
                    and node is not None and node.reason.startswith(TAG))]
    if run.name == "node-reboot":
        checks += reboot_checks(run, events)
    return checks


def reboot_checks(run: Run, events: list[dict]) -> list[tuple[str, bool]]:
    """node-reboot: Slurm requeued the job once (its batch host, the launcher with it, was gone), the host came back
    empty, and the job finished (its parameters equal the clean run's: ``run_checks``) whatever it had held there."""
    node = run.victim or "?"
    later = [e for e in events if e["event"] == "attempt_start" and e["time"] >= (run.fault_time or 0.0)]
    return [("requeued once", run.final is not None and run.final.restart_count == 1),
            (f"{node} booted again, its slurmd registered", run.booted is not None),
            (f"{node} came back with an empty /tmp and /dev/shm", run.held_files is not None
             and run.left_files == []),
            ("resumed from a committed checkpoint after the reboot", bool(later) and bool(later[0].get("resume_step")))]


def link_checks(run: Run, timing: Any, events: list[dict], quarantine: Any) -> list[tuple[str, bool]]:
    """link-down: caught within the hang timeout (+5 s), the job goes on without the node; link-flap: restarted in
    place on the same nodes, the node struck once (a soft strike) and not quarantined."""
    node = run.victim or "?"
    starts = [e for e in events if e["event"] == "attempt_start"]
    later = starts[1:]
    limit = hang_timeout(run.name)
    checks = [(f"detected within the {limit} s hang timeout + 5 s", timing is not None
               and timing.detection_s is not None and timing.detection_s <= limit + 5)]
    if run.name == "link-down":
        excluded = run.final is not None and node in run.final.excluded_nodes
        return checks + [(f"went on without {node} (spare or requeue excluding it)", bool(later) and all(
            node not in e["nodes"] for e in later) and (run.final is not None and run.final.restart_count == 0
                                                       or excluded))]
    strikes = [s.category for s in quarantine.strikes(node) if s.job_id == run.job_id]
    return checks + [("recovered in place on the same nodes", run.final is not None and run.final.restart_count == 0
                      and bool(later) and all(e["nodes"] == starts[0]["nodes"] for e in later)),
                     (f"{node} struck once (network, its epilog's own link counters)", strikes == ["network"]),
                     (f"{node} not quarantined", not quarantine.is_quarantined(node))]


def gpu_held_checks(run: Run, events: list[dict]) -> list[tuple[str, bool]]:
    """The launcher waited for the GPUs, found the held one, swapped its node out and finished without it."""
    node, gpu = run.held or ("?", -1)
    waits = [e for e in events if e["event"] == "gpu_reclaim"]
    held = [(h["node"], h["gpu_index"]) for e in waits for h in e["held"]]
    swaps = [e for e in events if e["event"] == "spare_swap"]
    later = [e for e in events if e["event"] == "attempt_start" and e["attempt"] > 1]
    return [(f"the wait named {node} GPU {gpu} held", held == [(node, gpu)]),
            (f"{node} swapped out for the spare", [s["out"] for s in swaps] == [[node]]),
            (f"finished without {node}", bool(later) and all(node not in e["nodes"] for e in later)),
            ("not requeued", run.final is not None and run.final.restart_count == 0)]


def verdict_of(run: Run, events: list[dict], monitor_verdict: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The verdict on the run's first fault: the launcher's first ``verdict`` event, else the monitor's (a launcher
    that died with its node judged nothing); None for a run without a fault."""
    launcher = next((e["verdict"] for e in events if e["event"] == "verdict"), None)
    return launcher if launcher is not None else monitor_verdict


def rank_node(run: Run, rank: int) -> str:
    """Where ``rank`` ran in the first attempt (its heartbeat's host; a run of one attempt keeps them in place)."""
    first = run.run_dir / "attempt-1"
    beats = [b for b in read_heartbeats(first if first.is_dir() else run.run_dir) if b.rank == rank]
    return beats[0].host if beats else ""


def culprit_checks(run: Run, events: list[dict], verdict: dict[str, Any] | None) -> list[tuple[str, bool]]:
    """The verdict names the rank the demo faulted (rank 1) and its node, in the design's words."""
    words = {c.value for c in Category}
    if run.name in ("clean", *NO_RESTART):
        return [("no verdict", verdict is None)]
    checks = [("a verdict in the design's words", verdict is not None and verdict["category"] in words)]
    if run.name in ("kill-rank", "hang", "stuck-loader", "user-error", "desync"):
        node = rank_node(run, 1)
        culprit = (verdict or {}).get("culprit", {})
        checks += [(f"culprit rank 1 on {node or '?'} only", bool(node) and culprit.get("ranks") == [1]
                    and culprit.get("nodes") == [node]),
                   ("a verdict event in events.jsonl", any(e["event"] == "verdict" for e in events))]
    if run.name == "kill-rank":
        checks.append(("not network", verdict is not None and verdict["category"] != Category.NETWORK.value))
    lines = list((verdict or {}).get("evidence", []))
    traced = [line for line in lines if "[flight recorder]" in line and line.startswith("rank 1 ")]
    if run.name in ("hang", "stuck-loader"):
        checks += [("hang", verdict is not None and verdict["category"] == Category.HANG.value),
                   ("rank 1 and its collective from the flight recorder", bool(traced))]
    if run.name == "stuck-loader":
        checks.append(("never entered the collective", any("never entered" in line for line in traced)))
    if run.name == "desync":
        checks += [("user_code, not recoverable", verdict is not None and verdict["category"] == "user_code"
                    and verdict["recoverable"] is False),
                   ("both collectives in the evidence", any("all_reduce" in line and "all_gather" in line
                                                            for line in traced))]
    culprit = (verdict or {}).get("culprit", {})
    if run.name in ("link-down", "node-reboot"):
        checks.append((f"culprit {run.victim or '?'} only", bool(run.victim) and culprit.get("nodes") == [run.victim]))
    if run.name == "link-flap":  # both ranks stalled alike and the probe found the link back: the counters name it
        checks += [(f"culprit {run.victim or '?'} only", bool(run.victim) and culprit.get("nodes") == [run.victim]),
                   ("network, recoverable", verdict is not None and verdict["category"] == Category.NETWORK.value
                    and verdict["recoverable"] is True),
                   ("the link's counter in the evidence", any(line.startswith(f"{run.victim}: link ") and
                                                              "went down" in line for line in lines))]
    if run.name == "link-down":
        checks.append(("network or hardware_node", verdict is not None and verdict["category"] in (
            Category.NETWORK.value, Category.HARDWARE_NODE.value)))
    if run.name == "gpu-held":
        node = (run.held or ("?", -1))[0]
        culprit = (verdict or {}).get("culprit", {})
        checks += [("hardware_gpu", verdict is not None and verdict["category"] == Category.HARDWARE_GPU.value),
                   (f"culprit {node} only", culprit.get("nodes") == [node])]
    return checks


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


# --- CLI --------------------------------------------------------------------------------------------------------
def register(subparsers: argparse._SubParsersAction, name: str = "demo") -> None:
    parser = subparsers.add_parser(name, help="inject faults into training jobs on a local Slurm lab, show recovery",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="working directory (default: a new one under /tmp)")
    parser.add_argument("--scenarios", default=None,
                        help=f"comma-separated subset of {','.join(SCENARIOS)} (clean always runs; default: all "
                        f"but {', '.join(HOSTS_ONLY)}, and {', '.join(DEFAULT_NETWORK)} too where the lab's nodes "
                        "are hosts)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--hosts", action="store_const", const=True, dest="hosts", default=None,
                      help="insist that every lab node be a host of its own (default: where this machine allows "
                           "namespaces, as `slurm-ft lab up`)")
    mode.add_argument("--single-address", action="store_const", const=False, dest="hosts",
                      help=f"all lab nodes on 127.0.0.1 (no {', '.join(HOSTS_ONLY)})")
    parser.add_argument("--steps", type=int, default=24, help="training steps per job (default 24)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for all jobs (default 600)")
    parser.add_argument("--keep-lab", action="store_true", help="leave the lab running afterwards")
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="slurm-ft-demo-", dir="/tmp"))
    try:
        chosen = {} if args.scenarios is None else {
            "scenarios": tuple(s.strip() for s in args.scenarios.split(",") if s.strip())}
        cfg = DemoConfig(dir=workdir, steps=args.steps, timeout_s=args.timeout, keep_lab=args.keep_lab,
                         hosts=args.hosts, **chosen)
    except ValueError as exc:
        raise SlurmFtError(f"demo: {exc}") from exc
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o755)  # the jobs read their scripts and write checkpoints here

    def say(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    return run_to_the_end("demo", lambda: _run(cfg, say, workdir))


def _run(cfg: DemoConfig, say: Callable[[str], None], workdir: Path) -> int:
    started = time.monotonic()
    table, failed = run_demo(cfg, say)
    print()
    print(table)
    print()
    for line in failed:
        print(f"FAILED CHECK  {line}")
    print(f"{'all checks held' if not failed else f'{len(failed)} check(s) failed'} in "
          f"{time.monotonic() - started:.0f} s; evidence in {workdir} (monitor.log, jobs/)")
    return 0 if not failed else 1
