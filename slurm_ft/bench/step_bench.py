"""``slurm-ft bench step``: what the checkpoint manager costs per training step when it does not save.

    slurm-ft bench step [--ranks 1,2,4,8,16] [--steps 300] [--step-s 1.0] [--agree-every-s 2] [--out DIR]
                        [--fr-entries 2000] [--fr-ranks 2,4] [--fr-collectives 8] [--fr-runs 2]

Per rank count, real processes in a gloo group on this host each build a CheckpointManager with signal handlers
installed (as a launched job has them; auto mode does the same all-reduce) and an interval it never reaches,
then, for --steps steps after --warmup, sleep --compute-ms (the step's compute), time ``maybe_save(step)`` and
the bare gloo all-reduce of the same three int32s on a group of their own beside it. Twice: agreeing every step
(``agree_every_s=0``: what a step that agrees pays) and spaced as configured (a step between agreements, and
the mean). The manager's agreement is pipelined (started in one step, waited for in the next), so
``maybe_save`` measures what stays on the critical path; the bare all-reduce measures the collective itself. The
per-step cost at P ranks is the median (and, spaced, the mean) over steps of the slowest rank's time. The model
(``slurm_ft.bench.step_model``) is fitted to those and extrapolated to 1k-16k ranks as a fraction of a --step-s
step. With more ranks than cores the processes share cores: the 4- to 16-rank figures include
context switches.

The flight recorder's cost (``slurm-ft launch`` turns it on: ``TORCH_FR_BUFFER_SIZE``, ``slurm_ft.launch.traces``),
beside the bare step: at each of --fr-ranks, --fr-runs runs with the recorder off and as many with --fr-entries
entries, in turn (off, on, off, on: a drift of the host hits both), each --steps steps of --fr-collectives gloo
all-reduces of 1 KiB after the --compute-ms sleep; per step the slowest rank's wall time for the collectives and the
ranks' mean CPU time (all threads: what a host busy with other work inflates least). The overhead is the median with
the recorder on minus the median with it off; the noise the larger spread of the off and of the on runs
(``step_model.recorder_row``). Outputs: the tables on stdout, step.json in --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from slurm_ft.bench import step_model as sm
from slurm_ft.core.errors import ConfigError

DEFAULT_OUT = Path("bench/results/step")
EVERY_NEVER = 10**12


def _worker(rank: int, world: int, plan: dict[str, Any], out: str) -> None:
    import logging

    import torch.distributed as dist

    logging.getLogger("slurm_ft").addHandler(logging.StreamHandler(sys.stderr))
    logging.getLogger("slurm_ft").setLevel(logging.WARNING)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    bare = dist.new_group(backend="gloo")
    times = {"manager": _time_steps(plan, 0.0, bare)["manager"]}
    spaced = _time_steps(plan, plan["agree_every_s"], bare)
    times.update(spaced=spaced["manager"], allreduce=spaced["allreduce"])
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, times)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.barrier()
    dist.destroy_process_group()


def _time_steps(plan: dict[str, Any], agree_every_s: float, bare: Any) -> dict[str, list[float]]:
    """Per measured step: ``maybe_save`` of a manager agreeing every ``agree_every_s``, and a bare all-reduce."""
    import torch
    import torch.distributed as dist

    from slurm_ft.train.checkpoint import CheckpointConfig, CheckpointManager

    mgr = CheckpointManager(CheckpointConfig(dir=plan["dir"], every=EVERY_NEVER, agree_every_s=agree_every_s),
                            model=torch.nn.Linear(4, 4))
    mgr.install_signal_handlers()
    flags = torch.zeros(3, dtype=torch.int32)
    times: dict[str, list[float]] = {"manager": [], "allreduce": []}
    for i in range(plan["warmup"] + plan["steps"]):
        time.sleep(plan["compute_s"])  # the training step's compute: the pipelined agreement runs meanwhile
        start = time.perf_counter()
        saved = mgr.maybe_save(i + 1)
        middle = time.perf_counter()
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=bare)
        end = time.perf_counter()
        if saved:
            raise RuntimeError(f"maybe_save saved at step {i + 1}: the benchmark must not save")
        if i >= plan["warmup"]:
            times["manager"].append(middle - start)
            times["allreduce"].append(end - middle)
    mgr.close()
    return times


def _recorder_worker(rank: int, world: int, plan: dict[str, Any], out: str) -> None:
    """One rank of a flight-recorder run: the recorder is on or off by the environment it was spawned with."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    tensor = torch.ones(256)
    times = []
    for i in range(plan["warmup"] + plan["steps"]):
        time.sleep(plan["compute_s"])
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(plan["collectives"]):
            dist.all_reduce(tensor)
        if i >= plan["warmup"]:
            times.append((time.perf_counter() - start, time.process_time() - cpu))
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, times)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.barrier()
    dist.destroy_process_group()


