"""Memory tier cost, side by side with a disk save's, in one run (issue 32).

    python bench/bench_memory_tier.py [--sizes small,medium] [--steps 24] [--ckpt-every 4] [--out DIR]

For each model size: 2 gloo ranks of the example trainer, each on its own "node" (``SLURMD_NODENAME``) with its
own memory root (that node's ``/dev/shm``), so every snapshot also sends a peer copy. A snapshot every step, an
async disk save every ``--ckpt-every`` steps. Reported from rank 0's own figures (``checkpoint`` stats): the mean
and largest stall of a disk save and of a memory snapshot, the snapshot's background write (serialize, write,
peer exchange, commit), the shard's size; and, sampled every 5 ms from outside, the bytes in each node's memory
directory (its rank's own snapshots plus the peer copy it holds): the peak and the median, as a multiple of the
shard. Timing figures on a shared host are noisy: read them as a ratio within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_ft.bench.report import Column, render_table  # noqa: E402
from slurm_ft.core import shmdir  # noqa: E402

RUN_ID = "bench-memtier"
NODES = ("a", "b")


def _dir_bytes(path: Path) -> int:
    total = 0
    try:
        for entry in os.scandir(path):
            try:
                total += entry.stat().st_size
            except FileNotFoundError:
                pass
    except FileNotFoundError:
        return 0
    return total


def _sample(dirs: list[Path], stop: threading.Event, samples: dict[str, list[int]]) -> None:
    while not stop.is_set():
        for node, path in zip(NODES, dirs):
            size = _dir_bytes(path)
            if size:
                samples[node].append(size)
        time.sleep(0.005)


def _spawn(root: Path, size: str, args: argparse.Namespace) -> tuple[dict, dict[str, list[int]]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_FT_", "SLURM_JOB_ID", "SLURM_RESTART"))}
    procs, dirs = [], []
    for rank, node in enumerate(NODES):
        mem_root = root / f"shm-{node}"
        mem_root.mkdir()
        dirs.append(mem_root / shmdir.dir_name(RUN_ID))
        env = {**base, "OMP_NUM_THREADS": "1", "SLURM_FT_RUN_ID": RUN_ID, "SLURM_FT_MEM_ROOT": str(mem_root),
               "SLURMD_NODENAME": node, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        cmd = [sys.executable, "-m", "slurm_ft.train.example", "--ckpt-dir", str(root / "ck"), "--model-size", size,
               "--steps", str(args.steps), "--ckpt-every", str(args.ckpt_every), "--mem-every", "1",
               "--step-time", str(args.step_time)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    samples: dict[str, list[int]] = {node: [] for node in NODES}
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(dirs, stop, samples), daemon=True)
    sampler.start()
    outs = [proc.communicate(timeout=600) for proc in procs]
    stop.set()
    sampler.join()
    for proc, (_out, err) in zip(procs, outs):
        if proc.returncode != 0:
            raise SystemExit(f"trainer exited {proc.returncode}:\n{err[-3000:]}")
    return json.loads(outs[0][0].strip().splitlines()[-1]), samples


def measure(size: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-memtier-") as tmp:
        result, samples = _spawn(Path(tmp), size, args)
    ckpt, mem = result["checkpoint"], result["checkpoint"]["memory"]
    disk_stalls = ckpt["stall_s_mean"]
    shard = mem["snapshot_bytes"]
    every = [s for node in NODES for s in samples[node]]
    return {
        "model_size": size, "shard_bytes": shard, "disk_saves": ckpt["saves"], "snapshots": mem["snapshots"],
        "disk_stall_ms_mean": 1000 * disk_stalls, "mem_stall_ms_mean": 1000 * mem["stall_s_mean"],
        "mem_stall_ms_max": 1000 * mem["stall_s_max"], "mem_write_ms_mean": 1000 * mem["write_s_mean"],
        "snapshot_vs_disk_stall": mem["stall_s_mean"] / disk_stalls,
        "peers": mem["peers"], "spacing": mem["spacing"],
        "node_dir_peak_bytes": max(every), "node_dir_median_bytes": statistics.median(every),
        "extra_peak_x_shard": max(every) / shard, "extra_median_x_shard": statistics.median(every) / shard,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="small,medium", help="example-trainer model sizes (comma-separated)")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--ckpt-every", type=int, default=4)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--out", type=Path, help="write memory_tier.json here")
    args = parser.parse_args(argv)
    rows = [measure(size, args) for size in args.sizes.split(",")]
    print(render_table(
        ["model", Column("shard KB", ",.1f"), Column("disk stall ms", ".1f"), Column("snapshot stall ms", ".1f"),
         Column("snapshot/disk", ".2f"), Column("snapshot max ms", ".1f"), Column("bg write ms", ".1f"),
         Column("mem peak x shard", ".2f"), Column("mem median x shard", ".2f"), "saves/snapshots"],
        [(r["model_size"], r["shard_bytes"] / 1000, r["disk_stall_ms_mean"], r["mem_stall_ms_mean"],
          r["snapshot_vs_disk_stall"], r["mem_stall_ms_max"], r["mem_write_ms_mean"], r["extra_peak_x_shard"],
          r["extra_median_x_shard"], f"{r['disk_saves']}/{r['snapshots']}") for r in rows]))
    for r in rows:
        print(f"{r['model_size']}: snapshot stall {r['snapshot_vs_disk_stall']:.2f}x a disk save's; extra host "
              f"memory per rank {r['extra_median_x_shard']:.2f}x the shard (median; peak "
              f"{r['extra_peak_x_shard']:.2f}x), goal <= 2x: {'met' if r['extra_peak_x_shard'] <= 2 else 'NOT met'}"
              f" at the peak")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        config = {"steps": args.steps, "ckpt_every": args.ckpt_every, "mem_every": 1, "step_time_s": args.step_time,
                  "ranks": 2, "nodes": list(NODES)}
        (args.out / "memory_tier.json").write_text(json.dumps({"config": config, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
