"""Topology check on (re)start: the ranks we have are the ranks the allocation promised, on allowed nodes,
and the collective layer actually works.

Gathering (``observe``: hosts per rank, env, manifest, one all-reduce) is separate from judging (``judge``: a
pure function returning one problem string per violation). Every rank raises the same TopologyError.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import socket
import time
from collections.abc import Mapping

from slurm_ft import env
from slurm_ft.errors import SlurmFtError
from slurm_ft.slurm.parsers import expand_hostlist
from slurm_ft.train import layout

log = logging.getLogger("slurm_ft.train.topology")

EXCLUDED_NODES = env.EXCLUDED_NODES  # job setting SLURM_FT_EXCLUDED_NODES


class TopologyError(SlurmFtError):
    """The running topology differs from the allocation (the message names the ranks)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Observed:
    world_size: int
    rank_hosts: list[str]
    allocated_nodes: list[str]          # from SLURM_JOB_NODELIST ([] when not under Slurm)
    expected_tasks: int | None          # SLURM_NTASKS
    excluded_nodes: list[str]
    checkpoint_world_size: int | None   # of the newest committed checkpoint
    allreduce_ok: bool = True
    allreduce_error: str = ""
    bandwidth_gbps: float | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TopologyReport:
    world_size: int
    rank_hosts: list[str]
    resharding: tuple[int, int] | None  # (checkpoint world size, current) when they differ
    bandwidth_gbps: float | None


def _ranks_on(hosts: list[str], wanted) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        if wanted(host):
            found.setdefault(host, []).append(rank)
    return found


def judge(obs: Observed, *, min_bandwidth_gbps: float = 0.0) -> list[str]:
    """Pure: one message per violation (empty = healthy)."""
    problems = []
    if obs.expected_tasks is not None and obs.expected_tasks != obs.world_size:
        problems.append(f"world size {obs.world_size} != SLURM_NTASKS {obs.expected_tasks}")
    if obs.allocated_nodes:
        allowed = set(obs.allocated_nodes)
        for host, ranks in _ranks_on(obs.rank_hosts, lambda h: h not in allowed).items():
            problems.append(f"ranks {ranks} run on {host!r}, not in the allocation {sorted(allowed)}")
    excluded = set(obs.excluded_nodes)
    for host, ranks in _ranks_on(obs.rank_hosts, lambda h: h in excluded).items():
        problems.append(f"ranks {ranks} run on excluded node {host!r}")
    if not obs.allreduce_ok:
        problems.append(f"all-reduce check failed: {obs.allreduce_error}")
    if min_bandwidth_gbps > 0 and obs.bandwidth_gbps is not None and obs.bandwidth_gbps < min_bandwidth_gbps:
        problems.append(f"all-reduce bandwidth {obs.bandwidth_gbps:.3f} GB/s below floor {min_bandwidth_gbps} GB/s")
    return problems


def _host(environ: Mapping[str, str]) -> str:
    return environ.get("SLURMD_NODENAME") or socket.gethostname()


def _allreduce_check(timeout_s: float, nbytes: int) -> tuple[bool, str, float | None]:
    """Sum of (rank+1) over all ranks, then an optional timed all-reduce of ``nbytes`` for bandwidth."""
    import torch
    import torch.distributed as dist
    world = dist.get_world_size()
    probe = torch.full((16,), float(dist.get_rank() + 1))
    work = dist.all_reduce(probe, async_op=True)
    try:
        work.wait(timeout=datetime.timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        return False, f"no completion within {timeout_s}s ({exc})", None
    expected = world * (world + 1) / 2
    if not torch.all(probe == expected):
        return False, f"sum {probe[0].item()} != expected {expected}", None
    if nbytes <= 0:
        return True, "", None
    payload = torch.ones(max(1, nbytes // 4))
    start = time.perf_counter()
    dist.all_reduce(payload)
    elapsed = time.perf_counter() - start
    return True, "", nbytes / elapsed / 1e9


def observe(*, ckpt_dir: str | os.PathLike[str] | None, environ: Mapping[str, str],
            excluded_nodes: list[str] | None, timeout_s: float, bandwidth_bytes: int) -> Observed:
    try:
        import torch.distributed as dist
        distributed = dist.is_available() and dist.is_initialized()
    except ImportError:
        distributed = False
    host = _host(environ)
    if distributed:
        world = dist.get_world_size()
        hosts: list = [None] * world
        dist.all_gather_object(hosts, host)
        ok, error, bandwidth = _allreduce_check(timeout_s, bandwidth_bytes)
    else:
        world, hosts, ok, error, bandwidth = 1, [host], True, "", None
    if excluded_nodes is None:
        excluded_nodes = expand_hostlist(env.job_setting(EXCLUDED_NODES, environ) or "")
    # Under torchrun (inside or outside Slurm) tasks are not ranks: only srun-launched ranks must match NTASKS.
    ntasks = None if "TORCHELASTIC_RUN_ID" in environ else environ.get("SLURM_NTASKS")
    manifest = layout.latest_committed(ckpt_dir) if ckpt_dir else None
    return Observed(world_size=world, rank_hosts=hosts,
                    allocated_nodes=expand_hostlist(environ.get("SLURM_JOB_NODELIST", "")),
                    expected_tasks=int(ntasks) if ntasks and ntasks.isdigit() else None,
                    excluded_nodes=list(excluded_nodes),
                    checkpoint_world_size=manifest.world_size if manifest else None,
                    allreduce_ok=ok, allreduce_error=error, bandwidth_gbps=bandwidth)


def revalidate(*, ckpt_dir: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None,
               excluded_nodes: list[str] | None = None, timeout_s: float = 30.0,
               min_bandwidth_gbps: float = 0.0, bandwidth_bytes: int | None = None) -> TopologyReport:
    """Check the topology on every rank (collective); raise TopologyError naming the differing ranks."""
    if timeout_s <= 0 or min_bandwidth_gbps < 0:
        raise ValueError(f"timeout_s must be > 0 and min_bandwidth_gbps >= 0, got {timeout_s}, {min_bandwidth_gbps}")
    environ = os.environ if environ is None else environ
    nbytes = bandwidth_bytes if bandwidth_bytes is not None else (64 << 20 if min_bandwidth_gbps > 0 else 0)
    obs = observe(ckpt_dir=ckpt_dir, environ=environ, excluded_nodes=excluded_nodes, timeout_s=timeout_s,
                  bandwidth_bytes=nbytes)
    problems = judge(obs, min_bandwidth_gbps=min_bandwidth_gbps)
    if problems:
        raise TopologyError("topology check failed: " + "; ".join(problems))
    resharding = None
    if obs.checkpoint_world_size is not None and obs.checkpoint_world_size != obs.world_size:
        resharding = (obs.checkpoint_world_size, obs.world_size)
        log.warning("world size changed %d -> %d since the last checkpoint: resharding on load", *resharding)
    return TopologyReport(world_size=obs.world_size, rank_hosts=obs.rank_hosts, resharding=resharding,
                          bandwidth_gbps=obs.bandwidth_gbps)
