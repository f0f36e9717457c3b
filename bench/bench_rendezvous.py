"""Process-group setup when rank 0 comes late: rank 0 hosting torch's TCPStore against the launcher's store.

    python bench/bench_rendezvous.py [--worlds 2,4,8] [--lates 0,0.1,0.3] [--trials 3] [--out DIR]

Every rank of an attempt is released at once; rank 0 then waits ``late`` seconds (a restarted rank that came up
later: srun on another node, a standby still handing over). Each rank runs ``init_process_group("gloo")`` with
``env://`` and one barrier. "rank 0" is torch's default: rank 0 starts the store server, the others connect and
retry while it is not listening. "launcher" is slurm-ft's restart path: a store the launcher's keeper
(``slurm_ft.launch.store``) holds open before the ranks start, every rank a client. The figure is the time from
the release until the last rank is through the barrier, less ``late`` (what the rendezvous adds to the wait for
the last rank). Both systems run interleaved in one run; compare their ratio, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path


def _rank(rank: int, world: int, late: float, env: dict, release, out) -> None:
    os.environ.update(env, RANK=str(rank), WORLD_SIZE=str(world))
    import torch.distributed as dist

    release.wait()
    start = time.monotonic()
    if rank == 0:
        time.sleep(late)
    dist.init_process_group("gloo")
    dist.barrier()
    out.put(time.monotonic() - start)
    dist.destroy_process_group()


def one(world: int, late: float, env: dict) -> float:
    ctx = mp.get_context("spawn")
    release, out = ctx.Barrier(world), ctx.Queue()
    ranks = [ctx.Process(target=_rank, args=(r, world, late, env, release, out)) for r in range(world)]
    for proc in ranks:
        proc.start()
    took = max(out.get(timeout=120) for _ in ranks)
    for proc in ranks:
        proc.join()
    return took - late


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="2,4,8")
    parser.add_argument("--lates", default="0,0.1,0.3")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from slurm_ft.launch.launcher import free_port
    from slurm_ft.launch.store import StoreKeeper

    keeper = StoreKeeper(sys.executable, "127.0.0.1")
    keeper.start()
    deadline = time.monotonic() + 120
    while (held := keeper.open()) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    if held is None:
        print("bench_rendezvous: the store keeper did not start", file=sys.stderr)
        return 1
    rows = []
    try:
        for world in (int(w) for w in args.worlds.split(",")):
            for late in (float(x) for x in args.lates.split(",")):
                times: dict[str, list[float]] = {"rank 0": [], "launcher": []}
                for _ in range(args.trials):  # interleaved: the host's noise hits both alike
                    times["rank 0"].append(one(world, late, {"MASTER_ADDR": "127.0.0.1",
                                                              "MASTER_PORT": str(free_port())}))
                    addr, port = keeper.open()
                    times["launcher"].append(one(world, late, {"MASTER_ADDR": addr, "MASTER_PORT": str(port),
                                                                "TORCHELASTIC_USE_AGENT_STORE": "True"}))
                med = {k: statistics.median(v) for k, v in times.items()}
                rows.append({"world": world, "late_s": late, **{f"{k}_s": v for k, v in med.items()},
                             "ratio": med["rank 0"] / med["launcher"], "trials": times})
                print(f"world {world:2d}  rank 0 late {late:4.2f} s   rank 0 hosts {med['rank 0']:6.3f} s   "
                      f"launcher's store {med['launcher']:6.3f} s   ratio {rows[-1]['ratio']:5.1f}x", flush=True)
    finally:
        keeper.close()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "rendezvous.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
