"""Headline of the cluster-scale projection: ETTR at 16,384 GPUs per policy, side by side in one run.

    python bench/bench_sim.py [--costs measured.json] [--replicas 32] [--days 30]

Prints each policy's ETTR and how much more wall time it loses than slurm-ft (lost time = 1 - ETTR), checks the
issue-7 target (slurm-ft >= 0.97 at 16,384 GPUs) and times the whole default sweep (target: < 10 s on one core).
The full table, JSON and plots: ``slurm-ft bench sim``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_ft.bench import sim  # noqa: E402
from slurm_ft.bench.report import Column, render_table  # noqa: E402

TARGET = 0.97
MEMORY_TARGET = 0.98  # issue 32: with the memory tier
MEMORY_POLICY = "slurm-ft memory tier"
SWEEP_BUDGET_S = 10.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--costs", type=Path, help="JSON of measured costs (default: the documented defaults)")
    parser.add_argument("--replicas", type=int, default=32)
    parser.add_argument("--days", type=float, default=30.0)
    args = parser.parse_args(argv)
    costs = sim.SimCosts.from_json(args.costs) if args.costs else sim.SimCosts()
    settings = dict(replicas=args.replicas, horizon_h=args.days * 24)

    results = {r.policy: r for r in sim.sweep((sim.LLAMA3_GPUS,), sim.POLICIES, costs=costs, **settings)}
    ours = results[sim.HEADLINE_POLICY]
    rows = [(r.policy, r.ettr, r.ettr_ci95, (1 - r.ettr) / (1 - ours.ettr), r.failures_per_day, r.interval_s,
             r.mem_every_s, r.rework_per_failure_s, r.lost_fraction["checkpoint_stall"])
            for r in results.values()]
    print(render_table(["policy @ 16,384 GPUs", Column("ETTR", ".4f"), Column("±95%", ".4f"),
                        Column("lost time vs slurm-ft", ".2f"), Column("fail/day", ".1f"),
                        Column("interval s", ".0f"), Column("mem every s", ".0f"),
                        Column("lost s/fault", ".1f"), Column("ckpt stall", ".2%")], rows))
    for baseline in ("slurm --requeue", "torchrun --max-restarts"):
        other = results[baseline]
        print(f"slurm-ft loses {(1 - ours.ettr) / (1 - other.ettr):.3f}x the wall time {baseline} loses "
              f"(ETTR {ours.ettr:.4f} vs {other.ettr:.4f})")
    print(f"target ETTR >= {TARGET} at 16,384 GPUs: {'met' if ours.ettr >= TARGET else 'NOT met'} "
          f"({ours.ettr:.4f} ± {ours.ettr_ci95:.4f}; costs: {costs.source})")

    tier = results[MEMORY_POLICY]
    print(f"memory tier on vs off: ETTR {tier.ettr:.4f} vs {ours.ettr:.4f}, work lost per fault "
          f"{tier.rework_per_failure_s:.1f} vs {ours.rework_per_failure_s:.1f} s, checkpoint stall "
          f"{tier.lost_fraction['checkpoint_stall']:.2%} vs {ours.lost_fraction['checkpoint_stall']:.2%} of wall time; "
          f"target ETTR >= {MEMORY_TARGET} with the tier: {'met' if tier.ettr >= MEMORY_TARGET else 'NOT met'}")

    started = time.process_time()
    sim.sweep(sim.DEFAULT_GPUS, sim.POLICIES, costs=costs, **settings)
    took = time.process_time() - started
    print(f"whole sweep ({len(sim.DEFAULT_GPUS)} sizes x {len(sim.POLICIES)} policies x {args.replicas} replicas "
          f"x {args.days:g} days): {took:.1f} CPU s (budget {SWEEP_BUDGET_S:g} s: "
          f"{'met' if took < SWEEP_BUDGET_S else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
