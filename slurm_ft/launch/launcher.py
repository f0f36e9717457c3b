"""The in-allocation supervisor: ``slurm-ft launch [options] -- CMD...`` inside the batch script.

Runs ``srun ... CMD`` over the allocation in a bounded restart loop (separate budgets, like torch elastic's
``_invoke_run``: a failure uses a retry, swapping in a spare node does not). While an attempt runs it watches
the ranks' heartbeats: a rank whose step has not advanced for ``hang_timeout_s`` (after a startup grace) is a
hang, and the attempt is killed. After a failed attempt:

- the earliest error file is the root cause; a non-recoverable verdict (user code, config ...) ends the job
  with the attempt's exit code, for the monitor to record;
- every node healthy -> restart in place, resuming from the newest checkpoint. Healthy: Slurm does not call it
  down, drained or not responding, and it runs a one-task probe step within ``probe_timeout_s``
  (``slurm_ft.launch.probe``: Slurm itself notices a dead node only after SlurmdTimeout); and before the nodes run
  the next attempt, their GPUs let go of the failed attempt's processes within ``gpu_reclaim_timeout_s``
  (``slurm_ft.launch.reclaim``, checked on each node through NVML): a GPU still held is a bad GPU
  (``hardware_gpu``), and its node is treated as unhealthy;
- a node unhealthy and enough spares -> swap the spares in and restart (submit with ``sbatch --no-kill`` so
  that the allocation survives the loss of a node);
- otherwise wait up to ``node_fail_wait_s`` for Slurm to declare the bad node (the job then ends NODE_FAIL and
  Slurm requeues it, with the node's state as evidence for the monitor), then exit ``EX_TEMPFAIL`` (75) with
  ``slurm-ft: tempfail bad_nodes=...`` in the job's Comment: the monitor requeues the job without those nodes.

Restarts start their ranks from warm standbys (``slurm_ft.launch.standby``) and rendezvous at a store the launcher's
node holds open (``slurm_ft.launch.store``), not at one rank 0 must start first.

Every rank runs under a tiny wrapper (``slurm_ft.launch.rank``) that records how and when it ended, and on a bad
end rings the launcher's fault bell (``slurm_ft.launch.bell``), so the attempt ends then, not a poll later; before
killing a hung attempt the launcher has each node read its ranks' process states and stacks (``slurm_ft.launch.hang``).
Every failed or hung attempt gets a ``verdict`` event naming the culprit rank and node (``slurm_ft.launch.verdict``)
and a short root cause paragraph in the job's output.

Between attempts the run directory's heartbeats, error files, end records and hang evidence move to
``attempt-<N>/`` (evidence); those a requeued job finds from its previous run move to ``earlier/``. Events go
to ``<run_dir>/events.jsonl``: ``attempt_start``, ``fault_detected {kind, time}``, ``gpu_reclaim``, ``verdict``,
``first_step``, ``standby_start``, ``standby_off``, ``standby_dropped`` (the standby steps on a node that
rebooted), ``launcher_store_off``, ``comment_error``, ``exit``. Each rank gets its own GPUs and NCCL's fault
settings (``slurm_ft.launch.rank_env``).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from slurm_ft.classify import collectives
from slurm_ft.classify.engine import victims_view
from slurm_ft.core import comment as job_comment
from slurm_ft.core import env as ft_env
from slurm_ft.core import shmdir
from slurm_ft.core.budget import Budget
from slurm_ft.core.config import require
from slurm_ft.core.errors import ConfigError, SlurmFtError
from slurm_ft.core.rundir import (
    END_GLOB,
    ERROR_GLOB,
    EVENTS_FILE,
    GPU_GLOB,
    HANG_GLOB,
    HEARTBEAT_GLOB,
    NCCL_TRACE_GLOB,
    RECLAIM_GLOB,
    STACK_GLOB,
    TRACE_GLOB,
    RankState,
    append_event,
    make_run_dir,
    read_ends,
    read_errors,
    read_heartbeats,
    read_rank_states,
    trace_path,
)
from slurm_ft.core.taxonomy import Category
from slurm_ft.health.jobfiles import latest_step
from slurm_ft.launch import bell as fault_bell
from slurm_ft.launch.hang import rank_states
from slurm_ft.launch.links import LINKS_GLOB
from slurm_ft.launch.preempt import PreemptConfig, requeue_job
from slurm_ft.launch.rank_env import nccl_defaults, wire
from slurm_ft.launch.probe import REBOOTED
from slurm_ft.launch.reclaim import Reclaimed, gpus_in_use
from slurm_ft.launch.standby import STOP_SIGNAL, script_of
from slurm_ft.launch.store import AGENT_STORE_ENV, RESTART_COUNT_ENV
from slurm_ft.launch.text import describe
from slurm_ft.launch.traces import DEFAULT_ENTRIES, recorder_env
from slurm_ft.launch.verdict import attempt_evidence, paragraph, root_cause
from slurm_ft.slurm.address import master_addr
from slurm_ft.slurm.types import NodeInfo

log = logging.getLogger("slurm_ft.launch.launcher")

EX_TEMPFAIL = 75  # sysexits.h: the allocation cannot recover; the monitor should requeue the job
COMMENT_FLUSH_S = 30.0  # how long the launcher waits for its Comment to be written before a requeue or its exit
LIVENESS_STALE_S = 6.0  # a rank's liveness beat (every 2 s by default) unchanged this long: the rank is stuck itself


class Outcome(str, enum.Enum):
    """How one attempt ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # srun exited non-zero (a rank died, a node failed)
    HUNG = "hung"  # no heartbeat progress within the hang timeout; killed by us
    PREEMPTED = "preempted"  # the launcher got SIGUSR1/SIGTERM: forwarded to the ranks (slurm_ft.launch.preempt)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LaunchConfig:
    """``slurm-ft launch``: what to run, how to watch it, and how to restart it."""

    command: tuple[str, ...]
    """The training command (after ``--``)."""
    nodes: int | None = None
    """Nodes per attempt (``--nodes``); unset: the allocation minus the spares."""
    ntasks_per_node: int = 1
    """Ranks per node (``--ntasks-per-node``)."""
    hang_timeout_s: float = 300.0
    """Seconds without heartbeat progress that make a hang (``--hang-timeout``, ``--ft-hang-timeout``); 0 turns the hang
    watch off."""
    startup_grace_s: float = 60.0
    """Seconds after an attempt starts before hang checks begin (``--startup-grace``)."""
    exit_grace_s: float = 300.0
    """Seconds every rank may take to exit once all finished their loop (their heartbeats say ``done``: an exit
    after the last step can be slow, a communicator's teardown or a loaded node); past it the attempt is hung."""
    max_restarts: int = 3
    """The job's restart budget: in-place restarts and requeues together (``--max-restarts``, ``--ft-max-restarts``)."""
    spare_nodes: int = 0
    """Allocation nodes held back to replace a bad one (``--spare-nodes``, ``--ft-spare-nodes``)."""
    run_dir: Path = Path(".slurm-ft")
    """Heartbeats, error files and events (``--run-dir``; default ``$SLURM_FT_RUN_DIR`` or ``<ckpt_dir>/.slurm-ft``)."""
    poll_s: float = 1.0
    """Seconds between two looks at the ranks; a rank's bad end rings the launcher awake sooner (the fault bell)."""
    kill_grace_s: float = 10.0
    """Seconds srun gets after SIGTERM to end a hung or failed attempt before SIGKILL."""
    evidence_wait_s: float = 1.0
    """After a rank wrote its error file or ended badly: the most the launcher waits for the rest of the evidence before
    it ends the step (at once when every rank with an error file has its end record too)."""
    error_grace_s: float = 3.0
    """How long srun may take to exit after its SIGTERM, once evidence is in, before SIGKILL."""
    probe_timeout_s: float = 10.0
    """Seconds a node may take to run a one-task probe step after a failure (``--probe-timeout``); 0: no probe."""
    node_fail_wait_s: float = 60.0
    """Seconds to wait for Slurm to declare a bad node before exiting 75 for the monitor (``--node-fail-wait``)."""
    rank_records: bool = True
    """Run each rank under the wrapper that records how it ended (``--no-rank-records`` turns it off)."""
    standby: bool = False
    """Restart ranks from warm standby processes that imported torch while the first attempt trained (the CLI turns it
    on unless ``--no-standby``)."""
    launcher_store: bool = False
    """Restarts rendezvous at a store held open on the launcher's node (the CLI turns it on unless
    ``--no-launcher-store``)."""
    gpu_bind: bool = True
    """Each rank gets its own share of the GPUs Slurm gave the step, by ``SLURM_LOCALID`` (``--no-gpu-bind`` turns
    it off; ``slurm_ft.launch.rank_env``)."""
    gpu_reclaim_timeout_s: float = 30.0
    """After a failed attempt, the most its nodes wait for their GPUs to let go of its processes before the next
    attempt runs there (``--gpu-reclaim-timeout``, ``SLURM_FT_GPU_RECLAIM_TIMEOUT``); a GPU still held then is a bad
    GPU. 0: no wait."""
    flight_recorder: int = DEFAULT_ENTRIES
    """Entries of torch's flight recorder in each rank (``TORCH_FR_BUFFER_SIZE``, set unless the job sets it; with the
    NCCL dump-on-timeout settings, ``slurm_ft.launch.traces``); 0 sets none of them (``--flight-recorder``)."""
    trace_wait_s: float = 3.0
    """After a rank of an attempt failed: the most the launcher waits for the other ranks' flight-recorder dumps
    before it kills the step (0: it does not ask for them)."""
    mem_every: str | None = None
    """The checkpoint manager's memory tier (``--mem-every``, ``--ft-mem-every``): snapshots in the job's ``/dev/shm``
    dir every N steps, ``auto`` or ``off``, given to the ranks as ``SLURM_FT_MEM_EVERY``; None: the job's setting, else
    the manager's default (``auto``). The launcher removes its node's dir when it ends."""

    def __post_init__(self) -> None:
        require(len(self.command) > 0, "command", "missing: give the training command after `--`")
        object.__setattr__(self, "command", tuple(str(c) for c in self.command))
        require(self.nodes is None or (isinstance(self.nodes, int) and self.nodes >= 1), "nodes",
                f"must be an integer >= 1 (--nodes), got {self.nodes!r}")
        require(isinstance(self.ntasks_per_node, int) and self.ntasks_per_node >= 1, "ntasks_per_node",
                f"must be an integer >= 1 (--ntasks-per-node), got {self.ntasks_per_node!r}")
        require(self.hang_timeout_s >= 0, "hang_timeout_s",
                f"must be >= 0 (--hang-timeout), got {self.hang_timeout_s!r}")
        require(self.startup_grace_s >= 0, "startup_grace_s", f"must be >= 0, got {self.startup_grace_s!r}")
        require(self.exit_grace_s > 0, "exit_grace_s", f"must be > 0, got {self.exit_grace_s!r}")
        require(isinstance(self.max_restarts, int) and self.max_restarts >= 0, "max_restarts",
                f"must be an integer >= 0 (--max-restarts), got {self.max_restarts!r}")
        require(isinstance(self.spare_nodes, int) and self.spare_nodes >= 0, "spare_nodes",
                f"must be an integer >= 0 (--spare-nodes), got {self.spare_nodes!r}")
        require(self.poll_s > 0, "poll_s", f"must be > 0, got {self.poll_s!r}")
        require(self.kill_grace_s >= 0, "kill_grace_s", f"must be >= 0, got {self.kill_grace_s!r}")
        require(self.error_grace_s >= 0, "error_grace_s", f"must be >= 0, got {self.error_grace_s!r}")
        require(self.evidence_wait_s >= 0, "evidence_wait_s", f"must be >= 0, got {self.evidence_wait_s!r}")
        require(self.probe_timeout_s >= 0, "probe_timeout_s",
                f"must be >= 0 (--probe-timeout), got {self.probe_timeout_s!r}")
        require(self.node_fail_wait_s >= 0, "node_fail_wait_s",
                f"must be >= 0 (--node-fail-wait), got {self.node_fail_wait_s!r}")
        require(isinstance(self.gpu_reclaim_timeout_s, (int, float)) and 0 <= self.gpu_reclaim_timeout_s <= 600,
                "gpu_reclaim_timeout_s",
                f"must be within [0, 600] seconds (--gpu-reclaim-timeout), got {self.gpu_reclaim_timeout_s!r}")
        require(isinstance(self.flight_recorder, int) and self.flight_recorder >= 0, "flight_recorder",
                f"must be an integer >= 0 (--flight-recorder), got {self.flight_recorder!r}")
        require(0 <= self.trace_wait_s <= 60, "trace_wait_s",
                f"must be within [0, 60] seconds, got {self.trace_wait_s!r}")
        if self.mem_every is not None:
            try:
                object.__setattr__(self, "mem_every", str(shmdir.parse_mem_every(str(self.mem_every))))
            except ValueError as exc:
                raise ConfigError(f"mem_every: {exc}") from None
        object.__setattr__(self, "run_dir", Path(self.run_dir))


