"""``slurm-ft bench``: sim (cluster-scale ETTR projection), checkpoint, classify, lab."""

from __future__ import annotations

import argparse
import importlib
import json
import runpy
import sys
from pathlib import Path

from slurm_ft.errors import SlurmFtError

REPO_BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def register(subparsers, name: str) -> None:
    parser = subparsers.add_parser(name, help="benchmarks: sim, checkpoint, classify, lab")
    sub = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    sim = sub.add_parser("sim", help="project ETTR to 1k-131k GPUs from measured costs")
    sim.add_argument("--gpus", type=int, nargs="+", help="GPU counts (default 1024 .. 131072)")
    sim.add_argument("--replicas", type=int, default=16)
    sim.add_argument("--horizon-h", type=float, default=24.0 * 14)
    sim.add_argument("--costs", type=Path, help="JSON of measured costs (keys of SimCosts)")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--out", type=Path, default=Path("bench/results"))
    sim.set_defaults(func=run_sim)
    for script, help_text in (("checkpoint", "checkpoint stall and throughput vs raw disk/memcpy"),
                              ("classify", "classifier verdicts per second")):
        p = sub.add_parser(script, help=help_text)
        p.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark")
        p.set_defaults(func=run_script, script=f"bench_{script}.py")
    lab = sub.add_parser("lab", help="recovery overhead vs throughput on the lab cluster")
    lab.add_argument("args", nargs=argparse.REMAINDER)
    lab.set_defaults(func=run_lab)


def run_sim(args: argparse.Namespace) -> int:
    from slurm_ft.bench import sim
    from slurm_ft.bench.plots import plot_ettr_vs_gpus
    from slurm_ft.bench.table import Progress, render_table

    costs = _load_costs(args.costs) if args.costs else sim.SimCosts()
    gpus = tuple(args.gpus) if args.gpus else sim.DEFAULT_GPUS
    if any(g <= 0 for g in gpus):
        raise SlurmFtError(f"--gpus: every count must be > 0, got {list(gpus)}")
    progress = Progress(len(gpus) * len(sim.POLICIES))
    results = sim.sweep(gpus, sim.POLICIES, costs=costs, replicas=args.replicas, horizon_h=args.horizon_h,
                        seed=args.seed, progress=lambda r: progress.step(f"{r.gpus} GPUs, {r.policy}: {r.ettr:.4f}"))
    rows = [(r.gpus, r.policy, r.ettr, r.ettr_ci95, r.failures_per_day, *r.lost_fraction.values()) for r in results]
    print(render_table(("gpus", "policy", "ettr", "ci95", "fail/day", "ckpt", "rework", "detect", "recover"), rows))
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {"costs": _as_dict(costs), "replicas": args.replicas,
               "horizon_h": args.horizon_h, "seed": args.seed, "results": [r.to_dict() for r in results]}
    (args.out / "sim.json").write_text(json.dumps(payload, indent=2))
    note = plot_ettr_vs_gpus(payload["results"], args.out / "ettr_vs_gpus.png")
    print(f"wrote {args.out / 'sim.json'}" + (f"; {note}" if note else f" and {args.out / 'ettr_vs_gpus.png'}"))
    return 0


def _as_dict(costs) -> dict:
    import dataclasses

    return dataclasses.asdict(costs)


def _load_costs(path: Path):
    from slurm_ft.bench.sim import SimCosts

    try:
        return SimCosts.from_json(path)
    except (OSError, ValueError, TypeError) as exc:
        raise SlurmFtError(f"--costs {str(path)!r}: {exc}") from exc


def run_script(args: argparse.Namespace) -> int:
    path = REPO_BENCH_DIR / args.script
    if not path.is_file():
        raise SlurmFtError(f"benchmark {args.script!r} is not available in this build (looked in {REPO_BENCH_DIR})")
    sys.argv = [str(path), *[a for a in args.args if a != "--"]]
    runpy.run_path(str(path), run_name="__main__")
    return 0


def run_lab(args: argparse.Namespace) -> int:
    try:
        lab = importlib.import_module("slurm_ft.bench.lab")
    except ModuleNotFoundError as exc:
        if exc.name == "slurm_ft.bench.lab":
            raise SlurmFtError("the lab benchmark is not available in this build") from None
        raise
    return int(lab.main([a for a in args.args if a != "--"]) or 0)
