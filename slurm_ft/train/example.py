"""Example trainer: a small MLP on deterministic synthetic data, FSDP2 (or DDP) over gloo, with slurm-ft.

    python -m torch.distributed.run --standalone --nproc-per-node=2 -m slurm_ft.train.example \
        --steps 20 --ckpt-dir /tmp/ck --ckpt-every 5 [--crash-at 1:12]
    srun -N2 --ntasks-per-node=1 python -m slurm_ft.train.example --steps 20 --ckpt-dir /shared/ck

Rank/world from RANK/WORLD_SIZE/LOCAL_RANK (torchrun) or SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID (srun);
MASTER_ADDR/MASTER_PORT from the launcher, else the first node of SLURM_JOB_NODELIST and a port derived from
SLURM_JOB_ID. Before the first step: topology check, then resume from the newest committed checkpoint (or
SLURM_FT_RESUME_STEP). Heartbeats every step and error files go to $SLURM_FT_RUN_DIR (default <ckpt-dir>/.slurm-ft).
The checkpoint dir belongs to this run (SLURM_FT_RUN_ID, else the Slurm job id; see CheckpointConfig): another
run's dir is refused unless --ckpt-adopt. A run whose last save failed exits non-zero.

Fault injection by RANK:STEP fires when this run reaches STEP without having resumed at or past it; so a run
that resumes from an earlier checkpoint fires it again (give the flag on the first attempt only, see
slurm_ft.lab.faults.first_attempt_only). --fail-at raises InjectedFault (user code), --crash-at SIGKILLs the rank,
--hang-at stops making progress (a sleep outside any collective: a stuck data loader), --signal-at sends the rank
SIGUSR1 (as Slurm's --signal does), --desync-at makes the rank call one all-reduce the others do not (a
rank-dependent branch around a collective: its peers go on into the forward's all-gather, and the ranks wait in
different collectives at the same sequence number, on every attempt alike).

The last stdout line of rank 0 is ``{"step": N, "param_sha256": "...", ...}`` (sha256 over all full parameters).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import logging
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from slurm_ft.core import env
from slurm_ft.core import rundir as records
from slurm_ft.slurm.address import master_addr
from slurm_ft.slurm.parsers import expand_hostlist
from slurm_ft.train import topology
from slurm_ft.train.checkpoint import (
    AGREE_EVERY_S,
    AUTO,
    AUTO_MIN_INTERVAL_S,
    EMERGENCY_DEADLINE_S,
    CheckpointConfig,
    CheckpointManager,
    parse_mem_every,
)
from slurm_ft.core.errors import ConfigError
from slurm_ft.train.errors import StepTracker, record_errors
from slurm_ft.train.heartbeat import HeartbeatWriter
from slurm_ft.train.interval import AdaptiveIntervalConfig
from slurm_ft.train.timeline import TimelineWriter

IN_FEATURES = 16
BATCH = 24
MODEL_SIZES = {"small": 32, "medium": 1024, "large": 2048}


class InjectedFault(RuntimeError):
    """The user-code error ``--fail-at`` raises."""


def _rank_step(text: str) -> tuple[int, int]:
    try:
        rank, step = text.split(":")
        return int(rank), int(step)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RANK:STEP, got {text!r}") from None


def _ckpt_every(text: str) -> int | str:
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of steps or {AUTO!r}, got {text!r}") from None


def _mem_every(text: str) -> int | str:
    try:
        return parse_mem_every(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="slurm_ft.train.example", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--ckpt-dir", default=env.job_setting(env.CKPT_DIR))
    p.add_argument("--ckpt-every", type=_ckpt_every, default=env.job_setting(env.CKPT_EVERY) or "10",
                   metavar="N|auto", help="save every N steps, or auto: a Young/Daly interval from the measured "
                                          "save cost and the failure rate")
    p.add_argument("--ckpt-min-interval", type=float, default=AUTO_MIN_INTERVAL_S, metavar="SECONDS",
                   help="auto: shortest interval, and the training time before a run's first save")
    p.add_argument("--mtbf-prior", type=float, default=AdaptiveIntervalConfig().prior_mtbf_s, metavar="SECONDS",
                   help="auto: mean time between failures assumed before any is seen")
    p.add_argument("--keep-last", type=int, default=3)
    p.add_argument("--mem-every", type=_mem_every, metavar="N|auto|off",
                   help="memory-tier snapshots in /dev/shm every N steps, auto or off (default: SLURM_FT_MEM_EVERY, "
                        "else auto)")
    p.add_argument("--ckpt-adopt", action="store_true", help="take over a checkpoint dir another run owns "
                                                             "(default: SLURM_FT_CKPT_ADOPT)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-size", choices=sorted(MODEL_SIZES), default="small", help="hidden width preset")
    p.add_argument("--hidden", type=int, help="hidden width (overrides --model-size)")
    p.add_argument("--parallel", choices=("fsdp", "ddp"), default="fsdp", help="with more than one rank")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--step-time", type=float, default=0.0, help="extra sleep per step (seconds)")
    p.add_argument("--sync", action="store_true", help="synchronous checkpoint saves")
    p.add_argument("--emergency-deadline", type=float, default=EMERGENCY_DEADLINE_S,
                   help="seconds from SIGUSR1/SIGTERM to exit (default 20: within Slurm's KillWait of 30)")
    p.add_argument("--agree-every", type=float, default=AGREE_EVERY_S, metavar="SECONDS",
                   help="training seconds between the ranks' agreements on signals and saves (0: every step)")
    p.add_argument("--batch-per-rank", type=int, help="samples per rank and step (default: a global batch of "
                                                     f"{BATCH} split across ranks); the same work per rank at any size")
    p.add_argument("--pg-timeout", type=float, help="seconds a collective may wait for a peer (process group and "
                                                    "checkpoint groups; default: torch's)")
    p.add_argument("--timeline", help="rank 0 appends its launch, start, steps and save stalls here (JSON lines; "
                                      "slurm_ft.bench.timeline)")
    for name in ("fail-at", "hang-at", "crash-at", "signal-at", "desync-at"):
        p.add_argument(f"--{name}", type=_rank_step, metavar="RANK:STEP")
    args = p.parse_args(argv)
    if not args.ckpt_dir:
        p.error("--ckpt-dir is required (or SLURM_FT_CKPT_DIR)")
    args.hidden = MODEL_SIZES[args.model_size] if args.hidden is None else args.hidden
    if args.steps < 0 or args.hidden < 1:
        p.error(f"--steps must be >= 0 and --hidden >= 1, got {args.steps} and {args.hidden}")
    if args.ckpt_every != AUTO and args.ckpt_every < 1:
        p.error(f"--ckpt-every must be >= 1 or auto, got {args.ckpt_every}")
    try:
        args.auto_interval = AdaptiveIntervalConfig(min_interval_s=args.ckpt_min_interval,
                                                    prior_mtbf_s=args.mtbf_prior)
    except ValueError as exc:
        p.error(f"--ckpt-min-interval / --mtbf-prior: {exc}")
    if args.batch_per_rank is not None and args.batch_per_rank < 1:
        p.error(f"--batch-per-rank must be >= 1, got {args.batch_per_rank}")
    if args.pg_timeout is not None and not args.pg_timeout > 0:
        p.error(f"--pg-timeout must be > 0 seconds, got {args.pg_timeout}")
    return args


def _world(environ=os.environ) -> tuple[int, int, int]:
    """(rank, world size, local rank) under torchrun or srun; (0, 1, 0) alone."""
    def pick(*names: str, default: str) -> int:
        for name in names:
            if environ.get(name, "") != "":
                return int(environ[name])
        return int(default)
    return (pick("RANK", "SLURM_PROCID", default="0"), pick("WORLD_SIZE", "SLURM_NTASKS", default="1"),
            pick("LOCAL_RANK", "SLURM_LOCALID", default="0"))


def rendezvous_env(environ) -> None:
    """Fill MASTER_ADDR/MASTER_PORT for srun without a launcher: the step's first node (rank 0 runs there),
    resolved as the launcher does; the port derived from the job id."""
    if not environ.get("MASTER_ADDR"):
        nodes = expand_hostlist(environ.get("SLURM_STEP_NODELIST", "")) or topology.allocated_nodes(environ)
        environ["MASTER_ADDR"] = master_addr(nodes[0], environ, nodes=len(nodes)) if nodes else "127.0.0.1"
    if not environ.get("MASTER_PORT"):
        job = environ.get("SLURM_JOB_ID", "")
        environ["MASTER_PORT"] = str(20000 + int(job) % 20000) if job.isdigit() else "29500"


class SyntheticData:
    """Deterministic batches: batch ``i`` is a pure function of (seed, i). ``position`` is the next batch
    index; it is what the checkpoint saves as the dataloader state."""

    def __init__(self, seed: int, rank: int, world: int, device: torch.device, global_batch: int = BATCH) -> None:
        self.seed, self.rank, self.world, self.device = seed, rank, world, device
        self.global_batch = global_batch
        self.position = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch(self.seed, self.position, self.rank, self.world, self.global_batch)
        self.position += 1
        return x.to(self.device), y.to(self.device)

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])


def batch(seed: int, index: int, rank: int, world: int, size: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of global batch ``index`` of ``size`` samples: a pure function of (seed, index, size)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    x = torch.randn(size, IN_FEATURES, generator=gen)
    y = x.sum(dim=1, keepdim=True).sin()
    return x[rank::world], y[rank::world]


def build_model(hidden: int, seed: int, world: int, *, parallel: str = "fsdp",
                device: torch.device = torch.device("cpu")) -> nn.Module:
    """MLP with dropout (so a resume must restore the RNG to be bitwise identical)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(IN_FEATURES, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, hidden),
                          nn.ReLU(), nn.Linear(hidden, 1)).to(device)
    if world == 1:
        return model
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(device.type, (world,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def param_sha256(model: nn.Module) -> str:
    """sha256 over all FULL parameters in name order (collective under FSDP: call on every rank)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    digest = hashlib.sha256()
    for name in sorted(full):
        digest.update(name.encode())
        digest.update(full[name].detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def _inject(args: argparse.Namespace, rank: int, step: int, resumed: int) -> None:
    def hit(spec):
        return spec is not None and spec == (rank, step) and resumed < step
    if hit(args.signal_at):
        os.kill(os.getpid(), signal.SIGUSR1)
    if hit(args.fail_at):
        raise InjectedFault(f"injected failure at rank {rank} step {step}")
    if hit(args.crash_at):
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    if hit(args.hang_at):
        while True:
            time.sleep(3600)
    if hit(args.desync_at) and dist.is_initialized():
        dist.all_reduce(torch.zeros(1))  # only this rank: a desync


def train(args: argparse.Namespace, rank: int, world: int, device: torch.device, tracker: StepTracker,
          run_dir: str, timeline=None) -> dict:
    report = topology.revalidate(ckpt_dir=args.ckpt_dir)
    model = build_model(args.hidden, args.seed, world, parallel=args.parallel, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.9)
    data = SyntheticData(args.seed, rank, world, device,
                         global_batch=args.batch_per_rank * world if args.batch_per_rank else BATCH)
    timeouts = {"collective_timeout_s": args.pg_timeout} if args.pg_timeout else {}
    config = CheckpointConfig.from_env(dir=args.ckpt_dir, every=args.ckpt_every, auto_interval=args.auto_interval,
                                       keep_last=args.keep_last, async_save=not args.sync,
                                       emergency_deadline_s=args.emergency_deadline, agree_every_s=args.agree_every,
                                       adopt=True if args.ckpt_adopt else None, mem_every=args.mem_every,
                                       **timeouts)
    mgr = CheckpointManager(config, model=model, optimizer=optimizer, lr_scheduler=scheduler, dataloader_state=data)
    mgr.install_signal_handlers()
    heart = HeartbeatWriter(run_dir, rank)
    if timeline is not None:
        timeline.write("built")
    start = mgr.resume()
    loaded_sha = param_sha256(model) if start > 0 else None
    step, emergency = start, False
    if timeline is not None:
        timeline.write("start", resumed_from=start, world=world, pid=os.getpid())
    model.train()
    while step < args.steps:
        began = time.time()
        tracker.step = step + 1
        _inject(args, rank, step + 1, start)
        x, y = data.next()
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        step += 1
        heart.beat(step)
        if args.step_time:
            time.sleep(args.step_time)
        stepped = time.time()
        if timeline is not None:  # before the save: a process killed after committing step N has recorded it
            timeline.write("step", step=step, t0=round(began, 4), t1=round(stepped, 4))
        saved = mgr.maybe_save(step)
        if timeline is not None and saved:
            timeline.write("save", step=step, t0=round(stepped, 4), t1=round(time.time(), 4))
        if mgr.exit_requested:
            emergency = True
            break
    mgr.close()  # raises when the last save failed: the run then exits non-zero
    if timeline is not None:
        timeline.write("end", step=step)
    return {"step": step, "param_sha256": param_sha256(model), "resumed_from": start,
            "resumed_sha256": loaded_sha, "world_size": world, "data_position": data.position,
            "emergency": emergency, "resharded_from": report.resharding[0] if report.resharding else None,
            "gpu_changed": report.gpu_changed, "resume_source": mgr.resume_source,
            "mem_stall_s": mgr.last_mem_stall_s, "disk_stall_s": mgr.last_stall_s,
            "checkpoint": mgr.stats}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world, local_rank = _world()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"[rank{rank}] %(levelname)s %(name)s: %(message)s")
    run_dir = env.job_setting(env.RUN_DIR) or str(records.run_dir_for(args.ckpt_dir))
    device = torch.device("cpu")
    timeline = None
    if args.timeline and rank == 0:
        timeline = TimelineWriter(args.timeline)
        timeline.write("launch")
    with record_errors(run_dir, rank) as tracker:
        if args.backend == "nccl":
            device = torch.device("cuda", local_rank % torch.cuda.device_count())  # bound by the launcher: cuda:0
            torch.cuda.set_device(device)
            topology.prepare_nccl_topo_dump(args.ckpt_dir)
        if world > 1:
            rendezvous_env(os.environ)
            timeout = {"timeout": datetime.timedelta(seconds=args.pg_timeout)} if args.pg_timeout else {}
            dist.init_process_group(args.backend, rank=rank, world_size=world, **timeout)
            if timeline is not None:
                timeline.write("process_group")
        try:
            result = train(args, rank, world, device, tracker, run_dir, timeline)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())  # a plain exit: the checkpoint manager keeps gloo from aborting it (slurm_ft.train.gloo_exit)