# --- side effects behind small interfaces ---------------------------------------------------------------------
class Process(Protocol):
    def poll(self) -> int | None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...

    def send_signal(self, sig: int) -> None: ...


class Runner(Protocol):
    def __call__(self, argv: Sequence[str], env: Mapping[str, str]) -> Process: ...


class StoreHost(Protocol):
    """The rendezvous store on the launcher's node (``slurm_ft.launch.store.StoreKeeper``)."""

    def start(self) -> None: ...

    def open(self) -> tuple[str, int] | None: ...

    def close(self) -> None: ...


class Waker(Protocol):
    """The launcher's fault bell (``slurm_ft.launch.bell.Bell``): a rank's wrapper rings it when the rank ends badly."""

    def arm(self) -> str:
        """A fresh token for the next attempt: the value of its ``$SLURM_FT_BELL``."""

    def wait(self, seconds: float) -> bool: ...

    def close(self) -> None: ...


class _Popen:
    """srun in its own process group, so terminate/kill reach it and nothing else."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.proc = subprocess.Popen(list(argv), env=dict(env), start_new_session=True)

    def poll(self) -> int | None:
        return self.proc.poll()

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def send_signal(self, sig: int) -> None:
        self._signal(sig)  # srun forwards it to every task of the step

    def kill(self) -> None:
        self._signal(signal.SIGKILL)


def popen_runner(argv: Sequence[str], env: Mapping[str, str]) -> Process:
    return _Popen(argv, env)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- pure pieces ----------------------------------------------------------------------------------------------
def command_python(command: Sequence[str]) -> str | None:
    """The command's interpreter when it is a Python one (``python3 train.py``), else None: the interpreter the
    standbys and the store keeper run, so they import the same torch as the ranks."""
    return command[0] if Path(command[0]).name.startswith("python") else None


def choose_nodes(allocation: Sequence[str], *, wanted: int, bad: set[str]) -> list[str] | None:
    """The first ``wanted`` nodes of the allocation that are not bad, or None when too few are left."""
    good = [n for n in allocation if n not in bad]
    return good[:wanted] if len(good) >= wanted else None


def from_nodes(records: list[Any], nodes: frozenset[str] | None) -> list[Any]:
    """``records`` (heartbeats, errors, ends) written on ``nodes`` or by a writer that names no node; all of them
    when ``nodes`` is None (no attempt yet)."""
    return records if nodes is None else [r for r in records if not r.host or r.host in nodes]


def unhealthy(nodes: Sequence[str], states: Mapping[str, NodeInfo]) -> set[str]:
    """Nodes that are down, drained or not responding in ``states`` (one ``nodes()`` call); unknown ones pass."""
    bad = set()
    for name in nodes:
        info = states.get(name)
        if info is not None and (info.down or info.drained or "NOT_RESPONDING" in info.state):
            bad.add(name)
    return bad


class HangWatch:
    """Tracks per-rank heartbeat progress on the launcher's own clock."""

    def __init__(self, ranks: int, started: float, *, timeout_s: float, grace_s: float,
                 exit_grace_s: float = float("inf")) -> None:
        self.ranks, self.started, self.timeout_s, self.grace_s = ranks, started, timeout_s, grace_s
        self.exit_grace_s = exit_grace_s
        self.progress: dict[int, tuple[int, float]] = {}  # rank -> (step, when we saw it change)
        self.alive: dict[int, tuple[float, float]] = {}  # rank -> (liveness beat, when we saw it change)
        self.done: dict[int, float] = {}  # rank -> when we saw it finish its loop (its heartbeat's ``done``)

    def update(self, beats: Sequence[Any], now: float) -> None:
        for beat in beats:
            seen = self.progress.get(beat.rank)
            if seen is None or beat.step != seen[0]:
                self.progress[beat.rank] = (beat.step, now)
            alive = getattr(beat, "alive", None)
            if alive is not None and (beat.rank not in self.alive or alive != self.alive[beat.rank][0]):
                self.alive[beat.rank] = (alive, now)
            if getattr(beat, "done", False):
                self.done.setdefault(beat.rank, now)

    def live(self, now: float, stale_s: float = LIVENESS_STALE_S) -> dict[int, bool | None]:
        """Per rank: did its liveness beat change within ``stale_s`` (on our clock)? None: it has no liveness beat."""
        return {rank: None if rank not in self.alive else now - self.alive[rank][1] < stale_s
                for rank in range(self.ranks)}

    def hung(self, now: float) -> list[int]:
        """Once a rank had no progress for the timeout since its last step (a rank not seen yet: importing,
        rendezvous, loading the checkpoint, gets the startup grace on top), every rank without progress for half
        of it: the ranks the launcher saw reach their last step a poll later are as stuck. A rank that finished
        its loop makes no more steps: it is not judged by the timeout, and once every rank finished, only an exit
        that has not come ``exit_grace_s`` after the last of them is a hang."""
        if self.timeout_s <= 0:
            return []
        working = [rank for rank in range(self.ranks) if rank not in self.done]
        if not working:
            return list(range(self.ranks)) if now - max(self.done.values()) >= self.exit_grace_s else []
        idle = {rank: now - self._since(rank) for rank in working}
        if max(idle.values(), default=0.0) < self.timeout_s:
            return []
        return [rank for rank, seconds in idle.items() if seconds >= self.timeout_s / 2]

    def _since(self, rank: int) -> float:
        step_seen = self.progress.get(rank)
        return self.started + self.grace_s if step_seen is None else step_seen[1]


