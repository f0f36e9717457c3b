"""The wait for a failed attempt's GPUs to let go of its processes, on the node (slurm_ft.launch.reclaim)."""

from __future__ import annotations

import json
import sys

import pytest

from slurm_ft.core.rundir import (
    ErrorRecord,
    GpuBinding,
    Heartbeat,
    RankEnd,
    write_end,
    write_error,
    write_gpu_binding,
    write_heartbeat,
)
from slurm_ft.health.nvml_fake import FakeNvml
from slurm_ft.health.records import GpuHold, GpuUse
from slurm_ft.launch import reclaim
from slurm_ft.launch.reclaim import ReclaimConfig, Reclaimed, holds, wait_released


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _gpus(processes0=(), processes1=()):
    return {"gpus": [{"uuid": "GPU-a", "pci_bus": "00000000:18:00.0", "memory": {"total_mb": 81559, "used_mb": 0},
                      "processes": list(processes0)},
                     {"uuid": "GPU-b", "pci_bus": "00000000:2A:00.0", "memory": {"total_mb": 81559, "used_mb": 0},
                      "processes": list(processes1)}]}


def test_held_means_a_process_of_the_attempt_or_memory_where_processes_cannot_be_listed():
    assert holds(GpuUse(index=0, pids=(5, 42)), {42}, set(), 512)
    assert not holds(GpuUse(index=0, pids=(5,), used_mb=70000), {42}, {"GPU-a"}, 512)  # someone else's process
    assert holds(GpuUse(index=0, uuid="GPU-a", pids=None, used_mb=600), set(), {"GPU-a"}, 512)
    assert not holds(GpuUse(index=0, uuid="GPU-a", pids=None, used_mb=500), set(), {"GPU-a"}, 512)
    assert not holds(GpuUse(index=0, uuid="GPU-z", pids=None, used_mb=9000), set(), {"GPU-a"}, 512)  # not ours
    assert not holds(GpuUse(index=0, uuid="GPU-a", pids=None, used_mb=None), set(), {"GPU-a"}, 512)  # cannot tell


def test_a_gpu_held_for_two_seconds_is_waited_for():
    clock = Clock()
    nvml = FakeNvml(_gpus(processes1=[{"pid": 42, "used_mb": 30000, "until": 1002.0}]), clock=clock)
    nvml.nvmlInit()
    waited = wait_released(lambda: reclaim.gpu_use(nvml), {42}, set(), ReclaimConfig(timeout_s=30, poll_s=0.25),
                           clock=clock, sleep=clock.sleep)
    assert waited.held == () and 2.0 <= waited.waited_s <= 2.25
    assert [g.index for g in waited.gpus] == [1] and waited.gpus[0].pids == ()  # watched: GPU 1, released


def test_a_gpu_held_for_good_is_named_at_the_bound():
    clock = Clock()
    nvml = FakeNvml(_gpus(processes1=[{"pid": 42, "used_mb": 30000}]), clock=clock)
    nvml.nvmlInit()
    waited = wait_released(lambda: reclaim.gpu_use(nvml), {42}, set(), ReclaimConfig(timeout_s=3, poll_s=0.25),
                           clock=clock, sleep=clock.sleep)
    assert waited.held == (1,) and waited.waited_s == 3.0
    assert waited.gpus[0].pids == (42,) and waited.gpus[0].used_mb == 30000


def test_free_gpus_take_one_look():
    clock = Clock()
    looks = []
    waited = wait_released(lambda: looks.append(1) or [GpuUse(index=0, pids=())], {42}, set(), ReclaimConfig(),
                           clock=clock, sleep=clock.sleep)
    assert waited == reclaim.Waited(waited_s=0.0, gpus=(), held=()) and len(looks) == 1


def _attempt(run, node="n2"):
    """Rank 1's heartbeat and end record on n2 (pid 42), rank 0's on n1 (pid 41), rank 2's error file on n2."""
    write_heartbeat(run, Heartbeat(rank=0, step=3, time=1.0, host="n1", pid=41))
    write_heartbeat(run, Heartbeat(rank=1, step=3, time=1.0, host=node, pid=42))
    write_end(run, RankEnd(rank=1, time=2.0, host=node, pid=42, signal=9))
    write_error(run, ErrorRecord(rank=2, time=2.0, exc_type="X", message="m", host=node, pid=43))
    write_gpu_binding(run, GpuBinding(rank=1, host=node, attempt=1, devices="1", index=1, uuid="GPU-b"))


def test_the_attempts_processes_and_gpus_on_a_node_come_from_its_records(tmp_path):
    _attempt(tmp_path)
    assert reclaim.attempt_pids(tmp_path, "n2") == {42, 43} and reclaim.attempt_pids(tmp_path, "n1") == {41}
    assert reclaim.bound_uuids(tmp_path, "n2") == {"GPU-b"} and reclaim.bound_uuids(tmp_path, "n1") == set()