def recorder_run(world: int, plan: dict[str, Any], entries: int) -> dict[str, float]:
    """One run of ``world`` ranks with ``entries`` recorder entries (0: off): the median step's wall time (the
    slowest rank's) and CPU time (the ranks' mean)."""
    import torch.multiprocessing as mp

    from slurm_ft.bench.checkpoint_bench import _free_port

    saved = {k: os.environ.get(k) for k in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), TORCH_FR_BUFFER_SIZE=str(entries))
    os.environ.pop("TORCH_NCCL_TRACE_BUFFER_SIZE", None)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-fr-") as tmp:
            out = Path(tmp) / "times.json"
            mp.spawn(_recorder_worker, args=(world, plan, str(out)), nprocs=world)
            ranks = json.loads(out.read_text())
            wall = slowest_rank([[w for w, _ in steps] for steps in ranks])
            cpu = [statistics.fmean(step) for step in zip(*[[c for _, c in steps] for steps in ranks])]
            return {"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu)}
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def measure_recorder(world: int, plan: dict[str, Any], entries: int, runs: int) -> dict[str, Any]:
    """Off and on runs in turn at ``world`` ranks (``step_model.recorder_row``)."""
    off, on = [], []
    for _ in range(runs):
        off.append(recorder_run(world, plan, 0))
        on.append(recorder_run(world, plan, entries))
    return sm.recorder_row(world, entries, plan["collectives"], off, on)


def slowest_rank(per_rank: list[list[float]]) -> list[float]:
    """Per step, the slowest rank's time (the step waits for it)."""
    return [max(step) for step in zip(*per_rank)]


def measure(world: int, plan: dict[str, Any]) -> dict[str, Any]:
    """One rank count: median and p90 of the slowest rank's per-step times."""
    import torch.multiprocessing as mp

    from slurm_ft.bench.checkpoint_bench import _free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        out = Path(tmp) / "times.json"
        mp.spawn(_worker, args=(world, {**plan, "dir": str(Path(tmp) / "ckpt")}, str(out)), nprocs=world)
        ranks = json.loads(out.read_text())
    manager = slowest_rank([r["manager"] for r in ranks])
    spaced = slowest_rank([r["spaced"] for r in ranks])
    bare = slowest_rank([r["allreduce"] for r in ranks])
    p90 = sorted(manager)[int(0.9 * (len(manager) - 1))]
    return {"ranks": world, "manager_s": statistics.median(manager), "manager_p90_s": p90,
            "base_s": statistics.median(spaced), "spaced_mean_s": statistics.fmean(spaced),
            "allreduce_s": statistics.median(bare)}


def parse(argv: list[str] | None) -> tuple[sm.StepConfig, Path, dict[str, Any]]:
    p = argparse.ArgumentParser(prog="slurm-ft bench step", description="What the checkpoint manager's one all-reduce per step costs at 1-16 gloo "
                                            "ranks, modelled to 1k-16k ranks.")
    p.add_argument("--ranks", default="1,2,4,8,16", help="rank counts, comma separated (default 1,2,4,8,16)")
    p.add_argument("--steps", type=int, default=300, help="measured steps per rank count")
    p.add_argument("--warmup", type=int, default=30, help="steps before measuring")
    p.add_argument("--step-s", type=float, default=1.0, help="training step the cost is compared with (s)")
    p.add_argument("--compute-ms", type=float, default=20.0,
                   help="simulated compute per training step (a sleep), during which the agreement runs (default 20)")
    p.add_argument("--agree-every-s", type=float, default=sm.AGREE_EVERY_S,
                   help="the managers' agree_every_s in the spaced pass and the model (default: the manager's, 2)")
    p.add_argument("--hop-us", type=float, default=30.0,
                   help="assumed network hop for the what-if table, microseconds (default 30)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--fr-entries", type=int, default=2000,
                   help="flight-recorder entries for its cost (slurm-ft launch's default 2000; 0 skips it)")
    p.add_argument("--fr-ranks", default="2,4", help="rank counts the flight recorder is measured at (default 2,4)")
    p.add_argument("--fr-collectives", type=int, default=8, help="all-reduces per step in those runs (default 8)")
    p.add_argument("--fr-runs", type=int, default=2, help="runs with the recorder off and on, each (default 2)")
    args = p.parse_args(argv)
    try:
        ranks = tuple(int(r) for r in args.ranks.split(","))
    except ValueError:
        p.error(f"--ranks must be integers, got {args.ranks!r}")
    try:
        config = sm.StepConfig(ranks=ranks, steps=args.steps, warmup=args.warmup, step_s=args.step_s,
                               hop_us=args.hop_us, compute_ms=args.compute_ms, agree_every_s=args.agree_every_s)
    except ConfigError as exc:
        p.error(str(exc))
    try:
        fr_ranks = tuple(int(r) for r in args.fr_ranks.split(",")) if args.fr_entries > 0 else ()
    except ValueError:
        p.error(f"--fr-ranks must be integers, got {args.fr_ranks!r}")
    if args.fr_entries < 0 or args.fr_collectives < 1 or args.fr_runs < 1 or any(r < 1 for r in fr_ranks):
        p.error(f"--fr-entries must be >= 0, --fr-collectives, --fr-runs and --fr-ranks >= 1, got {args.fr_entries}, "
                f"{args.fr_collectives}, {args.fr_runs}, {args.fr_ranks!r}")
    recorder = {"entries": args.fr_entries, "ranks": fr_ranks, "collectives": args.fr_collectives,
                "runs": args.fr_runs}
    return config, args.out, recorder


def main(argv: list[str] | None = None) -> int:
    import torch

    config, out, recorder = parse(argv)
    plan = {"steps": config.steps, "warmup": config.warmup, "compute_s": config.compute_ms / 1e3,
            "agree_every_s": config.agree_every_s}
    measured = []
    for world in config.ranks:
        print(f"{world} rank(s)...", file=sys.stderr, flush=True)
        measured.append(measure(world, plan))
    recorded = []
    for world in recorder["ranks"]:
        print(f"flight recorder, {world} rank(s)...", file=sys.stderr, flush=True)
        recorded.append(measure_recorder(world, {**plan, "collectives": recorder["collectives"]},
                                         recorder["entries"], recorder["runs"]))
    host = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "cpus": os.cpu_count(), "torch": torch.__version__, "platform": platform.platform()}
    data = sm.payload(config, measured, host)
    if recorded:
        data["flight_recorder"] = recorded
    print(sm.render(data))
    out.mkdir(parents=True, exist_ok=True)
    (out / "step.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "step.txt").write_text(sm.render(data) + "\n")
    print(f"wrote {out / 'step.json'}, {out / 'step.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
