"""Project ETTR to cluster scale from measured costs: a seeded discrete-event simulation of one training job.

Failure model (Llama 3 report, 54 days of pre-training on 16,384 H100s: 419 unexpected interruptions, about one
every 3 hours; 58.7% GPU-related, 12.9% software, 8.4% network switch/cable, the remaining ~20% host maintenance,
NIC, SSD, power, CPU, host memory, NCCL watchdog and unattributed). Failures are per GPU, so a job's MTBF scales as
``3 h * 16,384 / gpus``. Each fault class (:data:`LLAMA3_FAULTS`) says how often the culprit node must leave the job
and how the fault shows itself: a process exits, peers hang in a collective, or the node stops responding.

Repeat offenders ("lemons"): a share of node-level faults comes from a node that, put back into service, fails
again (mean ``lemon_mtbf_h``). Without automatic quarantine a lemon stays in the pool until an admin removes it by
hand (mean ``triage_h``); with slurm-ft's quarantine it is drained at its first hardware strike and quarantined for
good at its ``quarantine_strikes``-th. That sets the pool's lemon density, so how many lemons each fresh allocation
(job start, requeue, spare swap) brings in. Llama 3's rate is taken as first faults; lemon repeats come on top.

A replica runs one job for ``horizon_h`` wall hours: compute for the checkpoint interval, stall for the save, repeat.
An asynchronous save is durable only ``checkpoint_write_s`` after its stall ends, so a failure loses the work since
the last *durable* checkpoint. Each failure then costs its detection time and its recovery: an in-allocation
restart, a spare swap (while spares last), or a requeue (queue wait + job start; the allocation and its spares
come back fresh). Failures during detection or recovery are not modelled. ETTR = productive compute time / wall
time. Replicas of a (gpus, seed) pair share their random fault streams across policies (common random numbers),
so policy differences are not sampling noise.

Memory tier (``Policy.memory_tier``, issue 32): besides the disk saves, which keep their own interval, each rank
copies its shard into host memory every ``auto`` spacing of the trainer (:func:`slurm_ft.train.memtier.auto_spacing`
with ``step_s``, ``mem_snapshot_stall_s``, ``mem_snapshot_write_s``, the trainer's 5% stall budget and the job's
MTBF estimate at each restart, as the trainer's interval estimator holds it), each
snapshot stalling training for ``mem_snapshot_stall_s``. A snapshot is usable ``mem_snapshot_write_s`` after its
stall (its local and peer copies written). A fault restarted inside the allocation (on the same nodes: the node's
copy; on a spare: the peer copy) loses only the work since the newest usable snapshot, or since the newest durable
disk save where that is newer; after a requeue the job resumes from disk. Restart times are left as they are (the
restore from memory is not credited with a faster load), and two faults in one snapshot's peer pair are not
modelled.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import random
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_ft.core.config import require
from slurm_ft.train import memtier
from slurm_ft.train.interval import AdaptiveInterval, AdaptiveIntervalConfig

LLAMA3_GPUS = 16_384
LLAMA3_MTBF_S = 3 * 3600.0
DEFAULT_GPUS = tuple(2**k for k in range(10, 18))  # 1,024 .. 131,072
SCHEMA = "slurm-ft.sim/1"


class Symptom(str, enum.Enum):
    """How a fault shows itself to the job, which decides how long detecting it takes."""

    EXIT = "exit"  # a process exits with an error (CUDA error, exception): seen at once
    HANG = "hang"  # peers block in a collective and nothing exits: needs a timeout
    NODE_LOSS = "node_loss"  # the node stops responding: heartbeats stop, or Slurm marks it down


class Recovery(str, enum.Enum):
    IN_ALLOCATION = "in_allocation"  # restart the processes inside the running allocation
    REQUEUE = "requeue"  # the job ends and goes back through the Slurm queue


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class FaultClass:
    """One class of interruption: its share, how often its node must leave the job, how it shows."""

    category: str  # slurm-ft vocabulary
    label: str  # the Llama 3 report's name for it
    share: float
    exclude_share: float  # share of these faults whose node must leave the job (drain, exclude, swap)
    hang_share: float
    node_loss_share: float = 0.0  # the rest of the faults are Symptom.EXIT

    def __post_init__(self) -> None:
        for name in ("share", "exclude_share", "hang_share", "node_loss_share"):
            value = getattr(self, name)
            require(0 <= value <= 1, name, f"must be in [0, 1], got {value!r} ({self.category})")
        require(self.hang_share + self.node_loss_share <= 1, "hang_share",
                f"hang_share + node_loss_share must be <= 1 ({self.category})")

    def symptom(self, u: float) -> Symptom:
        if u < self.hang_share:
            return Symptom.HANG
        if u < self.hang_share + self.node_loss_share:
            return Symptom.NODE_LOSS
        return Symptom.EXIT


# Shares from the Llama 3 report; exclusion and symptom splits are this model's assumptions (reasons inline).
LLAMA3_FAULTS = (
    # faulty GPU, HBM3, SRAM, GPU processor, SDC, thermal: the node must go; most raise a CUDA error in the rank,
    # some (GPU off the bus) leave peers hanging in NCCL
    FaultClass(category="hardware_gpu", label="GPU-related", share=0.587, exclude_share=1.0, hang_share=0.25),
    # software bugs: restartable in place (they were, for Llama 3); mostly an exception, sometimes a deadlock
    FaultClass(category="user_code", label="software", share=0.129, exclude_share=0.0, hang_share=0.1),
    # switch and cable: mostly transient for the job, surfacing as NCCL hangs; a NIC/cable at one node means that
    # node must go
    FaultClass(category="network", label="network switch/cable", share=0.084, exclude_share=0.25, hang_share=0.7),
    # host maintenance, NIC, SSD, PSU, chassis, CPU, host memory (node-level) plus NCCL watchdog and unattributed
    FaultClass(category="hardware_node", label="host/other", share=0.200, exclude_share=0.8, hang_share=0.2,
               node_loss_share=0.6),
)


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class SimCosts:
    """Seconds each event costs. The defaults are estimates for a large H100 job, labelled ``source="defaults"``;
    a costs JSON (``slurm-ft bench sim --costs``, e.g. from the lab benchmark) replaces any of them.

    Checkpoint state is taken as 2 GB per GPU, constant as the job grows (weak scaling; e.g. a 70B model with
    Adam, ~1 TB, over 512 GPUs), so 16 GB per node:

    - ``checkpoint_stall_s`` 1: an async save blocks training only for the device-to-pinned-host copy of the
      rank's shard (~0.1 s at ~20 GB/s) plus planning and synchronisation; rounded up to a second.
    - ``checkpoint_write_s`` 30: the background write of 16 GB per node at ~0.5-1 GB/s per node (a parallel file
      system serving 1-2 TB/s to 2,048 nodes). A synchronous save stalls for this whole time.
    - ``detect_crash_s`` 5: a rank exits; the launcher polls every second and tears the attempt down.
    - ``detect_hang_s`` / ``detect_node_loss_s`` 65: slurm-ft's heartbeat hang timeout configured at 60 s (about
      ten steps of a large job; the launcher's own default is a cautious 300 s) plus 5 s of polling and teardown.
    - ``baseline_detect_hang_s`` 600: without heartbeats a hang lasts until PyTorch's default NCCL timeout (10 min).
    - ``baseline_detect_node_loss_s`` 300: without heartbeats a dead node is noticed when Slurm marks it down
      (``SlurmdTimeout`` default 300 s) and ends the job with NODE_FAIL.
    - ``restart_in_alloc_s`` 120: new processes on the same nodes at scale: interpreter and CUDA start, NCCL
      communicator init across thousands of ranks, each rank loading its 2 GB shard, warm-up.
    - ``spare_swap_s`` 130: the same restart with a spare node in place of the culprit (every rank restarts
      either way; the spare reads its shard like the others), plus ~10 s of topology check (all-reduce, bandwidth).
    - ``requeue_wait_s`` 600: the requeued job waiting for its nodes; Slurm holds a requeued job >= 120 s
      (measured on the lab cluster) and 10 min assumes a reservation or top priority (a busy queue: hours).
    - ``job_start_s`` 300: allocating thousands of nodes, prolog health checks, ``srun`` launch, then the same
      start-up as an in-allocation restart with every rank reading from the file system at once.
    - ``step_s`` 6: one training step (Llama 3 405B: 16M tokens a step, 6 x 405e9 x 16e6 FLOP over 16,384 GPUs at
      ~400 TFLOP/s); only the memory tier's spacing uses it.
    - ``mem_snapshot_stall_s`` 0.5: a memory snapshot stalls for the same device-to-host copy as an async save's
      stall, without its planning; the lab measured 0.5-0.85x a disk save's stall, so half the disk default.
    - ``mem_snapshot_write_s`` 5: the background part: 16 GB per node into ``/dev/shm`` (~2 s) and the same to the
      peer node over the network (~3 s at ~50 Gb/s).
    """

    checkpoint_stall_s: float = 1.0
    checkpoint_write_s: float = 30.0
    detect_crash_s: float = 5.0
    detect_hang_s: float = 65.0
    detect_node_loss_s: float = 65.0
    baseline_detect_hang_s: float = 600.0
    baseline_detect_node_loss_s: float = 300.0
    restart_in_alloc_s: float = 120.0
    spare_swap_s: float = 130.0
    requeue_wait_s: float = 600.0
    job_start_s: float = 300.0
    step_s: float = 6.0
    mem_snapshot_stall_s: float = 0.5
    mem_snapshot_write_s: float = 5.0
    source: str = "defaults"

    def __post_init__(self) -> None:
        for name in cost_names():
            value = getattr(self, name)
            require(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                    and value >= 0, name, f"must be a number of seconds >= 0, got {value!r}")
        require(self.checkpoint_stall_s > 0, "checkpoint_stall_s", "must be > 0")
        require(self.step_s > 0, "step_s", "must be > 0")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str) -> "SimCosts":
        """Measured costs: any subset of the cost keys (the rest keep their defaults, named in ``source``)."""
        require(isinstance(data, Mapping), "costs", f"must be a JSON object, got {type(data).__name__}")
        known = set(cost_names())
        unknown = sorted(set(data) - known - {"source"})
        require(not unknown, unknown[0] if unknown else "costs",
                f"unknown cost key (known: {', '.join(sorted(known))})")
        defaulted = sorted(known - set(data))
        label = source + (f" (defaults for {', '.join(defaulted)})" if defaulted else "")
        return cls(**{k: v for k, v in data.items() if k != "source"}, source=label)

    @classmethod
    def from_json(cls, path: str | Path) -> "SimCosts":
        """A JSON object of cost keys, or one whose ``sim_costs`` member is (so a lab results file works)."""
        data = json.loads(Path(path).read_text())
        if isinstance(data, dict) and "sim_costs" in data:
            data = data["sim_costs"]
        return cls.from_mapping(data, source=str(path))

    def scaled(self, name: str, factor: float) -> "SimCosts":
        return dataclasses.replace(self, **{name: getattr(self, name) * factor},
                                   source=f"{self.source}, {name} x{factor:g}")


def cost_names() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(SimCosts) if f.name != "source")


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class Policy:
    """How a job checkpoints and recovers. ``exclude_nodes``: a culprit node leaves the job for good (spare swap,
    or requeue with ExcNodeList); without it the job comes back on whatever nodes Slurm gives it."""

    name: str
    adaptive_interval: bool = True
    fixed_interval_s: float = 1800.0
    async_checkpoint: bool = True
    recovery: Recovery = Recovery.IN_ALLOCATION
    exclude_nodes: bool = True
    spare_fraction: float = 0.01  # spare nodes held in the allocation, as a share of the job's nodes (>= 1)
    quarantine: bool = True
    hang_detection: bool = True  # heartbeats with a hang timeout; False: NCCL's timeout, Slurm's node timeout
    memory_tier: bool = False  # snapshots in host memory with a peer copy (issue 32)

    def __post_init__(self) -> None:
        require(self.fixed_interval_s > 0, "fixed_interval_s", f"must be > 0, got {self.fixed_interval_s!r}")
        require(0 <= self.spare_fraction < 1, "spare_fraction", f"must be in [0, 1), got {self.spare_fraction!r}")

    def spare_nodes(self, nodes: int) -> int:
        if self.recovery is not Recovery.IN_ALLOCATION or self.spare_fraction == 0:
            return 0
        return max(1, math.ceil(self.spare_fraction * nodes))

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "recovery": self.recovery.value}


BASELINE_INTERVAL_S = 1800.0  # what a user picks by hand: a checkpoint every 30 minutes

POLICIES = (
    Policy(name="slurm-ft"),
    Policy(name="slurm-ft memory tier", memory_tier=True),
    Policy(name="slurm-ft fixed 30 min", adaptive_interval=False),
    Policy(name="slurm-ft no quarantine", quarantine=False),
    Policy(name="slurm-ft no spares", spare_fraction=0.0),
    Policy(name="slurm-ft requeue only", recovery=Recovery.REQUEUE, spare_fraction=0.0),
    Policy(name="torchrun --max-restarts", adaptive_interval=False, async_checkpoint=False, exclude_nodes=False,
           spare_fraction=0.0, quarantine=False, hang_detection=False),
    Policy(name="slurm --requeue", adaptive_interval=False, async_checkpoint=False, recovery=Recovery.REQUEUE,
           exclude_nodes=False, spare_fraction=0.0, quarantine=False, hang_detection=False),
)
HEADLINE_POLICY = "slurm-ft"


def policy_by_name(name: str) -> Policy:
    for policy in POLICIES:
        if policy.name == name:
            return policy
    raise KeyError(name)


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class SimConfig:
    """One job size and the failure model. Lemon figures are assumptions (no public source), so flags."""

    gpus: int
    gpus_per_node: int = 8
    horizon_h: float = 30 * 24.0
    replicas: int = 32
    seed: int = 0
    faults: tuple[FaultClass, ...] = LLAMA3_FAULTS
    reference_gpus: int = LLAMA3_GPUS
    reference_mtbf_s: float = LLAMA3_MTBF_S
    lemon_share: float = 0.10  # of node-level faults, the share whose node is a lemon
    lemon_mtbf_h: float = 24.0  # a lemon in service fails again after this long on average
    triage_h: float = 72.0  # without automatic quarantine, an admin removes a lemon after this long on average
    quarantine_strikes: int = 2  # slurm-ft: drained at the 1st hardware strike, quarantined for good at the 2nd
    prior_mtbf_h: float = 6.0  # the adaptive interval's prior before failures are seen

    def __post_init__(self) -> None:
        for name in ("gpus", "gpus_per_node", "replicas", "reference_gpus", "quarantine_strikes"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value > 0, name,
                    f"must be an integer > 0, got {value!r}")
        for name in ("horizon_h", "reference_mtbf_s", "lemon_mtbf_h", "triage_h", "prior_mtbf_h"):
            value = getattr(self, name)
            require(value > 0, name, f"must be > 0, got {value!r}")
        require(0 <= self.lemon_share <= 1, "lemon_share", f"must be in [0, 1], got {self.lemon_share!r}")
        require(self.faults, "faults", "need at least one fault class")
        total = sum(f.share for f in self.faults)
        require(abs(total - 1.0) < 1e-6, "faults", f"shares must sum to 1, got {total:.4f}")

    @property
    def nodes(self) -> int:
        return math.ceil(self.gpus / self.gpus_per_node)

    @property
    def mtbf_s(self) -> float:
        """The job's MTBF from first faults alone: the per-GPU rate times its GPUs."""
        return self.reference_mtbf_s * self.reference_gpus / self.gpus

    @property
    def lemon_fault(self) -> FaultClass:
        """The class a lemon's repeat fault belongs to: GPU-related, else the most node-level class."""
        return next((f for f in self.faults if f.category == "hardware_gpu"),
                    max(self.faults, key=lambda f: f.exclude_share))

    def lemon_density(self, quarantine: bool) -> float:
        """Lemons in service per node of the pool, in steady state: new lemons per node-second times how long one
        stays in service (until triage, or with quarantine until its remaining strikes)."""
        exclude = sum(f.share * f.exclude_share for f in self.faults)
        per_node_s = exclude * self.gpus_per_node / (self.reference_mtbf_s * self.reference_gpus) * self.lemon_share
        removal_per_s = 1.0 / (self.triage_h * 3600.0)
        if quarantine:
            if self.quarantine_strikes == 1:
                return 0.0
            removal_per_s += 1.0 / ((self.quarantine_strikes - 1) * self.lemon_mtbf_h * 3600.0)
        return per_node_s / removal_per_s


