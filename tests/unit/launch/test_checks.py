"""Configuration mistakes stop the job before the first attempt, as ``config`` (slurm_ft.launch.checks)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from slurm_ft.core.comment import parse_launcher_stop
from slurm_ft.core.errors import ConfigError
from slurm_ft.launch.checks import check_nodes, preflight, refuse


def _preflight(tmp_path, command=("python", "t.py"), allocation=("n1", "n2"), nodes=None, spare=0, tasks=1, **env):
    preflight(command, allocation=allocation, nodes=nodes, spare_nodes=spare, ntasks_per_node=tasks,
              run_dir=tmp_path / "run", environ=env)


def test_spare_nodes_that_leave_nothing_to_train_on_are_refused_with_what_works(tmp_path):
    with pytest.raises(ConfigError) as info:
        _preflight(tmp_path, spare=2)
    assert str(info.value) == ("launch: --ft-spare-nodes=2 leaves none of the allocation's 2 node(s) to train on: "
                               "submit with sbatch -N3 or more, or fewer spares")
    with pytest.raises(ConfigError, match="--nodes=3, but the allocation has 2"):
        _preflight(tmp_path, nodes=3)
    assert check_nodes(["a", "b", "c"], nodes=None, spare_nodes=1) == 2


def test_ft_without_a_checkpoint_dir_and_an_unusable_one_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="--ft without a checkpoint directory: submit with --ft-ckpt-dir="):
        _preflight(tmp_path, SLURM_SPANK_FT_ENABLED="1")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"checkpoint dir \(--ft-ckpt-dir\) '.*/file/ckpt' is unusable"):
        _preflight(tmp_path, SLURM_FT_CKPT_DIR=str(blocker / "ckpt"))
    _preflight(tmp_path, SLURM_FT_CKPT_DIR=str(tmp_path / "new" / "ckpt"))  # made when missing
    assert (tmp_path / "new" / "ckpt").is_dir() and os.listdir(tmp_path / "new" / "ckpt") == []


def test_a_read_only_checkpoint_dir_is_refused(tmp_path, monkeypatch):
    import errno

    from slurm_ft.launch import checks as launch_checks

    def read_only(path, *args, **kwargs):  # a read-only mount (root ignores mode bits, so no chmod here)
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(launch_checks.os, "open", read_only)
    with pytest.raises(ConfigError) as info:
        _preflight(tmp_path, SLURM_FT_CKPT_DIR=str(tmp_path / "ckpt"))
    assert str(info.value) == (f"launch: checkpoint dir (--ft-ckpt-dir) '{tmp_path / 'ckpt'}' is read-only: "
                               "Read-only file system (choose a writable directory on a shared file system)")


def test_torchrun_that_cannot_work_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match="use: slurm-ft launch -- torchrun --nnodes=2"):
        _preflight(tmp_path, command=("torchrun", "--standalone", "t.py"))


def test_refusal_says_it_on_stderr_in_the_comment_and_in_the_events(tmp_path, capsys):
    comments = []
    run = tmp_path / "run"
    run.mkdir()
    code = refuse("launch: --ft-spare-nodes=2 leaves none", set_comment=comments.append,
                  environ={"SLURM_FT_RUN_DIR": str(run)})
    assert code == 2
    assert "slurm-ft: config: launch: --ft-spare-nodes=2 leaves none" in capsys.readouterr().err
    assert comments == ["slurm-ft: stopped cause=config by=launch launch: --ft-spare-nodes=2 leaves none"]
    assert parse_launcher_stop(comments[0]) is not None  # the monitor stops it as well
    record = json.loads((run / "events.jsonl").read_text())
    assert record["event"] == "exit" and record["cause"] == "config" and record["code"] == 2


def test_the_run_dir_is_created_private_to_the_jobs_user(tmp_path):
    old = os.umask(0o022)
    try:
        _preflight(tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o700


def test_a_multi_node_job_whose_node_has_no_address_is_refused_in_one_line(tmp_path):
    """Names that do not resolve, and a Slurm that knows no NodeAddr for them: the launcher stops as ``config``
    naming the node, instead of telling the ranks of two hosts to meet at 127.0.0.1."""
    import subprocess
    import sys

    fake = tmp_path / "bin" / "scontrol"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "Node $5 not found" >&2\nexit 1\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "MASTER_"))}
    env.update(PATH=f"{fake.parent}:{os.environ['PATH']}", SLURM_JOB_NODELIST="ghost-a.invalid,ghost-b.invalid",
               SLURMD_NODENAME="ghost-a.invalid", SLURM_FT_RUN_DIR=str(tmp_path / "run"))
    done = subprocess.run([sys.executable, "-m", "slurm_ft.cli", "launch", "--", "python", "t.py"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    [line] = [ln for ln in done.stderr.splitlines() if ln.startswith("slurm-ft: config:")]
    assert "node 'ghost-a.invalid' has no address" in line
    assert not (tmp_path / "run" / "attempt-1").exists()
