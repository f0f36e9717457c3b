"""Example trainer: a small MLP on deterministic synthetic data, FSDP2 over gloo, with slurm-ft checkpoints.

    python -m torch.distributed.run --standalone --nproc-per-node=2 -m slurm_ft.train.example \
        --steps 20 --ckpt-dir /tmp/ck --ckpt-every 5 [--crash-at 1:12]

Rank/world from RANK/WORLD_SIZE (torchrun) or SLURM_PROCID/SLURM_NTASKS (srun; MASTER_ADDR/MASTER_PORT from the
launcher). Fault injection (``RANK:STEP``) fires only on an attempt that did not resume at or past that step.
The last stdout line of rank 0 is ``{"step": N, "param_sha256": "...", ...}``.
"""

from __future__ import annotations

import argparse
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

from slurm_ft import env
from slurm_ft.train import records
from slurm_ft.train.checkpoint import CheckpointConfig, CheckpointManager
from slurm_ft.train.errors import StepTracker, record_errors
from slurm_ft.train.heartbeat import HeartbeatWriter

IN_FEATURES = 16
BATCH = 24


class InjectedFault(RuntimeError):
    """The user-code error ``--fail-at`` raises."""


def _rank_step(text: str) -> tuple[int, int]:
    try:
        rank, step = text.split(":")
        return int(rank), int(step)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RANK:STEP, got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="slurm_ft.train.example", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--ckpt-dir", default=env.job_setting(env.CKPT_DIR))
    p.add_argument("--ckpt-every", type=int, default=int(env.job_setting(env.CKPT_EVERY) or 10))
    p.add_argument("--keep-last", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--step-time", type=float, default=0.0, help="extra sleep per step (seconds)")
    p.add_argument("--sync", action="store_true", help="synchronous checkpoint saves")
    for name in ("fail-at", "hang-at", "crash-at"):
        p.add_argument(f"--{name}", type=_rank_step, metavar="RANK:STEP")
    args = p.parse_args(argv)
    if not args.ckpt_dir:
        p.error("--ckpt-dir is required (or SLURM_FT_CKPT_DIR)")
    if args.steps < 0 or args.hidden < 1:
        p.error(f"--steps must be >= 0 and --hidden >= 1, got {args.steps} and {args.hidden}")
    return args


def _world() -> tuple[int, int]:
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
    world = os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1"))
    return int(rank), int(world)


def batch(seed: int, step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of the global batch for ``step``: a pure function of (seed, step)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(BATCH, IN_FEATURES, generator=gen)
    y = x.sum(dim=1, keepdim=True).sin()
    return x[rank::world], y[rank::world]


def build_model(hidden: int, seed: int, world: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(IN_FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                          nn.Linear(hidden, 1))
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
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
    if hit(args.fail_at):
        raise InjectedFault(f"injected failure at rank {rank} step {step}")
    if hit(args.crash_at):
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    if hit(args.hang_at):
        while True:
            time.sleep(3600)


def train(args: argparse.Namespace, rank: int, world: int, tracker: StepTracker, run_dir: str) -> dict:
    model = build_model(args.hidden, args.seed, world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.9)
    config = CheckpointConfig(dir=args.ckpt_dir, every=args.ckpt_every, keep_last=args.keep_last,
                              async_save=not args.sync)
    mgr = CheckpointManager(config, model=model, optimizer=optimizer, lr_scheduler=scheduler)
    mgr.install_signal_handlers()
    try:
        from slurm_ft.train import topology
    except ImportError:
        topology = None
    if topology is not None:
        topology.revalidate(ckpt_dir=args.ckpt_dir)
    heart = HeartbeatWriter(run_dir, rank)
    start = mgr.resume()
    loaded_sha = param_sha256(model) if start > 0 else None
    step, emergency = start, False
    while step < args.steps:
        tracker.step = step + 1
        _inject(args, rank, step + 1, start)
        x, y = batch(args.seed, step + 1, rank, world)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        step += 1
        heart.beat(step)
        if args.step_time:
            time.sleep(args.step_time)
        mgr.maybe_save(step)
        if mgr.exit_requested:
            emergency = True
            break
    mgr.close()
    return {"step": step, "param_sha256": param_sha256(model), "resumed_from": start,
            "resumed_sha256": loaded_sha, "world_size": world,
            "emergency": emergency, "checkpoint": mgr.stats}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world = _world()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"[rank{rank}] %(levelname)s %(name)s: %(message)s")
    run_dir = env.job_setting(env.RUN_DIR) or str(records.run_dir_for(args.ckpt_dir))
    with record_errors(run_dir, rank) as tracker:
        if world > 1:
            dist.init_process_group("gloo", rank=rank, world_size=world)
        try:
            result = train(args, rank, world, tracker, run_dir)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