@dataclasses.dataclass(kw_only=True, slots=True)
class Tally:
    """One replica's time, split the way ETTR is (names match :class:`slurm_ft.bench.ettr.Overhead`)."""

    productive: float = 0.0
    checkpoint_stall: float = 0.0
    rework: float = 0.0
    detection: float = 0.0
    recovery: float = 0.0
    queue_wait: float = 0.0
    failures: int = 0
    lemon_failures: int = 0
    requeues: int = 0
    spare_swaps: int = 0
    interval_s: float = 0.0
    mem_every_s: float = 0.0

    LOST = ("checkpoint_stall", "rework", "detection", "recovery", "queue_wait")

    @property
    def wall(self) -> float:
        return self.productive + sum(getattr(self, k) for k in self.LOST)

    @property
    def ettr(self) -> float:
        return self.productive / self.wall


def _poisson(rng: random.Random, mean: float) -> int:
    """Knuth's method for small means, a rounded normal beyond (means here are tens at most)."""
    if mean <= 0:
        return 0
    if mean > 50:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


MEM_STALL_BUDGET = 0.05  # the trainer's auto budget (slurm_ft.train.memory.STALL_BUDGET; a unit test holds them equal)


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class MemoryTier:
    """The memory tier's timeline inside the compute between disk saves: ``every_s`` of training, then a
    snapshot's ``stall_s``, repeat; a snapshot is usable ``write_s`` after its stall."""

    every_s: float
    stall_s: float
    write_s: float

    @classmethod
    def from_costs(cls, costs: SimCosts, mtbf_s: float = 0.0) -> "MemoryTier":
        """The trainer's ``auto`` spacing for these costs and the job's MTBF estimate ``mtbf_s`` (0: unknown)."""
        steps = memtier.auto_spacing(step_s=costs.step_s, stall_s=costs.mem_snapshot_stall_s,
                                     write_s=costs.mem_snapshot_write_s, budget=MEM_STALL_BUDGET, mtbf_s=mtbf_s)
        return cls(every_s=steps * costs.step_s, stall_s=costs.mem_snapshot_stall_s,
                   write_s=costs.mem_snapshot_write_s)

    @property
    def period_s(self) -> float:
        return self.every_s + self.stall_s

    @property
    def stall_share(self) -> float:
        return self.stall_s / self.period_s

    def restore_point(self, computed: float) -> float:
        """Of ``computed`` seconds (snapshot stalls included) since the restart, the point the newest usable
        snapshot holds (0: the state the run started from)."""
        return max(0, math.floor((computed - self.write_s) / self.period_s)) * self.period_s


