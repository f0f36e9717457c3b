"""Fault scenarios for the demo and benchmarks, and what one run's evidence says about its recovery.

Faults are injected by (rank, step) through the example trainer's flags, on the launcher's first attempt only
(``$SLURM_FT_ATTEMPT``), so a restarted attempt runs clean. ``summarize(run_dir)`` reads the launcher's
``events.jsonl`` and the first attempt's heartbeats (``attempt-1/``) and returns detection time, recovery time
and steps lost.

In hosts mode (``slurm-ft lab up --hosts``) the network faults are real: ``link_down``/``link_up`` pull and plug
a node's cable (its veth on the lab bridge), ``slow_link`` throttles it with a tbf qdisc, ``crash_node`` is the
death of the whole host, and ``reboot_node`` its death and its return, empty, a little later (``crash_node`` now,
``boot_node`` after the downtime; ``slurm-ft lab fault`` applies them by hand).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

from slurm_ft.core import env as ft_env
from slurm_ft.core.rundir import read_events, read_heartbeats
from slurm_ft.core.errors import SlurmFtError
from slurm_ft.lab import procs
from slurm_ft.lab.cluster import node_ready


class Fault(str, enum.Enum):
    KILL_RANK = "kill-rank"  # SIGKILL one rank mid-step (--crash-at)
    HANG = "hang"  # one rank stops making progress (--hang-at)
    USER_ERROR = "user-error"  # an exception in the training code (--fail-at)
    DESYNC = "desync"  # one rank calls a collective the others do not (--desync-at): a bug, on every attempt


_FLAG = {Fault.KILL_RANK: "--crash-at", Fault.HANG: "--hang-at", Fault.USER_ERROR: "--fail-at",
         Fault.DESYNC: "--desync-at"}


def trainer_flags(fault: Fault, rank: int, step: int) -> str:
    """The example trainer's flag injecting ``fault`` at ``rank``/``step``."""
    if rank < 0 or step < 1:
        raise ValueError(f"fault position: rank must be >= 0 and step >= 1, got {rank}:{step}")
    return f"{_FLAG[Fault(fault)]} {rank}:{step}"


def first_attempt_only(command: str, flags: str) -> str:
    """A shell command line that adds ``flags`` to ``command`` on the launcher's first attempt only."""
    return f"/bin/bash -c 'if [ \"$SLURM_FT_ATTEMPT\" = 1 ]; then x=\"{flags}\"; fi; exec {command} $x'"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    """One run's fault and recovery, from its evidence. ``None``: not seen (no fault, or no restart)."""

    attempts: int
    exit_code: int | None
    fault_kind: str | None = None
    detection_s: float | None = None  # last heartbeat progress -> fault detected by the launcher
    recovery_s: float | None = None  # fault detected -> first heartbeat of the next attempt (poll resolution)
    steps_lost: int | None = None  # steps done before the fault that were redone (last step - resume step)
    wall_s: float | None = None  # first attempt start -> exit


def summarize(run_dir: str | Path) -> Recovery:
    events = read_events(run_dir)
    starts = [e for e in events if e["event"] == "attempt_start"]
    end = next((e for e in reversed(events) if e["event"] == "exit"), None)
    fault = next((e for e in events if e["event"] == "fault_detected"), None)
    wall = end["time"] - starts[0]["time"] if end and starts else None
    result = Recovery(attempts=len(starts), exit_code=end["code"] if end else None, wall_s=wall)
    if fault is None:
        return result
    beats = read_heartbeats(Path(run_dir) / "attempt-1")
    last = max(beats, key=lambda b: b.time) if beats else None
    resumed = next((e for e in events if e["event"] == "first_step" and e.get("attempt") == 2), None)
    restart = next((e for e in starts if e.get("attempt") == 2), None)
    resume_step = restart.get("resume_step") if restart else None
    return dataclasses.replace(
        result, fault_kind=fault["kind"],
        detection_s=fault["time"] - last.time if last else None,
        recovery_s=resumed["time"] - fault["time"] if resumed else None,
        steps_lost=max(b.step for b in beats) - (resume_step or 0) if restart and beats else None)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FaultTiming:
    """One fault injected from outside at ``fault_time`` (rank steps at ``fault_step``), as the launcher's events
    saw it. ``None``: not seen (no restart, or the launcher died with the node)."""

    fault_time: float
    fault_step: int
    detection_s: float | None = None  # fault -> detected (the launcher's fault_detected, or ``detected_at``)
    recovery_s: float | None = None  # fault -> the first step of the attempt that followed
    resume_step: int | None = None  # the checkpoint that attempt resumed from
    steps_lost: int | None = None  # fault_step - resume_step: work done twice
    wall_s: float | None = None  # first attempt start -> last exit (across requeues: events.jsonl is appended)


