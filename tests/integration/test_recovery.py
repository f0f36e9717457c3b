"""End to end on the lab: ``slurm-ft launch`` in a 2-node sbatch job, faults injected by (rank, step).

- a rank killed with SIGKILL mid-run: the launcher restarts in place and the final parameters are bitwise the
  same as an uninterrupted run's (run side by side on the other two nodes);
- a user-code error: one attempt only, and ``slurm-ft monitor --once`` leaves the job stopped with the verdict
  in its Comment.

A hung (SIGSTOPped) rank and node death are in test_recovery_node.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from labutil import cancel, jobs_dir, lab_env, output_of, result_line, submit, wait_job

from slurm_ft.cluster.status import read_status

pytestmark = pytest.mark.lab

STEPS = 16
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def _script(ckpt: Path, *trainer_args: str, first_attempt_only: str = "", hang_timeout: int = 120) -> str:
    """The batch script. ``first_attempt_only``: trainer flags given only on the launcher's first attempt
    (the example trainer re-fires ``--crash-at`` after resuming from an earlier checkpoint)."""
    trainer = " ".join([sys.executable, "-m", "slurm_ft.train.example", "--steps", str(STEPS), "--ckpt-every", "4",
                        "--seed", "3", "--sync", *trainer_args])
    if first_attempt_only:
        trainer = (f"/bin/bash -c 'if [ \"$SLURM_FT_ATTEMPT\" = 1 ]; then x=\"{first_attempt_only}\"; fi;"
                   f" exec {trainer} $x'")
    return (f"export SLURM_FT_CKPT_DIR={ckpt}\n"
            f"exec {sys.executable} -m slurm_ft.cli launch --hang-timeout {hang_timeout} --startup-grace 30 --max-restarts 2"
            f" -- {trainer}\n")


def _fresh(lab, prefix: str) -> Path:
    """A new directory in the lab's jobs dir (a reused lab, SLURM_FT_LAB_DIR, keeps earlier runs' files)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=jobs_dir(lab)))
    path.chmod(0o755)
    return path




def _events(ckpt: Path) -> list[dict]:
    return [json.loads(line) for line in (ckpt / ".slurm-ft" / "events.jsonl").read_text().splitlines()]


def test_rank_crash_recovers_in_place_bitwise(lab):
    state = _fresh(lab, "state-")
    env = lab_env(lab, SLURM_FT_STATE_DIR=str(state))
    crash_ckpt, clean_ckpt = _fresh(lab, "ck-crash-"), _fresh(lab, "ck-clean-")
    crashed = submit(lab, _script(crash_ckpt, first_attempt_only="--crash-at 1:10"), "-N2", "-J", "rec-crash", env=env)
    clean = submit(lab, _script(clean_ckpt), "-N2", "-J", "rec-clean", env=env)
    try:
        a = wait_job(lab, crashed, TERMINAL, timeout=180)
        b = wait_job(lab, clean, TERMINAL, timeout=180)
        assert a.state.value == "COMPLETED", output_of(lab, crashed)[-3000:]
        assert b.state.value == "COMPLETED", output_of(lab, clean)[-3000:]
        got, want = result_line(output_of(lab, crashed)), result_line(output_of(lab, clean))
        assert got["step"] == want["step"] == STEPS
        assert got["param_sha256"] == want["param_sha256"]
        kinds = [e["event"] for e in _events(crash_ckpt)]
        assert kinds.count("attempt_start") == 2 and "restart_in_place" in kinds
        assert _events(clean_ckpt)[-1] == {**_events(clean_ckpt)[-1], "event": "exit", "code": 0}
        registered = json.loads((state / "jobs" / f"{crashed}.json").read_text())
        assert registered["ckpt_dir"] == str(crash_ckpt)
    finally:
        cancel(lab, crashed, clean)


def test_user_error_stops_after_one_attempt_with_verdict(lab):
    state = _fresh(lab, "state-")
    env = lab_env(lab, SLURM_FT_STATE_DIR=str(state))
    ckpt = _fresh(lab, "ck-fail-")
    job_id = submit(lab, _script(ckpt, "--fail-at", "1:5"), "-N2", "-J", "rec-fail", env=env)
    try:
        info = wait_job(lab, job_id, TERMINAL, timeout=180)
        assert info.state.value == "FAILED", output_of(lab, job_id)[-3000:]
        attempts = [e["event"] for e in _events(ckpt)].count("attempt_start")
        assert attempts == 1  # user code: not restarted in place
        done = subprocess.run([sys.executable, "-m", "slurm_ft.cli", "monitor", "--once", "--state-dir", str(state)],
                              env=env, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        events = [json.loads(line.split(": ", 1)[1]) for line in done.stderr.splitlines()
                  if "slurm_ft.cluster.monitor" in line]
        failed = [e for e in events if e.get("event") == "job_failed" and e.get("job_id") == job_id]
        assert len(failed) == 1, done.stderr[-4000:]
        assert failed[0]["verdict"]["category"] == "user_code" and not failed[0]["requeue"]
        acts = [a for a in read_status(state)["actions"] if a["job_id"] == job_id]
        assert [(a["action"], a["state"]) for a in acts] == [("stop", "done")]  # the monitor's verdict, once
        # the launcher wrote the verdict while the job ran (Slurm 22.05 refuses Comment updates once it ended)
        comment = lab.client().job(job_id).comment
        assert comment.startswith("slurm-ft: stopped cause=user_code by=launch"), comment
        assert "InjectedFault" in comment
        assert lab.client().job(job_id).state.value == "FAILED"  # not requeued
        # the monitor's final word where the user looks, though Slurm refuses to change an ended job's Comment
        assert "slurm-ft: stopped by the monitor: cause=user_code: " in output_of(lab, job_id)
        assert _events(ckpt)[-1]["event"] == "stopped" and _events(ckpt)[-1]["by"] == "monitor"
    finally:
        cancel(lab, job_id)
