"""The CLI backend through a fake runner: exact argument lists (never a shell), one read call per poll, errors."""

from __future__ import annotations

import json

import pytest

from slurm_ft.core.errors import SlurmCommandError
from slurm_ft.slurm.cli_backend import CliSlurmClient
from slurm_ft.slurm.runner import CommandResult, run_command
from slurm_ft.slurm.types import JobState, SlurmClient

SQUEUE = json.dumps({"jobs": [
    {"job_id": 7, "name": "a", "job_state": "RUNNING", "nodes": "n[1-2]", "exit_code": 0, "restart_cnt": 0},
    {"job_id": 8, "name": "b", "job_state": "FAILED", "nodes": "n3", "exit_code": 256, "restart_cnt": 1},
]})
SINFO = json.dumps({"nodes": [{"name": "n1", "state": "idle", "state_flags": [], "reason": ""}]})


class FakeRunner:
    def __init__(self, outputs=None, returncode=0, stderr=""):
        self.calls = []
        self.outputs = outputs or {}
        self.returncode = returncode
        self.stderr = stderr

    def __call__(self, argv, *, env=None, timeout=30.0):
        self.calls.append((tuple(argv), env))
        stdout = self.outputs.get(argv[0], "")
        return CommandResult(argv=tuple(argv), returncode=self.returncode, stdout=stdout, stderr=self.stderr)


@pytest.fixture()
def runner():
    return FakeRunner({"squeue": SQUEUE, "sinfo": SINFO, "scontrol": "slurm 22.05.8\n"})


def _argv(runner):
    return [call[0] for call in runner.calls]


def test_is_a_slurm_client(runner):
    assert isinstance(CliSlurmClient(runner=runner), SlurmClient)


VERSION_CALL = ("scontrol", "--version")  # once per client: it picks the JSON generation


def test_jobs_is_one_squeue_call_with_env(runner):
    client = CliSlurmClient(env={"SLURM_CONF": "/lab/slurm.conf"}, runner=runner)
    jobs = client.jobs()
    assert [j.job_id for j in jobs] == [7, 8] and jobs[1].exit_code == 1
    assert _argv(runner) == [VERSION_CALL, ("squeue", "--all", "--json")]
    assert runner.calls[1][1]["SLURM_CONF"] == "/lab/slurm.conf"
    assert "PATH" in runner.calls[1][1]  # overrides go on top of os.environ


def test_job_filters_the_batched_read(runner):
    client = CliSlurmClient(runner=runner)
    assert client.job(8).state is JobState.FAILED
    assert client.job(99) is None
    assert _argv(runner) == [VERSION_CALL] + [("squeue", "--all", "--json")] * 2


def test_nodes_is_one_sinfo_call(runner):
    assert [n.name for n in CliSlurmClient(runner=runner).nodes()] == ["n1"]
    assert _argv(runner) == [VERSION_CALL, ("sinfo", "--all", "--json")]


def test_actions_pass_argument_lists(runner):
    client = CliSlurmClient(runner=runner)
    client.drain("n3", "slurm-ft: xid 79; rm -rf / $(reboot)")
    client.resume("n3")
    client.requeue(8)
    client.requeue(8, hold=True)
    client.release(8)
    client.cancel(8)
    client.update_job(8, comment="slurm-ft: resume_step=100", excluded_nodes=("n3", "n1", "n2"))
    client.update_job(8, excluded_nodes=())
    client.update_job(8)  # nothing to change: no call
    assert _argv(runner) == [
        ("scontrol", "update", "NodeName=n3", "State=DRAIN", "Reason=slurm-ft: xid 79; rm -rf / $(reboot)"),
        ("scontrol", "update", "NodeName=n3", "State=RESUME"),
        ("scontrol", "requeue", "8"),
        ("scontrol", "requeuehold", "8"),
        ("scontrol", "release", "8"),
        ("scancel", "8"),
        ("scontrol", "update", "JobId=8", "Comment=slurm-ft: resume_step=100", "ExcNodeList=n[1-3]"),
        ("scontrol", "update", "JobId=8", "ExcNodeList="),
    ]


def test_version(runner):
    assert CliSlurmClient(runner=runner).version() == "22.05.8"


@pytest.mark.parametrize(("call", "match"), [
    (lambda c: c.drain("n1 State=DOWN", "x"), "node"),
    (lambda c: c.drain("", "x"), "node"),
    (lambda c: c.drain("n1", "two\nlines"), "reason"),
    (lambda c: c.requeue(0), "job_id"),
    (lambda c: c.requeue("7"), "job_id"),
    (lambda c: c.release(True), "job_id"),
    (lambda c: c.cancel(-3), "job_id"),
    (lambda c: c.update_job(7, comment="a\nb"), "comment"),
    (lambda c: c.update_job(7, excluded_nodes=("n1,", "x y")), "node"),
])
def test_bad_arguments_never_reach_slurm(runner, call, match):
    with pytest.raises(ValueError, match=match):
        call(CliSlurmClient(runner=runner))
    assert runner.calls == []


def test_failure_raises_slurm_command_error_with_command_and_stderr():
    runner = FakeRunner(returncode=1, stderr="slurm_update error: Invalid node name specified\n")
    with pytest.raises(SlurmCommandError) as info:
        CliSlurmClient(runner=runner).drain("zz", "x")
    text = str(info.value)
    assert "scontrol update NodeName=zz State=DRAIN Reason=x" in text
    assert "Invalid node name specified" in text and info.value.exit_code == 3


def test_real_runner_reports_missing_program_and_timeout():
    missing = run_command(["slurm-ft-no-such-program-xyz"])
    assert missing.returncode == 127 and not missing.ok
    slow = run_command(["sleep", "5"], timeout=0.2)
    assert slow.returncode == 124 and "timed out" in slow.stderr
    ok = run_command(["printf", "%s", "a b; $(x)"])
    assert ok.ok and ok.stdout == "a b; $(x)"  # no shell: metacharacters are plain text
