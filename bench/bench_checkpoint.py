"""Checkpoint benchmark: ours vs every torch.distributed.checkpoint save mode, against raw disk and memcpy.

    python bench/bench_checkpoint.py [--sizes 64,256,512] [--repeats 5] [--ranks 1] [--out DIR]

The same as ``slurm-ft bench checkpoint``; see slurm_ft/bench/checkpoint_bench.py for what is measured.
"""

import sys

from slurm_ft.bench.checkpoint_bench import main

if __name__ == "__main__":
    sys.exit(main())
