"""``slurm-ft bench checkpoint``: our checkpoint manager side by side with every ``torch.distributed.checkpoint``
save mode, for the same state, interleaved round by round, against the raw fsync'd disk write (as many files in
parallel as DCP writer threads) and the memcpy of that state (the physical limits) measured in the same rounds.

    slurm-ft bench checkpoint [--sizes 64,256,512] [--repeats 5] [--ranks 1] [--threads 2] [--device cpu|cuda]
                              [--out DIR]

Each rank is a real process in a gloo group (``--ranks``), holding ``size`` MB of its own parameters. Per size:
one cold save per system (not reported in the medians), then --repeats rounds in which every system saves once
(the order rotates each round) after a barrier. Per system: training stall per save (time the caller is
blocked), time to durable commit, persist bandwidth (bytes / time spent writing after the caller was released)
and its ratio to the raw disk write of the same round. A memory pass then runs each system alone in a fresh
process group (two saves) and records the peak growth of the proportional set size of each rank and its child
processes over the model's own: the extra host memory it needs, staging buffers and helper processes included
(page cache excluded). A system that cannot run here is listed as ``unavailable: <reason>``. ``--device cuda``
holds every rank's state on a GPU (ours, ``dcp.async_save`` with DCP's pinned and non-blocking stagers and the
rest save the same GPU state); on a host without CUDA it says so in one line and exits 1.
Outputs: the table on stdout, checkpoint_peers.json/.txt/.png in --out. Timings on a shared host are noisy:
read the ratios, which compare neighbours in time.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from slurm_ft.bench import ckpt_peers as cp
from slurm_ft.core.errors import ConfigError

DEFAULT_OUT = Path("bench/results/checkpoint")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_group(plan: dict[str, Any], world: int) -> list[dict[str, Any]]:
    """Run :func:`_worker` on ``world`` spawned processes (a gloo group); the records of all ranks."""
    import torch.multiprocessing as mp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
        out = Path(tmp) / "records.json"
        mp.spawn(_worker, args=(world, plan, str(out)), nprocs=world, join=True)
        return json.loads(out.read_text())


def _worker(rank: int, world: int, plan: dict[str, Any], out: str) -> None:
    import logging

    import torch.distributed as dist

    quiet = logging.getLogger("slurm_ft")  # warnings only: no "committed" line per save
    quiet.addHandler(logging.StreamHandler(sys.stderr))
    quiet.setLevel(logging.WARNING)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
    group = dist.new_group(backend="gloo")  # DCP's own group, apart from the barriers on the default one
    measure = _time_sizes if plan["mode"] == "time" else _memory_one
    records = measure(plan, rank, world, group)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, records)
    if rank == 0:
        Path(out).write_text(json.dumps([r for part in gathered for r in part]))
    dist.barrier()
    dist.destroy_process_group()


def _setup_all(names: list[str], model: Any, size: int, plan: dict[str, Any], rank: int, world: int,
               group: Any):
    """Build and set up every system; (usable systems, unavailable records), the same on every rank."""
    from slurm_ft.bench import ckpt_systems as cs

    usable, down = [], []
    for name in names:
        system, error = cs.build(name, model, Path(plan["dir"]) / f"{size}MB", plan["threads"], group, rank), ""
        try:
            system.setup()
        except Exception as exc:  # any failure to set up is the system's, reported, never fatal
            error = cp.unavailable_reason(exc)
        error = cs.agree_error(error, world)
        if error:
            down.append({"size_mb": size, "system": name, "unavailable": error})
        else:
            usable.append(system)
    return usable, down


def _save_once(system: Any, step: int, world: int) -> tuple[dict[str, Any] | None, str]:
    """One barrier-aligned save: (timing, "") or (None, the agreed failure)."""
    import torch.distributed as dist

    from slurm_ft.bench import ckpt_systems as cs

    dist.barrier()
    timing, error = None, ""
    try:
        stall, commit = system.save(step)
        timing = {"stall_s": stall, "commit_s": commit}
    except Exception as exc:  # a failed save marks the system, the run goes on
        error = cp.unavailable_reason(exc).replace("unavailable:", "failed:", 1)
    error = cs.agree_error(error, world)
    dist.barrier()
    system.prune()
    return (None if error else timing), error


def _time_sizes(plan: dict[str, Any], rank: int, world: int, group: Any) -> list[dict[str, Any]]:
    from slurm_ft.bench.ckpt_systems import make_model

    records = []
    for size in plan["sizes"]:
        model = make_model(size, rank, plan.get("device", "cpu"))
        systems, down = _setup_all(plan["systems"], model, size, plan, rank, world, group)
        records += down
        step = 1
        for rnd in range(plan["repeats"] + 1):  # round 0: cold saves
            order = systems[rnd % len(systems):] + systems[:rnd % len(systems)] if systems else []
            for system in order:
                timing, error = _save_once(system, step, world)
                step += 1
                base = {"size_mb": size, "system": system.info.name}
                if error:
                    records.append({**base, "unavailable": error})
                    systems.remove(system)
                elif timing:
                    records.append({**base, "round": rnd, "rank": rank, **timing})
        for system in systems:
            system.close()
        gc.collect()
        if rank == 0:
            shutil.rmtree(Path(plan["dir"]) / f"{size}MB", ignore_errors=True)
    return records


def _memory_one(plan: dict[str, Any], rank: int, world: int, group: Any) -> list[dict[str, Any]]:
    """One system, one size, in this fresh group: peak PSS growth (with child processes) over two saves."""
    from slurm_ft.bench import ckpt_systems as cs

    size = plan["size"]
    model = cs.make_model(size, rank, plan.get("device", "cpu"))
    cs.preload(model)  # code every system imports lazily is not memory a save needs
    gc.collect()
    base = cs.pss_tree_bytes()
    sampler = cs.PeakSampler()
    systems, down = _setup_all([plan["system"]], model, size, plan, rank, world, group)
    for step in (1, 2):
        for system in systems:
            _save_once(system, step, world)
    peak = sampler.stop()
    for system in systems:
        system.close()
    if rank == 0:
        shutil.rmtree(Path(plan["dir"]) / f"{size}MB", ignore_errors=True)
    if down:
        return []
    return [{"size_mb": size, "system": plan["system"], "rank": rank, "extra_mb": (peak - base) / 2**20}]


def _host(config: cp.BenchConfig) -> dict[str, Any]:
    import torch

    where = Path(config.dir).absolute()
    while not where.exists():  # the dir is made by the first save; its nearest existing ancestor's disk
        where = where.parent
    usage = shutil.disk_usage(where)
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "cuda": torch.cuda.is_available(), "platform": platform.platform(), "dir": config.dir,
            "device": config.device, "gpu": torch.cuda.get_device_name(0) if config.device == "cuda" else None,
            "disk_free_gb": round(usage.free / 2**30, 1)}


def parse(argv: list[str] | None) -> tuple[cp.BenchConfig, Path]:
    from slurm_ft.bench.ckpt_systems import system_names

    p = argparse.ArgumentParser(prog="slurm-ft bench checkpoint", description="Our checkpoint manager beside every torch.distributed.checkpoint save mode, interleaved "
                                            "round by round, against raw fsync'd disk and memcpy.")
    p.add_argument("--sizes", default="64,256,512", help="state sizes in MB per rank, comma separated")
    p.add_argument("--repeats", type=int, default=5, help="measured rounds per size (medians)")
    p.add_argument("--threads", type=int, default=2, help="DCP writer threads per rank (every system)")
    p.add_argument("--ranks", type=int, default=1, help="gloo processes, each with its own state (default 1)")
    p.add_argument("--dir", default="/tmp/bench-ckpt", help="where the checkpoints are written")
    p.add_argument("--system", action="append", metavar="NAME",
                   help=f"only this system (repeatable; the two limits always run): {'; '.join(system_names())}")
    p.add_argument("--no-memory", action="store_true", help="skip the memory pass")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where every rank's state lives (cuda: on GPU rank %% count; default cpu)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    args = p.parse_args(argv)
    try:
        sizes = tuple(int(s) for s in args.sizes.split(","))
    except ValueError:
        p.error(f"--sizes must be integers, got {args.sizes!r}")
    known = system_names()
    bad = [s for s in args.system or () if s not in known]
    if bad:
        p.error(f"--system {bad[0]!r}: unknown (known: {'; '.join(known)})")
    chosen = tuple(known[:2] + [s for s in known[2:] if s in args.system]) if args.system else ()
    try:
        config = cp.BenchConfig(sizes=sizes, repeats=args.repeats, threads=args.threads, ranks=args.ranks,
                                dir=args.dir, memory=not args.no_memory, systems=chosen, device=args.device)
    except ConfigError as exc:
        p.error(str(exc))
    return config, args.out


def cuda_missing(device: str) -> str:
    """Why ``device`` cannot hold the state here ("" when it can): only cuda can be missing."""
    if device != "cuda":
        return ""
    import torch

    if torch.cuda.is_available():
        return ""
    build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, but no GPU or driver"
    return f"CUDA is unavailable here (torch {torch.__version__}: {build}); run it on a GPU node"


def main(argv: list[str] | None = None) -> int:
    from slurm_ft.bench.ckpt_systems import build, system_names

    config, out = parse(argv)
    missing = cuda_missing(config.device)
    if missing:
        print(f"slurm-ft bench checkpoint: --device cuda: {missing}", file=sys.stderr)
        return 1
    names = list(config.systems or system_names())
    plan = {"mode": "time", "sizes": list(config.sizes), "repeats": config.repeats, "threads": config.threads,
            "dir": config.dir, "systems": names, "device": config.device}
    started = time.monotonic()
    print(f"timing {len(names)} systems x {len(config.sizes)} sizes x {config.repeats} rounds on "
          f"{config.ranks} rank(s)...", file=sys.stderr, flush=True)
    records = run_group(plan, config.ranks)
    memory = _memory_pass(config, names, records) if config.memory else []
    infos = [build(n, None, Path(config.dir), 1, None, 0).info for n in names]
    data = cp.payload(config, infos, records, memory, _host(config))
    data["elapsed_s"] = round(time.monotonic() - started, 1)
    print(cp.render(data))
    paths = cp.write(out, data)
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0


def _memory_pass(config: cp.BenchConfig, names: list[str], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each system that ran, alone in a fresh group per size (limits: memcpy only; raw disk holds nothing)."""
    down = {(r["size_mb"], r["system"]) for r in records if "unavailable" in r}
    out = []
    for size in config.sizes:
        for name in names:
            if (size, name) in down or name == cp.DISK:
                continue
            print(f"memory: {size} MB, {name}", file=sys.stderr, flush=True)
            plan = {"mode": "memory", "size": size, "system": name, "threads": config.threads, "dir": config.dir,
                    "device": config.device}
            out += run_group(plan, config.ranks)
    return out


if __name__ == "__main__":
    sys.exit(main())
