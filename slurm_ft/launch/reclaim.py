"""Before a restart in place: the failed attempt's GPUs must let go of its processes, checked on each node.

A rank SIGKILLed in a CUDA kernel can leave its context and memory on the GPU for seconds after its process is
gone (for good on a wedged GPU); a new rank started there at once fails with "CUDA error: out of memory". After
a failed attempt the launcher runs ``python -m slurm_ft.launch.reclaim --run-dir DIR --attempt N --timeout S`` as
one task on each node the next attempt uses again (``srun --overlap``, like the hang helpers: never assuming the
launcher's host is the node). On its node, through NVML, the helper waits, within ``S``, until

- no GPU lists a compute process (``nvmlDeviceGetComputeRunningProcesses``) of the attempt: a pid its ranks'
  heartbeats, end records or error files name on this node;
- a GPU whose process list NVML cannot read, and that a rank of the attempt was bound to (``gpu.rank<R>.json``),
  uses at most ``tolerance_mb`` (``nvmlDeviceGetMemoryInfo``);

and writes ``reclaim.<node>.json``::

    {"node": "n2", "attempt": 1, "time": 1700000000.0, "waited_s": 30.0, "nvml": "",
     "gpus": [{"index": 1, "uuid": "GPU-...", "pci_bus": "0000:2a:00", "pids": [4242], "used_mb": 30000, ...}],
     "held": [1]}

``gpus``: the watched GPUs as last seen; ``held``: those still held at the bound; ``nvml``: why NVML could not be
read ("" when it could). A GPU still held is node evidence read on the node: the launcher's verdict is
``hardware_gpu`` naming that node and GPU (``slurm_ft.health.records.GpuHold``), and the node is swapped for a
spare or left out. What NVML cannot tell is never waited on: no NVML, no GPU listing a process of the attempt.

Pids are matched in the helper's PID namespace, which is the ranks' under Slurm; where NVML reports pids of
another namespace (some container runtimes) no process matches and nothing is waited on: the restart goes ahead
as it would without this check, and nobody is blamed. In the lab, a node's NVML is its TEST-ONLY scripted fake
(``slurm_ft.health.checks.job_nvml``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_ft.core import rundir as records
from slurm_ft.core.config import require
from slurm_ft.health.checks import job_nvml
from slurm_ft.health.nvml import gpu_use
from slurm_ft.health.records import GpuHold, GpuUse

RECORD_PREFIX = "reclaim."


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReclaimConfig:
    """The wait, after a failed attempt, for its GPUs to let go of its processes (``--gpu-reclaim-timeout``)."""

    timeout_s: float = 30.0
    """The most a node's helper waits for its GPUs (``--gpu-reclaim-timeout``, ``SLURM_FT_GPU_RECLAIM_TIMEOUT``);
    a GPU still held then is a bad GPU. 0: no wait."""
    poll_s: float = 0.25
    """Seconds between two looks at NVML on the node."""
    tolerance_mb: int = 512
    """Memory a GPU may use and count as released, where NVML cannot list its processes."""
    slack_s: float = 20.0
    """Beyond ``timeout_s``: how long the helpers' step may take to start and report before the launcher goes on
    without the nodes that did not report (no evidence against them)."""

    def __post_init__(self) -> None:
        require(isinstance(self.timeout_s, (int, float)) and 0 <= self.timeout_s <= 600, "timeout_s",
                f"must be within [0, 600] seconds (--gpu-reclaim-timeout), got {self.timeout_s!r}")
        require(self.poll_s > 0, "poll_s", f"must be > 0, got {self.poll_s!r}")
        require(isinstance(self.tolerance_mb, int) and self.tolerance_mb >= 0, "tolerance_mb",
                f"must be an integer >= 0, got {self.tolerance_mb!r}")
        require(self.slack_s > 0, "slack_s", f"must be > 0, got {self.slack_s!r}")


# --- on the node -----------------------------------------------------------------------------------------------
def attempt_pids(run_dir: Path, node: str) -> set[int]:
    """The attempt's processes on ``node``: what its heartbeats, end records and error files name."""
    found = [*records.read_heartbeats(run_dir), *records.read_ends(run_dir), *records.read_errors(run_dir)]
    return {r.pid for r in found if r.host == node and isinstance(r.pid, int) and r.pid > 0}