def _account_run(tally: Tally, run: float, interval: float, stall: float, lag: float, *, failed: bool,
                 memory: MemoryTier | None = None, from_memory: bool = False) -> None:
    """``run`` seconds of training from a durable checkpoint: compute ``interval``, stall ``stall``, repeat.
    A save is durable ``lag`` seconds after its stall; a failure loses the work since the last durable one, or,
    ``from_memory``, since the newest usable memory snapshot where that is newer. With a ``memory`` tier its
    snapshots' stalls take their share of the compute. At the horizon (not ``failed``) the work done counts: the
    job would save once more before it ends."""
    period = interval + stall
    saves = math.floor(run / period)
    tail = run - saves * period
    computed = saves * interval + min(tail, interval)
    share = memory.stall_share if memory else 0.0
    tally.checkpoint_stall += saves * stall + max(0.0, tail - interval) + share * computed
    if not failed:
        tally.productive += (1 - share) * computed
        return
    restore = max(0, min(saves, math.floor((run - lag) / period))) * interval
    if memory and from_memory:
        restore = max(restore, min(computed, memory.restore_point(computed)))
    tally.productive += (1 - share) * restore
    tally.rework += (1 - share) * (computed - restore)


def _detection_s(symptom: Symptom, policy: Policy, costs: SimCosts) -> float:
    if symptom is Symptom.EXIT:
        return costs.detect_crash_s  # generous to the baselines: assumes srun --kill-on-bad-exit
    if symptom is Symptom.HANG:
        return costs.detect_hang_s if policy.hang_detection else costs.baseline_detect_hang_s
    return costs.detect_node_loss_s if policy.hang_detection else costs.baseline_detect_node_loss_s


