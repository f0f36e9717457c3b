"""The rank wrapper's record of the GPU the launcher bound its rank to (slurm_ft.launch.gpus)."""

from __future__ import annotations

import json

from slurm_ft.core.rundir import GpuBinding, read_gpu_bindings
from slurm_ft.health.nvml_fake import FakeNvml
from slurm_ft.lab.gpus import spec
from slurm_ft.launch import gpus


def test_the_device_to_ask_nvml_about():
    assert gpus.nvml_device({}) is None and gpus.nvml_device({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) is None
    assert gpus.nvml_device({"CUDA_VISIBLE_DEVICES": "1"}) == "1"
    assert gpus.nvml_device({"CUDA_VISIBLE_DEVICES": "GPU-9,GPU-8"}) == "GPU-9"
    # Slurm renumbered the step's devices (ConstrainDevices): its physical list maps the CUDA index back
    bound = {"CUDA_VISIBLE_DEVICES": "1", "SLURM_FT_STEP_DEVICES": "0,1", "SLURM_STEP_GPUS": "4,6"}
    assert gpus.nvml_device(bound) == "6"
    assert gpus.nvml_device({**bound, "SLURM_STEP_GPUS": "4"}) == "1"  # lists that do not match: as it is


def test_the_binding_as_nvml_names_it():
    environ = {"CUDA_VISIBLE_DEVICES": "1", "SLURMD_NODENAME": "n3", "SLURM_FT_ATTEMPT": "2"}
    nvml = FakeNvml(spec("n3"))
    assert gpus.binding(environ, nvml, rank=5) == GpuBinding(rank=5, host="n3", attempt=2, devices="1", index=1,
                                                            uuid="GPU-fa4e0000-n3-1", pci_bus="0000:29:00")
    assert nvml.initialised == 0
    assert gpus.binding({**environ, "CUDA_VISIBLE_DEVICES": "7"}, nvml, rank=5).index == -1  # NVML has no GPU 7
    assert gpus.binding(environ, None, rank=5).uuid == ""  # no NVML: the list is all we know
    assert gpus.binding({"SLURMD_NODENAME": "n3"}, nvml, rank=5) is None


def test_the_record_lands_in_the_run_dir_and_a_cpu_rank_writes_none(tmp_path):
    environ = {"CUDA_VISIBLE_DEVICES": "0", "SLURMD_NODENAME": "n1", "SLURM_FT_RUN_DIR": str(tmp_path)}
    asked = []

    def nvml_for(node):
        asked.append(node)
        return FakeNvml(spec(node)), "TEST-ONLY"

    assert gpus.record(environ, 0, nvml_for).uuid == "GPU-fa4e0000-n1-0"
    assert [b.uuid for b in read_gpu_bindings(tmp_path)] == ["GPU-fa4e0000-n1-0"] and asked == ["n1"]
    assert json.loads((tmp_path / "gpu.rank0.json").read_text())["host"] == "n1"
    assert gpus.record({"SLURM_FT_RUN_DIR": str(tmp_path)}, 1, nvml_for) is None and asked == ["n1"]
    assert gpus.record_in_background({"SLURM_FT_RUN_DIR": str(tmp_path)}, 1) is None
