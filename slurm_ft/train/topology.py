"""Topology check on (re)start: the ranks we have are the ranks the allocation promised, on allowed nodes,
and the collective layer actually works.

Gathering (``observe``: a monitored barrier, hosts per rank, env, manifest, an all-reduce on the live group) is
separate from judging (``judge``: a pure function returning one problem string per violation). Every rank
raises the same TopologyError; a rank that never arrives is named by the barrier's timeout, not a hang.

Allowed and reported, not an error: a world size or rank->host map that differs from the newest checkpoint's
manifest (the load reshards), and a rank whose GPU (UUID, PCI bus id) differs from its previous attempt's: the
binding (``slurm_ft.launch.rank_env``) keeps it on a restart in place, a swapped-in spare changes it. The rank's
GPU is CUDA's own word where this process uses CUDA, else what its wrapper recorded through NVML
(``gpu.rank<R>.json``, ``slurm_ft.launch.gpus``); the previous one is in ``<run_dir>/attempt-<N-1>/``. With NCCL, call ``prepare_nccl_topo_dump(ckpt_dir)`` before
``init_process_group``: NCCL then writes its topology XML to ``<ckpt_dir>/topology/`` during the check.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import time
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from slurm_ft.core import env, layout
from slurm_ft.core import rundir as records
from slurm_ft.core.errors import SlurmFtError
from slurm_ft.slurm.parsers import expand_hostlist

log = logging.getLogger("slurm_ft.train.topology")

EXCLUDED_NODES = env.EXCLUDED_NODES  # job setting SLURM_FT_EXCLUDED_NODES
NCCL_TOPO_DUMP_FILE = "NCCL_TOPO_DUMP_FILE"
TOPOLOGY_SUBDIR = "topology"


class TopologyError(SlurmFtError):
    """The running topology differs from the allocation (the message names the ranks)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Observed:
    world_size: int
    rank_hosts: list[str]
    allocated_nodes: list[str]          # from SLURM_JOB_NODELIST / SLURM_NODELIST ([] when not under Slurm)
    expected_tasks: int | None          # SLURM_NTASKS (srun-launched ranks only)
    excluded_nodes: list[str]
    checkpoint_world_size: int | None   # of the newest committed checkpoint
    checkpoint_rank_hosts: list[str] = dataclasses.field(default_factory=list)
    allreduce_ok: bool = True
    allreduce_error: str = ""
    bandwidth_gbps: float | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TopologyReport:
    world_size: int
    rank_hosts: list[str]
    resharding: tuple[int, int] | None  # (checkpoint world size, current) when they differ
    bandwidth_gbps: float | None
    moved: list[str] = dataclasses.field(default_factory=list)  # rank->host changes since the checkpoint
    nccl_topo_file: str | None = None
    gpu: records.GpuBinding | None = None  # this rank's GPU, when it has one
    gpu_changed: list[str] = dataclasses.field(default_factory=list)  # this rank's GPU change since its last attempt


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


def moved_ranks(before: list[str], now: list[str]) -> list[str]:
    """Pure: ``"rank R: A -> B"`` for each rank whose host changed since the checkpoint (ranks both have)."""
    return [f"rank {rank}: {old} -> {new}" for rank, (old, new) in enumerate(zip(before, now)) if old != new]


def gpu_changes(before: records.GpuBinding | None, now: records.GpuBinding | None) -> list[str]:
    """Pure: ``["rank R: GPU <before> -> <now>"]`` when the rank's GPU differs from its previous attempt's (UUID
    and PCI bus id), else [] (also when either is unknown)."""
    if before is None or now is None or not (before.uuid or before.pci_bus) or before.same_gpu(now):
        return []
    return [f"rank {now.rank}: GPU {before.describe()} -> {now.describe()}"]


def _cuda_binding(rank: int, environ: Mapping[str, str]) -> records.GpuBinding | None:
    """The rank's current CUDA device as CUDA names it, when this process has initialised CUDA."""
    try:
        import torch
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return None
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
    except (ImportError, RuntimeError, AssertionError):
        return None
    uuid = str(getattr(props, "uuid", "") or "")
    bus = (f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}"
           if hasattr(props, "pci_bus_id") else "")
    return records.GpuBinding(rank=rank, host=_host(environ), attempt=_attempt(environ),
                              devices=environ.get("CUDA_VISIBLE_DEVICES", ""),
                              uuid=uuid if not uuid or uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}",
                              pci_bus=bus)