class _Job:
    """One replica's mutable state: the clock, the allocation's lemons and spares, the interval estimator."""

    def __init__(self, config: SimConfig, policy: Policy, costs: SimCosts, replica: int) -> None:
        self.config, self.policy, self.costs = config, policy, costs
        base = f"{config.seed}:{config.gpus}:{replica}"
        self.faults = random.Random(base + ":faults")  # the same fault stream for every policy
        self.pool = random.Random(base + ":pool")
        self.density = config.lemon_density(policy.quarantine)
        self.full_spares = policy.spare_nodes(config.nodes)
        self.stall = costs.checkpoint_stall_s if policy.async_checkpoint else costs.checkpoint_write_s
        self.lag = costs.checkpoint_write_s if policy.async_checkpoint else 0.0
        self.estimator = AdaptiveInterval(AdaptiveIntervalConfig(prior_mtbf_s=config.prior_mtbf_h * 3600.0,
                                                                 initial_cost_s=self.stall))
        self.estimator.observe_checkpoint(self.stall, write_s=self.lag)
        self.tally = Tally()
        self._allocate()

    def _allocate(self) -> None:
        """A fresh allocation (start or requeue): its lemons drawn from the pool, its spares full."""
        self.lemons = _poisson(self.pool, self.density * self.config.nodes)
        self.spares = self.full_spares

    def interval_s(self) -> float:
        return self.estimator.interval_s() if self.policy.adaptive_interval else self.policy.fixed_interval_s

    def memory(self) -> MemoryTier | None:
        """The memory tier as the trainer spaces it now (from the same MTBF estimate), or None."""
        return MemoryTier.from_costs(self.costs, self.estimator.mtbf_s) if self.policy.memory_tier else None

    def run(self) -> Tally:
        cfg, tally = self.config, self.tally
        horizon = cfg.horizon_h * 3600.0
        base_rate, lemon_rate = 1.0 / cfg.mtbf_s, 1.0 / (cfg.lemon_mtbf_h * 3600.0)
        clock = 0.0
        while clock < horizon:
            rate = base_rate + self.lemons * lemon_rate
            run = self.faults.expovariate(1.0) / rate
            interval, memory = self.interval_s(), self.memory()
            if clock + run >= horizon:
                _account_run(tally, horizon - clock, interval, self.stall, self.lag, failed=False,
                             memory=memory)
                break
            clock += run
            self.estimator.observe_running(run)
            self.estimator.observe_failure()
            draw = self.faults.random
            from_lemon = draw() < self.lemons * lemon_rate / rate  # four draws per failure, whatever the policy
            took, in_allocation = self._fail(from_lemon, draw(), draw(), draw())
            _account_run(tally, run, interval, self.stall, self.lag, failed=True, memory=memory,
                         from_memory=in_allocation)
            clock += took
        tally.interval_s = self.interval_s()
        memory = self.memory()
        tally.mem_every_s = memory.every_s if memory else 0.0
        return tally

    def _fail(self, from_lemon: bool, u_class: float, u_exclude: float, u_symptom: float) -> tuple[float, bool]:
        """One failure: detection and recovery; returns the seconds they took and whether the job stayed in its
        allocation (so a memory tier's node or peer copy can restore it)."""
        tally = self.tally
        tally.failures += 1
        if from_lemon:
            fault, node_fault = self.config.lemon_fault, True
            tally.lemon_failures += 1
            self.lemons -= 1  # it leaves this job: swapped out, excluded, or the job moves to a new allocation
        else:
            fault = _pick(self.config.faults, u_class)
            node_fault = u_exclude < fault.exclude_share
        detect = _detection_s(fault.symptom(u_symptom), self.policy, self.costs)
        requeues = tally.requeues
        restart, wait = self._recover(node_fault)
        tally.detection += detect
        tally.recovery += restart
        tally.queue_wait += wait
        return detect + restart + wait, tally.requeues == requeues

    def _recover(self, node_fault: bool) -> tuple[float, float]:
        """(restart seconds, queue-wait seconds) for one failure, updating spares and lemons."""
        policy, costs = self.policy, self.costs
        if policy.recovery is Recovery.IN_ALLOCATION and not node_fault:
            return costs.restart_in_alloc_s, 0.0
        if policy.recovery is Recovery.IN_ALLOCATION and policy.exclude_nodes and self.spares > 0:
            self.spares -= 1
            self.tally.spare_swaps += 1
            self.lemons += int(self.pool.random() < self.density)  # the spare came from the same pool
            return costs.spare_swap_s, 0.0
        futile = costs.restart_in_alloc_s if policy.recovery is Recovery.IN_ALLOCATION and not policy.exclude_nodes \
            else 0.0  # in place on the broken node: the restart fails at start-up, then the job is requeued
        self.tally.requeues += 1
        self._allocate()
        return futile + costs.job_start_s, costs.requeue_wait_s


