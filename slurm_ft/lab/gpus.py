"""TEST-ONLY fake GPUs for the lab's nodes, and the fault of a GPU that keeps a killed rank's memory.

The lab's nodes have no GPUs. Its site config runs in test mode with ``test_nvml_snapshot_dir`` (``<lab>/test-nvml``):
there ``<node>.fake.json`` (a ``slurm_ft.health.nvml_fake`` spec, keyed by node name, as the lab's nodes share one
host) is the NVML the job's own helpers read on that node (``slurm_ft.health.checks.job_nvml``): the rank
wrapper's binding record, the launcher's reclaim wait. The prolog and epilog keep reading ``<node>.json``.

``hold_and_kill`` is the fault: rank R's GPU lists R's process (and its memory) for ``seconds`` after a SIGKILL
(None: for good, a GPU that never lets go), as a real GPU does while the driver tears a context down. The process
is listed by its pid on its node, as that node's driver would list it (where the lab's nodes are hosts, each has
a PID namespace of its own: not the pid this side sees).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from slurm_ft.core.config import load_site_config
from slurm_ft.health.checks import FAKE_SUFFIX, HealthConfig
from slurm_ft.lab import procs
from slurm_ft.lab.faults import rank_pid

GPUS_PER_NODE = 2
MEMORY_MB = 81559  # an H100 80GB's, as NVML says it
HELD_MB = 30000


def fake_dir(lab: Any) -> Path:
    """Where the lab's nodes' fake NVML specs live: the site config's TEST-ONLY ``test_nvml_snapshot_dir``."""
    config = load_site_config(lab.site_config).build("health", HealthConfig)
    if not config.test_mode or not config.test_nvml_snapshot_dir:
        raise RuntimeError(f"{lab.site_config}: [health] test_mode with test_nvml_snapshot_dir is needed for fake "
                           "GPUs (a lab with slurm-ft's hooks has it)")
    return Path(config.test_nvml_snapshot_dir)


def spec(node: str, count: int = GPUS_PER_NODE) -> dict[str, Any]:
    """``count`` idle GPUs, each with a UUID and PCI bus id of its own node's (``GPU-fa4e0000-<node>-<i>``)."""
    return {"driver_version": "550.54.15", "gpus": [
        {"uuid": f"GPU-fa4e0000-{node}-{i}", "pci_bus": f"00000000:{0x18 + 0x11 * i:02X}:00.0", "temperature": 35,
         "memory": {"total_mb": MEMORY_MB, "used_mb": 0}, "processes": []} for i in range(count)]}


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.chmod(0o644)
    os.replace(tmp, path)  # the helpers never read half a spec


def install(lab: Any, nodes: Iterable[str] | None = None, count: int = GPUS_PER_NODE) -> Path:
    """Give ``nodes`` (default: all of the lab's) ``count`` idle fake GPUs each; the specs' dir."""
    where = fake_dir(lab)
    for node in nodes if nodes is not None else lab.node_names:
        _write(where / f"{node}{FAKE_SUFFIX}", spec(node, count))
    return where


def remove(lab: Any, nodes: Iterable[str] | None = None) -> None:
    """Take the fake GPUs away again (the nodes then have no NVML, as before)."""
    where = fake_dir(lab)
    for node in nodes if nodes is not None else lab.node_names:
        (where / f"{node}{FAKE_SUFFIX}").unlink(missing_ok=True)


def hold(lab: Any, node: str, gpu: int, pid: int, *, seconds: float | None, used_mb: int = HELD_MB) -> None:
    """``node``'s GPU ``gpu`` lists process ``pid`` with ``used_mb`` for ``seconds`` from now (None: for good)."""
    path = fake_dir(lab) / f"{node}{FAKE_SUFFIX}"
    data = json.loads(path.read_text())
    until = None if seconds is None else time.time() + seconds
    data["gpus"][gpu].setdefault("processes", []).append({"pid": pid, "used_mb": used_mb, "until": until})
    _write(path, data)


def release(lab: Any, node: str, pid: int, *, after: float = 0.0) -> None:
    """``node``'s GPUs stop listing ``pid`` ``after`` seconds from now (a hold for good that lets go in the end)."""
    path = fake_dir(lab) / f"{node}{FAKE_SUFFIX}"
    data = json.loads(path.read_text())
    for gpu in data["gpus"]:
        for process in gpu.get("processes") or ():
            if process["pid"] == pid:
                process["until"] = time.time() + after
    _write(path, data)


def rank_gpu(environ: dict[str, str]) -> int:
    """The fake GPU index a rank was bound to: its first ``CUDA_VISIBLE_DEVICES`` entry (0 when not a number)."""
    first = environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0]
    return int(first) if first.isdigit() else 0


def hold_and_kill(lab: Any, job_id: int, rank: int, *, seconds: float | None) -> tuple[int, str, int]:
    """SIGKILL rank ``rank`` of job ``job_id``, its GPU keeping the process listed for ``seconds`` (None: for good).
    Returns (pid on its node, node, GPU index): ``release`` takes that pid. The hold is written first: the
    launcher's helper must find it."""
    pid = rank_pid(lab, job_id, rank)
    if pid is None:
        raise LookupError(f"no running rank {rank} in job {job_id}")
    environ = _environ(pid)
    node, gpu, on_node = environ.get("SLURMD_NODENAME", ""), rank_gpu(environ), procs.inner_pid(pid)
    hold(lab, node, gpu, on_node, seconds=seconds)
    os.kill(pid, signal.SIGKILL)
    return on_node, node, gpu


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if b"=" in item)
    return {key: value for key, _, value in pairs}
