"""revalidate() inside the real example trainer under 2 gloo ranks."""

import os
import subprocess
import sys

import pytest

from slurm_ft.train import records

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
