"""Project ETTR to cluster scale from measured costs (seeded, deterministic).

Failure model (Llama 3 report, 54 days on 16,384 H100s: 419 unexpected interruptions, about one every 3 hours;
58.7% GPU/hardware-related, 12.9% software, 8.4% network, the rest host/other). The failure rate is per GPU, so a
job's MTBF scales as ``3 h * 16384 / gpus``. A share of hardware failures comes from "lemon" nodes that fail again
soon unless they are quarantined.

A replica runs one job for ``horizon_h`` wall hours: compute segments of ``interval`` seconds, each followed by a
checkpoint stall; on a failure the work since the last checkpoint is lost, then detection and recovery time pass.
ETTR = productive compute time / wall time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from slurm_ft.config import require
from slurm_ft.interval import AdaptiveInterval, AdaptiveIntervalConfig, young_daly_interval

LLAMA3_GPUS = 16_384
LLAMA3_MTBF_S = 3 * 3600.0
FAILURE_MIX = {"hardware": 0.587, "software": 0.129, "network": 0.084, "other": 0.200}
DEFAULT_GPUS = tuple(2**k for k in range(10, 18))  # 1,024 .. 131,072


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class SimCosts:
    """Seconds each event costs. Defaults are estimates for a large H100 job, labelled ``source="defaults"``:

    - async stall 0.5 s: staging a rank's shard of model and optimizer state (~2.5 GB per GPU for a 405B model
      with Adam, fully sharded over 16k GPUs, is far less) into pinned host memory at ~5-10 GB/s over PCIe;
    - checkpoint write 60 s: the same state at ~0.3-1 GB/s per node to a parallel file system (the sync baseline
      stalls for this whole time);
    - detection: process exit or NODE_FAIL within ~10 s; hangs are caught by the hang timeout (60 s) with slurm-ft,
      by NCCL's 600 s watchdog without it; network faults mostly surface as hangs;
    - in-allocation restart 120 s (process start, NCCL init, checkpoint load), spare swap 180 s;
    - requeue 900 s (back through the queue, node allocation, prolog, full job start at scale).
    """

    checkpoint_stall_s: float = 0.5
    checkpoint_write_s: float = 60.0
    detect_exit_s: float = 10.0
    hang_timeout_s: float = 60.0
    nccl_timeout_s: float = 600.0
    restart_in_alloc_s: float = 120.0
    spare_swap_s: float = 180.0
    requeue_s: float = 900.0
    source: str = "defaults"

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if field.name != "source":
                value = getattr(self, field.name)
                require(value >= 0, field.name, f"must be >= 0 seconds, got {value}")

    @classmethod
    def from_json(cls, path: str | Path) -> "SimCosts":
        data = json.loads(Path(path).read_text())
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        require(not unknown, unknown[0] if unknown else "", f"unknown cost key in {path}")
        return cls(**{**data, "source": str(path)})


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class Policy:
    """How a job checkpoints and recovers."""

    name: str
    adaptive_interval: bool = True
    fixed_interval_s: float = 3600.0
    async_checkpoint: bool = True
    in_allocation_restart: bool = True
    spare_nodes: int = 2
    quarantine: bool = True
    hang_detection: bool = True  # False: hangs wait for NCCL's watchdog


POLICIES = (
    Policy(name="slurm-ft"),
    Policy(name="slurm-ft fixed 1h interval", adaptive_interval=False),
    Policy(name="slurm-ft without quarantine", quarantine=False),
    Policy(name="slurm-ft requeue only", in_allocation_restart=False, spare_nodes=0),
    Policy(name="torchrun --max-restarts", adaptive_interval=False, async_checkpoint=False, spare_nodes=0,
           quarantine=False, hang_detection=False),
    Policy(name="slurm --requeue", adaptive_interval=False, async_checkpoint=False, in_allocation_restart=False,
           spare_nodes=0, quarantine=False, hang_detection=False),
)


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class SimConfig:
    gpus: int
    horizon_h: float = 24.0 * 14
    replicas: int = 16
    seed: int = 0
    lemon_share: float = 0.10  # of hardware failures, the share caused by a lemon node
    lemon_mtbf_s: float = 4 * 3600.0  # how soon a lemon fails again while it stays in the job
    hang_share: dict[str, float] = dataclasses.field(
        default_factory=lambda: {"hardware": 0.1, "software": 0.2, "network": 0.8, "other": 0.3})

    def __post_init__(self) -> None:
        require(self.gpus > 0, "gpus", f"must be > 0, got {self.gpus}")
        require(self.horizon_h > 0, "horizon_h", f"must be > 0, got {self.horizon_h}")
        require(self.replicas > 0, "replicas", f"must be > 0, got {self.replicas}")
        require(0 <= self.lemon_share <= 1, "lemon_share", f"must be in [0, 1], got {self.lemon_share}")

    @property
    def mtbf_s(self) -> float:
        return LLAMA3_MTBF_S * LLAMA3_GPUS / self.gpus


@dataclasses.dataclass(kw_only=True, slots=True)
class ReplicaTally:
    productive_s: float = 0.0
    checkpoint_s: float = 0.0
    rework_s: float = 0.0
    detect_s: float = 0.0
    recover_s: float = 0.0
    failures: int = 0


def _interval_for(policy: Policy, estimator: AdaptiveInterval, stall: float, write_s: float) -> float:
    """Fixed, or Young/Daly on the stall; never shorter than one background write (one save in flight)."""
    if not policy.adaptive_interval:
        return policy.fixed_interval_s
    return min(max(young_daly_interval(stall, estimator.mtbf_s), write_s, 30.0), 6 * 3600.0)


def _run_replica(config: SimConfig, policy: Policy, costs: SimCosts, rng: random.Random) -> ReplicaTally:
    stall = costs.checkpoint_stall_s if policy.async_checkpoint else costs.checkpoint_write_s
    estimator = AdaptiveInterval(AdaptiveIntervalConfig(prior_mtbf_s=6 * 3600.0, initial_cost_s=max(stall, 1e-3)))
    tally = ReplicaTally()
    horizon = config.horizon_h * 3600.0
    clock = 0.0
    lemons = 0  # lemon nodes currently in the job
    kinds, weights = zip(*FAILURE_MIX.items())
    while clock < horizon:
        rate = 1.0 / config.mtbf_s + lemons / config.lemon_mtbf_s
        run = min(rng.expovariate(rate), horizon - clock)
        interval = _interval_for(policy, estimator, stall, costs.checkpoint_write_s)
        segments = math.floor(run / (interval + stall))
        tally.productive_s += segments * interval
        tally.checkpoint_s += segments * stall
        clock += run
        estimator.observe_exposure(run)
        if clock >= horizon:
            tally.productive_s += run - segments * (interval + stall)  # the tail is checkpointed at the end
            break
        tally.rework_s += run - segments * (interval + stall)
        tally.failures += 1
        estimator.observe_failure()
        kind = rng.choices(kinds, weights)[0]
        lemons = _lemons_after(kind, lemons, rate, config, policy, rng)
        hang = rng.random() < config.hang_share[kind]
        detect = (costs.hang_timeout_s if policy.hang_detection else costs.nccl_timeout_s) if hang else costs.detect_exit_s
        recover = _recovery_s(kind, policy, costs)
        tally.detect_s += detect
        tally.recover_s += recover
        clock += detect + recover
    return tally


def _lemons_after(kind: str, lemons: int, rate: float, config: SimConfig, policy: Policy,
                  rng: random.Random) -> int:
    """Lemon nodes in the job after this failure. Quarantine removes a failing node at its first hardware fault,
    so a lemon never stays; without it the node comes back (requeue without exclusion, or swapped back later)."""
    if kind != "hardware" or policy.quarantine:
        return lemons
    from_lemon = rng.random() < (lemons / config.lemon_mtbf_s) / rate
    if not from_lemon and rng.random() < config.lemon_share:
        return lemons + 1
    return lemons


def _recovery_s(kind: str, policy: Policy, costs: SimCosts) -> float:
    if not policy.in_allocation_restart:
        return costs.requeue_s
    if kind == "hardware":
        return costs.spare_swap_s if policy.spare_nodes > 0 else costs.requeue_s
    return costs.restart_in_alloc_s


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class SimResult:
    gpus: int
    policy: str
    ettr: float
    ettr_ci95: float
    failures_per_day: float
    mtbf_h: float
    lost_fraction: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def simulate(config: SimConfig, policy: Policy, costs: SimCosts | None = None) -> SimResult:
    costs = costs or SimCosts()
    rng = random.Random(f"{config.seed}:{config.gpus}:{policy.name}")
    tallies = [_run_replica(config, policy, costs, rng) for _ in range(config.replicas)]
    wall = config.horizon_h * 3600.0
    ettrs = [t.productive_s / (t.productive_s + t.checkpoint_s + t.rework_s + t.detect_s + t.recover_s)
             for t in tallies]
    spread = statistics.stdev(ettrs) if len(ettrs) > 1 else 0.0

    def share(attr: str) -> float:
        return statistics.fmean(getattr(t, attr) for t in tallies) / wall

    return SimResult(
        gpus=config.gpus,
        policy=policy.name,
        ettr=statistics.fmean(ettrs),
        ettr_ci95=1.96 * spread / math.sqrt(len(ettrs)),
        failures_per_day=statistics.fmean(t.failures for t in tallies) / config.horizon_h * 24,
        mtbf_h=config.mtbf_s / 3600,
        lost_fraction={k: share(k + "_s") for k in ("checkpoint", "rework", "detect", "recover")},
    )


def sweep(gpus: Iterable[int] = DEFAULT_GPUS, policies: Iterable[Policy] = POLICIES, *,
          costs: SimCosts | None = None, replicas: int = 16, horizon_h: float = 24.0 * 14, seed: int = 0,
          progress: Callable[[SimResult], None] | None = None) -> list[SimResult]:
    """Every (gpus, policy) pair; ``progress`` is called after each."""
    results = []
    for count in gpus:
        config = SimConfig(gpus=count, replicas=replicas, horizon_h=horizon_h, seed=seed)
        for policy in policies:
            result = simulate(config, policy, costs)
            results.append(result)
            if progress:
                progress(result)
    return results
