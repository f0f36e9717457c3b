"""``slurm-ft bench``: ``sim`` (cluster-scale ETTR projection), and ``lab``, ``checkpoint``, ``step``, ``classify``.

``sim`` is built in. The others live in their own modules, imported only when asked for, so a build without one
says so in one line; their arguments pass through unchanged (``slurm-ft bench lab -- --help``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import runpy
import sys
import time
from pathlib import Path
from typing import Any

from slurm_ft.core.errors import SlurmFtError

REPO_BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
DEFAULT_OUT = Path("bench/results")
ETTR_TARGET_16K = 0.97  # issue 7: projected ETTR at 16,384 GPUs for slurm-ft

# subcommand -> (module with main(argv) -> int, fallback script in a source checkout, help)
DELEGATED = {
    "lab": ("slurm_ft.bench.lab", None, "recovery, checkpoint overhead and ETTR on the lab cluster vs baselines"),
    "checkpoint": ("slurm_ft.bench.checkpoint_bench", "bench_checkpoint.py",
                   "ours vs every DCP save mode: stall, commit, bandwidth vs raw disk, memory"),
    "step": ("slurm_ft.bench.step_bench", "bench_step_collective.py",
             "per-step cost of the manager's all-reduce at 1-8 ranks, modelled to 16k"),
    "classify": ("slurm_ft.bench.classify_bench", "bench_classify.py",
                 "classifier accuracy on real failures (--speed: verdicts per second)"),
    "faults": ("slurm_ft.bench.faults", None, "every fault on a lab of hosts, one table (run once per Slurm release)"),
}


def register(subparsers, name: str) -> None:
    parser = subparsers.add_parser(name, help="benchmarks: sim, lab, checkpoint, step, classify, faults")
    sub = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    _add_sim(sub)
    for bench, (_, _, help_text) in DELEGATED.items():
        p = sub.add_parser(bench, help=help_text, add_help=False, prefix_chars="+")  # every arg passes through
        p.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark")
        p.set_defaults(func=run_delegated, delegate=bench)


def _add_sim(sub) -> None:
    sim = sub.add_parser("sim", help="project ETTR to 1k-131k GPUs from measured costs",
                         description="Simulate one training job under the Llama 3 failure mix for each GPU count "
                                     "and policy; print a table, write sim.json and PNG plots.")
    sim.add_argument("--gpus", type=int, nargs="+", metavar="N", help="GPU counts (default 1024 2048 .. 131072)")
    sim.add_argument("--policy", action="append", metavar="NAME", help="only this policy (repeatable)")
    sim.add_argument("--costs", type=Path, help="JSON of measured costs (SimCosts keys, or a file with 'sim_costs')")
    sim.add_argument("--replicas", type=int, default=32, help="independent jobs per cell (default 32)")
    sim.add_argument("--days", type=float, default=30.0, help="simulated wall days per replica (default 30)")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--lemon-share", type=float, help="share of node faults from repeat offenders (default 0.1)")
    sim.add_argument("--lemon-mtbf-h", type=float, help="hours between a lemon's faults in service (default 24)")
    sim.add_argument("--triage-h", type=float, help="hours until a lemon is removed by hand (default 72)")
    sim.add_argument("--spare-fraction", type=float,
                     help="spare nodes as a share of the job's nodes, for the policies that hold spares (default 0.01)")
    sim.add_argument("--no-sensitivity", action="store_true", help="skip the per-cost sensitivity at 16,384 GPUs")
    sim.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    sim.set_defaults(func=run_sim)


def run_sim(args: argparse.Namespace) -> int:
    from slurm_ft.bench import sim
    from slurm_ft.bench.report import Progress

    costs = _load_costs(args.costs) if args.costs else sim.SimCosts()
    policies = _policies(args.policy, args.spare_fraction)
    gpus = tuple(args.gpus) if args.gpus else sim.DEFAULT_GPUS
    overrides = {k: v for k, v in (("lemon_share", args.lemon_share), ("lemon_mtbf_h", args.lemon_mtbf_h),
                                   ("triage_h", args.triage_h)) if v is not None}
    settings = dict(replicas=args.replicas, horizon_h=args.days * 24.0, seed=args.seed, **overrides)
    _check_args(args, gpus)
    base = sim.SimConfig(gpus=gpus[0], **settings)
    started = time.monotonic()
    progress = Progress(len(gpus) * len(policies))
    results = sim.sweep(gpus, policies, costs=costs, **settings,
                        progress=lambda r: progress.step(f"{r.gpus:>7,} GPUs  {r.policy:<24} ETTR {r.ettr:.4f}"))
    payload: dict[str, Any] = {
        "schema": sim.SCHEMA, "costs_source": costs.source, "costs": _asdict(costs), "config": sim.config_dict(base),
        "policies": [p.to_dict() for p in policies], "results": [r.to_dict() for r in results],
    }
    payload["headline"] = _headline(sim, results)
    if not args.no_sensitivity and payload["headline"]:
        headline_config = sim.SimConfig(gpus=sim.LLAMA3_GPUS, **settings)
        payload["sensitivity"] = {"gpus": sim.LLAMA3_GPUS, "policy": sim.HEADLINE_POLICY,
                                  "rows": sim.sensitivity(headline_config, sim.policy_by_name(sim.HEADLINE_POLICY),
                                                          costs)}
    payload["elapsed_s"] = round(time.monotonic() - started, 2)
    print(render_sim(payload))
    _write_outputs(args.out, payload)
    return 0


def _check_args(args: argparse.Namespace, gpus: tuple[int, ...]) -> None:
    bad = next((g for g in gpus if g <= 0), None)
    if bad is not None:
        raise SlurmFtError(f"--gpus: every count must be > 0, got {bad}")
    if args.replicas <= 0:
        raise SlurmFtError(f"--replicas: must be > 0, got {args.replicas}")
    if not args.days > 0:
        raise SlurmFtError(f"--days: must be > 0, got {args.days}")


def _policies(names: list[str] | None, spare_fraction: float | None):
    import dataclasses

    from slurm_ft.bench import sim

    known = [p.name for p in sim.POLICIES]
    bad = [n for n in names or () if n not in known]
    if bad:
        raise SlurmFtError(f"--policy {bad[0]!r}: unknown (known: {', '.join(known)})")
    chosen = tuple(sim.policy_by_name(n) for n in names) if names else sim.POLICIES
    if spare_fraction is None:
        return chosen
    if not 0 < spare_fraction < 1:
        raise SlurmFtError(f"--spare-fraction: must be in (0, 1), got {spare_fraction}")
    return tuple(dataclasses.replace(p, spare_fraction=spare_fraction) if p.spare_fraction > 0 else p
                 for p in chosen)


def _headline(sim, results) -> dict[str, Any] | None:
    hit = next((r for r in results if r.gpus == sim.LLAMA3_GPUS and r.policy == sim.HEADLINE_POLICY), None)
    if hit is None:
        return None
    return {"gpus": hit.gpus, "policy": hit.policy, "ettr": hit.ettr, "ettr_ci95": hit.ettr_ci95,
            "target": ETTR_TARGET_16K, "met": hit.ettr >= ETTR_TARGET_16K}


def render_sim(payload: dict[str, Any]) -> str:
    """The terminal report of a sim payload: results table, headline, sensitivity."""
    from slurm_ft.bench.report import Column, records_table

    pct = ".2%"
    lines = [records_table(payload["results"], {
        "gpus": "gpus", "policy": "policy", Column("ettr", ".4f"): "ettr", Column("±95%", ".4f"): "ettr_ci95",
        Column("fail/day", ".1f"): "failures_per_day", Column("requeue/day", ".2f"): "requeues_per_day",
        Column("interval s", ".0f"): "interval_s",
        Column("mem every s", ".0f"): lambda r: r.get("mem_every_s", 0.0),
        Column("lost s/fault", ".1f"): lambda r: r.get("rework_per_failure_s", float("nan")),
        **{Column(k.replace("checkpoint_", "ckpt_"), pct): (lambda r, k=k: r["lost_fraction"][k])
           for k in ("checkpoint_stall", "rework", "detection", "recovery", "queue_wait")},
        Column("spare GPUs", pct): "spare_gpu_share"})]
    lines.append(f"costs: {payload['costs_source']}")
    head = payload.get("headline")
    if head:
        lines.append(f"{head['policy']} at {head['gpus']:,} GPUs: ETTR {head['ettr']:.4f} ± {head['ettr_ci95']:.4f} "
                     f"(target {head['target']}: {'met' if head['met'] else 'NOT met'})")
    sens = payload.get("sensitivity")
    if sens:
        lines += ["", f"sensitivity of {sens['policy']} at {sens['gpus']:,} GPUs (one cost scaled at a time):",
                  records_table(sens["rows"], {"cost": "cost", Column("value s", "g"): "value_s",
                                               Column("ETTR x0.5", ".4f"): "ettr_x0.5",
                                               Column("ETTR x2", ".4f"): "ettr_x2"})]
    return "\n".join(lines)


def _write_outputs(out: Path, payload: dict[str, Any]) -> None:
    from slurm_ft.bench.plots import plot_ettr_vs_gpus

    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "sim.json").write_text(json.dumps(payload, indent=2) + "\n")
    except OSError as exc:
        raise SlurmFtError(f"--out {str(out)!r}: {exc.strerror or exc}") from None
    plot = out / "ettr_vs_gpus.png"
    note = plot_ettr_vs_gpus(payload["results"], plot, target=(16_384, ETTR_TARGET_16K))
    print(f"wrote {out / 'sim.json'}" + (f"; {note}" if note else f" and {plot}"))


def _asdict(costs) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(costs)


def _load_costs(path: Path):
    from slurm_ft.bench.sim import SimCosts

    try:
        return SimCosts.from_json(path)
    except OSError as exc:
        raise SlurmFtError(f"--costs {str(path)!r}: {exc.strerror or exc}") from None
    except (ValueError, TypeError) as exc:  # bad JSON, a bad value (ConfigError is a ValueError)
        raise SlurmFtError(f"--costs {str(path)!r}: {exc}") from None


def run_script(path: Path, argv: list[str]) -> int:
    """Run a benchmark script of the source checkout as ``__main__`` with ``argv``; its exit code."""
    saved, sys.argv = sys.argv, [str(path), *argv]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    return 0


def run_delegated(args: argparse.Namespace) -> int:
    module_name, script, _ = DELEGATED[args.delegate]
    argv = list(args.args)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        module = None
    if module is not None and callable(getattr(module, "main", None)):
        return int(module.main(argv) or 0)
    path = REPO_BENCH_DIR / script if script else None
    if path is not None and path.is_file():  # a source checkout: the benchmark's script
        return run_script(path, argv)
    raise SlurmFtError(f"bench {args.delegate}: not available in this build ({module_name} is missing)")