def _pick(faults: Sequence[FaultClass], u: float) -> FaultClass:
    acc = 0.0
    for fault in faults:
        acc += fault.share
        if u < acc:
            return fault
    return faults[-1]


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class SimResult:
    gpus: int
    nodes: int
    policy: str
    ettr: float
    ettr_ci95: float  # half-width of the 95% confidence interval over replicas
    failures_per_day: float
    lemon_failures_per_day: float
    requeues_per_day: float
    spare_swaps_per_day: float
    job_mtbf_h: float  # from first faults alone (lemon repeats come on top)
    interval_s: float  # the checkpoint interval at the end of the run (mean over replicas)
    mem_every_s: float  # training between memory snapshots at the end of the run (mean over replicas; 0: no tier)
    rework_per_failure_s: float  # work lost per fault (mean over replicas)
    spare_nodes: int
    spare_gpu_share: float  # GPUs held idle as spares, of all the job's GPUs (not counted in ETTR)
    lost_fraction: dict[str, float]  # of wall time, per Tally.LOST

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def simulate(config: SimConfig, policy: Policy, costs: SimCosts | None = None) -> SimResult:
    costs = costs or SimCosts()
    tallies = [_Job(config, policy, costs, replica).run() for replica in range(config.replicas)]
    ettrs = [t.ettr for t in tallies]
    spread = statistics.stdev(ettrs) if len(ettrs) > 1 else 0.0
    days = config.horizon_h / 24.0
    spares = policy.spare_nodes(config.nodes)

    def per_day(attr: str) -> float:
        return statistics.fmean(getattr(t, attr) for t in tallies) / days

    return SimResult(
        gpus=config.gpus, nodes=config.nodes, policy=policy.name,
        ettr=statistics.fmean(ettrs), ettr_ci95=1.96 * spread / math.sqrt(len(ettrs)),
        failures_per_day=per_day("failures"), lemon_failures_per_day=per_day("lemon_failures"),
        requeues_per_day=per_day("requeues"), spare_swaps_per_day=per_day("spare_swaps"),
        job_mtbf_h=config.mtbf_s / 3600.0, interval_s=statistics.fmean(t.interval_s for t in tallies),
        mem_every_s=statistics.fmean(t.mem_every_s for t in tallies),
        rework_per_failure_s=statistics.fmean(t.rework / max(1, t.failures) for t in tallies),
        spare_nodes=spares, spare_gpu_share=spares / (config.nodes + spares),
        lost_fraction={k: statistics.fmean(getattr(t, k) / t.wall for t in tallies) for k in Tally.LOST},
    )