def test_on_node_writes_what_the_launcher_reads_as_evidence(tmp_path):
    _attempt(tmp_path)
    clock = Clock()
    nvml = FakeNvml(_gpus(processes0=[{"pid": 99, "used_mb": 10}], processes1=[{"pid": 42, "used_mb": 30000}]),
                    clock=clock)
    record = reclaim.on_node(tmp_path, "n2", 1, ReclaimConfig(timeout_s=2), nvml, clock=clock, sleep=clock.sleep,
                             now=lambda: 5.0)
    assert record["held"] == [1] and record["waited_s"] == 2.0 and record["nvml"] == ""
    assert [g["index"] for g in record["gpus"]] == [1]  # GPU 0 holds someone else's process: not watched
    assert nvml.initialised == 0  # shut down again
    reclaim.record_path(tmp_path, "n2").write_text(json.dumps(record))
    found = reclaim.read_records(tmp_path, ["n2", "n3"], 1)
    assert found.held == (GpuHold(node="n2", gpu_index=1, uuid="GPU-b", pci_bus="0000:2a:00", pids=(42,),
                                  used_mb=30000, waited_s=2.0),)
    assert found.unread == ("n3",) and found.waited_s == {"n2": 2.0} and found.held_nodes == {"n2"}
    assert reclaim.read_records(tmp_path, ["n2"], 2).unread == ("n2",)  # another attempt's record is no evidence


def test_no_nvml_is_nothing_to_wait_for(tmp_path):
    record = reclaim.on_node(tmp_path, "n2", 1, ReclaimConfig(), None)
    assert record["held"] == [] and record["nvml"].startswith("nvml unavailable")
    broken = FakeNvml({"init_error": "Driver Not Loaded"})
    assert reclaim.on_node(tmp_path, "n2", 1, ReclaimConfig(), broken)["nvml"] == \
        "nvml unavailable: Driver Not Loaded"


def test_the_helper_runs_one_task_per_node_and_cpu_jobs_run_none(tmp_path):
    argv = reclaim.helper_argv(["n1", "n2"], tmp_path, 3, ReclaimConfig(timeout_s=7))
    assert argv[:5] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n2"]
    assert "--overlap" in argv and argv[argv.index("--attempt") + 1] == "3" and argv[argv.index("--timeout") + 1] == "7"
    assert argv[argv.index("-m") - 1] == sys.executable  # the helper runs under the launcher's interpreter
    assert not reclaim.gpus_in_use(tmp_path, {"PATH": "/bin"})
    assert reclaim.gpus_in_use(tmp_path, {"SLURM_JOB_GPUS": "0,1"})
    assert not reclaim.gpus_in_use(tmp_path, {"CUDA_VISIBLE_DEVICES": "NoDevFiles"})
    write_gpu_binding(tmp_path, GpuBinding(rank=0, host="n1", devices="0"))
    assert reclaim.gpus_in_use(tmp_path, {})


def test_a_failed_step_keeps_what_was_read_and_says_why(tmp_path):
    found = reclaim.reclaim_on_nodes(["n1"], tmp_path, 1, {"PATH": str(tmp_path)}, ReclaimConfig(timeout_s=1))
    assert found.unread == ("n1",) and found.why.startswith("no srun")
    assert found.event() == {"nodes": [], "waited_s": {}, "held": [], "unread": ["n1"], "why": found.why}


def test_config_names_the_field_and_flag():
    with pytest.raises(ValueError, match=r"timeout_s: .*--gpu-reclaim-timeout"):
        ReclaimConfig(timeout_s=-1)
    with pytest.raises(ValueError, match="tolerance_mb"):
        ReclaimConfig(tolerance_mb=-5)


def test_the_helper_cli_reads_its_nodes_fake_in_test_mode(tmp_path, monkeypatch):
    run = tmp_path / "run"
    _attempt(run)
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "n2.fake.json").write_text(json.dumps(_gpus(processes1=[{"pid": 42, "used_mb": 30000}])))
    site = tmp_path / "config.toml"
    site.write_text(f'[health]\ntest_mode = true\ntest_nvml_snapshot_dir = "{fakes}"\n')
    monkeypatch.setenv("SLURM_FT_CONFIG", str(site))
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    assert reclaim.main(["--run-dir", str(run), "--attempt", "1", "--timeout", "0.3"]) == 0
    record = json.loads(reclaim.record_path(run, "n2").read_text())
    assert record["held"] == [1] and record["node"] == "n2" and record["attempt"] == 1
    assert Reclaimed(held=reclaim.read_records(run, ["n2"], 1).held).held_nodes == {"n2"}
