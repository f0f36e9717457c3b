"""The monitor on the lab: a node's slurmd dies under a registered job. Slurm (JobRequeue=1) requeues the batch
job itself; the monitor's next poll adopts that requeue: the dead node goes into ExcNodeList and the resume hint
into the Comment, and nothing is requeued a second time."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from labutil import cancel, jobs_dir, lab_env, submit, wait_for, wait_job

from slurm_ft.monitor import FtJob, write_registration

pytestmark = pytest.mark.lab


def _monitor_once(env: dict[str, str], state) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "slurm_ft.cli", "monitor", "--once", "--state-dir", str(state)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return [json.loads(line.split(": ", 1)[1]) for line in done.stderr.splitlines() if "slurm_ft.monitor:" in line]


def test_node_failure_requeues_once_excluding_the_node(lab, tmp_path):
    state = jobs_dir(lab) / f"state-{tmp_path.name}"
    env = lab_env(lab)
    job_id = submit(lab, "sleep 300\n", "-N2", "-J", "mon-nodefail", env=env)
    try:
        job = wait_job(lab, job_id, ["RUNNING"], timeout=60)
        write_registration(state, FtJob(job_id=job_id, max_restarts=2, user_id=os.getuid()))
        _monitor_once(env, state)  # the monitor sees it running, on which nodes
        victim = job.nodes[-1]
        lab.stop_node(victim)
        try:
            ended = wait_job(lab, job_id, ["NODE_FAIL", "FAILED", "PENDING"], timeout=90)
            assert ended.state.value == "PENDING" and ended.restart_count == 1, ended  # requeued by Slurm
            events = _monitor_once(env, state)
            assert [e["event"] for e in events if e.get("job_id") == job_id][-1] == "job_requeued", events
            info = wait_for(lambda: (j := lab.client().job(job_id)) and j.restart_count == 1 and j, 30)
            assert info.comment.startswith("slurm-ft: restart=1 resume_step=none cause=")
            assert victim in info.excluded_nodes
            assert info.state.value == "PENDING"
            again = _monitor_once(env, state)
            assert not [e for e in again if e.get("event") == "job_requeued"]
        finally:
            lab.start_node(victim)
    finally:
        cancel(lab, job_id)
