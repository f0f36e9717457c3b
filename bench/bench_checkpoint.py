"""Checkpoint benchmark: raw fsync'd disk bandwidth, memcpy, sync DCP save, async stall and background rate.

    python bench/bench_checkpoint.py [--sizes 64,256,512] [--dir /tmp/bench-ckpt]

Single process. Targets: async stall <= 1.5x the memcpy time of the state; background throughput >= 0.8x the raw
disk bandwidth. All figures of one size are measured side by side in one run (timings here are noisy).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from torch import nn

from slurm_ft.train.checkpoint import CheckpointConfig, CheckpointManager

CHUNK_MB = 16


def make_model(size_mb: int) -> nn.Module:
    n = max(1, size_mb // CHUNK_MB)
    model = nn.Module()
    model.chunks = nn.ParameterList(nn.Parameter(torch.randn(CHUNK_MB * 2**20 // 4)) for _ in range(n))
    return model


def raw_disk_s(path: Path, nbytes: int) -> float:
    block = os.urandom(8 << 20)
    start = time.perf_counter()
    with open(path, "wb") as fh:
        for _ in range(nbytes // len(block)):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())
    elapsed = time.perf_counter() - start
    path.unlink()
    return elapsed


def memcpy_s(model: nn.Module) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        copies = [p.detach().clone() for p in model.parameters()]
        best = min(best, time.perf_counter() - start)
        del copies
    return best


def run(size_mb: int, root: Path) -> dict[str, float]:
    model = make_model(size_mb)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    root.mkdir(parents=True, exist_ok=True)
    disk = raw_disk_s(root / "raw.bin", nbytes)
    copy = memcpy_s(model)
    mgr = CheckpointManager(CheckpointConfig(dir=str(root / "ck"), every=1, keep_last=1, async_save=True), model=model)
    sync = mgr.save(1, blocking=True)
    asyn = mgr.save(2)
    mgr.wait()
    mgr.close()
    shutil.rmtree(root / "ck")
    if not (sync.ok and asyn.ok):
        raise SystemExit(f"save failed: {sync.error or asyn.error}")
    mb = nbytes / 2**20
    return {"MB": mb, "disk_MBps": mb / disk, "memcpy_s": copy, "sync_save_s": sync.total_s,
            "async_stall_s": asyn.stall_s, "bg_MBps": mb / asyn.total_s,
            "stall/memcpy": asyn.stall_s / copy, "bg/disk": (mb / asyn.total_s) / (mb / disk)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="64,256,512", help="state sizes in MB, comma separated")
    p.add_argument("--dir", default="/tmp/bench-ckpt")
    args = p.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        p.error(f"--sizes must be integers, got {args.sizes!r}")
    cols = ["MB", "disk_MBps", "memcpy_s", "sync_save_s", "async_stall_s", "bg_MBps", "stall/memcpy", "bg/disk"]
    print(" ".join(f"{c:>13}" for c in cols))
    for size in sizes:
        row = run(size, Path(args.dir))
        print(" ".join(f"{row[c]:>13.3f}" for c in cols), flush=True)
    print("targets: stall/memcpy <= 1.5, bg/disk >= 0.8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
