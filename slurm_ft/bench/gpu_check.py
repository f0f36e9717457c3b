"""The checks ``device/check_gpu.sh`` runs on a GPU node, one subcommand each, each ending in one summary line
``check_gpu: <name>: ok|FAIL|skip: <what it saw>`` and writing ``<name>.json`` under ``--out``:

- ``reclaim``: a CUDA process SIGKILLed mid-kernel (a matmul loop queued on the GPU, 2 GiB held); how long until
  NVML stops listing it (``slurm_ft.launch.reclaim.wait_released``, as the launcher's helper waits) and until the
  GPU's memory is back to what it was before;
- ``fsdp``: a 1-GPU FSDP2 trainer with slurm-ft's checkpoint manager, SIGKILLed mid-run and resumed: its final
  parameters bitwise equal to an uninterrupted run's (``train`` is that trainer, one process per run);
- ``fr``: the flight recorder on NCCL (``TORCH_FR_BUFFER_SIZE``, set by the script): the dump after some
  collectives lists them.

Every check also runs on CPU (``--device cpu``: gloo, no NVML needed for ``fsdp`` and ``fr``): the unit tests
run them there; ``reclaim`` takes its NVML and child as arguments (a fake NVML in the tests).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_ft.health.nvml import gpu_identity, gpu_use
from slurm_ft.launch.reclaim import ReclaimConfig, wait_released

HOLD_MB = 2048
CHILD = """
import sys, torch
hold = torch.empty(int(sys.argv[1]) * 2**18, device="cuda")   # MiB of float32
x = torch.randn(8192, 8192, device="cuda")
for i in range(1000000):  # kernels queued back to back: the SIGKILL lands inside one
    x = (x @ x) / 8192.0
    if i == 64:
        print("ready", flush=True)
"""


def line(name: str, status: str, detail: str) -> str:
    """The check's one summary line."""
    return f"check_gpu: {name}: {status}: {detail}"


