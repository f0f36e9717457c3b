"""What a restarted rank spends, in CPU and wall seconds, on each part of its resume (real gloo ranks, FSDP2).

A warm restart (``slurm_ft.launch.standby``) starts each rank in a spare that has imported torch; what is left is
the rank's own work: the process group, the model, the checkpoint (verify, the state dict DCP loads into,
``dcp.load``, ``set_state_dict``), the example's digest of the loaded parameters and the first steps. This
script saves one checkpoint of the example trainer's model on N ranks, then starts N fresh ranks twice over and
times each part on every rank (CPU: ``time.process_time``; wall: the slowest rank). CPU per rank that stays flat
while the wall time grows means the ranks wait on each other's cores, not on more work.

``--warm`` first runs a small FSDP2 model through a state dict and an optimizer step on a one-rank process group
in each rank (what a spare could do before it is needed), to see whether DTensor's first use of its ops is a
cost the spare could take off the restart.

Usage: python bench/bench_resume_cpu.py [--ranks N] [--hidden H] [--warm] [--rounds R]

The process group's wall time includes waiting for the slowest rank to start (spawn); its CPU is the cost.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from slurm_ft.launch.launcher import free_port  # noqa: E402
from slurm_ft.launch.standby import PRELOAD  # noqa: E402
from slurm_ft.train import checkpoint as ckpt  # noqa: E402
from slurm_ft.train import example  # noqa: E402

PARTS = ("process group", "model", "manager", "verify", "state dict", "dcp.load", "set_state_dict", "digest",
         "first step", "second step")


class Clock:
    """CPU and wall seconds since the previous mark, by part."""

    def __init__(self) -> None:
        self.parts: dict[str, tuple[float, float]] = {}
        self._last = (time.process_time(), time.perf_counter())

    def mark(self, part: str) -> None:
        now = (time.process_time(), time.perf_counter())
        cpu, wall = self.parts.get(part, (0.0, 0.0))
        self.parts[part] = (cpu + now[0] - self._last[0], wall + now[1] - self._last[1])
        self._last = now


def _timed(clock: Clock, part: str, fn):
    def wrapper(*args, **kwargs):
        clock.mark("manager")  # whatever the manager did since the previous timed call
        try:
            return fn(*args, **kwargs)
        finally:
            clock.mark(part)
    return wrapper


def _warm_up() -> None:
    """A small FSDP2 model through a state dict and an optimizer step, on a one-rank group, then gone."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    fd, path = tempfile.mkstemp()
    os.close(fd)
    dist.init_process_group("gloo", store=dist.FileStore(path, 1), rank=0, world_size=1)
    model = torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.ReLU(), torch.nn.Linear(13, 5))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    get_state_dict(model, optimizer)
    model(torch.randn(2, 7)).sum().backward()
    optimizer.step()
    dist.destroy_process_group()
    os.unlink(path)


def _rank(rank: int, world: int, port: int, ckpt_dir: str, hidden: int, save: bool, warm: bool, out) -> None:
    for module in PRELOAD:  # what a spare has imported before it becomes a rank
        importlib.import_module(module)
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if warm:
        _warm_up()
    clock = Clock()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    clock.mark("process group")
    model = example.build_model(hidden, 0, world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    clock.mark("model")
    manager = ckpt.CheckpointManager(ckpt.CheckpointConfig(dir=ckpt_dir, every=1, async_save=False),
                                     model=model, optimizer=optimizer)
    x = torch.randn(8, example.IN_FEATURES)
    if save:
        model(x).sum().backward()
        optimizer.step()
        manager.maybe_save(1)
        manager.close()
        dist.barrier()
        dist.destroy_process_group()
        return
    manager._verify = _timed(clock, "verify", manager._verify)
    manager._state_dict = _timed(clock, "state dict", manager._state_dict)
    load, set_sd = ckpt.dcp.load, ckpt.set_state_dict
    ckpt.dcp.load, ckpt.set_state_dict = _timed(clock, "dcp.load", load), _timed(clock, "set_state_dict", set_sd)
    try:
        manager.resume()
    finally:
        ckpt.dcp.load, ckpt.set_state_dict = load, set_sd
    clock.mark("manager")
    example.param_sha256(model)
    clock.mark("digest")
    for part in ("first step", "second step"):
        model(x).sum().backward()
        optimizer.step()
        clock.mark(part)
    every = [None] * world
    dist.all_gather_object(every, clock.parts)
    if rank == 0:
        out.put(every)
    dist.barrier()  # no rank tears its group down while a peer still uses it
    dist.destroy_process_group()


def _round(world: int, ckpt_dir: str, hidden: int, save: bool, warm: bool) -> list[dict]:
    port = free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_rank, args=(world, port, ckpt_dir, hidden, save, warm, queue), nprocs=world,
                       start_method="spawn")
    return [] if save else queue.get()


def _table(every: list[dict], label: str) -> str:
    world = len(every)
    lines = [f"{label}: {world} ranks", f"{'part':16s} {'CPU s/rank':>10s} {'CPU max':>8s} {'wall max':>9s}"]
    for part in PARTS:
        cpus = [ranks.get(part, (0.0, 0.0))[0] for ranks in every]
        walls = [ranks.get(part, (0.0, 0.0))[1] for ranks in every]
        lines.append(f"{part:16s} {sum(cpus) / world:10.3f} {max(cpus):8.3f} {max(walls):9.3f}")
    total = sum(sum(cpu for cpu, _ in ranks.values()) for ranks in every) / world
    walls = max(sum(wall for _, wall in ranks.values()) for ranks in every)
    lines.append(f"{'total':16s} {total:10.3f} {'':8s} {walls:9.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024, help="the example's width (bench lab's medium: 1024)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warm", action="store_true", help="also rounds with a one-rank FSDP2 warm-up first")
    args = parser.parse_args(argv)
    for name in ("ranks", "hidden", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    ckpt_dir = tempfile.mkdtemp(prefix="resume-cpu-")
    try:
        _round(args.ranks, ckpt_dir, args.hidden, save=True, warm=False)
        modes = (False, True) if args.warm else (False,)
        for index in range(args.rounds):
            for warm in modes:
                every = _round(args.ranks, ckpt_dir, args.hidden, save=False, warm=warm)
                print(_table(every, f"round {index + 1}, {'warmed up' if warm else 'as a spare starts'}"),
                      flush=True)
    finally:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