def fault_timing(events: list[dict], *, fault_time: float, fault_step: int,
                 detected_at: float | None = None) -> FaultTiming:
    """Detection, recovery and steps lost for a fault injected at ``fault_time`` (events: ``read_events``).
    ``detected_at`` stands in when no launcher saw the fault (a dead batch host: Slurm's NODE_FAIL)."""
    after = [e for e in events if e["time"] >= fault_time]
    detected = next((e["time"] for e in after if e["event"] == "fault_detected"), detected_at)
    restart = next((e for e in after if e["event"] == "attempt_start"), None)
    resumed = next((e for e in after if e["event"] == "first_step" and restart is not None
                    and e["time"] >= restart["time"]), None)
    resume_step = (restart.get("resume_step") or 0) if restart is not None else None
    starts = [e["time"] for e in events if e["event"] == "attempt_start"]
    ends = [e["time"] for e in events if e["event"] == "exit"]
    return FaultTiming(
        fault_time=fault_time, fault_step=fault_step,
        detection_s=None if detected is None else detected - fault_time,
        recovery_s=None if resumed is None else resumed["time"] - fault_time,
        resume_step=resume_step, steps_lost=None if resume_step is None else fault_step - resume_step,
        wall_s=ends[-1] - starts[0] if starts and ends else None)


def ettr(recovery: Recovery, clean_wall_s: float) -> float | None:
    """Effective training time ratio of a faulted run: the clean run's wall time over this run's."""
    if not recovery.wall_s or clean_wall_s <= 0:
        return None
    return min(1.0, clean_wall_s / recovery.wall_s)


# --- process-level faults on the lab cluster -------------------------------------------------------------------
# Used by the demo, the integration tests and the lab benchmark. Each finds its victims by the environment that
# slurmstepd gives job processes (SLURM_CLUSTER_NAME of this lab, SLURMD_NODENAME, SLURM_JOB_ID, SLURM_PROCID),
# never by name, and never touches this process or its ancestors.
def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if b"=" in item)
    return {key: value for key, _, value in pairs}


def _job_processes(lab, **match: str) -> list[tuple[int, dict[str, str]]]:
    """Processes of ``lab``'s jobs whose environment has every ``match`` item (e.g. SLURMD_NODENAME="n2")."""
    spared = procs.ancestors(os.getpid())
    found = []
    for pid in procs.all_pids():
        if pid in spared:
            continue
        env = _environ(pid)
        if env.get("SLURM_CLUSTER_NAME") == lab.cluster_name and all(env.get(k) == v for k, v in match.items()):
            found.append((pid, env))
    return found


def crash_node(lab, node: str) -> list[int]:
    """Node ``node`` dies as a whole: its slurmd, then every slurmstepd and job process on it (SIGKILL). In hosts
    mode that is the death of the host: its link goes down and every process in its namespaces is killed.

    Slurm notices only after SlurmdTimeout (the job then ends NODE_FAIL unless it runs with ``--no-kill``);
    the ranks on other nodes see their peer's connections drop at once (single-address mode) or stop hearing
    from it (hosts mode). Returns the pids killed."""
    if lab.mode.value == "hosts":
        return lab.kill_host(node)
    lab.stop_node(node)
    tasks = [pid for pid, _ in _job_processes(lab, SLURMD_NODENAME=node)]
    stepds = {ppid for ppid in map(procs.parent, tasks) if procs.comm(ppid) == "slurmstepd"}
    killed = []
    for pid in [*sorted(stepds), *tasks]:  # the stepds first: nothing reports the tasks' deaths
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            continue
    return killed


# --- network faults (hosts mode: ``slurm-ft lab up --hosts``) ---------------------------------------------------
class NetFault(str, enum.Enum):
    LINK_DOWN = "link-down"  # the node's cable is pulled (its veth on the lab bridge down) and stays out
    LINK_UP = "link-up"  # plugged back in
    SLOW_LINK = "slow-link"  # the node's link throttled both ways to a rate (tbf; netem is not in every kernel)
    FAST_LINK = "fast-link"  # the throttle lifted
    HOST_DEATH = "host-death"  # the whole host dies: every process in its namespaces killed, link down
    NODE_REBOOT = "node-reboot"  # the host dies, stays down a while, and boots again empty (fresh /tmp, /dev/shm, /run)


# node-reboot's default downtime. slurmctld counts a job lost on a node that rebooted when the node's new boot time
# is more than MessageTimeout + 5 s (15 s in the lab) after the job's start: a real boot takes longer than that.
REBOOT_DOWN_S = 20.0
BOOT_TIMEOUT_S = 60.0  # how long a booted node may take to register with slurmctld again


