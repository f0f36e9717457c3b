"""Headline of the cluster-scale projection: ETTR at 16,384 GPUs per policy, side by side in one run."""

from slurm_ft.bench import sim
from slurm_ft.bench.table import render_table


def main() -> None:
    results = sim.sweep((sim.LLAMA3_GPUS,), sim.POLICIES)
    best = max(results, key=lambda r: r.ettr)
    baseline = next(r for r in results if r.policy == "slurm --requeue")
    rows = [(r.policy, r.ettr, r.ettr_ci95, (1 - r.ettr) / (1 - best.ettr)) for r in results]
    print(render_table(("policy @16384 GPUs", "ettr", "ci95", "lost time vs best"), rows))
    print(f"slurm-ft loses {(1 - best.ettr) / (1 - baseline.ettr):.3f}x the time of slurm --requeue "
          f"(costs: {sim.SimCosts().source})")


if __name__ == "__main__":
    main()
