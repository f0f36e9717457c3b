"""One contract suite for every SlurmClient backend that can run here, against the real lab cluster."""

from __future__ import annotations

import os
import subprocess

import pytest
from labutil import cancel, lab_env, output_of, submit, wait_for, wait_job

from slurm_ft.core.errors import SlurmCommandError
from slurm_ft.slurm.backend import backend_for
from slurm_ft.slurm.cli_backend import CliSlurmClient
from slurm_ft.slurm.formats import release
from slurm_ft.slurm.types import JobState, SlurmClient

pytestmark = pytest.mark.lab

PYSLURM_IN_CI = (25, 11)  # .ci/install-slurm-vendor builds pyslurm for the vendored 25.11
NODE = "n4"  # the node the drain tests borrow (resumed afterwards)


@pytest.fixture(params=["cli", "pyslurm"])
def client(request, lab, monkeypatch) -> SlurmClient:
    if request.param == "cli":
        return CliSlurmClient(env=lab.env())
    monkeypatch.setenv("SLURM_CONF", str(lab.conf_path))  # pyslurm reads the process's SLURM_CONF
    version = CliSlurmClient(env=lab.env()).version()
    picked, why = backend_for(version)
    if picked != "pyslurm":
        if os.environ.get("CI", "").lower() in ("1", "true", "yes") and release(version) >= PYSLURM_IN_CI:
            pytest.fail(f"CI installs pyslurm for Slurm {version}, but {why}", pytrace=False)
        pytest.skip(f"pyslurm backend cannot run here: {why}")
    from slurm_ft.slurm.pyslurm_backend import PyslurmClient

    return PyslurmClient()


def _sinfo(lab, node):
    out = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T|%E"], env=lab_env(lab), capture_output=True,
                         text=True, timeout=30, check=True).stdout.strip()
    state, _, reason = out.partition("|")
    return state, reason


def _running(lab, client, *sbatch_args):
    """Submit a sleeper and wait until its script really runs (RUNNING is reported while the prolog still runs)."""
    job_id = submit(lab, "echo started\nexec sleep 300\n", "-N1", *sbatch_args)
    wait_for(lambda: "started" in output_of(lab, job_id), 60, message=f"job {job_id} script started")
    assert client.job(job_id).state is JobState.RUNNING
    return job_id


def test_jobs_and_nodes_are_batched_reads(lab, client):
    job_id = _running(lab, client, "-J", "contract-read")
    try:
        jobs = {j.job_id: j for j in client.jobs()}
        job = jobs[job_id]
        assert job.name == "contract-read" and job.state is JobState.RUNNING
        assert len(job.nodes) == 1 and job.nodes[0] in lab.node_names
        assert job.user_id == os.geteuid() and job.requeue and job.exit_code is None
        nodes = {n.name: n for n in client.nodes()}
        assert set(lab.node_names) <= set(nodes)
        assert not nodes[job.nodes[0]].idle  # it runs a job
    finally:
        cancel(lab, job_id)
    job = wait_job(lab, job_id, [JobState.CANCELLED], timeout=30)
    if release(client.version()) < (24, 11):
        assert job.exit_signal is not None  # 22.05 reports scancel's signal; 25.11 reports ExitCode=0:0
    assert job.exit_code is not None  # an ended job has an exit code on every release


def test_drain_shows_in_sinfo_with_reason_then_resume(lab, client):
    reason = f"slurm-ft: contract test {type(client).__name__} (xid 79)"
    client.drain(NODE, reason)
    try:
        state, shown = wait_for(lambda: (s := _sinfo(lab, NODE))[0].startswith("drain") and s, 15,
                                message=f"{NODE} drained")
        assert shown == reason
        node = next(n for n in client.nodes() if n.name == NODE)
        assert node.drained and node.reason == reason
    finally:
        client.resume(NODE)
    wait_for(lambda: _sinfo(lab, NODE)[0] == "idle", 15, message=f"{NODE} idle again")
    assert next(n for n in client.nodes() if n.name == NODE).idle


def test_requeue_counts_a_restart(lab, client):
    job_id = _running(lab, client, "-J", "contract-requeue")
    try:
        client.requeue(job_id)
        job = wait_for(lambda: (j := client.job(job_id)) is not None and j.restart_count == 1 and j, 20,
                       message=f"job {job_id} restart count 1")
        # Back in the queue, held off by the credential lifetime (~120 s) before it may start again.
        job = wait_for(lambda: (j := client.job(job_id)).state is JobState.PENDING and j.reason == "BeginTime"
                       and j, 20, message=f"job {job_id} pending again, waiting for its requeue delay")
        assert job.restart_count == 1
    finally:
        cancel(lab, job_id)


def test_requeuehold_then_release(lab, client):
    job_id = _running(lab, client, "-J", "contract-hold")
    try:
        client.requeue(job_id, hold=True)
        held = wait_for(lambda: (j := client.job(job_id)) is not None and j.state is JobState.PENDING
                        and "held" in j.reason.lower() and j, 20, message=f"job {job_id} held")
        assert held.restart_count == 1
        client.release(job_id)
        released = wait_for(lambda: (j := client.job(job_id)) is not None and "held" not in j.reason.lower() and j,
                            20,
                            message=f"job {job_id} released")
        assert released.restart_count == 1
    finally:
        cancel(lab, job_id)


def test_update_comment_and_excluded_nodes(lab, client):
    job_id = submit(lab, "true\n", "-N1", "--hold", "-J", "contract-update")
    try:
        client.update_job(job_id, comment="slurm-ft: resume_step=47832 note=a b", excluded_nodes=("n4", "n3"))
        job = client.job(job_id)
        assert job.comment == "slurm-ft: resume_step=47832 note=a b"
        assert job.excluded_nodes == ("n3", "n4")
        shown = subprocess.run(["scontrol", "show", "job", str(job_id)], env=lab_env(lab), capture_output=True,
                               text=True, timeout=30, check=True).stdout
        assert "ExcNodeList=n[3-4]" in shown
        client.update_job(job_id, excluded_nodes=())
        assert client.job(job_id).excluded_nodes == ()
    finally:
        cancel(lab, job_id)


def test_failures_raise_slurm_command_error(lab, client):
    with pytest.raises(SlurmCommandError, match="nosuchnode|Invalid node"):
        client.drain("nosuchnode", "slurm-ft: x")
    with pytest.raises(SlurmCommandError, match="Invalid job id|999999"):
        client.requeue(999999)


def test_the_checkpoint_owner_check_reads_from_squeue_whether_a_job_has_ended(lab, monkeypatch):
    """``slurm_job_active`` (a resubmitted job takes over the checkpoint dir of one that has ended): running is
    active; ended (listed as such on 22.05, hidden on 25.11) and never-known ids are not."""
    from slurm_ft.train.checkpoint import slurm_job_active

    monkeypatch.setenv("SLURM_CONF", str(lab.conf_path))
    job_id = submit(lab, "echo started\nexec sleep 300\n", "-N1")
    try:
        wait_for(lambda: "started" in output_of(lab, job_id), 60, message=f"job {job_id} script started")
        assert slurm_job_active(str(job_id)) is True
        cancel(lab, job_id)
        wait_for(lambda: slurm_job_active(str(job_id)) is False, 60, message=f"job {job_id} seen ended")
        assert slurm_job_active("999999") is False
        monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")
        assert slurm_job_active(str(job_id)) is None  # Slurm cannot say: the owner keeps its dir
    finally:
        cancel(lab, job_id)
