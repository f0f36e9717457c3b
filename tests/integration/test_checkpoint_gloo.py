"""Checkpoint engine end to end: real example-trainer subprocesses, real gloo groups, real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_ft.train import layout

pytestmark = pytest.mark.gloo
STEPS = 8


def _run(ckpt: Path, nproc: int, *args: str, env_extra: dict | None = None, check: bool = True):
    trainer = ["-m", "slurm_ft.train.example", "--ckpt-dir", str(ckpt), "--hidden", "16", *args]
    if nproc == 1:
        cmd = [sys.executable, *trainer]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *trainer]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    env.pop("SLURM_FT_RESUME_STEP", None)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} -> {proc.returncode}\n{proc.stderr[-3000:]}")
    return proc


def _result(proc) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_kill9_of_one_rank_then_resume_is_bitwise_identical(tmp_path):
    common = ("--steps", str(STEPS), "--ckpt-every", "3", "--step-time", "0.15")
    clean = _result(_run(tmp_path / "clean", 2, *common))
    crashed = _run(tmp_path / "ft", 2, *common, "--crash-at", "1:7", check=False)
    assert crashed.returncode != 0
    committed = layout.committed_steps(tmp_path / "ft")
    assert committed in ([3], [3, 6])  # the async step-6 save may still be in flight at the kill
    resumed = _result(_run(tmp_path / "ft", 2, *common))
    assert resumed["resumed_from"] == committed[-1]
    assert resumed["step"] == clean["step"] == STEPS
    assert resumed["param_sha256"] == clean["param_sha256"]


@pytest.mark.slow
def test_resharding_4_to_2_to_3_loads_identical_full_params(tmp_path):
    ckpt = tmp_path / "ck"
    saved4 = _result(_run(ckpt, 4, "--steps", "2", "--ckpt-every", "2", "--sync"))
    assert layout.read_manifest(layout.step_dir(ckpt, 2)).world_size == 4
    run2 = _result(_run(ckpt, 2, "--steps", "4", "--ckpt-every", "2", "--sync"))
    assert (run2["resumed_from"], run2["world_size"]) == (2, 2)
    assert run2["resumed_sha256"] == saved4["param_sha256"]
    assert layout.read_manifest(layout.step_dir(ckpt, 4)).world_size == 2
    run3 = _result(_run(ckpt, 3, "--steps", "4", "--ckpt-every", "2", "--sync"))
    assert (run3["resumed_from"], run3["world_size"]) == (4, 3)
    assert run3["resumed_sha256"] == run2["param_sha256"] != saved4["param_sha256"]


CRASH_ARGS = ("--steps", "4", "--ckpt-every", "2", "--sync")


@pytest.fixture(scope="module")
def reference_sha(tmp_path_factory):
    return _result(_run(tmp_path_factory.mktemp("ref"), 1, *CRASH_ARGS))["param_sha256"]


# One point per outcome: temp dir only (also before_manifest/after_manifest), renamed without marker, committed.
@pytest.mark.parametrize("point", ["after_shards", "after_rename", "after_marker"])
def test_crash_at_each_commit_point_leaves_a_consistent_checkpoint(tmp_path, point, reference_sha):
    args = CRASH_ARGS
    ckpt = tmp_path / "ck"
    crashed = _run(ckpt, 1, *args, env_extra={"SLURM_FT_TEST_CRASH_AT": f"{point}@4"}, check=False)
    assert crashed.returncode == 17, crashed.stderr[-2000:]
    latest = layout.latest_committed(ckpt)
    assert latest.step == (4 if point == "after_marker" else 2)
    assert layout.verify_files(latest) == []
    resumed = _result(_run(ckpt, 1, *args))
    assert resumed["resumed_from"] == latest.step
    assert resumed["param_sha256"] == reference_sha
    assert not list(ckpt.glob(".tmp-*")), "stale temp dirs are removed by the next commit"
