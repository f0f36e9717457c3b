"""revalidate() under real gloo groups: inside the example trainer, and with a rank that never arrives."""

import datetime
import os
import subprocess
import sys
import time

import pytest
import torch.multiprocessing as mp

from slurm_ft.core import rundir as records

pytestmark = pytest.mark.gloo


def test_trainer_on_excluded_node_fails_with_error_files_naming_ranks(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SLURMD_NODENAME": "n7", "SLURM_FT_EXCLUDED_NODES": "n[5-7]"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "slurm_ft.train.example", "--steps", "2", "--ckpt-dir", str(tmp_path), "--hidden", "8"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    errors = records.read_errors(records.run_dir_for(tmp_path))
    assert sorted(e.rank for e in errors) == [0, 1]
    assert all(e.exc_type == "TopologyError" and "ranks [0, 1] run on excluded node 'n7'" in e.message
               for e in errors), [e.message for e in errors]


def _rank(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    from slurm_ft.train import topology
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    if rank == 1:  # never reaches the check (stuck in data loading, say)
        time.sleep(5)
        return
    start = time.monotonic()
    try:
        topology.revalidate(environ={}, timeout_s=3)
        message = "no error"
    except topology.TopologyError as exc:
        message = str(exc)
    with open(os.path.join(out, f"rank{rank}.txt"), "w") as fh:
        fh.write(f"{time.monotonic() - start:.1f}\n{message}")


def test_missing_rank_is_a_topology_error_naming_it_not_a_hang(tmp_path):
    init = f"file://{tmp_path}/store"
    mp.start_processes(_rank, args=(2, init, str(tmp_path)), nprocs=2, start_method="spawn", join=True)
    elapsed, message = (tmp_path / "rank0.txt").read_text().split("\n", 1)
    assert message == "topology check failed: ranks [1] did not arrive within 3s", message
    assert float(elapsed) < 10
