"""Preemption on the lab: ``--signal=B:USR1@N`` reaches ``slurm-ft launch`` (``scancel --batch --signal=USR1`` is
what Slurm then does), the ranks make their emergency save, the job requeues itself with ``cause=preemption`` and
the exact step, and the next run resumes from it and ends with the uninterrupted run's parameters."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from labutil import (
    cancel,
    jobs_dir,
    lab_env,
    output_of,
    result_line,
    submit,
    torchrun_reference_sha,
    wait_for,
    wait_job,
)

from slurm_ft.core.comment import parse_resume_step
from slurm_ft.core.rundir import read_heartbeats
from slurm_ft.health.jobfiles import latest_step
from slurm_ft.slurm.types import JobState

pytestmark = pytest.mark.lab

STEPS, SEED = 30, 3
TRAINER = [sys.executable, "-m", "slurm_ft.train.example", "--steps", str(STEPS), "--seed", str(SEED), "--sync"]




@pytest.fixture(scope="module")
def reference_sha(tmp_path_factory) -> str:
    return torchrun_reference_sha(tmp_path_factory.mktemp("reference"), [*TRAINER[3:], "--ckpt-every", "1000"])


def test_sigusr1_saves_requeues_with_the_exact_step_and_resumes_bitwise(lab, reference_sha):
    ckpt = Path(tempfile.mkdtemp(prefix="ck-preempt-", dir=jobs_dir(lab)))
    # no periodic checkpoint: the only one is the emergency save, so the resume step is exactly where it stopped
    script = (f"exec {sys.executable} -m slurm_ft.cli launch --hang-timeout 120 -- {' '.join(TRAINER)}"
              " --ckpt-every 1000 --step-time 0.3\n")
    job = submit(lab, script, "-N2", "-J", "preempt", "--ft", f"--ft-ckpt-dir={ckpt}", "--ft-max-restarts=0")
    client = lab.client()
    try:
        wait_for(lambda: max((b.step for b in read_heartbeats(ckpt / ".slurm-ft")), default=0) >= 5, 120,
                 message="5 steps")
        subprocess.run(["scancel", "--batch", "--signal=USR1", str(job)], env=lab_env(lab), check=True, timeout=30)
        requeued = wait_for(lambda: (lambda j: j if j and j.restart_count == 1 else None)(client.job(job)), 60,
                            message="the job to requeue itself")
        saved = latest_step(str(ckpt))
        assert saved is not None and 5 <= saved < STEPS
        assert requeued.comment.startswith(f"slurm-ft: restart=1 resume_step={saved} cause=preemption by=launch")
        assert parse_resume_step(requeued.comment) == saved
        # --ft-max-restarts=0: a preemption uses no restart, so the job runs again
        done = wait_job(lab, job, [JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED], timeout=180)
        assert done.state is JobState.COMPLETED, output_of(lab, job)[-3000:]
        result = result_line(output_of(lab, job))
        assert result["resumed_from"] == saved and result["step"] == STEPS
        assert result["param_sha256"] == reference_sha
        events = [json.loads(line) for line in (ckpt / ".slurm-ft" / "events.jsonl").read_text().splitlines()]
        kinds = [e["event"] for e in events]
        assert "signal_forwarded" in kinds and "preempted" in kinds
        assert [e["resume_step"] for e in events if e["event"] == "attempt_start"][-1] == saved
    finally:
        cancel(lab, job)
