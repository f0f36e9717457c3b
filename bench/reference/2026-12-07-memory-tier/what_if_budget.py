"""What if the memory tier's auto stall budget (the trainer's 5%) were smaller: ETTR at 16,384 GPUs, tier on vs
off, default and lab costs. Sets slurm_ft.bench.sim.MEM_STALL_BUDGET for the run (the trainer's is unchanged)."""
from slurm_ft.bench import sim

for label, costs in (("defaults", sim.SimCosts()),
                     ("lab", sim.SimCosts.from_json("bench/reference/2026-12-07-memory-tier/costs-lab.json"))):
    off = sim.simulate(sim.SimConfig(gpus=16384), sim.policy_by_name("slurm-ft"), costs)
    print(f"{label}: tier off ETTR {off.ettr:.4f}, lost {off.rework_per_failure_s:.1f} s/fault")
    for budget in (0.05, 0.02, 0.01, 0.005, 0.002, 0.001):
        sim.MEM_STALL_BUDGET = budget
        on = sim.simulate(sim.SimConfig(gpus=16384), sim.policy_by_name("slurm-ft memory tier"), costs)
        print(f"  budget {budget:>5.1%}: snapshot every {on.mem_every_s:>5.0f} s, ETTR {on.ettr:.4f} ± "
              f"{on.ettr_ci95:.4f}, lost {on.rework_per_failure_s:5.1f} s/fault, stall "
              f"{on.lost_fraction['checkpoint_stall']:.2%}, rework {on.lost_fraction['rework']:.2%}")
