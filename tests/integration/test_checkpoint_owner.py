"""Trust between runs: a checkpoint dir belongs to one run; a failed last save fails the run.

In process (single rank, real files) and with the example trainer on 2 ranks over real gloo groups.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from slurm_ft.core import layout
from slurm_ft.core.errors import ConfigError
from slurm_ft.train.checkpoint import CheckpointConfig, CheckpointError, CheckpointManager
from slurm_ft.train.storage import TEST_FAIL_AT

pytestmark = pytest.mark.gloo


def _manager(ckpt, run_id=None, job_active=lambda job: None, **kwargs) -> tuple[CheckpointManager, nn.Module]:
    """``job_active``: what Slurm says of the owner job (None: Slurm cannot say, as on a host without one)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    config = CheckpointConfig(dir=str(ckpt), every=2, keep_last=1, run_id=run_id, **{"async_save": False, **kwargs})
    return CheckpointManager(config, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                             job_active=job_active), model


def _saved(ckpt, run_id, *steps) -> None:
    mgr, _ = _manager(ckpt, run_id)
    for step in steps:
        assert mgr.save(step).ok
    mgr.close()


def test_another_run_is_refused_both_resume_and_save(tmp_path):
    _saved(tmp_path, "101", 2)
    assert layout.read_manifest(layout.step_dir(tmp_path, 2)).run_id == "101"
    assert layout.read_owner(tmp_path) == "101"
    with pytest.raises(ConfigError, match=rf"^dir: {tmp_path} belongs to run 101 \(this run: 202\), and Slurm "
                                          r"cannot tell whether job 101 has ended; .*adopt=True "
                                          r"\(SLURM_FT_CKPT_ADOPT=1\)$"):
        _manager(tmp_path, "202")
    (tmp_path / layout.OWNER).unlink()  # the newest manifest still names its run
    with pytest.raises(ConfigError, match="belongs to run 101"):
        _manager(tmp_path, "202")
    assert layout.committed_steps(tmp_path) == [2] and not (tmp_path / layout.OWNER).exists()
    _saved(tmp_path, "101", 4)  # the same run (a requeued job keeps its id) goes on
    assert layout.committed_steps(tmp_path) == [4]


def test_a_resubmitted_job_takes_over_the_dir_of_a_job_that_has_ended_not_of_one_still_running(tmp_path):
    """The everyday resume: fix the bug, sbatch again with the same --ft-ckpt-dir (a new job id). Two jobs at
    once on one dir stay refused."""
    _saved(tmp_path, "101", 2)
    asked = []
    with pytest.raises(ConfigError, match="belongs to run 101 \\(this run: 202\\), and Slurm job 101 is still "
                                          "queued or running"):
        _manager(tmp_path, "202", job_active=lambda job: asked.append(job) or True)
    mgr, _ = _manager(tmp_path, "202", job_active=lambda job: asked.append(job) or False)
    assert asked == ["101", "101"] and layout.read_owner(tmp_path) == "202"
    assert mgr.resume() == 2
    mgr.close()
    named = tmp_path / "named"
    _saved(named, "tune", 2)  # a run named by SLURM_FT_RUN_ID is no job: Slurm is not asked, the dir is not passed on
    with pytest.raises(ConfigError, match="belongs to run tune \\(this run: 303\\); give"):
        _manager(named, "303", job_active=lambda job: pytest.fail("asked Slurm about a run that is no job"))


def test_adopt_takes_the_dir_over_and_keeps_the_other_runs_steps(tmp_path):
    _saved(tmp_path, "101", 2)
    mgr, _ = _manager(tmp_path, "202", adopt=True)
    assert layout.read_owner(tmp_path) == "202"
    assert mgr.resume() == 2
    for step in (4, 6):
        assert mgr.save(step).ok
    mgr.close()
    assert layout.committed_steps(tmp_path) == [2, 6]  # keep_last=1: its own 4 went, the other run's 2 stays
    assert layout.read_manifest(layout.step_dir(tmp_path, 6)).run_id == "202"
    with pytest.raises(ConfigError, match="belongs to run 202"):
        _manager(tmp_path, "101")


def test_a_run_whose_dir_was_adopted_fails_its_next_save_and_its_close(tmp_path):
    first, _ = _manager(tmp_path, "101")
    assert first.save(2).ok
    _manager(tmp_path, "202", adopt=True)[0].close()
    result = first.save(4)
    assert not result.ok and f"{tmp_path} now belongs to run 202 (this run: 101)" in result.error
    with pytest.raises(CheckpointError, match="step 4"):
        first.close()
    assert layout.committed_steps(tmp_path) == [2] and not list(tmp_path.glob(".tmp-*"))