def sweep(gpus: Iterable[int] = DEFAULT_GPUS, policies: Iterable[Policy] = POLICIES, *,
          costs: SimCosts | None = None, progress: Callable[[SimResult], None] | None = None,
          **config: Any) -> list[SimResult]:
    """Every (gpus, policy) pair; ``config`` holds SimConfig fields; ``progress`` is called after each pair."""
    policies = tuple(policies)
    results = []
    for count in gpus:
        sim_config = SimConfig(gpus=count, **config)
        for policy in policies:
            result = simulate(sim_config, policy, costs)
            results.append(result)
            if progress:
                progress(result)
    return results


def sensitivity(config: SimConfig, policy: Policy, costs: SimCosts | None = None,
                factors: Sequence[float] = (0.5, 2.0)) -> list[dict[str, Any]]:
    """ETTR with each cost the policy uses scaled by each factor, one at a time."""
    costs = costs or SimCosts()
    rows = []
    for name in _costs_used(policy):
        row: dict[str, Any] = {"cost": name, "value_s": getattr(costs, name)}
        for factor in factors:
            row[f"ettr_x{factor:g}"] = simulate(config, policy, costs.scaled(name, factor)).ettr
        rows.append(row)
    return rows


def _costs_used(policy: Policy) -> list[str]:
    names = ["checkpoint_stall_s", "checkpoint_write_s", "detect_crash_s"]
    names += ["detect_hang_s", "detect_node_loss_s"] if policy.hang_detection else \
        ["baseline_detect_hang_s", "baseline_detect_node_loss_s"]
    if policy.recovery is Recovery.IN_ALLOCATION:
        names.append("restart_in_alloc_s")
        if policy.spare_fraction > 0 and policy.exclude_nodes:
            names.append("spare_swap_s")
    if not policy.async_checkpoint:
        names.remove("checkpoint_stall_s")
    if policy.memory_tier:
        names += ["step_s", "mem_snapshot_stall_s", "mem_snapshot_write_s"]
    return names + ["requeue_wait_s", "job_start_s"]


def config_dict(config: SimConfig) -> dict[str, Any]:
    """The failure model and run settings, for the results JSON (without the job size)."""
    data = dataclasses.asdict(config)
    data.pop("gpus")
    return data
