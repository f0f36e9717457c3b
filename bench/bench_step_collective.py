"""Per-step cost of the checkpoint manager's one small all-reduce, at 1-8 gloo ranks, modelled to 1k-16k ranks.

    python bench/bench_step_collective.py [--ranks 1,2,4,8] [--steps 300] [--step-s 1.0] [--out DIR]

The same as ``slurm-ft bench step``; see slurm_ft/bench/step_bench.py and slurm_ft/bench/step_model.py.
"""

import sys

from slurm_ft.bench.step_bench import main

if __name__ == "__main__":
    sys.exit(main())