def test_a_malformed_owner_file_is_refused_until_adopted(tmp_path):
    _saved(tmp_path, "101", 2)
    (tmp_path / layout.OWNER).write_text("{torn")
    with pytest.raises(ConfigError, match=r"belongs to run unknown \(.*OWNER: malformed owner file"):
        _manager(tmp_path, "101")
    _manager(tmp_path, "101", adopt=True)[0].close()
    assert layout.read_owner(tmp_path) == "101"


def test_a_checkpoint_from_before_run_identity_loads_and_the_run_claims_the_dir(tmp_path):
    _saved(tmp_path, None, 2)
    marker = json.loads((layout.step_dir(tmp_path, 2) / layout.MARKER).read_text())
    assert "run_id" not in marker and not (tmp_path / layout.OWNER).exists()
    mgr, _ = _manager(tmp_path, "303")
    assert mgr.resume() == 2 and layout.read_owner(tmp_path) == "303"
    mgr.close()


def test_the_run_identity_defaults_to_the_slurm_job_id(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_FT_RUN_ID", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "404")
    _saved(tmp_path, None, 2)
    assert layout.read_owner(tmp_path) == "404"
    monkeypatch.setenv("SLURM_FT_RUN_ID", "tune")
    with pytest.raises(ConfigError, match="belongs to run 404 \\(this run: tune\\)"):
        _manager(tmp_path)


def test_close_raises_when_the_last_save_failed_and_only_then(tmp_path, monkeypatch):
    monkeypatch.setenv(TEST_FAIL_AT, "after_local_state@2")
    mgr, _ = _manager(tmp_path)
    assert not mgr.save(2).ok  # a failed periodic save: training goes on
    assert mgr.save(4).ok
    mgr.close()
    monkeypatch.setenv(TEST_FAIL_AT, "after_local_state@6")
    mgr, _ = _manager(tmp_path, async_save=True)
    mgr.save(6)
    with pytest.raises(CheckpointError, match=r"last checkpoint save \(step 6\) failed: OSError: .*TEST-ONLY "
                                              r"injected I/O error.*; newest committed checkpoint in .*: step 4$"):
        mgr.close()
    assert mgr._ctl_group is None and layout.committed_steps(tmp_path) == [4]  # released before raising


def _trainer(ckpt, *args, env_extra=None):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "slurm_ft.train.example", "--ckpt-dir", str(ckpt), "--hidden", "8", "--sync", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_FT_", "SLURM_JOB_ID"))}
    return subprocess.run(cmd, env={**env, "OMP_NUM_THREADS": "1", **(env_extra or {})}, capture_output=True,
                          text=True, timeout=180)


def test_example_trainer_exits_non_zero_when_its_final_save_failed(tmp_path):
    proc = _trainer(tmp_path, "--steps", "4", "--ckpt-every", "2",
                    env_extra={TEST_FAIL_AT: "after_local_state@4"})
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert "CheckpointError: the last checkpoint save (step 4) failed" in proc.stderr
    assert layout.committed_steps(tmp_path) == [2]
    errors = [json.loads(p.read_text()) for p in sorted((tmp_path / ".slurm-ft").glob("error.rank*.json"))]
    assert [e["exc_type"] for e in errors] == ["CheckpointError", "CheckpointError"]


def test_the_readme_trainer_exits_non_zero_when_its_final_save_failed(tmp_path):
    trainer = Path(__file__).resolve().parents[2] / "examples" / "minimal_train.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_FT_", "SLURM_JOB_ID"))}
    env.update(OMP_NUM_THREADS="1", STEPS="4", SLURM_FT_CKPT_DIR=str(tmp_path), SLURM_FT_CKPT_EVERY="2",
               SLURM_FT_RUN_DIR=str(tmp_path / "run"), **{TEST_FAIL_AT: "after_local_state@4"})
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(trainer)], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0 and "the last checkpoint save (step 4) failed" in proc.stderr, proc.stderr[-3000:]
    assert "done at step" not in proc.stdout and layout.committed_steps(tmp_path) == [2]


def test_example_trainer_refuses_another_jobs_dir_unless_adopting(tmp_path):
    first = _trainer(tmp_path, "--steps", "2", "--ckpt-every", "2", env_extra={"SLURM_JOB_ID": "101"})
    assert first.returncode == 0, first.stderr[-3000:]
    refused = _trainer(tmp_path, "--steps", "4", "--ckpt-every", "2", env_extra={"SLURM_JOB_ID": "202"})
    assert refused.returncode != 0 and "belongs to run 101 (this run: 202)" in refused.stderr
    assert layout.committed_steps(tmp_path) == [2]
    adopted = _trainer(tmp_path, "--steps", "4", "--ckpt-every", "2",
                       env_extra={"SLURM_JOB_ID": "202", "SLURM_FT_CKPT_ADOPT": "1"})
    assert adopted.returncode == 0, adopted.stderr[-3000:]
    assert json.loads(adopted.stdout.strip().splitlines()[-1])["resumed_from"] == 2
    assert layout.read_owner(tmp_path) == "202"