class CommentWriter:
    """Sets the job's Comment from a thread of its own, newest text only: ``scontrol update`` can block for
    seconds (a busy slurmctld; 5 s in the lab when 22.05 answered "the DB index is being set, try again"), and a
    restart must not wait for it. ``flush`` waits until the newest text is written (before a requeue, before the
    launcher exits: the monitor and the next run read it). A failed write goes to ``on_error``; nothing stops the
    writer."""

    def __init__(self, write: Callable[[str], None], on_error: Callable[[str], None]) -> None:
        self._write, self._on_error = write, on_error
        self._cond = threading.Condition()
        self._pending: str | None = None
        self._writing = False
        self._thread: threading.Thread | None = None

    def set(self, text: str) -> None:
        with self._cond:
            self._pending = text
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="slurm-ft-comment", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Whether the newest text was written (or failed) within ``timeout_s``."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and not self._writing, timeout=timeout_s)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None)
                text, self._pending, self._writing = self._pending, None, True
            try:
                self._write(text)
            except Exception as exc:  # noqa: BLE001 - a Slurm error or a bug: reported, the next text still goes
                self._on_error(str(exc)[-200:])
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()


# --- the supervisor -------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AttemptResult:
    outcome: Outcome
    exit_code: int
    time: float
    hung_ranks: tuple[int, ...] = ()
    hang: tuple[RankState, ...] = ()  # a hung attempt's ranks as their nodes saw them before the kill
    trained: bool = False  # a rank of the attempt reached a step (a heartbeat)
    warm: bool = False  # the attempt's ranks were to start from standbys (SLURM_FT_STANDBY in its environment)
    held_store: bool = False  # the attempt's ranks were to rendezvous at the launcher's store


