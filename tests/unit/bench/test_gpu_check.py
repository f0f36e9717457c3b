"""device/check_gpu.sh's CPU-side parts: its skip without a GPU, its summary lines, the reclaim measurement with a
fake NVML, and the flight-recorder check rehearsed over gloo (slurm_ft.bench.gpu_check)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from slurm_ft.bench import gpu_check
from slurm_ft.health.nvml_fake import FakeNvml
from slurm_ft.lab.gpus import spec

SCRIPT = Path(__file__).resolve().parents[3] / "device" / "check_gpu.sh"


def _run(env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT)], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_without_a_gpu_it_skips_cleanly(tmp_path):
    done = _run({"OUT": str(tmp_path), "PATH": "/usr/bin:/bin"})  # no nvidia-smi on this PATH (nor on this host)
    assert done.returncode == 0 and done.stdout == "check_gpu: skip: no GPU here (no working nvidia-smi)\n"
    assert (tmp_path / "summary.txt").read_text() == done.stdout


def test_with_nvidia_smi_but_no_cuda_it_still_skips(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-x)'\n")
    (fake / "nvidia-smi").chmod(0o755)
    done = _run({"OUT": str(tmp_path / "out"), "PATH": f"{fake}:{os.environ['PATH']}",
                 "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0 and done.stdout.strip() == "check_gpu: skip: no GPU here (torch sees no CUDA device)"


def test_the_cpu_rehearsal_runs_the_flight_recorder_check_and_skips_the_gpu_only_ones(tmp_path):
    done = _run({"OUT": str(tmp_path), "CHECK_GPU_DEVICE": "cpu", "CHECKS": "nvml reclaim fr"})
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert lines[:2] == ["check_gpu: nvml: skip: needs a GPU (rehearsal on cpu)",
                         "check_gpu: reclaim: skip: needs a GPU (rehearsal on cpu)"]
    assert lines[2] == "check_gpu: fr: ok: TORCH_FR_BUFFER_SIZE=2000: 5 entries, 5 gloo:all_reduce of 5"
    assert (tmp_path / "fr_trace.pkl").stat().st_size > 0 and (tmp_path / "fr.log").is_file()


class Child:
    """A killed CUDA process, scripted: the fake GPU lists it until ``release_after`` s past the kill."""

    def __init__(self, nvml: FakeNvml, clock, release_after: float | None) -> None:
        self.pid, self.nvml, self.clock, self.release_after = 4242, nvml, clock, release_after
        gpu = nvml.gpus[0]
        gpu["processes"] = [{"pid": self.pid, "used_mb": 2048, "until": None}]
        gpu["memory"]["used_mb"] = 500

    def kill(self) -> None:
        process = self.nvml.gpus[0]["processes"][0]
        process["until"] = None if self.release_after is None else self.clock.now + self.release_after

    def wait(self) -> int:
        self.clock.now += 0.05
        return -signal.SIGKILL


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _measure(release_after):
    clock = Clock()
    nvml = FakeNvml(spec("n1"), clock=clock)
    nvml.gpus[0]["memory"]["used_mb"] = 500  # the baseline before the child
    return gpu_check.measure_reclaim(nvml, lambda: Child(nvml, clock, release_after), "0", bound_s=5.0,
                                     clock=clock, sleep=clock.sleep)


def test_the_reclaim_measure_times_the_kill_the_unlisting_and_the_memory():
    found = _measure(1.0)
    assert found.listed and found.held_mb == 2048 and found.reaped_s == 0.05
    assert 1.0 <= found.unlisted_s <= 1.35 and 1.0 <= found.memory_back_s <= 1.35
    text, code = gpu_check.reclaim_line(found)
    assert code == 0 and text.startswith("check_gpu: reclaim: ok: SIGKILL mid-kernel (2048 MiB held): reaped 0.05 s")


def test_a_gpu_that_never_lets_go_fails_the_reclaim_check():
    found = _measure(None)
    assert found.unlisted_s is None and found.memory_back_s is None
    text, code = gpu_check.reclaim_line(found)
    assert code == 1 and "never (within the bound)" in text and ": FAIL: " in text
    unlisted = gpu_check.Reclaim(listed=False, held_mb=None, reaped_s=0.1, unlisted_s=0.1, memory_back_s=0.1)
    assert gpu_check.reclaim_line(unlisted)[0].startswith("check_gpu: reclaim: FAIL: NVML never listed")


def test_the_fsdp_summary_needs_a_kill_a_resume_and_equal_parameters():
    ok = '{"step": 12, "param_sha256": "abc123abc123ff", "resumed_from": 6}'
    ref = '{"step": 12, "param_sha256": "abc123abc123ff", "resumed_from": 0}'
    runs = {"reference": (0, ref), "killed": (-signal.SIGKILL, "log"), "resumed": (0, f"x\n{ok}")}
    want = ("check_gpu: fsdp: ok: killed at a step, resumed from step 6: parameters bitwise equal to the "
            "uninterrupted run's (sha256 abc123abc123)")
    assert gpu_check.fsdp_line(runs) == (want, 0)
    differ = {**runs, "resumed": (0, ok.replace("abc123abc123ff", "ffff"))}
    assert gpu_check.fsdp_line(differ)[1] == 1 and "DIFFERENT" in gpu_check.fsdp_line(differ)[0]
    assert "not SIGKILL" in gpu_check.fsdp_line({**runs, "killed": (0, "")})[0]
    assert "the resumed run gave no result" in gpu_check.fsdp_line({**runs, "resumed": (1, "Traceback")})[0]


def test_the_fr_summary_counts_the_backends_all_reduces(monkeypatch):
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")
    trace = {"entries": [{"profiling_name": "nccl:all_reduce"}] * 5 + [{"profiling_name": "nccl:broadcast"}]}
    want = "check_gpu: fr: ok: TORCH_FR_BUFFER_SIZE=2000: 6 entries, 5 nccl:all_reduce of 5"
    assert gpu_check.fr_line(trace, "nccl", 5) == (want, 0)
    assert gpu_check.fr_line({"entries": []}, "nccl", 5)[1] == 1


def test_the_cli_refuses_an_unknown_check(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err
