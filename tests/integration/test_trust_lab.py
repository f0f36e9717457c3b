"""Issue 16 on the real lab, with a job run by a non-root user (created here when missing): a user's forged error
files name other nodes with a GPU fault, and a symlink planted as its checkpoint's COMMITTED points at
/proc/kmsg. The root monitor judges the job, drains and strikes no node, does not block on the symlink, and never
takes the planted step as the resume step."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from labutil import cancel, jobs_dir, lab_env, wait_job

from slurm_ft.core.registry import FtJob, write_registration
from slurm_ft.slurm.types import JobState

pytestmark = pytest.mark.lab

USER = "slurmft-test"
FORGED = "CUDA error: uncorrectable ECC error encountered"


@pytest.fixture(scope="module")
def user() -> pwd.struct_passwd:
    """A plain user for the job (root runs the monitor, as in production)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a user and run the monitor as root")
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        pass
    if shutil.which("useradd") is None:
        pytest.skip("no useradd on this host")
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", USER], check=True, timeout=30)
    return pwd.getpwnam(USER)


def _submit_as(lab, user: pwd.struct_passwd, script: str, *args: str) -> int:
    """sbatch as ``user`` from a directory the user owns."""
    home = Path(tempfile.mkdtemp(prefix="user-", dir=jobs_dir(lab)))
    os.chown(home, user.pw_uid, user.pw_gid)
    path = home / "job.sh"
    path.write_text("#!/bin/sh\n" + script)
    os.chown(path, user.pw_uid, user.pw_gid)
    path.chmod(0o755)
    done = subprocess.run(["sbatch", "--parsable", *args, str(path)], cwd=home, env=lab_env(lab), user=user.pw_uid,
                          group=user.pw_gid, extra_groups=[], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().split(";")[0])


def _forging_script(ckpt: Path) -> str:
    """Writes error files that blame n2, n3, n4 (never in the job) and a COMMITTED symlink, then fails."""
    records = "".join(
        f"printf '%s' '{json.dumps({'rank': rank, 'time': 1.0 + rank, 'exc_type': 'RuntimeError', 'message': FORGED, 'host': host, 'pid': 1})}'"
        f" > {ckpt}/.slurm-ft/error.rank{rank}.json\n"
        for rank, host in enumerate(("n2", "n3", "n4")))
    return (f"mkdir -p {ckpt}/.slurm-ft {ckpt}/step_00000099\n{records}"
            f"ln -s /proc/kmsg {ckpt}/step_00000099/COMMITTED\n"
            f"echo 'Node failure on n3' >&2\nexit 1\n")


def test_a_users_forged_files_drain_no_node_and_do_not_stall_the_monitor(lab, user):
    state = Path(tempfile.mkdtemp(prefix="state-", dir=jobs_dir(lab)))
    ckpt = Path(tempfile.mkdtemp(prefix="ck-forged-", dir=jobs_dir(lab)))
    os.chown(ckpt, user.pw_uid, user.pw_gid)
    client = lab.client()
    drained_before = {n.name for n in client.nodes() if n.drained}
    job = _submit_as(lab, user, _forging_script(ckpt), "-N1", "-w", "n1", "-J", "forged")
    try:
        info = wait_job(lab, job, [JobState.FAILED, JobState.COMPLETED, JobState.CANCELLED], timeout=60)
        assert info.state is JobState.FAILED and info.user_id == user.pw_uid
        assert (ckpt / ".slurm-ft" / "error.rank0.json").stat().st_uid == user.pw_uid  # the user's word
        write_registration(state, FtJob(job_id=job, ckpt_dir=str(ckpt), run_dir=str(ckpt / ".slurm-ft"),
                                        max_restarts=0, user_id=user.pw_uid))  # as the prolog would, as root
        done = subprocess.run([sys.executable, "-m", "slurm_ft.cli", "monitor", "--once", "--state-dir", str(state)],
                              env=lab_env(lab), capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-3000:]  # returned: did not block in /proc/kmsg
        events = [json.loads(line.split(": ", 1)[1]) for line in done.stderr.splitlines()
                  if "slurm_ft.cluster.monitor" in line]
        [failed] = [e for e in events if e.get("event") == "job_failed" and e.get("job_id") == job]
        assert failed["resume_step"] is None  # the planted step 99 is no committed step
        # no node's own evidence: nothing struck for this job, no drain on its word (a monitor with a fresh state
        # also judges the lab's earlier slurm-ft jobs, found by their Comment: their strikes are not this job's)
        assert not [e for e in events if e.get("event") == "node_strike" and e.get("job_id") == job], events
        forged_drains = {n.name for n in client.nodes() if n.drained and "ECC" in n.reason} - drained_before
        assert forged_drains == set()
    finally:
        cancel(lab, job)
