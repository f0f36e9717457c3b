"""Records the flight-recorder dumps in this folder: real gloo ranks on this host, dumped by slurm-ft's own rank
side (``slurm_ft.train.traces``: the trace signal, the wakeup-fd thread), exactly as a launched job's ranks dump.

    PYTHONPATH=<checkout> python tests/data/traces/record.py [SCENARIO ...]

Each scenario runs its ranks (three all-reduces of 4 floats first: the "steps" before the fault), then one fault,
then signals every rank still running (``TRACE_SIGNAL``), collects ``trace.rank<R>.json`` into ``<scenario>/`` and
kills the ranks. Ranks 0-1 say they run on node n1, ranks 2-3 on n2 (``SLURMD_NODENAME``).

- ``stuck_outside`` (3 ranks): rank 1 sleeps instead of the 4th all-reduce; ranks 0 and 2 wait in it;
- ``desync2`` (2 ranks): rank 1 calls all_gather where rank 0 calls its 4th all_reduce (a tie, settled by history);
- ``desync3`` (3 ranks): rank 1 calls all_gather where ranks 0 and 2 call all_reduce (a majority);
- ``stopped`` (2 ranks): rank 1 stops itself (SIGSTOP) before the 4th all-reduce: no dump from it;
- ``node_silent`` (4 ranks): ranks 2-3 (n2) never answer the signal (no handler): ranks 0-1 wait in the 4th.
"""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORLD = {"stuck_outside": 3, "desync2": 2, "desync3": 3, "stopped": 2, "node_silent": 4}


def rank_main(rank: int, world: int, scenario: str, out: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE="200",
                      SLURMD_NODENAME=f"n{1 + rank // 2}")
    import torch
    import torch.distributed as dist

    from slurm_ft.train import traces

    if not (scenario == "node_silent" and rank >= 2):
        traces.install(out, rank)
    (Path(out) / f"pid.{rank}").write_text(str(os.getpid()))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    odd = rank == 1
    if scenario == "stuck_outside" and odd:
        time.sleep(120)
    elif scenario == "stopped" and odd:
        os.kill(os.getpid(), signal.SIGSTOP)
    elif scenario.startswith("desync") and odd:
        dist.all_gather([torch.zeros(4) for _ in range(world)], t)
    elif scenario == "node_silent" and rank >= 2:
        time.sleep(120)
    dist.all_reduce(t)


def record(scenario: str) -> None:
    import torch.multiprocessing as mp

    from slurm_ft.core.rundir import TRACE_SIGNAL

    world = WORLD[scenario]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        ctx = mp.start_processes(rank_main, args=(world, scenario, out, port), nprocs=world, join=False,
                                 start_method="spawn")
        deadline = time.monotonic() + 120
        while len(list(Path(out).glob("pid.*"))) < world and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(6)  # init_process_group, three all-reduces, the fault
        pids = [int((Path(out) / f"pid.{r}").read_text()) for r in range(world)]
        for pid in pids:
            try:
                os.kill(pid, TRACE_SIGNAL) if not (scenario == "node_silent" and pid in pids[2:]) else None
            except ProcessLookupError:
                pass
        time.sleep(2)
        for pid in pids:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        try:
            ctx.join()
        except Exception:  # noqa: BLE001 - we killed them
            pass
        dest = HERE / scenario
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        for path in sorted(Path(out).glob("trace.rank*.json")):
            shutil.copy(path, dest / path.name)
        print(scenario, sorted(p.name for p in dest.iterdir()))


if __name__ == "__main__":
    for name in sys.argv[1:] or list(WORLD):
        record(name)
