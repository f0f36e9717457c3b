"""Checkpoint engine end to end: real example-trainer subprocesses, real gloo groups, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_ft.bench import timeline as tl
from slurm_ft.core import layout
from slurm_ft.train import example
from slurm_ft.train.storage import CRASH_POINTS

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
    assert resumed["data_position"] == STEPS  # the dataloader position came back with the checkpoint
    assert resumed["param_sha256"] == clean["param_sha256"]


def test_ddp_emergency_signal_on_one_rank_saves_everywhere_and_resumes_bitwise(tmp_path):
    common = ("--steps", "6", "--ckpt-every", "100", "--parallel", "ddp")
    clean = _result(_run(tmp_path / "clean", 2, *common))
    # SIGUSR1 to rank 1 only; agreeing every step, the ranks act one step after the signal (the agreement is
    # pipelined off the critical path), all at step 5
    stopped = _result(_run(tmp_path / "ft", 2, *common, "--signal-at", "1:4", "--agree-every", "0"))
    assert stopped["emergency"] and stopped["step"] == 5
    assert layout.committed_steps(tmp_path / "ft") == [5]
    assert layout.read_manifest(layout.step_dir(tmp_path / "ft", 5)).world_size == 2
    resumed = _result(_run(tmp_path / "ft", 2, *common))
    assert (resumed["resumed_from"], resumed["resumed_sha256"]) == (5, stopped["param_sha256"])
    assert resumed["param_sha256"] == clean["param_sha256"]


@pytest.mark.slow
def test_resharding_4_to_2_to_3_loads_identical_full_params(tmp_path):
    ckpt = tmp_path / "ck"
    saved4 = _result(_run(ckpt, 4, "--steps", "2", "--ckpt-every", "2", "--sync"))
    assert layout.read_manifest(layout.step_dir(ckpt, 2)).world_size == 4
    run2 = _result(_run(ckpt, 2, "--steps", "4", "--ckpt-every", "2", "--sync"))
    assert (run2["resumed_from"], run2["world_size"], run2["resharded_from"]) == (2, 2, 4)
    assert run2["resumed_sha256"] == saved4["param_sha256"]
    assert layout.read_manifest(layout.step_dir(ckpt, 4)).world_size == 2
    run3 = _result(_run(ckpt, 3, "--steps", "4", "--ckpt-every", "2", "--sync"))
    assert (run3["resumed_from"], run3["world_size"], run3["resharded_from"]) == (4, 3, 2)
    assert run3["resumed_sha256"] == run2["param_sha256"] != saved4["param_sha256"]


# The sweep: a real saver process SIGKILLed at every point of the protocol, then resumed (in this process).
CRASH_ARGS = ["--steps", "4", "--ckpt-every", "2", "--sync", "--hidden", "16"]
COMMITTED_AT = {"after_marker", "after_fsync"}  # the marker is in place: step 4 is a checkpoint


def _run_in_process(ckpt: Path, capsys) -> dict:
    capsys.readouterr()
    assert example.main([*CRASH_ARGS, "--ckpt-dir", str(ckpt)]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def reference_sha(tmp_path_factory):
    proc = _run(tmp_path_factory.mktemp("ref"), 1, *CRASH_ARGS)
    return _result(proc)["param_sha256"]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_sigkill_at_each_commit_point_resumes_from_a_consistent_checkpoint(tmp_path, point, reference_sha, capsys):
    ckpt = tmp_path / "ck"
    crashed = _run(ckpt, 1, *CRASH_ARGS, env_extra={"SLURM_FT_TEST_CRASH_AT": f"{point}@4"}, check=False)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    latest = layout.latest_committed(ckpt)
    assert latest.step == (4 if point in COMMITTED_AT else 2)
    assert layout.verify_files(latest) == []
    resumed = _run_in_process(ckpt, capsys)
    assert resumed["resumed_from"] == latest.step
    assert resumed["param_sha256"] == reference_sha
    assert not list(ckpt.glob(".tmp-*")), "stale temp dirs are removed by the next commit"


def test_a_step_killed_after_its_save_committed_is_in_the_timeline_once(tmp_path):
    """The bench's ETTR counts each step once: a process SIGKILLed after committing step 4 (and before it
    could write anything more) must have recorded step 4, or the resumed run never records it."""
    ckpt, timeline = tmp_path / "ck", tmp_path / "timeline.jsonl"
    args = ["--steps", "6", "--ckpt-every", "2", "--sync", "--timeline", str(timeline)]
    crashed = _run(ckpt, 1, *args, env_extra={"SLURM_FT_TEST_CRASH_AT": "after_fsync@4"}, check=False)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    assert _result(_run(ckpt, 1, *args))["resumed_from"] == 4
    steps = tl.step_records(tl.read_timeline(timeline))
    assert sorted(s.step for s in steps if not s.lost) == [1, 2, 3, 4, 5, 6]


def test_finished_runs_exit_0_not_aborted_by_gloo_at_interpreter_exit(tmp_path):
    """Without the manager's exit drain (slurm_ft.train.gloo_exit) about 1 two-rank run in 10 aborted after its
    last save ("terminate called without an active exception", exit 134): 8 runs here all end 0."""
    for run in range(8):
        proc = _run(tmp_path / f"ckpt{run}", 2, "--steps", "6", "--ckpt-every", "3", check=False)
        assert proc.returncode == 0, f"run {run}: exit {proc.returncode}: {proc.stderr[-1500:]}"
        assert "terminate called" not in proc.stderr