def _attempt(environ: Mapping[str, str]) -> int:
    text = environ.get("SLURM_FT_ATTEMPT", "")
    return int(text) if text.isdigit() else 0


def _recorded(run_dir: Path, rank: int, wait_s: float = 0.0,
              sleep=time.sleep) -> records.GpuBinding | None:
    """Rank ``rank``'s record in ``run_dir``, waiting up to ``wait_s`` for its wrapper to write it."""
    waited = 0.0
    while True:
        found = next((b for b in records.read_gpu_bindings(run_dir) if b.rank == rank), None)
        if found is not None or waited >= wait_s:
            return found
        sleep(0.1)
        waited += 0.1


def check_gpu(rank: int, environ: Mapping[str, str], run_dir: Path | None) -> tuple[records.GpuBinding | None,
                                                                                   list[str]]:
    """This rank's GPU and its change since the previous attempt (see the module docstring). CUDA's own word is
    written over the wrapper's record, so the next attempt compares with it."""
    if run_dir is None:
        return _cuda_binding(rank, environ), []
    now = _cuda_binding(rank, environ)
    if now is not None:
        try:
            records.write_gpu_binding(run_dir, now)
        except OSError:
            log.warning("cannot record rank %d's GPU in %s", rank, run_dir)
    else:  # the wrapper writes its record while the rank starts: a moment's wait where one is coming
        coming = bool(environ.get("CUDA_VISIBLE_DEVICES")) and _attempt(environ) > 0
        now = _recorded(run_dir, rank, wait_s=2.0 if coming else 0.0)
    attempt = _attempt(environ)
    before = _recorded(run_dir / f"attempt-{attempt - 1}", rank) if attempt > 1 else None
    return now, gpu_changes(before, now)


def allocated_nodes(environ: Mapping[str, str]) -> list[str]:
    return expand_hostlist(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or "")


def _host(environ: Mapping[str, str]) -> str:
    return records.node_name(environ)


def topology_dir(ckpt_dir: str | os.PathLike[str]) -> Path:
    return Path(ckpt_dir) / TOPOLOGY_SUBDIR


def prepare_nccl_topo_dump(ckpt_dir: str | os.PathLike[str], environ: MutableMapping[str, str] | None = None,
                           host: str | None = None) -> str:
    """Point NCCL_TOPO_DUMP_FILE (unless set) at ``<ckpt_dir>/topology/nccl_topo.<host>.xml``; call before the
    first NCCL communicator is created. NCCL writes it on one rank (NCCL_TOPO_DUMP_FILE_RANK, default 0)."""
    environ = os.environ if environ is None else environ
    if not environ.get(NCCL_TOPO_DUMP_FILE):
        path = topology_dir(ckpt_dir) / f"nccl_topo.{host or _host(environ)}.xml"
        path.parent.mkdir(parents=True, exist_ok=True)
        environ[NCCL_TOPO_DUMP_FILE] = str(path)
    return environ[NCCL_TOPO_DUMP_FILE]


def _device_for(group) -> "object":
    import torch
    import torch.distributed as dist
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


_CHECKS = [0]  # revalidate calls in this process: fresh store keys for each


def _gather_hosts(host: str, timeout_s: float) -> list[str]:
    """Hosts of all ranks through the rendezvous store, bounded by ``timeout_s``: ranks that do not arrive are
    named (a TopologyError), never waited on forever. Rank 0 collects the hosts and publishes one key."""
    import torch.distributed as dist
    store = dist.distributed_c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    _CHECKS[0] += 1
    prefix = f"slurm_ft/topology/{_CHECKS[0]}"
    keys = [f"{prefix}/arrived/{r}" for r in range(world)]
    timeout = datetime.timedelta(seconds=timeout_s)
    store.set(keys[rank], host)
    try:
        store.wait(keys, timeout)
    except RuntimeError:
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        raise TopologyError(f"topology check failed: ranks {missing} did not arrive within {timeout_s}s") from None
    if rank == 0:
        store.set(f"{prefix}/hosts", json.dumps([store.get(key).decode() for key in keys]))
    try:
        store.wait([f"{prefix}/hosts"], timeout)
    except RuntimeError:
        raise TopologyError(f"topology check failed: rank 0 did not publish the hosts within {timeout_s}s") from None
    return json.loads(store.get(f"{prefix}/hosts"))