class Launcher:
    """The bounded restart loop over one allocation."""

    def __init__(self, config: LaunchConfig, *, allocation: Sequence[str], environ: Mapping[str, str],
                 runner: Runner = popen_runner, node_states: Callable[[], Mapping[str, NodeInfo]] | None = None,
                 classify_fn: Callable[[Any], Any] | None = None, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, port: Callable[[], int] = free_port,
                 resume_step: int | None = None,
                 probe: Callable[[Sequence[str], float | None], Mapping[str, str]] | None = None,
                 set_comment: Callable[[str], None] | None = None, requeues: int = 0,
                 restart_cause: str | None = None, latch: Any = None, preempt: Any = None,
                 requeue: Callable[[], None] | None = None, comment: str = "",
                 gather_hang: Callable[[Sequence[str], Path], str] | None = None,
                 store: StoreHost | None = None, bell: Waker | None = None,
                 reclaim: Callable[[Sequence[str], Path, int], Reclaimed] | None = None,
                 request_traces: Callable[[Sequence[str], Path], Any] | None = None,
                 addr_of: Callable[[str, int], str] | None = None) -> None:
        self.config = config
        self.allocation = list(allocation)
        self.environ = dict(environ)
        self.runner, self.node_states, self.classify_fn = runner, node_states, classify_fn
        self.clock, self.sleep, self.port = clock, sleep, port
        self.resume_step = resume_step
        self.restart_cause = restart_cause  # why the first attempt is a restart (the requeue's cause), else None
        self.probe = probe
        self._comments = (CommentWriter(set_comment, lambda error: self._event("comment_error", error=error))
                          if set_comment is not None else None)
        self.gather_hang = gather_hang  # runs the per-node hang helpers (slurm_ft.launch.hang); "" or why not
        self.store = store  # holds each restart's rendezvous store open before the ranks start (else rank 0 does)
        self.bell = bell  # wakes the attempt's poll loop when a rank ends badly (else it sees it a poll later)
        self.reclaim = reclaim  # waits on each node for its GPUs to let go of a failed attempt (launch.reclaim)
        self.request_traces = request_traces  # starts the ranks' flight-recorder dumps (``TraceRequest``: .wait(s))
        # the address of an attempt's first node, for an attempt of so many nodes (``slurm_ft.slurm.address``)
        self.addr_of = addr_of or (lambda node, nodes: master_addr(node, self.environ, nodes=nodes))
        self.requeues = requeues  # $SLURM_RESTART_COUNT: how often Slurm or the monitor requeued this job
        self.latch, self.preempt = latch, preempt or PreemptConfig()  # SIGUSR1/SIGTERM: save, requeue
        self.requeue = requeue  # requeues this job (after the ranks' emergency save on SIGUSR1)
        self.comment = comment  # the job's Comment: the resume hint, the cause, the restart budget's counts
        self.budget = Budget(limit=config.max_restarts, requeues=requeues, **job_comment.counts(comment))
        self.wanted = config.nodes if config.nodes is not None else len(self.allocation) - config.spare_nodes
        if self.wanted < 1 or self.wanted > len(self.allocation):
            raise SlurmFtError(f"launch: need {self.wanted} node(s) from an allocation of {len(self.allocation)} "
                               f"({', '.join(self.allocation) or 'empty'}) with {config.spare_nodes} spare(s)")
        self.attempts = 0
        self._last_root: tuple[Any, ...] | None = None
        self._stopping: tuple[str, str, list[str]] = ("unknown", "", [])
        self._failure = "unknown"  # the category of the last attempt's fault: the next attempt's restart cause
        self._standbys: list[tuple[frozenset[str], Process]] = []  # steps of warm standby ranks, by their nodes
        self._bad: set[str] = set()  # nodes of the allocation found unhealthy: no attempt, no standby on them
        self._standby_off = False  # a warm attempt hung before its first step: cold restarts from then on
        # the random part of the standbys' socket names, for our own steps only: nobody can bind them first
        self._standby_key = secrets.token_hex(16)
        self._launch_id = secrets.token_hex(8)  # every attempt's: the memory tier keeps to this launch's snapshots
        self._world = 0  # the current attempt's ranks
        self._attempt_nodes: frozenset[str] | None = None  # the current attempt's nodes
        self._attempt_started: float | None = None  # when the current attempt started (the probe's reboot line)
        self._rebooted: set[str] = set()  # nodes the last probe found rebooted under the attempt (back, empty)

    def run(self) -> int:
        try:
            return self._run()
        finally:
            self._stop_standby()
            self._remove_memory_tier()
            if self.store is not None:
                self.store.close()
            if self.bell is not None:
                self.bell.close()
            self._flush_comment()

    def _remove_memory_tier(self) -> None:
        """The job's memory-tier dir on this node (``slurm_ft.core.shmdir``): a job that ends resumes from disk. The
        ranks remove their own files when they finish; the epilog removes what is left on every node."""
        key = shmdir.job_key(self.environ.get(ft_env.SLURM_JOB_ID), ft_env.run_identity(self.environ))
        if key is None:
            return
        done = shmdir.remove_job_dir(self.environ.get(ft_env.MEM_ROOT) or shmdir.SHM_ROOT, key, os.getuid())
        if not done.startswith("absent"):
            log.info("memory tier: %s", done)

    def _run(self) -> int:
        if self.budget.used > self.budget.limit:  # Slurm requeues NODE_FAIL jobs by itself: the budget holds here
            why = (f"restart budget exhausted ({self.budget.used} restarts > {self.budget.limit}: "
                   f"{self.requeues} requeues, {self.budget.in_place} in place, {self.budget.free} not for faults)")
            self._comment(job_comment.stopped("unknown", f"by=launch {why}"))
            return self._exit(1, why)
        self._archive("earlier")  # a requeued job's run dir holds the previous run's beats and errors
        while True:
            chosen = choose_nodes(self.allocation, wanted=self.wanted, bad=self._bad)
            if chosen is None:
                return self._exit(EX_TEMPFAIL, "no healthy nodes left in the allocation", bad=sorted(self._bad))
            if self._signalled():  # between attempts: nothing runs, the newest checkpoint is the resume step
                return self._preempted()
            self.attempts += 1
            if self.attempts > 1:
                self._archive(f"attempt-{self.attempts - 1}")
            result = self._attempt(chosen)
            if result.outcome is Outcome.PREEMPTED:
                return self._preempted()
            if result.outcome is Outcome.SUCCEEDED:
                return self._exit(0, "succeeded")
            self._event("fault_detected", kind=result.outcome.value, time=result.time, exit_code=result.exit_code,
                        hung_ranks=list(result.hung_ranks), attempt=self.attempts)
            self._failure = (Category.HANG if result.outcome is Outcome.HUNG else Category.UNKNOWN).value
            if result.outcome is Outcome.HUNG and result.warm and not result.trained:
                self._turn_standby_off()
            if result.outcome is Outcome.HUNG and result.held_store and not result.trained:
                self._turn_store_off()
            sick = self._sick(chosen)
            held = self._gpu_reclaim(chosen, sick)
            verdict = self._judge(result, sick, chosen, held)
            if sick or held:
                self._failure = (Category.HARDWARE_NODE if sick else Category.HARDWARE_GPU).value
                out = sick | {hold.node for hold in held}
                self._bad |= out
                if choose_nodes(self.allocation, wanted=self.wanted, bad=self._bad) is None:
                    return self._give_up(sick, self._bad)  # Slurm may declare the sick ones; a held GPU, never
                self._event("spare_swap", out=sorted(out), attempt=self.attempts)
                continue  # a membership change: no retry used
            if self._unrecoverable(result, verdict):  # a desync hangs again on every restart: none is taken
                category, reason, evidence = self._stopping
                self._comment(job_comment.stopped(category, f"by=launch {reason}", evidence))
                code = 1 if result.outcome is Outcome.HUNG else result.exit_code or 1
                return self._exit(code, "not recoverable in place", cause=category)
            if self.budget.left == 0:
                return self._exit(result.exit_code or 1, f"restart budget exhausted ({self.budget.used} of "
                                  f"{self.budget.limit} used, in place and requeues together)")
            self.budget = dataclasses.replace(self.budget, in_place=self.budget.in_place + 1)
            self._comment(self.comment, wait=False)  # the new count, for the monitor and the next run
            self._event("restart_in_place", attempt=self.attempts, retries_left=self.budget.left)

    def _sick(self, chosen: list[str]) -> set[str]:
        """Nodes of the attempt that Slurm calls unhealthy, or that fail the probe step."""
        bad = self._flagged(chosen)
        if self.probe is not None and self.config.probe_timeout_s > 0:
            found = self.probe([n for n in chosen if n not in bad], self._attempt_started)
            self._event("node_probe", attempt=self.attempts, failed=dict(found))
            bad |= set(found)
            self._rebooted = {node for node, why in found.items() if why.startswith(REBOOTED)}
            self._drop_standbys(self._rebooted)
        return bad

    def _gpu_reclaim(self, chosen: list[str], sick: set[str]) -> tuple[Any, ...]:
        """Before the healthy nodes of the failed attempt run the next one: wait (bounded, on each node) until their
        GPUs let go of its processes; the GPUs still held (``GpuHold``). No wait where the job has no GPUs."""
        nodes = [n for n in chosen if n not in sick]
        if (self.reclaim is None or self.config.gpu_reclaim_timeout_s <= 0 or not nodes
                or not gpus_in_use(self.config.run_dir, self.environ)):
            return ()
        started = self.clock()
        found = self.reclaim(nodes, self.config.run_dir, self.attempts)
        self._event("gpu_reclaim", attempt=self.attempts, took_s=round(self.clock() - started, 3), **found.event())
        return found.held

    def _flagged(self, nodes: Sequence[str]) -> set[str]:
        if self.node_states is None:
            return set()
        try:
            return unhealthy(nodes, self.node_states())
        except SlurmFtError as exc:  # Slurm unreachable: judge by the probe and the error files alone
            self._event("node_states_error", error=str(exc))
            return set()

    def _give_up(self, sick: set[str], bad: set[str]) -> int:
        """No spare left: give Slurm time to declare the sick nodes (it then ends the job NODE_FAIL and requeues
        it, which kills us), then leave the requeue to the monitor, naming the nodes to exclude."""
        deadline = self.clock() + self.config.node_fail_wait_s
        waiting = sorted(sick - self._flagged(sorted(sick)) - self._rebooted)  # Slurm has a rebooted one back
        if waiting:
            self._event("node_fail_wait", nodes=waiting, seconds=self.config.node_fail_wait_s)
        while waiting and self.clock() < deadline:
            self.sleep(min(2.0, max(self.config.poll_s, 0.1)))
            waiting = sorted(set(waiting) - self._flagged(waiting))
        self._comment(job_comment.tempfail(bad, self.attempts))
        return self._exit(EX_TEMPFAIL, "node unhealthy and no spare left", bad=sorted(bad), unconfirmed=waiting)

    def _comment(self, text: str, *, wait: bool = True) -> None:
        """Set the job's Comment to ``text`` with the restart budget's counts (slurm_ft.core.comment); ``wait=False``
        leaves the write to the writer's thread (a restart does not wait for scontrol)."""
        text = self.comment = job_comment.with_counts(text, in_place=self.budget.in_place, free=self.budget.free)
        if self._comments is None:
            return
        self._comments.set(text)
        if wait:
            self._flush_comment()

    def _flush_comment(self) -> None:
        if self._comments is not None and not self._comments.flush(COMMENT_FLUSH_S):
            self._event("comment_error", error=f"the Comment was not written within {COMMENT_FLUSH_S:g} s")

    # --- SIGUSR1 / SIGTERM (slurm_ft.launch.preempt) ------------------------------------------------------------
    def _signalled(self) -> bool:
        return self.latch is not None and self.latch.signum is not None

    def _forward(self, proc: Process) -> AttemptResult:
        """Pass the signal to every rank (their emergency save) and wait for them within the deadline."""
        signum = self.latch.signum
        wait_s = self.preempt.wait_s(signum)
        self._event("signal_forwarded", signal=signal.Signals(signum).name, attempt=self.attempts, wait_s=wait_s)
        proc.send_signal(signum)
        deadline = self.clock() + wait_s
        while proc.poll() is None and self.clock() < deadline:
            self.sleep(min(self.config.poll_s, 0.2))
        code = proc.poll()
        if code is None:  # past the deadline: what was saved is saved
            self._kill(proc, grace_s=0.0)
        return AttemptResult(outcome=Outcome.PREEMPTED, exit_code=code if code is not None else -signal.SIGKILL,
                             time=self.clock())

    def _preempted(self) -> int:
        """After the ranks' emergency save: SIGUSR1 -> requeue from that step; SIGTERM -> end, Slurm decides."""
        signum = self.latch.signum
        step = self._committed()
        self._event("preempted", signal=signal.Signals(signum).name, attempt=self.attempts, resume_step=step)
        if signum != signal.SIGUSR1:
            return self._exit(128 + signum, "SIGTERM: the ranks saved; Slurm ends the job", resume_step=step)
        self.budget = dataclasses.replace(self.budget, free=self.budget.free + 1)  # not a fault: no restart used
        self._comment(job_comment.requeue(self.requeues + 1, step, Category.PREEMPTION.value,
                                          by=job_comment.BY_LAUNCH))
        why = requeue_job(self.requeue)
        if why:
            self._event("requeue_error", error=why)
            self._comment(job_comment.tempfail_preempted(step, self.attempts))
            return self._exit(EX_TEMPFAIL, f"SIGUSR1: the ranks saved; the requeue failed: {why}", resume_step=step)
        return self._exit(0, "SIGUSR1: the ranks saved; requeued", cause="preemption", resume_step=step)

    # --- one attempt ----------------------------------------------------------------------------------------
    def _attempt(self, chosen: list[str]) -> AttemptResult:
        cfg = self.config
        env = self._env(chosen)
        wiring = wire(cfg.command, nodes=len(chosen), ntasks_per_node=cfg.ntasks_per_node, addr=env["MASTER_ADDR"],
                      port=int(env["MASTER_PORT"]), gpu_bind=cfg.gpu_bind)  # RANK, WORLD_SIZE ..., GPUs; torchrun wired
        env.update(wiring.env)
        env.update(nccl_defaults(env, hang_timeout_s=cfg.hang_timeout_s))  # only those the user did not set
        self._world = len(chosen) * wiring.ranks_per_node
        self._attempt_nodes = frozenset(chosen)
        # A step that had a rank on a dead node stays "completing" in Slurm's books, holding its CPUs on the live
        # nodes, until the job ends: later attempts share them (only one attempt runs at a time).
        overlap = ["--overlap"] if self.attempts > 1 else []
        # With the wrappers' end records we see a rank fail ourselves, and end the step with srun's SIGTERM (SIGKILL
        # to every task at once). srun's own kill on a bad exit cancels the step instead: the ranks waiting in a
        # collective ignore its SIGTERM, and Slurm kills them only after KillWait (30 s by default), later attempts
        # beside them. Without the records srun's kill is the only one quick enough.
        kill_on_bad_exit = 0 if cfg.rank_records else 1
        argv = ["srun", f"--nodes={len(chosen)}", f"--ntasks={len(chosen) * wiring.tasks_per_node}",
                f"--ntasks-per-node={wiring.tasks_per_node}", f"--nodelist={','.join(chosen)}",
                f"--kill-on-bad-exit={kill_on_bad_exit}", *overlap, *wiring.prefix, *self._wrapped(cfg.command)]

        started = self._attempt_started = self.clock()
        self._event("attempt_start", attempt=self.attempts, nodes=chosen, master_port=int(env["MASTER_PORT"]),
                    store="launcher" if env.get(AGENT_STORE_ENV) == "True" else "rank 0", time=started,
                    resume_step=self._committed())
        proc = self.runner(argv, env)
        watch = HangWatch(len(chosen) * wiring.ranks_per_node, started, timeout_s=cfg.hang_timeout_s,
                          grace_s=cfg.startup_grace_s, exit_grace_s=cfg.exit_grace_s)
        first_step_logged = False
        failed_since: float | None = None
        dumps: Any = None  # the live ranks' flight-recorder dumps, asked for when a rank failed
        while True:
            if self._signalled():
                return self._forward(proc)
            code = proc.poll()
            if code is not None:
                now = self.clock()
                if dumps is not None:  # every rank has ended: no dump is coming
                    dumps.wait(0.0)
                return AttemptResult(outcome=Outcome.SUCCEEDED if code == 0 else Outcome.FAILED,
                                     exit_code=code, time=now)
            now = self.clock()
            beats = self._ours(read_heartbeats(cfg.run_dir))
            watch.update(beats, now)
            if not first_step_logged and beats:
                first_step_logged = True
                self._event("first_step", attempt=self.attempts, step=max(b.step for b in beats), time=now)
                self._start_standby(chosen, wiring.tasks_per_node, env)  # off the startup's critical path
                if self.store is not None:
                    self.store.start()  # likewise: the next attempt's store
            stuck = watch.hung(now)
            if stuck:
                hang = self._hang_evidence(chosen, watch, now)  # before the kill: stopped ranks, stacks
                self._kill(proc)
                return AttemptResult(outcome=Outcome.HUNG, exit_code=-signal.SIGKILL, time=now,
                                     hung_ranks=tuple(stuck), hang=hang, trained=first_step_logged,
                                     warm=ft_env.STANDBY in env, held_store=env.get(AGENT_STORE_ENV) == "True")
            complete = self._failure_evidence()
            if failed_since is None and complete is not None:
                failed_since, dumps = now, self._ask_traces(chosen)
            if failed_since is not None and (complete or now - failed_since >= cfg.evidence_wait_s):
                # srun waits for every task; one on a dead node never reports back. The culprit's record came
                # first; the ranks it takes down keep failing one by one (3.5 s for 8 ranks on this lab's 2
                # cores), and their records would not change the verdict. Nothing is left to save either.
                self._traces_in(dumps)
                self._kill(proc, grace_s=min(cfg.kill_grace_s, cfg.error_grace_s))
                return AttemptResult(outcome=Outcome.FAILED, exit_code=1, time=failed_since)
            self._wait(cfg.poll_s)

    # --- warm standby ranks (slurm_ft.launch.standby) --------------------------------------------------------------
    def _standby_python(self) -> str | None:
        """The interpreter the ranks run, when the command is one a standby can run (``python SCRIPT``,
        ``python -m MODULE``) and standbys are on."""
        python = command_python(self.config.command)
        if python is None or self._standby_off or not (self.config.standby and self.config.rank_records):
            return None
        return python if script_of(self.config.command, python) is not None else None

    def _start_standby(self, chosen: list[str], tasks_per_node: int, env: Mapping[str, str]) -> None:
        """One pre-imported standby per task slot of the attempt's nodes and of the spare nodes (a node swapped
        in then starts its ranks warm too), for the next restart: one step (``srun --overlap``) for the nodes that
        have none yet (all of them at first; later the nodes whose standby step has ended).

        ``--no-kill``: when a node of the step dies, Slurm kills the step's tasks on that node only. Without it
        Slurm kills the whole step, and with it the ranks the standbys on the surviving nodes are running: the
        attempt that had just replaced the dead node failed again when Slurm declared the node down."""
        python = self._standby_python()
        if python is None:
            return
        covered = frozenset().union(*(nodes for nodes, proc in self._standbys if proc.poll() is None))
        spares = [n for n in self.allocation if n not in chosen and n not in self._bad]
        missing = [n for n in [*chosen, *spares] if n not in covered]
        if not missing:
            return
        argv = ["srun", f"--nodes={len(missing)}", f"--ntasks={len(missing) * tasks_per_node}",
                f"--ntasks-per-node={tasks_per_node}", f"--nodelist={','.join(missing)}", "--overlap", "--no-kill",
                "--kill-on-bad-exit=0", python, "-m", "slurm_ft.launch.standby", "--python", python]
        try:
            step = self.runner(argv, {**env, ft_env.STANDBY_KEY: self._standby_key})
            self._standbys.append((frozenset(missing), step))
        except OSError as exc:
            self._event("standby_error", error=str(exc)[-200:])
            return
        self._event("standby_start", attempt=self.attempts, nodes=missing, slots=len(missing) * tasks_per_node)

    def _turn_standby_off(self) -> None:
        """A circuit breaker: an attempt of warm ranks hung before any rank's first step (seen on a loaded host
        when ranks were forks of a warm parent: a fork's first CPU GEMM spun in MKL's memory accounting; spares
        are no forks now, the breaker stays for what else could), so this job restarts cold from now on."""
        self._standby_off = True
        self._event("standby_off", attempt=self.attempts, why="a warm attempt hung before its first step")
        self._stop_standby()

    def _turn_store_off(self) -> None:
        """A circuit breaker: an attempt at the launcher's store hung before any rank's first step. The store admits
        only the allocation's nodes (``slurm_ft.launch.store``); ranks that reach it from an address their node's
        name does not resolve to are dropped and wait in their connect. From now on rank 0 hosts the store."""
        self._event("launcher_store_off", attempt=self.attempts,
                    why="an attempt at the launcher's store hung before its first step")
        self.store.close()
        self.store = None

    def _drop_standbys(self, rebooted: set[str]) -> None:
        """End the standby steps with a task on a node that rebooted: its standbys died with it, and srun aborts such
        a step (a step missing on a node Slurm saw boot), taking the standbys of the other nodes with it, and the
        ranks they had just become. The next attempt starts cold there; new standbys follow its first step."""
        doomed = [(nodes, proc) for nodes, proc in self._standbys if nodes & rebooted]
        if not doomed:
            return
        self._standbys = [entry for entry in self._standbys if entry not in doomed]
        for _, proc in doomed:
            if proc.poll() is None:
                self._kill(proc, grace_s=0.0)
        self._event("standby_dropped", attempt=self.attempts, rebooted=sorted(rebooted),
                    nodes=sorted(set().union(*(nodes for nodes, _ in doomed))))

    def _standby_ready(self) -> bool:
        return any(proc.poll() is None for _, proc in self._standbys)

    def _stop_standby(self) -> None:
        """The standbys exit quietly on their stop signal (srun's own SIGTERM would SIGKILL them, noisily)."""
        running = [proc for _, proc in self._standbys if proc.poll() is None]
        for proc in running:
            proc.send_signal(STOP_SIGNAL)
        deadline = self.clock() + 5.0
        while any(proc.poll() is None for proc in running) and self.clock() < deadline:
            self.sleep(0.1)
        for proc in running:
            if proc.poll() is None:
                self._kill(proc, grace_s=0.0)

    def _committed(self) -> int | None:
        """The newest committed checkpoint step (what this attempt resumes from), when the ckpt dir is known."""
        return latest_step(ft_env.job_setting(ft_env.CKPT_DIR, self.environ) or "")

    def _ours(self, records: list[Any]) -> list[Any]:
        """The records of this attempt's nodes: a rank of an earlier run on a node cut off from the network (its
        link down, Slurm's kill never reached it) still writes to the shared run dir; its records name its node."""
        return from_nodes(records, self._attempt_nodes)

    def _failure_evidence(self) -> bool | None:
        """None while no rank of this attempt left an error file or a bad end record (earlier attempts' are
        archived); else whether the evidence is complete: every rank with an error file has its end record too
        (the wrapper writes it last, once the rank's process is gone), but for the victims of a bad end: errors
        recorded after it, or only a victim's view ("Connection closed by peer"; its time may precede the bad
        end's record by the wrapper's lag). How their processes end changes no verdict, and waiting for it (a torch
        process with its collectives' threads takes a while to exit, seconds with CUDA) only delays the restart."""
        errors = self._ours(read_errors(self.config.run_dir))
        ends = self._ours(read_ends(self.config.run_dir))
        first_bad = min((end.time for end in ends if end.failed), default=None)
        if not errors and first_bad is None:
            return None
        ended = {end.rank for end in ends}
        return bool(ends) and all(record.rank in ended for record in errors
                                  if first_bad is None or (record.time <= first_bad and not victims_view(record)))

    def _ask_traces(self, chosen: list[str]) -> Any:
        """Start the failed attempt's flight-recorder dumps on its nodes (``slurm_ft.launch.traces``), or None."""
        if self.request_traces is None or self.config.trace_wait_s <= 0 or self.config.flight_recorder <= 0:
            return None
        return self.request_traces(chosen, self.config.run_dir)

    def _traces_in(self, dumps: Any) -> None:
        """Wait for the dumps asked for (at most ``trace_wait_s`` after asking, less once every rank has dumped or
        ended); a shortfall is an event."""
        why = dumps.wait(self.config.trace_wait_s, done=self._ranks_accounted) if dumps is not None else ""
        if why:
            self._event("trace_dumps_partial", attempt=self.attempts, why=why)

    def _ranks_accounted(self) -> bool:
        """Every rank of the attempt has dumped its flight recorder or ended (this attempt's files only: the last
        one's were set aside)."""
        run_dir = self.config.run_dir
        dumped = {r for r in range(self._world) if trace_path(run_dir, r).exists()}
        return dumped | {end.rank for end in read_ends(run_dir)} >= set(range(self._world))

    def _wait(self, seconds: float) -> None:
        """Until the next poll, or until a rank's wrapper rings the bell (a rank ended badly)."""
        if self.bell is None:
            self.sleep(seconds)
        else:
            self.bell.wait(seconds)

    def _wrapped(self, command: Sequence[str]) -> list[str]:
        """The command under the per-rank wrapper that records how each rank ended."""
        if not self.config.rank_records:
            return list(command)
        return [sys.executable, "-m", "slurm_ft.launch.rank", "--", *command]

    def _hang_evidence(self, chosen: list[str], watch: HangWatch, now: float) -> tuple[RankState, ...]:
        """Every rank's process state and stacks, read on its node, plus liveness and step as we saw them."""
        why = self.gather_hang(chosen, self.config.run_dir) if self.gather_hang is not None else "not asked"
        if why:
            self._event("hang_evidence_partial", attempt=self.attempts, why=why)
        return rank_states(watch.ranks, read_heartbeats(self.config.run_dir), read_rank_states(self.config.run_dir),
                           watch.live(now))

    def _judge(self, result: AttemptResult, sick: set[str], chosen: list[str], held: Sequence[Any] = ()) -> Any:
        """The attempt's verdict (culprit rank and node), as a ``verdict`` event and a root cause paragraph."""
        if self.classify_fn is None:
            return None
        world = self._world
        evidence = attempt_evidence(self.config.run_dir, hang=result.hang, sick=sick, held=held, nodes=chosen,
                                    ranks=range(world))
        verdict = self.classify_fn(evidence)
        cause = root_cause(verdict, evidence)
        where = collectives.positions(evidence.traces, range(world), result.hang) if evidence.traces else []
        self._event("verdict", attempt=self.attempts, outcome=result.outcome.value, root_cause_rank=cause["rank"],
                    root_cause=cause, verdict=verdict.to_dict(), **({"collectives": where} if where else {}))
        print(paragraph(self.attempts, verdict, cause), file=sys.stderr, flush=True)
        self._failure = verdict.category.value
        return verdict

    def _kill(self, proc: Process, grace_s: float | None = None) -> None:
        proc.terminate()
        deadline = self.clock() + (self.config.kill_grace_s if grace_s is None else grace_s)
        while proc.poll() is None and self.clock() < deadline:
            self.sleep(min(self.config.poll_s, 0.05))
        if proc.poll() is None:
            proc.kill()

    def _env(self, chosen: list[str]) -> dict[str, str]:
        env = dict(self.environ)
        held = self.store.open() if self.store is not None else None
        if held is not None:  # every rank connects to it; none hosts it (slurm_ft.launch.store)
            env["MASTER_ADDR"], port = held
            env["MASTER_PORT"] = str(port)
            env[AGENT_STORE_ENV], env[RESTART_COUNT_ENV] = "True", str(self.attempts - 1)
        else:
            env["MASTER_ADDR"] = self.addr_of(chosen[0], len(chosen))
            env["MASTER_PORT"] = str(self.port())
            env.pop(AGENT_STORE_ENV, None)
            env.pop(RESTART_COUNT_ENV, None)
        env[ft_env.PREFIX + ft_env.RUN_DIR] = str(self.config.run_dir)
        env["SLURM_FT_ATTEMPT"] = str(self.attempts)
        env[ft_env.LAUNCH_ID] = self._launch_id
        if self.config.mem_every is not None:
            env[ft_env.PREFIX + ft_env.MEM_EVERY] = self.config.mem_every
        if self.bell is not None and self.config.rank_records:  # the wrappers ring it
            env[fault_bell.ENV] = self.bell.arm()  # a token per attempt
        else:
            env.pop(fault_bell.ENV, None)
        if self.resume_step is not None and self.attempts == 1:
            env[ft_env.PREFIX + ft_env.RESUME_STEP] = str(self.resume_step)
        else:  # later attempts resume from the newest committed checkpoint
            env.pop(ft_env.PREFIX + ft_env.RESUME_STEP, None)
        python = self._standby_python()
        if python is not None and self.attempts > 1 and self._standby_ready():
            env[ft_env.STANDBY] = python  # the wrappers ask their slot's standby for the rank (else start it cold)
            env[ft_env.STANDBY_KEY] = self._standby_key
        else:
            env.pop(ft_env.STANDBY, None)
            env.pop(ft_env.STANDBY_KEY, None)
        cause = self.restart_cause if self.attempts == 1 else self._failure
        if cause:
            env[ft_env.PREFIX + ft_env.RESTART_CAUSE] = cause
        else:
            env.pop(ft_env.PREFIX + ft_env.RESTART_CAUSE, None)
        env.update(self._flight_recorder_env())
        return env

    def _flight_recorder_env(self) -> dict[str, str]:
        """torch's flight recorder for the ranks, where the job does not set it (``slurm_ft.launch.traces``)."""
        return recorder_env(self.environ, self.config.run_dir, self.config.flight_recorder)

    def _unrecoverable(self, result: AttemptResult, verdict: Any) -> bool:
        """A failed attempt that ``_recoverable`` refuses, or a hung one whose verdict is not recoverable (the
        flight recorder found a desync: the training code's)."""
        if result.outcome is Outcome.FAILED:
            return not self._recoverable(verdict)
        if result.outcome is Outcome.HUNG and verdict is not None and not verdict.recoverable:
            self._stopping = (verdict.category.value, "not recoverable", list(verdict.evidence[:2]))
            return True
        return False

    def _recoverable(self, verdict: Any) -> bool:
        """The attempt's verdict (``_judge``) allows another try, and its root cause is not the last one's again."""
        errors = read_errors(self.config.run_dir)
        category = verdict.category.value if verdict is not None else "unknown"
        culprits = verdict.culprit.ranks if verdict is not None else ()
        root = next((e for e in errors if e.rank in culprits), errors[0] if errors else None)
        if root is None:  # no error file: a rank or node died; only the verdict (OOM killer ...) may stop it
            if verdict is not None and not verdict.recoverable:
                self._stopping = (category, "not recoverable", list(verdict.evidence[:2]))
                return False
            return True
        key = (root.rank, root.exc_type, root.step)
        repeated, self._last_root = key == self._last_root, key
        evidence = list(verdict.evidence[:2]) if verdict is not None else [
            f"rank {root.rank}: {root.exc_type}: {root.message}"]
        if repeated:  # the same rank failed the same way at the same step again: deterministic, not a fault
            self._event("repeated_root_cause", attempt=self.attempts, rank=root.rank, exc_type=root.exc_type,
                        step=root.step)
            self._stopping = (category, f"same root cause twice (rank {root.rank} {root.exc_type} step {root.step})",
                              evidence)
            return False
        if verdict is not None and not verdict.recoverable:
            self._stopping = (category, "not recoverable", evidence)
            return False
        return True

    def _archive(self, name: str) -> None:
        """Move the heartbeats and error files in the run dir (the last attempt's) to ``<run_dir>/<name>/``."""
        patterns = (HEARTBEAT_GLOB, ERROR_GLOB, END_GLOB, HANG_GLOB, STACK_GLOB, GPU_GLOB, RECLAIM_GLOB, TRACE_GLOB,
                    NCCL_TRACE_GLOB, LINKS_GLOB)
        found = [p for pattern in patterns for p in self.config.run_dir.glob(pattern)
                 if p.is_file() and not p.is_symlink()]
        if not found:
            return
        dest = make_run_dir(self.config.run_dir / name)
        for path in found:
            os.replace(path, dest / path.name)

    def _exit(self, code: int, why: str, **fields: Any) -> int:
        code = 128 - code if code < 0 else code  # srun killed by signal N (Popen: -N): the shell's 128 + N
        self._event("exit", code=code, why=why, attempts=self.attempts, **fields)
        return code

    def _event(self, event: str, **fields: Any) -> None:
        record = {"event": event, "time": round(self.clock(), 3), **fields}
        log.info(describe(record))  # a plain line in the job's output; the JSON goes to events.jsonl
        try:
            append_event(self.config.run_dir, record)  # private: it names the store's port
        except OSError as exc:
            log.warning("cannot write %s: %s", self.config.run_dir / EVENTS_FILE, exc)
