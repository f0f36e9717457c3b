"""GPU node readiness on the lab, with the nodes' TEST-ONLY fake NVML (``slurm_ft.lab.gpus``): two ranks per node
on the two fake GPUs Slurm's ``--gres`` would give the step (``CUDA_VISIBLE_DEVICES=0,1``).

- a rank SIGKILLed whose GPU keeps its process for 2 s after the launcher's helper starts looking: the launcher
  waits for it (on that node, through NVML), then restarts in place, every rank on the same GPU as before;
- a rank SIGKILLed whose GPU keeps it for good: at the bound the verdict is ``hardware_gpu`` naming that node and
  GPU, the node is swapped for the spare, and the moved ranks report their new GPU; the job finishes there;
- every rank got its own GPU by SLURM_LOCALID and NCCL's fault settings, the user's own value kept.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from labutil import (
    cancel,
    jobs_dir,
    lab_env,
    output_of,
    result_line,
    submit,
    wait_for,
    wait_job,
)

from slurm_ft.core.rundir import read_events, read_gpu_bindings, read_heartbeats
from slurm_ft.lab import gpus as lab_gpus
from slurm_ft.lab import procs
from slurm_ft.lab.faults import training_processes

pytestmark = pytest.mark.lab

STEPS = 24
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


@pytest.fixture
def fake_gpus(lab):
    lab_gpus.install(lab)
    yield
    lab_gpus.remove(lab)


def _script(ckpt: Path, *, spares: int = 0, standby: bool = True) -> str:
    trainer = " ".join([sys.executable, "-m", "slurm_ft.train.example", "--steps", str(STEPS), "--ckpt-every", "4",
                        "--seed", "3", "--sync", "--step-time", "0.3"])
    return (f"export SLURM_FT_CKPT_DIR={ckpt} CUDA_VISIBLE_DEVICES=0,1 TORCH_NCCL_ENABLE_MONITORING=0\n"
            f"exec {sys.executable} -m slurm_ft.cli launch --ntasks-per-node 2 --spare-nodes {spares} "
            f"{'' if standby else '--no-standby '}--hang-timeout 120 --startup-grace 120 --max-restarts 2 --probe-timeout 5 --gpu-reclaim-timeout 8 "
            f"-- {trainer}\n")


def _fresh(lab, prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=jobs_dir(lab)))
    path.chmod(0o755)
    return path


def _trained_to(run_dir: Path, step: int):
    return lambda: len([b for b in read_heartbeats(run_dir) if b.step >= step]) == 4


def _helper_started(job_id: int) -> bool:
    """The launcher's reclaim helper runs on a node of job ``job_id``."""
    for pid in procs.all_pids():
        if "slurm_ft.launch.reclaim" in procs.cmdline(pid):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            if f"SLURM_JOB_ID={job_id}\0".encode() in environ:
                return True
    return False


def _rank_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().partition("=")[::2] for item in raw.split(b"\0") if b"=" in item)


def _by_attempt(run_dir: Path, attempt: int) -> dict[int, tuple[str, int, str]]:
    return {b.rank: (b.host, b.index, b.uuid) for b in read_gpu_bindings(run_dir / f"attempt-{attempt}")}


