"""The prolog gate and epilog reports on the real lab cluster.

The bad node is made with the TEST-ONLY injection that ``lab_install`` enables (``[health] test_mode`` and
``test_nvml_snapshot_dir = <lab>/test-nvml``): a recorded NVML snapshot with Xid 79 in ``<node>.json`` replaces
the probe on that node. Production configs refuse the knob unless ``test_mode = true``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from labutil import jobs_dir, lab_env, output_of, submit, wait_for, wait_job

from slurm_ft.slurm.types import JobState

pytestmark = pytest.mark.lab

XID79 = Path(__file__).parent.parent / "data" / "nvml" / "xid79.snapshot.json"
REQUEUE_WAIT_S = 240  # Slurm holds a requeued job back ~120 s (the credential lifetime) before it may restart


def quarantine_cli(lab, *args: str) -> subprocess.CompletedProcess[str]:
    config = lab.dir / "etc" / "slurm-ft" / "config.toml"
    return subprocess.run([sys.executable, "-m", "slurm_ft.cli", "quarantine", "--config", str(config), *args],
                          env=lab_env(lab), capture_output=True, text=True, timeout=60, check=False)


def report(lab, job: int, name: str) -> dict:
    return json.loads((lab.dir / "state" / "reports" / str(job) / name).read_text())


def prolog_record(lab, job: int, node: str) -> dict:
    return json.loads((lab.dir / "state" / "prolog" / str(job) / f"{node}.json").read_text())


def test_healthy_node_passes_and_epilog_gathers_error_files(lab) -> None:
    ckpt = lab.dir / "jobs" / "ckpt-epilog"
    script = (f"mkdir -p {ckpt}/.slurm-ft\n"
              f"echo '{{\"rank\": 0, \"time\": 5.0, \"exc_type\": \"RuntimeError\", \"message\": \"boom\"}}' "
              f"> {ckpt}/.slurm-ft/error.rank0.json\n"
              "exit 3\n")
    job = submit(lab, script, "-N1", f"--ft-ckpt-dir={ckpt}")
    info = wait_job(lab, job, [JobState.FAILED, JobState.COMPLETED], timeout=60)
    node = info.nodes[0]
    assert prolog_record(lab, job, node)["passed"] is True
    got = wait_for(lambda: (lab.dir / "state" / "reports" / str(job) / f"{node}.json").exists(), 30,
                   message="the epilog's node report")
    assert got
    data = report(lab, job, f"{node}.json")
    assert (data["job_id"], data["node"], data["exit_code"]) == (job, node, 3)
    assert [(e["rank"], e["message"]) for e in data["error_files"]] == [(0, "boom")]
    assert data["nvml"]["available"] is False and data["nvml"]["error"].startswith("nvml unavailable")


@pytest.mark.slow  # ~2 min: the requeue delay
def test_bad_node_fails_the_prolog_is_drained_and_the_job_runs_elsewhere(lab) -> None:
    client = lab.client()
    nodes = client.nodes()
    idle = sorted(n.name for n in nodes if n.idle)
    assert len(idle) >= 2, f"need two idle nodes, have {idle}"
    victim = idle[0]  # with the busy nodes excluded the scheduler starts on the first idle node
    busy = [n.name for n in nodes if not n.idle]
    snapshot = lab.dir / "test-nvml" / f"{victim}.json"  # TEST-ONLY injection
    snapshot.write_text(XID79.read_text())
    try:
        extra = [f"--exclude={','.join(busy)}"] if busy else []
        job = submit(lab, "echo ran-on=$SLURMD_NODENAME\n", "-N1", "--ft", f"--ft-ckpt-dir={jobs_dir(lab)}", *extra)

        def drained():
            # Slurm 25.11 shows its own "Prolog error" while the failed job completes, then the reason slurm-ft set.
            info = next(n for n in client.nodes() if n.name == victim)
            return info if info.drained and info.reason != "Prolog error" else None

        info = wait_for(drained, 60, message=f"{victim} to be drained")
        assert info.reason.startswith("slurm-ft: hardware_gpu: Xid 79 on gpu 1: GPU has fallen off the bus."), \
            info.reason
        prolog = prolog_record(lab, job, victim)
        assert prolog["passed"] is False and prolog["findings"][0]["check"] == "xid"
        registered = json.loads((lab.dir / "state" / "jobs" / f"{job}.json").read_text())
        assert registered["job_id"] == job  # --ft: the monitor's registry entry, written by the prolog

        done = wait_job(lab, job, [JobState.COMPLETED], timeout=REQUEUE_WAIT_S)
        ran_on = output_of(lab, job).strip()
        assert ran_on.startswith("ran-on=") and ran_on != f"ran-on={victim}"
        assert done.restart_count >= 1

        listed = json.loads(quarantine_cli(lab, "list", "--json").stdout)
        assert {r["node"]: r["state"] for r in listed}[victim] == "quarantined"
    finally:
        snapshot.unlink(missing_ok=True)
        released = quarantine_cli(lab, "release", victim)
    assert released.returncode == 0, released.stderr
    back = wait_for(lambda: next(n for n in client.nodes() if n.name == victim and not n.drained), 30,
                    message=f"{victim} to be resumed")
    assert back.reason == "", back
    listed = json.loads(quarantine_cli(lab, "list", "--json").stdout)
    assert {r["node"]: r["state"] for r in listed}[victim] == "healthy"


def test_an_unusable_checkpoint_dir_stops_the_job_and_drains_no_node(lab) -> None:
    """Issue 16: one `sbatch --ft-ckpt-dir=/proc/...` drained every node in turn (prolog exit 1, requeue, next)."""
    client = lab.client()
    drained_before = {n.name for n in client.nodes() if n.drained}
    job = submit(lab, "sleep 1\n", "-N1", "--ft-ckpt-dir=/proc/nonexistent/ckpt")
    info = wait_job(lab, job, [JobState.CANCELLED, JobState.COMPLETED, JobState.FAILED], timeout=60)
    assert info.state is JobState.CANCELLED and info.restart_count == 0
    assert info.comment.startswith("slurm-ft: stopped cause=storage by=prolog"), info.comment
    assert "checkpoint dir /proc" in info.comment
    assert {n.name for n in client.nodes() if n.drained} == drained_before
    record = prolog_record(lab, job, info.nodes[0])
    assert record["passed"] is True and record["job_findings"][0]["check"] == "space"