def bound_uuids(run_dir: Path, node: str) -> set[str]:
    """The GPUs the attempt's ranks on ``node`` were bound to (``gpu.rank<R>.json``), by UUID."""
    return {b.uuid for b in records.read_gpu_bindings(run_dir) if b.host == node and b.uuid}


def holds(use: GpuUse, pids: set[int], uuids: set[str], tolerance_mb: int) -> bool:
    """Pure: whether ``use`` shows the GPU still held by the attempt (see the module docstring)."""
    if use.pids is not None:
        return bool(pids.intersection(use.pids))
    return use.uuid in uuids and use.used_mb is not None and use.used_mb > tolerance_mb


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Waited:
    """One node's wait: how long, the watched GPUs as last seen, and the indices of those still held."""

    waited_s: float
    gpus: tuple[GpuUse, ...]
    held: tuple[int, ...]


def wait_released(read: Callable[[], Sequence[GpuUse]], pids: set[int], uuids: set[str], config: ReclaimConfig, *,
                  clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> Waited:
    """Look at the GPUs (``read``) until none is held by the attempt or ``config.timeout_s`` has passed. Watched:
    the GPUs held at the first look (the others were free already)."""
    start = clock()
    watched: set[int] = set()
    while True:
        uses = list(read())
        held = {u.index for u in uses if holds(u, pids, uuids, config.tolerance_mb)}
        watched |= held
        waited = clock() - start
        if not held or waited >= config.timeout_s:
            return Waited(waited_s=round(waited, 3), gpus=tuple(u for u in uses if u.index in watched),
                          held=tuple(sorted(held)))
        sleep(min(config.poll_s, max(0.0, config.timeout_s - waited)))


def on_node(run_dir: Path, node: str, attempt: int, config: ReclaimConfig, nvml: Any, *,
            clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
            now: Callable[[], float] = time.time) -> dict[str, Any]:
    """This node's wait (NVML initialised once for it), as the record ``reclaim.<node>.json`` holds."""
    record: dict[str, Any] = {"node": node, "attempt": attempt, "time": now(), "waited_s": 0.0, "nvml": "",
                              "gpus": [], "held": []}
    if nvml is None:
        return {**record, "nvml": "nvml unavailable: pynvml not installed"}
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no driver, no GPU: nothing to wait for
        return {**record, "nvml": f"nvml unavailable: {str(exc)[:200]}"}
    try:
        waited = wait_released(lambda: gpu_use(nvml), attempt_pids(run_dir, node), bound_uuids(run_dir, node),
                               config, clock=clock, sleep=sleep)
    except Exception as exc:  # noqa: BLE001 - a driver fault mid-wait: said, not judged
        return {**record, "nvml": f"nvml failed: {str(exc)[:200]}"}
    finally:
        _shutdown(nvml)
    return {**record, "time": now(), "waited_s": waited.waited_s, "gpus": [dataclasses.asdict(g) for g in waited.gpus],
            "held": list(waited.held)}


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - shutting down changes nothing recorded
        return


def record_path(run_dir: Path, node: str) -> Path:
    return Path(run_dir) / f"{RECORD_PREFIX}{node}.json"


# --- in the launcher -------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Reclaimed:
    """What the nodes' helpers found: GPUs still held (evidence), each node's wait, nodes that did not report
    (no evidence either way), and why the step did not finish ("" when it did)."""

    held: tuple[GpuHold, ...] = ()
    waited_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    unread: tuple[str, ...] = ()
    why: str = ""

    @property
    def held_nodes(self) -> set[str]:
        return {hold.node for hold in self.held}

    def event(self) -> dict[str, Any]:
        """The ``gpu_reclaim`` event's fields."""
        return {"nodes": sorted(self.waited_s), "waited_s": dict(sorted(self.waited_s.items())),
                "held": [dataclasses.asdict(h) for h in self.held], "unread": list(self.unread),
                **({"why": self.why} if self.why else {})}


def helper_argv(nodes: Sequence[str], run_dir: Path, attempt: int, config: ReclaimConfig) -> list[str]:
    """One helper task on each node, beside whatever of the attempt is still ending there."""
    return ["srun", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
            f"--nodelist={','.join(nodes)}", "--overlap", "--quiet", "--kill-on-bad-exit=0",
            sys.executable, "-m", "slurm_ft.launch.reclaim", "--run-dir", str(run_dir), "--attempt", str(attempt),
            "--timeout", f"{config.timeout_s:g}", "--tolerance-mb", str(config.tolerance_mb)]


def read_records(run_dir: Path, nodes: Sequence[str], attempt: int) -> Reclaimed:
    """The helpers' records of ``attempt`` for ``nodes`` (a node without one is unread)."""
    held: list[GpuHold] = []
    waited: dict[str, float] = {}
    unread = []
    for node in nodes:
        data = _read_record(record_path(run_dir, node))
        if data is None or data.get("node") != node or data.get("attempt") != attempt:
            unread.append(node)
            continue
        waited[node] = float(data.get("waited_s") or 0.0)
        held += _holds_of(data, node)
    return Reclaimed(held=tuple(held), waited_s=waited, unread=tuple(unread))


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _holds_of(data: Mapping[str, Any], node: str) -> list[GpuHold]:
    found = []
    gpus = {g.get("index"): g for g in data.get("gpus", ()) if isinstance(g, dict)}
    for index in data.get("held", ()):
        if not isinstance(index, int) or isinstance(index, bool):
            continue
        gpu = gpus.get(index, {})
        found.append(GpuHold(node=node, gpu_index=index, uuid=str(gpu.get("uuid") or ""),
                             pci_bus=str(gpu.get("pci_bus") or ""), pids=tuple(int(p) for p in gpu.get("pids") or ()),
                             used_mb=gpu.get("used_mb"), waited_s=float(data.get("waited_s") or 0.0)))
    return found


def reclaim_on_nodes(nodes: Sequence[str], run_dir: Path, attempt: int, environ: Mapping[str, str],
                     config: ReclaimConfig = ReclaimConfig()) -> Reclaimed:
    """Run the helpers on ``nodes`` and read what they found."""
    why = ""
    try:
        done = subprocess.run(helper_argv(nodes, run_dir, attempt, config), env=dict(environ),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=config.timeout_s + config.slack_s, check=False)
        if done.returncode != 0:
            why = f"helpers exit {done.returncode}: {done.stderr.strip()[-200:]}"
    except subprocess.TimeoutExpired:
        why = f"the per-node helpers did not finish within {config.timeout_s + config.slack_s:g}s"
    except OSError as exc:
        why = f"no srun to run the per-node helpers: {exc}"
    return dataclasses.replace(read_records(run_dir, nodes, attempt), why=why)


def gpus_in_use(run_dir: Path, environ: Mapping[str, str]) -> bool:
    """Whether the attempt may have used GPUs: a rank recorded its binding, or Slurm gave the job GPUs. A CPU job
    then runs no helpers at all."""
    if records.read_gpu_bindings(run_dir):
        return True
    return any(environ.get(name, "") not in ("", "NoDevFiles") for name in
               ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS_ON_NODE"))


# --- CLI (the per-node helper) -----------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_ft.launch.reclaim", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--attempt", required=True, type=int)
    parser.add_argument("--timeout", type=float, default=ReclaimConfig().timeout_s)
    parser.add_argument("--tolerance-mb", type=int, default=ReclaimConfig().tolerance_mb)
    args = parser.parse_args(argv)
    try:
        config = ReclaimConfig(timeout_s=args.timeout, tolerance_mb=args.tolerance_mb)
    except ValueError as exc:
        parser.error(str(exc))
    node = records.node_name()
    nvml, note = job_nvml(node)
    if note:
        print(f"slurm-ft: {note}", file=sys.stderr)
    record = on_node(args.run_dir, node, args.attempt, config, nvml)
    records.write_json_atomic(record_path(args.run_dir, node), record)
    for index in record["held"]:
        print(f"slurm-ft: {node} GPU {index} still holds the failed attempt's processes after "
              f"{record['waited_s']:g}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