def _allreduce_check(timeout_s: float, nbytes: int) -> tuple[bool, str, float | None]:
    """On the live group: sum of (rank+1) over all ranks, then an optional timed all-reduce of ``nbytes``."""
    import torch
    import torch.distributed as dist
    world, device = dist.get_world_size(), _device_for(None)
    timeout = datetime.timedelta(seconds=timeout_s)
    probe = torch.full((16,), float(dist.get_rank() + 1), device=device)
    try:
        dist.all_reduce(probe, async_op=True).wait(timeout=timeout)
    except RuntimeError as exc:
        return False, f"no completion within {timeout_s}s ({str(exc).splitlines()[0]})", None
    expected = world * (world + 1) / 2
    if not torch.all(probe == expected):
        return False, f"sum {probe[0].item()} != expected {expected}", None
    if nbytes <= 0:
        return True, "", None
    payload = torch.ones(max(1, nbytes // 4), device=device)
    dist.all_reduce(payload, async_op=True).wait(timeout=timeout)  # warm-up (algorithm setup, buffers)
    start = time.perf_counter()
    try:
        dist.all_reduce(payload, async_op=True).wait(timeout=timeout)
        if device.type == "cuda":
            torch.cuda.synchronize()
    except RuntimeError as exc:
        return False, f"bandwidth probe: no completion within {timeout_s}s ({str(exc).splitlines()[0]})", None
    return True, "", nbytes / (time.perf_counter() - start) / 1e9


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
        hosts = _gather_hosts(host, timeout_s)
        ok, error, bandwidth = _allreduce_check(timeout_s, bandwidth_bytes)
    else:
        world, hosts, ok, error, bandwidth = 1, [host], True, "", None
    if excluded_nodes is None:
        excluded_nodes = expand_hostlist(env.job_setting(EXCLUDED_NODES, environ) or "")
    # Under torchrun (inside or outside Slurm) tasks are not ranks: only srun-launched ranks must match NTASKS.
    ntasks = None if "TORCHELASTIC_RUN_ID" in environ else environ.get("SLURM_NTASKS")
    manifest = layout.latest_committed(ckpt_dir) if ckpt_dir else None
    return Observed(world_size=world, rank_hosts=hosts, allocated_nodes=allocated_nodes(environ),
                    expected_tasks=int(ntasks) if ntasks and ntasks.isdigit() else None,
                    excluded_nodes=list(excluded_nodes),
                    checkpoint_world_size=manifest.world_size if manifest else None,
                    checkpoint_rank_hosts=list(manifest.rank_hosts) if manifest else [],
                    allreduce_ok=ok, allreduce_error=error, bandwidth_gbps=bandwidth)


def revalidate(*, ckpt_dir: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None,
               excluded_nodes: list[str] | None = None, timeout_s: float = 30.0,
               min_bandwidth_gbps: float = 0.0, bandwidth_bytes: int | None = None) -> TopologyReport:
    """Check the topology on every rank (collective, before the first step); raise TopologyError naming the
    differing ranks. ``excluded_nodes`` default: the hostlist in SLURM_FT_EXCLUDED_NODES."""
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
    moved = moved_ranks(obs.checkpoint_rank_hosts, obs.rank_hosts)
    if moved:
        log.info("ranks on other hosts than at the last checkpoint: %s", ", ".join(moved))
    gpu, gpu_changed = check_gpu(_rank(environ), environ, _run_dir(ckpt_dir, environ))
    for change in gpu_changed:
        log.warning("the GPU changed since the last attempt: %s", change)
    dump = environ.get(NCCL_TOPO_DUMP_FILE)
    return TopologyReport(world_size=obs.world_size, rank_hosts=obs.rank_hosts, resharding=resharding,
                          bandwidth_gbps=obs.bandwidth_gbps, moved=moved,
                          nccl_topo_file=dump if dump and os.path.isfile(dump) else None, gpu=gpu,
                          gpu_changed=gpu_changed)


def _rank(environ: Mapping[str, str]) -> int:
    try:
        import torch.distributed as dist
    except ImportError:
        dist = None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    text = environ.get("RANK") or environ.get("SLURM_PROCID") or "0"
    return int(text) if text.isdigit() else 0


def _run_dir(ckpt_dir: str | os.PathLike[str] | None, environ: Mapping[str, str]) -> Path | None:
    """The run dir the launcher and the wrappers use (``SLURM_FT_RUN_DIR``, else ``<ckpt_dir>/.slurm-ft``)."""
    chosen = env.job_setting(env.RUN_DIR, environ)
    if chosen:
        return Path(chosen)
    return records.run_dir_for(ckpt_dir) if ckpt_dir else None