_RATE = re.compile(r"^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)$")


def check_rate(rate: str) -> str:
    """A tc rate (``10mbit``, ``500kbit``, ``1.5mbps``), or ValueError naming the value."""
    if not _RATE.match(rate):
        raise ValueError(f"rate: {rate!r} is not a tc rate such as 10mbit, 500kbit or 1mbps")
    return rate


def link_down(lab, node: str) -> None:
    """Pull node ``node``'s cable: nothing reaches it or leaves it until ``link_up``."""
    lab.set_link(node, up=False)


def link_up(lab, node: str) -> None:
    lab.set_link(node, up=True)


def slow_link(lab, node: str, rate: str | None) -> None:
    """Throttle node ``node``'s link to ``rate`` both ways (tbf qdisc on each end of its veth); None lifts it."""
    lab.throttle_link(node, None if rate is None else check_rate(rate))


def check_down_s(down_s: float) -> float:
    """A reboot's downtime in seconds (0..3600), or ValueError naming the value."""
    if not 0 <= down_s <= 3600:
        raise ValueError(f"down_s: a reboot's downtime must be within 0..3600 seconds (--down-s), got {down_s:g}")
    return down_s


def reboot_node(lab, node: str, down_s: float = REBOOT_DOWN_S, *,
                sleep: Callable[[float], None] = time.sleep) -> list[int]:
    """Node ``node`` reboots (hosts mode): its host dies as in ``crash_node`` (every process killed, link down),
    stays down ``down_s`` seconds, then boots again empty (``boot_node``). Returns the pids killed."""
    check_down_s(down_s)
    killed = lab.kill_host(node)
    sleep(down_s)
    boot_node(lab, node)
    return killed


def boot_node(lab, node: str, timeout_s: float = BOOT_TIMEOUT_S) -> None:
    """Node ``node``'s host boots after ``kill_host``: fresh PID, mount and UTS namespaces with empty private
    ``/tmp``, ``/dev/shm`` and ``/run`` (its network namespace, the NIC, is kept), its link up, slurmd started; then
    wait until slurmctld has it back.

    How it returns to service is Slurm's own, on both releases the lab runs (22.05, 25.11): slurmd registers with
    an uptime counted from the host's boot (its time namespace, ``hosts.holder_argv``), so slurmctld sees a new
    BootTime, ends a batch job whose batch host rebooted NODE_FAIL (requeued where it may be), and, as the lab's
    slurm.conf has ``ReturnToService=2``, puts the node back in service at once, even one it had marked DOWN for
    not responding; nobody runs ``scontrol update state=resume``. A drain set meanwhile (slurm-ft's quarantine)
    stays: the node then returns IDLE+DRAIN, as slurm-ft decided."""
    lab.start_node(node)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            seen = next((n for n in lab.client().nodes() if n.name == node), None)
        except SlurmFtError:
            seen = None
        if seen is not None and node_ready(seen):
            return
        if time.monotonic() > deadline:
            state = "+".join(sorted(seen.state)) if seen is not None else "unknown"
            raise SlurmFtError(f"node-reboot: {node} did not register with slurmctld within {timeout_s:g} s "
                               f"after its boot (state {state})")
        time.sleep(0.5)


def node_local_files(lab, node: str) -> list[str] | None:
    """What node ``node``'s host holds in its private ``/tmp`` and ``/dev/shm`` (paths as the node sees them, sorted),
    read through its holder's root (``/proc/PID/root``: its mount namespace); None when the host is not running."""
    holder = lab.host_pid(node)
    if holder is None:
        return None
    found = []
    for where in ("tmp", "dev/shm"):
        try:
            found += [f"/{where}/{name}" for name in os.listdir(f"/proc/{holder}/root/{where}")]
        except OSError:
            return None
    return sorted(found)


def inject(lab, fault: NetFault | str, node: str, rate: str | None = None,
           down_s: float = REBOOT_DOWN_S) -> list[int]:
    """Apply one network fault to ``node`` (``slurm-ft lab fault``); the pids killed by a host death or a
    reboot."""
    fault = NetFault(fault)
    if fault is NetFault.SLOW_LINK and rate is None:
        raise ValueError("rate: slow-link needs a rate such as 10mbit")
    if fault is NetFault.NODE_REBOOT:
        return reboot_node(lab, node, down_s)
    actions = {NetFault.LINK_DOWN: lambda: link_down(lab, node), NetFault.LINK_UP: lambda: link_up(lab, node),
               NetFault.SLOW_LINK: lambda: slow_link(lab, node, rate),
               NetFault.FAST_LINK: lambda: slow_link(lab, node, None)}
    if fault is NetFault.HOST_DEATH:
        return lab.kill_host(node)
    actions[fault]()
    return []