def test_a_gpu_held_2s_is_waited_for_then_the_ranks_restart_on_their_gpus(lab, fake_gpus):
    ckpt = _fresh(lab, "ck-gpu2s-")
    run_dir = ckpt / ".slurm-ft"
    # cold restarts: half the processes on the lab's shared cores (the swap test below restarts warm)
    job = submit(lab, _script(ckpt, standby=False), "-N2", "--ntasks-per-node=2", "-J", "gpu-2s", env=lab_env(lab))
    try:
        wait_for(_trained_to(run_dir, 6), 300, message="4 ranks past step 6")
        ranks = {p.rank: p for p in training_processes(lab, job)}
        envs = {r: _rank_env(p.pid) for r, p in ranks.items()}
        assert {r: e["CUDA_VISIBLE_DEVICES"] for r, e in envs.items()} == {0: "0", 1: "1", 2: "0", 3: "1"}
        assert all(e["SLURM_FT_STEP_DEVICES"] == "0,1" for e in envs.values())
        assert all(e["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3" and e["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "60"
                   for e in envs.values())
        assert all(e["TORCH_NCCL_ENABLE_MONITORING"] == "0" for e in envs.values())  # the user's, kept
        pid, node, gpu = lab_gpus.hold_and_kill(lab, job, 3, seconds=None)
        assert gpu == 1
        released = threading.Thread(target=lambda: (wait_for(lambda: _helper_started(job), 60, interval=0.05),
                                                    lab_gpus.release(lab, node, pid, after=2.5)), daemon=True)
        released.start()
        info = wait_job(lab, job, TERMINAL, timeout=480)
        assert info.state.value == "COMPLETED", output_of(lab, job)[-3000:]
        assert result_line(output_of(lab, job))["step"] == STEPS
        events = read_events(run_dir)
        waits = [e for e in events if e["event"] == "gpu_reclaim"]
        assert len(waits) == 1 and waits[0]["held"] == [] and sorted(waits[0]["nodes"]) == sorted(info.nodes)
        assert 0.25 <= waits[0]["waited_s"][node] < 8  # it looked again at least once (a free GPU: 0 s), not 8 s
        record = json.loads((run_dir / "attempt-1" / f"reclaim.{node}.json").read_text())
        assert [(g["index"], g["pids"]) for g in record["gpus"]] == [(gpu, [])] and record["held"] == []
        kinds = [e["event"] for e in events]
        assert "restart_in_place" in kinds and "spare_swap" not in kinds
        verdict = next(e for e in events if e["event"] == "verdict")["verdict"]
        assert verdict["category"] != "hardware_gpu"
        now = {b.rank: (b.host, b.index, b.uuid) for b in read_gpu_bindings(run_dir)}
        assert now == _by_attempt(run_dir, 1) and len(now) == 4  # the same GPU per rank after the restart
        assert "the GPU changed since the last attempt" not in output_of(lab, job)
    finally:
        cancel(lab, job)


def test_a_gpu_held_for_good_is_named_and_its_node_swapped_for_the_spare(lab, fake_gpus):
    ckpt = _fresh(lab, "ck-gpuheld-")
    run_dir = ckpt / ".slurm-ft"
    job = submit(lab, _script(ckpt, spares=1), "-N3", "--ntasks-per-node=2", "-J", "gpu-held", env=lab_env(lab))
    try:
        wait_for(_trained_to(run_dir, 6), 300, message="4 ranks past step 6")
        pid, node, gpu = lab_gpus.hold_and_kill(lab, job, 3, seconds=None)
        info = wait_job(lab, job, TERMINAL, timeout=480)
        assert info.state.value == "COMPLETED", output_of(lab, job)[-3000:]
        events = read_events(run_dir)
        wait = next(e for e in events if e["event"] == "gpu_reclaim")
        assert [(h["node"], h["gpu_index"], h["pids"]) for h in wait["held"]] == [(node, gpu, [pid])]
        assert wait["waited_s"][node] >= 8
        verdict = next(e for e in events if e["event"] == "verdict")["verdict"]
        assert verdict["category"] == "hardware_gpu" and verdict["culprit"]["nodes"] == [node]
        assert f"{node} GPU {gpu} " in verdict["evidence"][0]
        assert next(e for e in events if e["event"] == "spare_swap")["out"] == [node]
        second = next(e for e in events if e["event"] == "attempt_start" and e["attempt"] == 2)
        assert node not in second["nodes"]
        before = _by_attempt(run_dir, 1)
        after = {b.rank: (b.host, b.index, b.uuid) for b in read_gpu_bindings(run_dir)}
        moved = sorted(r for r in after if after[r] != before[r])
        assert moved == [2, 3] and [after[r][1] for r in (2, 3)] == [0, 1]  # same local binding on the spare
        out = output_of(lab, job)
        for rank in (2, 3):
            assert f"the GPU changed since the last attempt: rank {rank}: GPU {node} GPU {rank - 2}" in out
        assert result_line(out)["gpu_changed"] == []  # rank 0 kept its GPU
    finally:
        cancel(lab, job)
