"""The GPU a rank was bound to, as NVML on its node names it, recorded by the rank's wrapper at its start.

The launcher's binding (``slurm_ft.launch.rank_env``) leaves each rank a ``CUDA_VISIBLE_DEVICES`` of its own;
the wrapper (``slurm_ft.launch.rank``) asks NVML which GPU that is (index, UUID, PCI bus id) and writes
``gpu.rank<R>.json`` (``slurm_ft.core.rundir.GpuBinding``), off the rank's start path (a thread: NVML's first
call can take a second where persistence mode is off). The topology check compares it with the rank's last
attempt's; the reclaim helper (``slurm_ft.launch.reclaim``) knows from it which GPUs were the attempt's.

A device named by number is a CUDA index within the step's devices; where Slurm says which physical GPUs those
are (``SLURM_STEP_GPUS``, ``SLURM_JOB_GPUS``: NVML's numbering, as Slurm renumbers ``CUDA_VISIBLE_DEVICES`` under
``ConstrainDevices``), that list maps it. A rank without ``CUDA_VISIBLE_DEVICES`` (no GPUs asked of Slurm, a CPU
job) records nothing and costs nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from slurm_ft.core import env as ft_env
from slurm_ft.core import rundir as records
from slurm_ft.health.checks import job_nvml
from slurm_ft.health.nvml import gpu_identity
from slurm_ft.launch.rank_env import NO_DEVICES, STEP_DEVICES

NvmlFor = Callable[[str], tuple[Any, str]]  # node -> (NVML module or None, note): health.checks.job_nvml


def nvml_device(environ: Mapping[str, str]) -> str | None:
    """Pure: the device to look up in NVML for the rank's first visible GPU (a UUID or NVML's index), or None
    when the rank sees no list."""
    own = environ.get("CUDA_VISIBLE_DEVICES", "")
    if not own or own == NO_DEVICES:
        return None
    first = own.split(",")[0].strip()
    if first.startswith(("GPU-", "MIG-")) or not first:
        return first or None
    step = environ.get(STEP_DEVICES, own).split(",")
    physical = (environ.get("SLURM_STEP_GPUS") or environ.get("SLURM_JOB_GPUS") or "").split(",")
    if first in step and len(physical) == len(step) and physical[step.index(first)].strip().isdigit():
        return physical[step.index(first)].strip()
    return first


def binding(environ: Mapping[str, str], nvml: Any, *, rank: int) -> records.GpuBinding | None:
    """The rank's GPU as ``nvml`` names it (NVML initialised and shut down here); None without a device list.
    A device NVML cannot find is recorded with what is known (its list, index -1)."""
    device = nvml_device(environ)
    if device is None:
        return None
    base = records.GpuBinding(rank=rank, host=records.node_name(environ), devices=environ["CUDA_VISIBLE_DEVICES"],
                              attempt=int(environ.get("SLURM_FT_ATTEMPT", "0") or 0))
    if nvml is None:
        return base
    try:
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver here: the list is all we know
        return base
    try:
        found = gpu_identity(nvml, device)
    finally:
        _shutdown(nvml)
    if found is None:
        return base
    index, uuid, pci_bus = found
    return records.GpuBinding(rank=base.rank, host=base.host, attempt=base.attempt, devices=base.devices,
                              index=index, uuid=uuid, pci_bus=pci_bus)


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - shutting down changes nothing recorded
        return


def record(environ: Mapping[str, str], rank: int, nvml_for: NvmlFor = job_nvml) -> records.GpuBinding | None:
    """Write the rank's ``gpu.rank<R>.json`` into its run dir; the record, or None (no list, no run dir, no write)."""
    run_dir = ft_env.job_setting(ft_env.RUN_DIR, environ)
    if not run_dir or nvml_device(environ) is None:
        return None
    nvml, _ = nvml_for(records.node_name(environ))
    found = binding(environ, nvml, rank=rank)
    if found is None:
        return None
    try:
        records.write_gpu_binding(run_dir, found)
    except OSError:
        return None  # the topology check then has nothing to compare: it says so
    return found


def record_in_background(environ: Mapping[str, str], rank: int) -> threading.Thread | None:
    """``record`` in a daemon thread (the rank starts meanwhile); None when the rank sees no GPU list."""
    if nvml_device(environ) is None:
        return None
    thread = threading.Thread(target=record, args=(dict(environ), rank), name="slurm-ft-gpu-record", daemon=True)
    thread.start()
    return thread