def rank_pid(lab, job_id: int, rank: int) -> int | None:
    """The pid of global rank ``rank`` of job ``job_id``'s newest step: the task slurmstepd started, or the
    training process under it when that task is the launcher's per-rank wrapper (``slurm_ft.launch.rank``)."""
    found = _job_processes(lab, SLURM_JOB_ID=str(job_id), SLURM_PROCID=str(rank))
    tasks = [(int(env["SLURM_STEP_ID"]), pid) for pid, env in found
             if env.get("SLURM_STEP_ID", "").isdigit() and procs.comm(procs.parent(pid)) == "slurmstepd"
             and STANDBY_MODULE not in procs.cmdline(pid)]  # the warm standbys' step is no attempt
    if not tasks:
        return None
    task = max(tasks)[1]
    if "slurm_ft.launch.rank" not in procs.cmdline(task):
        return task
    under = [pid for pid, _ in found if procs.parent(pid) == task]
    return under[0] if under else standby_rank_pid(dict(found)[task], rank, task)


def standby_rank_pid(wrapper_env: dict[str, str], rank: int, wrapper: int) -> int | None:
    """The rank a warm standby runs for wrapper ``wrapper`` with no child of its own (``slurm_ft.launch.standby``):
    the process its heartbeat names (by its pid on its own node: translated into ours, as the node's PID namespace
    is not ours when the lab's nodes are hosts), when that is a live child of a standby (a spare that became the
    rank: its command line is the spare's, so nothing else names it)."""

    run_dir = ft_env.job_setting(ft_env.RUN_DIR, wrapper_env)
    if not run_dir:
        return None
    beat = next((b for b in read_heartbeats(run_dir) if b.rank == rank), None)
    pid = procs.outer_pid(beat.pid, procs.pid_namespace(wrapper)) if beat is not None and beat.pid else None
    if pid is None or not alive(pid):
        return None
    return pid if STANDBY_MODULE in procs.cmdline(procs.parent(pid)) else None


def signal_rank(lab, job_id: int, rank: int, sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` to rank ``rank`` of job ``job_id`` (SIGKILL: a crash; SIGSTOP: a hang). Returns its pid."""
    pid = rank_pid(lab, job_id, rank)
    if pid is None:
        raise LookupError(f"no running rank {rank} in job {job_id}")
    os.kill(pid, sig)
    return pid


TRAINER_MODULE = "slurm_ft.train.example"
STANDBY_MODULE = "slurm_ft.launch.standby"


@dataclasses.dataclass(frozen=True, slots=True)
class RankProcess:
    """One training process of a job: its global rank, pid and node."""

    rank: int
    pid: int
    node: str


def is_trainer(argv: tuple[str, ...], module: str = TRAINER_MODULE) -> bool:
    """Whether ``argv`` is a Python process running ``module`` itself (not srun, torchrun or slurm-ft launch
    carrying it as an argument)."""
    if not argv or not Path(argv[0]).name.startswith("python"):
        return False
    first = next((argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "-m"), None)
    return first == module


def training_processes(lab, job_id: int, module: str = TRAINER_MODULE) -> list[RankProcess]:
    """The live training processes of job ``job_id``, whoever started them (srun, torchrun's agent). The rank
    is ``RANK`` (torchrun) or else ``SLURM_PROCID``."""
    found = []
    for pid, env in _job_processes(lab, SLURM_JOB_ID=str(job_id)):
        rank = env.get("RANK") or env.get("SLURM_PROCID", "")
        if not rank.isdigit() or not alive(pid):
            continue
        argv = procs.cmdline(pid)
        if is_trainer(argv, module):
            found.append(RankProcess(rank=int(rank), pid=pid, node=env.get("SLURMD_NODENAME", "")))
        elif _wraps(argv, module) and (warm := standby_rank_pid(env, int(rank), pid)) is not None:
            found.append(RankProcess(rank=int(rank), pid=warm, node=env.get("SLURMD_NODENAME", "")))
    return sorted(found, key=lambda p: (p.rank, p.pid))


def _wraps(argv: tuple[str, ...], module: str) -> bool:
    """Whether ``argv`` is the per-rank wrapper (``slurm_ft.launch.rank -- CMD``) around the trainer."""
    if "slurm_ft.launch.rank" not in argv or "--" not in argv:
        return False
    return is_trainer(argv[argv.index("--") + 1:], module)


def alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rfind(")") + 2:][:1] != "Z"