def _write(out: Path, name: str, data: Mapping[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- reclaim -----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Reclaim:
    """One kill: was the process listed, how long until reaped, unlisted (NVML), memory back to the baseline."""

    listed: bool
    held_mb: int | None
    reaped_s: float
    unlisted_s: float | None  # None: still listed at the bound
    memory_back_s: float | None  # None: not back within the bound


def measure_reclaim(nvml: Any, start_child: Callable[[], Any], device: str, *, bound_s: float = 30.0,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> Reclaim:
    """Start the child (it holds memory and runs kernels on ``device``), SIGKILL it, and time the release."""
    nvml.nvmlInit()
    try:
        index = (gpu_identity(nvml, device) or (0, "", ""))[0]
        baseline = _used(nvml, index)
        child = start_child()
        seen = _use(nvml, index)
        listed = child.pid in (seen.pids or ())
        killed = clock()
        child.kill()
        child.wait()
        reaped = clock() - killed
        waited = wait_released(lambda: [_use(nvml, index)], {child.pid}, set(), ReclaimConfig(timeout_s=bound_s),
                               clock=clock, sleep=sleep)
        back = _memory_back(nvml, index, baseline, killed, bound_s, clock, sleep)
    finally:
        nvml.nvmlShutdown()
    return Reclaim(listed=listed, held_mb=None if seen.used_mb is None or baseline is None else seen.used_mb - baseline,
                   reaped_s=round(reaped, 3), unlisted_s=None if waited.held else round(reaped + waited.waited_s, 3),
                   memory_back_s=back)


def _use(nvml: Any, index: int) -> Any:
    return gpu_use(nvml)[index]


def _used(nvml: Any, index: int) -> int | None:
    return _use(nvml, index).used_mb


def _memory_back(nvml: Any, index: int, baseline: int | None, since: float, bound_s: float,
                 clock: Callable[[], float], sleep: Callable[[float], None]) -> float | None:
    """Seconds from ``since`` until the GPU uses at most 256 MiB more than ``baseline``; None past the bound."""
    while True:
        used = _used(nvml, index)
        if baseline is not None and used is not None and used <= baseline + 256:
            return round(clock() - since, 3)
        if clock() - since >= bound_s or baseline is None or used is None:
            return None
        sleep(0.05)


def cuda_child(hold_mb: int = HOLD_MB) -> subprocess.Popen:
    """The CUDA process to kill: holds ``hold_mb`` and queues matmuls; returns once they run ("ready")."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(hold_mb)], stdout=subprocess.PIPE, text=True)
    if child.stdout.readline().strip() != "ready":
        child.kill()
        raise RuntimeError(f"the CUDA child did not start (exit {child.wait()})")
    return child


def reclaim_check(out: Path) -> tuple[str, int]:
    from slurm_ft.health.nvml import load_pynvml
    from slurm_ft.launch.gpus import nvml_device

    nvml = load_pynvml()
    if nvml is None:
        return line("reclaim", "skip", "pynvml (nvidia-ml-py) not installed"), 0
    found = measure_reclaim(nvml, cuda_child, nvml_device(os.environ) or "0")
    _write(out, "reclaim", dataclasses.asdict(found))
    return reclaim_line(found)


def reclaim_line(found: Reclaim) -> tuple[str, int]:
    """Pure: the summary line and exit code of one measured kill."""
    detail = (f"SIGKILL mid-kernel ({found.held_mb} MiB held): reaped {found.reaped_s:g} s, NVML stopped listing it "
              f"after {_secs(found.unlisted_s)}, memory back after {_secs(found.memory_back_s)}")
    if not found.listed:
        return line("reclaim", "FAIL", "NVML never listed the CUDA process (a PID namespace NVML does not share?); "
                    + detail), 1
    ok = found.unlisted_s is not None and found.memory_back_s is not None
    return line("reclaim", "ok" if ok else "FAIL", detail), 0 if ok else 1


def _secs(value: float | None) -> str:
    return "never (within the bound)" if value is None else f"{value:g} s"


# --- fsdp: a 1-GPU FSDP2 trainer, killed and resumed --------------------------------------------------------------
def train(args: argparse.Namespace) -> int:
    """One run of the trainer: FSDP2 over a 1-rank group, slurm-ft's checkpoint manager, deterministic batches by
    step, ``--crash-at`` SIGKILLs the process after that step; prints ``{"step", "param_sha256", "resumed_from"}``."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    model, optimizer = _fsdp_model(device)
    mgr = _manager(args.ckpt_dir, model, optimizer)
    start = mgr.resume()
    for step in range(start + 1, args.steps + 1):
        x, y = _batch(step, device)
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        mgr.maybe_save(step)
        if step == args.crash_at:
            mgr.wait()  # the save of this step is committed: the kill loses nothing the resume needs
            os.kill(os.getpid(), signal.SIGKILL)
    mgr.close()
    from slurm_ft.train.example import param_sha256

    print(json.dumps({"step": args.steps, "param_sha256": param_sha256(model), "resumed_from": start}), flush=True)
    dist.destroy_process_group()
    return 0


def _fsdp_model(device: Any) -> tuple[Any, Any]:
    import torch
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)).to(device)
    mesh = init_device_mesh(device.type, (1,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _manager(ckpt_dir: str, model: Any, optimizer: Any) -> Any:
    from slurm_ft.train.checkpoint import CheckpointConfig, CheckpointManager

    return CheckpointManager(CheckpointConfig(dir=ckpt_dir, every=3, keep_last=2, async_save=True, adopt=True),
                             model=model, optimizer=optimizer)


def _batch(step: int, device: Any) -> tuple[Any, Any]:
    import torch

    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(32, 64, generator=gen)
    return x.to(device), x.sum(dim=1, keepdim=True).to(device)


def _run_trainer(device: str, ckpt: Path, steps: int, crash_at: int | None, timeout_s: float) -> tuple[int, str]:
    argv = [sys.executable, "-m", "slurm_ft.bench.gpu_check", "train", "--device", device, "--ckpt-dir", str(ckpt),
            "--steps", str(steps), *(["--crash-at", str(crash_at)] if crash_at else [])]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "SLURM_FT_RUN_ID": "gpu-check"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    return done.returncode, done.stdout + done.stderr


def result_of(text: str) -> dict[str, Any] | None:
    """The trainer's last JSON line in ``text``, or None."""
    for raw in reversed(text.splitlines()):
        if raw.startswith("{") and "param_sha256" in raw:
            return json.loads(raw)
    return None


def fsdp_check(out: Path, device: str, steps: int = 12, crash_at: int = 7, timeout_s: float = 90.0) -> tuple[str, int]:
    """An uninterrupted run, then a run SIGKILLed after step ``crash_at`` and its resume: the same parameters."""
    runs = {}
    shutil.rmtree(out / "fsdp", ignore_errors=True)
    for name, crash in (("reference", None), ("killed", crash_at), ("resumed", None)):
        ckpt = out / "fsdp" / ("reference" if name == "reference" else "killed")
        runs[name] = _run_trainer(device, ckpt, steps, crash, timeout_s / 3)
    _write(out, "fsdp", {name: {"exit": code, "tail": text[-2000:]} for name, (code, text) in runs.items()})
    return fsdp_line(runs)


def fsdp_line(runs: Mapping[str, tuple[int, str]]) -> tuple[str, int]:
    """Pure: the summary of the three runs (exit code, output)."""
    reference, resumed = result_of(runs["reference"][1]), result_of(runs["resumed"][1])
    killed = runs["killed"][0]
    if killed != -signal.SIGKILL:
        return line("fsdp", "FAIL", f"the killed run ended with {killed}, not SIGKILL"), 1
    if reference is None or resumed is None:
        which = "reference" if reference is None else "resumed"
        return line("fsdp", "FAIL", f"the {which} run gave no result: {runs[which][1].strip()[-200:]}"), 1
    same = reference["param_sha256"] == resumed["param_sha256"]
    detail = (f"killed at a step, resumed from step {resumed['resumed_from']}: parameters "
              f"{'bitwise equal to' if same else 'DIFFERENT from'} the uninterrupted run's "
              f"(sha256 {resumed['param_sha256'][:12]})")
    ok = same and resumed["resumed_from"] > 0  # it did resume from the killed run's checkpoint
    return line("fsdp", "ok" if ok else "FAIL", detail), 0 if ok else 1


# --- fr: the flight recorder ------------------------------------------------------------------------------------
def flight_recorder(device: str, collectives: int = 5) -> dict[str, Any]:
    """A 1-rank group (NCCL on cuda, gloo on cpu) runs ``collectives`` all-reduces; its flight recorder's dump."""
    import torch
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    tensor = torch.ones(1024, device="cuda" if device == "cuda" else "cpu")
    for _ in range(collectives):
        dist.all_reduce(tensor)
    if device == "cuda":
        torch.cuda.synchronize()
    dump = getattr(c10d, "_dump_nccl_trace", None) if backend == "nccl" else None
    raw = (dump or c10d._dump_fr_trace)(True, True, False)
    dist.destroy_process_group()
    return pickle.loads(raw)


def fr_line(trace: Mapping[str, Any], backend: str, wanted: int) -> tuple[str, int]:
    """Pure: whether the dump lists the ``wanted`` all-reduces of ``backend``."""
    names = [str(e.get("profiling_name", "")) for e in trace.get("entries", ())]
    found = sum(1 for n in names if n == f"{backend}:all_reduce")
    detail = (f"TORCH_FR_BUFFER_SIZE={os.environ.get('TORCH_FR_BUFFER_SIZE', 'unset')}: {len(names)} entries, "
              f"{found} {backend}:all_reduce of {wanted}")
    return line("fr", "ok" if found >= wanted else "FAIL", detail), 0 if found >= wanted else 1


def fr_check(out: Path, device: str) -> tuple[str, int]:
    trace = flight_recorder(device)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fr_trace.pkl").write_bytes(pickle.dumps(trace))
    _write(out, "fr", {"entries": len(trace.get("entries", ())), "version": trace.get("version")})
    return fr_line(trace, "nccl" if device == "cuda" else "gloo", 5)


# --- CLI --------------------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_ft.bench.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=("reclaim", "fsdp", "fr", "train"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/slurm-ft-gpu-check")))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--ckpt-dir")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--crash-at", type=int)
    parser.add_argument("--timeout", type=float, default=90.0, help="fsdp: seconds for its three runs together")
    args = parser.parse_args(argv)
    if args.check == "train":
        return train(args)
    if args.check == "reclaim":
        text, code = reclaim_check(args.out)
    elif args.check == "fsdp":
        text, code = fsdp_check(args.out, args.device, timeout_s=args.timeout)
    else:
        text, code = fr_check(args.out, args.device)
    print(text, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
