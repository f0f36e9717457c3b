"""Checkpoint benchmark: loop stall and background throughput against state size, side by side with the raw
fsync'd disk write bandwidth and the in-memory copy bandwidth measured in the same run.

    python bench/bench_checkpoint.py [--sizes 64,256,512] [--dir /tmp/bench-ckpt] [--threads 2]

Single process, one rank's state (fp32 tensors of 16 MiB). Per size: a plain ``dcp.save`` (FileSystemWriter,
fsync'd files: what a synchronous loop blocks for), our blocking
save (DCP + digests + manifest + atomic publish), one cold async save (staging buffers allocated), then
--repeats rounds of
  memcpy     copy of the state into already-allocated host buffers (the in-memory copy bandwidth)
  async      our async save in steady state: stall = time the loop was blocked; bg = bytes / (commit - stall)
  disk       raw write of the state's bytes to one file with fsync (8 MiB writes)
Each ratio is the median of the per-round ratios (neighbours in time), the other columns are medians.
Targets: stall/memcpy <= 1.5; bg/disk >= 0.8. Timings on a shared host are noisy: read the ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from slurm_ft.train.checkpoint import CheckpointConfig, CheckpointManager

CHUNK_MB = 16
COLUMNS = ("MB", "disk_MBps", "memcpy_s", "dcp_sync_s", "ours_sync_s", "cold_stall_s", "stall_s", "bg_MBps",
           "stall/memcpy", "bg/disk")


def make_model(size_mb: int) -> nn.Module:
    n = max(1, size_mb // CHUNK_MB)
    model = nn.Module()
    model.chunks = nn.ParameterList(nn.Parameter(torch.randn(CHUNK_MB * 2**20 // 4)) for _ in range(n))
    return model


def raw_disk_s(path: Path, model: nn.Module) -> float:
    """Write the state's own bytes (8 MiB writes) to one file, fsync it."""
    views = [memoryview(p.detach().numpy()).cast("B") for p in model.parameters()]
    block = 8 << 20
    start = time.perf_counter()
    with open(path, "wb") as fh:
        for view in views:
            for offset in range(0, len(view), block):
                fh.write(view[offset:offset + block])
        fh.flush()
        os.fsync(fh.fileno())
    elapsed = time.perf_counter() - start
    path.unlink()
    return elapsed


class Memcpy:
    """Copies of the state into host buffers allocated (and touched) once."""

    def __init__(self, model: nn.Module) -> None:
        self.params = [p.detach() for p in model.parameters()]
        self.buffers = [torch.empty_like(p) for p in self.params]
        self.copy_s()

    def copy_s(self) -> float:
        start = time.perf_counter()
        for buf, p in zip(self.buffers, self.params):
            buf.copy_(p)
        return time.perf_counter() - start


def dcp_sync_s(model: nn.Module, path: Path, threads: int) -> float:
    start = time.perf_counter()
    dcp.save({"model": model.state_dict()}, storage_writer=dcp.FileSystemWriter(path, thread_count=threads),
             no_dist=True)
    elapsed = time.perf_counter() - start
    shutil.rmtree(path)
    return elapsed


def run(size_mb: int, root: Path, threads: int, repeats: int) -> dict[str, float]:
    """One size. The async save is measured in ``repeats`` rounds of (memcpy, async save, raw disk write) so each
    ratio compares neighbours in time; the medians of the per-round ratios are reported."""
    model = make_model(size_mb)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    mb = nbytes / 2**20
    root.mkdir(parents=True, exist_ok=True)
    plain = dcp_sync_s(model, root / "dcp", threads)
    config = CheckpointConfig(dir=str(root / "ck"), every=1, keep_last=1, async_save=True, write_threads=threads)
    mgr = CheckpointManager(config, model=model)
    ours = mgr.save(1, blocking=True)
    cold = mgr.save(2)
    mgr.wait()
    memcpy = Memcpy(model)
    rounds = []
    for step in range(3, 3 + repeats):
        copy = memcpy.copy_s()
        result = mgr.save(step)
        mgr.wait()
        disk = raw_disk_s(root / "raw.bin", model)
        rounds.append((copy, result, disk))
    mgr.close()
    del memcpy
    shutil.rmtree(root / "ck")
    failed = [r.error for r in (ours, cold, *(r for _, r, _ in rounds)) if not r.ok]
    if failed:
        raise SystemExit(f"save failed: {failed[0]}")
    med = statistics.median
    bg = [mb / (r.total_s - r.stall_s) for _, r, _ in rounds]
    return {"MB": mb, "disk_MBps": med(mb / d for _, _, d in rounds), "memcpy_s": med(c for c, _, _ in rounds),
            "dcp_sync_s": plain, "ours_sync_s": ours.total_s, "cold_stall_s": cold.stall_s,
            "stall_s": med(r.stall_s for _, r, _ in rounds), "bg_MBps": med(bg),
            "stall/memcpy": med(r.stall_s / c for c, r, _ in rounds),
            "bg/disk": med(b / (mb / d) for b, (_, _, d) in zip(bg, rounds))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="64,256,512", help="state sizes in MB, comma separated")
    p.add_argument("--dir", default="/tmp/bench-ckpt")
    p.add_argument("--threads", type=int, default=2, help="DCP writer threads (ours and plain DCP)")
    p.add_argument("--repeats", type=int, default=5, help="measurement rounds per size (median)")
    args = p.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        p.error(f"--sizes must be integers, got {args.sizes!r}")
    if any(s < CHUNK_MB for s in sizes) or args.threads < 1 or args.repeats < 1:
        p.error(f"--sizes must be >= {CHUNK_MB} MB, --threads and --repeats >= 1, got {args.sizes!r}, "
                f"{args.threads}, {args.repeats}")
    print(" ".join(f"{c:>12}" for c in COLUMNS))
    worst = {"stall/memcpy": 0.0, "bg/disk": float("inf")}
    for size in sizes:
        row = run(size, Path(args.dir), args.threads, args.repeats)
        worst = {"stall/memcpy": max(worst["stall/memcpy"], row["stall/memcpy"]),
                 "bg/disk": min(worst["bg/disk"], row["bg/disk"])}
        print(" ".join(f"{row[c]:>12.3f}" for c in COLUMNS), flush=True)
    stall_ok, bg_ok = worst["stall/memcpy"] <= 1.5, worst["bg/disk"] >= 0.8
    print(f"targets: stall/memcpy <= 1.5 (worst {worst['stall/memcpy']:.2f}: {'met' if stall_ok else 'MISSED'}), "
          f"bg/disk >= 0.8 (worst {worst['bg/disk']:.2f}: {'met' if bg_ok else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
