"""The launcher's side of the flight recorder (slurm_ft.launch.traces): the ranks' variables, the dump request."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slurm_ft.launch.traces import TraceRequest, recorder_env


def test_recorder_env_sets_only_what_the_job_does_not(tmp_path):
    assert recorder_env({}, tmp_path, 2000) == {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                                               "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "nccl_trace.rank")}
    users = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "100", "TORCH_FR_DUMP_TEMP_FILE": "/scratch/fr_"}
    assert recorder_env(users, tmp_path, 2000) == {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    assert recorder_env({"TORCH_FR_BUFFER_SIZE": "0"}, tmp_path, 2000) == {
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "nccl_trace.rank")}
    assert recorder_env({}, tmp_path, 0) == {}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def popen_of(argv):
    seen = []

    def popen(helper, **kwargs):
        seen.append(helper)
        return subprocess.Popen(argv, **kwargs)
    return popen, seen


def test_a_request_runs_the_traces_only_helpers_and_waits_for_them(tmp_path):
    popen, seen = popen_of([sys.executable, "-c", "pass"])
    request = TraceRequest(["n1", "n2"], tmp_path, {}, popen=popen)
    assert request.wait(10.0) == ""
    assert seen[0][:5] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n2"]
    assert seen[0][-3:] == ["--run-dir", str(tmp_path), "--traces-only"]


def test_a_request_that_overruns_is_stopped_at_its_deadline(tmp_path):
    clock = Clock()
    popen, _ = popen_of([sys.executable, "-c", "import time; time.sleep(60)"])
    request = TraceRequest(["n1"], tmp_path, {}, popen=popen, clock=clock)
    clock.now = 2.9  # asked at 0: 0.1 s of the 3 s left

    def tick(seconds):
        clock.now += seconds
    assert request.wait(3.0, sleep=tick) == "the flight-recorder dumps were not all in within 3 s"
    assert request.proc.poll() is not None and clock.now == pytest.approx(3.0, abs=0.06)  # one poll late at most


def test_a_request_without_srun_says_so(tmp_path):
    def popen(helper, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "srun")
    assert TraceRequest(["n1"], tmp_path, {}, popen=popen).wait(3.0).startswith("no srun to ask for the flight")


def test_a_request_ends_early_once_every_rank_is_accounted_for(tmp_path):
    clock = Clock()
    popen, _ = popen_of([sys.executable, "-c", "import time; time.sleep(60)"])
    request = TraceRequest(["n1"], tmp_path, {}, popen=popen, clock=clock)
    answers = iter([False, False, True])

    def tick(seconds):
        clock.now += seconds
    assert request.wait(3.0, done=lambda: next(answers), sleep=tick) == ""
    assert request.proc.poll() is not None and clock.now == pytest.approx(0.1)  # two polls, not 3 s
