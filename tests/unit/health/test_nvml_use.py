"""Who holds a GPU (compute processes, memory used) through NVML, and the TEST-ONLY per-node fake NVML."""

from __future__ import annotations

import json
import os

import pytest

from slurm_ft.core.config import SiteConfig
from slurm_ft.health.checks import (
    FAKE_SUFFIX,
    HealthConfig,
    job_nvml,
    recorded_fake_path,
)
from slurm_ft.health.nvml import gpu_identity, gpu_use
from slurm_ft.health.nvml_fake import FakeNvml, FakeNvmlError
from slurm_ft.health.records import GpuHold, GpuUse


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _spec(processes=None):
    gpu = {"uuid": "GPU-aaaa", "pci_bus": "00000000:18:00.0", "memory": {"total_mb": 81559, "used_mb": 3}}
    if processes is not ...:
        gpu["processes"] = processes or []
    return {"gpus": [gpu, {"uuid": "GPU-bbbb", "pci_bus": "00000000:2A:00.0",
                           "memory": {"total_mb": 81559, "used_mb": 0}}]}


def test_a_process_is_listed_with_its_memory_until_its_time_passes():
    clock = Clock()
    nvml = FakeNvml(_spec([{"pid": 42, "used_mb": 30000, "until": 1002.0}, {"pid": 7, "used_mb": 10}]), clock=clock)
    nvml.nvmlInit()
    first = gpu_use(nvml)
    assert first[0] == GpuUse(index=0, uuid="GPU-aaaa", pci_bus="0000:18:00", pids=(7, 42), used_mb=30013)
    assert first[1].pids == () and first[1].used_mb == 0  # no process list in the spec: nobody listed
    clock.now = 1002.0
    assert gpu_use(nvml)[0].pids == (7,) and gpu_use(nvml)[0].used_mb == 13  # pid 42's context is gone


def test_an_unreadable_process_list_is_none_not_empty():
    nvml = FakeNvml(_spec(...))
    nvml.spec["gpus"][0]["processes"] = None  # NVML_ERROR_NOT_SUPPORTED
    nvml.gpus = nvml.spec["gpus"]
    nvml.nvmlInit()
    use = gpu_use(nvml)[0]
    assert use.pids is None and use.used_mb == 3


def test_a_gpu_nvml_cannot_open_is_a_record_with_the_reason():
    spec = _spec()
    spec["gpus"][1]["lost"] = True
    nvml = FakeNvml(spec)
    nvml.nvmlInit()
    assert gpu_use(nvml)[1] == GpuUse(index=1, error="GPU is lost")


def test_gpu_identity_by_uuid_or_index():
    nvml = FakeNvml(_spec())
    nvml.nvmlInit()
    assert gpu_identity(nvml, "GPU-bbbb") == (1, "GPU-bbbb", "0000:2a:00")
    assert gpu_identity(nvml, "0") == (0, "GPU-aaaa", "0000:18:00")
    assert gpu_identity(nvml, "GPU-nope") is None and gpu_identity(nvml, "7") is None
    assert gpu_identity(nvml, "not-a-device") is None
    with pytest.raises(FakeNvmlError):
        FakeNvml(_spec()).nvmlDeviceGetHandleByUUID("GPU-aaaa")  # NVML not initialised


def test_the_held_gpu_says_where_what_and_how_long():
    hold = GpuHold(node="n2", gpu_index=1, pci_bus="0000:2a:00", pids=(4242,), used_mb=30000, waited_s=30.0)
    assert hold.describe() == ("n2 GPU 1 (0000:2a:00): 30000 MiB of the failed attempt's pid 4242 not released "
                               "after 30 s")


def _site(tmp_path, **health):
    return lambda: SiteConfig(sections={"health": health}, source=str(tmp_path / "config.toml"))


def test_the_fake_answers_only_in_test_mode_and_only_for_its_own_node(tmp_path):
    (tmp_path / f"n2{FAKE_SUFFIX}").write_text(json.dumps(_spec()))
    on = HealthConfig(test_mode=True, test_nvml_snapshot_dir=str(tmp_path))
    assert recorded_fake_path("n2", on) == tmp_path / "n2.fake.json"
    assert recorded_fake_path("n1", on) is None  # keyed by node name: n1 has no fake
    assert recorded_fake_path("../n2", on) is None
    assert recorded_fake_path("n2", HealthConfig()) is None
    nvml, note = job_nvml("n2", _site(tmp_path, test_mode=True, test_nvml_snapshot_dir=str(tmp_path)))
    assert isinstance(nvml, FakeNvml) and note.startswith("TEST-ONLY: NVML answered by")
    nvml, note = job_nvml("n2", _site(tmp_path))  # a production site config: the real library (or None)
    assert not isinstance(nvml, FakeNvml) and note == ""


def test_a_bad_fake_or_a_bad_site_config_never_raises(tmp_path):
    (tmp_path / f"n2{FAKE_SUFFIX}").write_text("{not json")
    nvml, note = job_nvml("n2", _site(tmp_path, test_mode=True, test_nvml_snapshot_dir=str(tmp_path)))
    assert nvml is None and "bad fake NVML" in note
    nvml, note = job_nvml("n2", _site(tmp_path, nonsense=1))  # unknown key: no test mode
    assert not isinstance(nvml, FakeNvml) and note == ""


def test_real_nvml_lists_this_process_on_its_gpu():
    """Runs where a GPU and pynvml are (device/check_gpu.sh); skipped elsewhere. The reclaim wait matches NVML's
    pids with the ranks' own: this process, holding CUDA memory, must be listed under its own pid."""
    pynvml = pytest.importorskip("pynvml")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    held = torch.empty(64 * 2**18, device="cuda")  # 64 MiB
    torch.cuda.synchronize()
    pynvml.nvmlInit()
    try:
        uses = gpu_use(pynvml)
    finally:
        pynvml.nvmlShutdown()
    assert uses and all(u.error == "" and u.uuid.startswith(("GPU-", "MIG-")) and u.used_mb is not None for u in uses)
    listed = [u for u in uses if u.pids is not None and os.getpid() in u.pids]
    assert len(listed) == 1, f"pid {os.getpid()} not listed: {uses}"
    assert listed[0].used_mb >= 64
    del held


def test_a_fake_from_a_file_sees_the_file_change(tmp_path):
    path = tmp_path / "n1.fake.json"
    path.write_text(json.dumps(_spec([{"pid": 42, "used_mb": 100}])))
    nvml = FakeNvml.from_file(path)
    nvml.nvmlInit()
    assert gpu_use(nvml)[0].pids == (42,)
    replaced = tmp_path / "new.json"
    replaced.write_text(json.dumps(_spec([{"pid": 42, "used_mb": 100, "until": 0.0}])))
    replaced.replace(path)  # as the lab writes it: a whole new file
    assert gpu_use(nvml)[0].pids == ()  # released, seen by the same long-lived fake
    path.write_text("{torn")
    assert gpu_use(nvml)[0].pids == ()  # a file that cannot be read now: the last spec stands
