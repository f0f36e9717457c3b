"""Pure Slurm parsers on literal text and on output recorded from the lab cluster (Slurm 22.05.8)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_ft.slurm import parsers
from slurm_ft.slurm.types import JobState

DATA = Path(__file__).resolve().parents[2] / "data" / "slurm"

SQUEUE_SNIPPET = """
{"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "errors": [],
 "jobs": [
  {"job_id": 41, "name": "train", "user_id": 1000, "user_name": "ada", "job_state": "RUNNING",
   "state_reason": "None", "nodes": "gpu[01-02]", "exit_code": 0, "restart_cnt": 0, "comment": "",
   "excluded_nodes": "", "requeue": true, "batch_flag": true, "current_working_directory": "/home/ada",
   "standard_output": "", "standard_error": ""},
  {"job_id": 42, "name": "exit3", "user_id": 0, "job_state": "FAILED", "state_reason": "NonZeroExitCode",
   "nodes": "n1", "exit_code": 768, "restart_cnt": 2, "comment": "slurm-ft: step=47832 a=b c",
   "excluded_nodes": "n[3-4]", "requeue": false, "batch_flag": true, "current_working_directory": "/w",
   "standard_output": "/logs/%x-%j.out", "standard_error": "err-%j.txt"},
  {"job_id": 43, "name": "killed", "job_state": "FAILED", "state_reason": "JobLaunchFailure",
   "nodes": "n2", "exit_code": 9},
  {"job_id": 44, "name": "cancelled", "job_state": "CANCELLED", "nodes": "n3", "exit_code": 15},
  {"job_id": 45, "name": "segv-in-bash", "job_state": "FAILED", "nodes": "n3", "exit_code": 35584},
  {"job_id": 46, "name": "core", "job_state": "FAILED", "nodes": "n3", "exit_code": 134}
 ]}
"""


def _by_id(jobs):
    return {j.job_id: j for j in jobs}


def test_squeue_snippet_fields():
    jobs = _by_id(parsers.parse_squeue_json(SQUEUE_SNIPPET))
    train = jobs[41]
    assert train.state is JobState.RUNNING and train.reason == ""
    assert train.nodes == ("gpu01", "gpu02")
    assert train.user_id == 1000 and train.requeue
    assert (train.exit_code, train.exit_signal) == (None, None)  # still running: no exit status yet
    assert train.std_out == train.std_err == "/home/ada/slurm-41.out"  # Slurm's default
    failed = jobs[42]
    assert failed.state is JobState.FAILED and failed.reason == "NonZeroExitCode"
    assert (failed.exit_code, failed.exit_signal) == (3, None)
    assert failed.restart_count == 2 and not failed.requeue
    assert failed.comment == "slurm-ft: step=47832 a=b c"
    assert failed.excluded_nodes == ("n3", "n4")
    assert failed.std_out == "/logs/exit3-42.out" and failed.std_err == "/w/err-42.txt"


@pytest.mark.parametrize(("job_id", "expected"), [
    (43, (0, 9)),      # wait status 9: killed by SIGKILL (scontrol: ExitCode=0:9)
    (44, (0, 15)),     # scancel: SIGTERM
    (45, (139, None)),  # bash exited 139 after its child's SIGSEGV: an exit code, not a signal
    (46, (0, 6)),      # 134 = 0x80 (core dumped) | SIGABRT
])
def test_exit_status_decoding(job_id, expected):
    job = _by_id(parsers.parse_squeue_json(SQUEUE_SNIPPET))[job_id]
    assert (job.exit_code, job.exit_signal) == expected


def test_decode_exit_later_slurm_shape():
    assert parsers.decode_exit({"status": ["SIGNALED"], "return_code": {"set": True, "number": 0},
                                "signal": {"id": {"set": True, "number": 9}, "name": "KILL"}}) == (0, 9)
    assert parsers.decode_exit({"status": ["ERROR"], "return_code": {"set": True, "number": 3},
                                "signal": {"id": {"set": False, "number": 0}}}) == (3, None)
    assert parsers.decode_exit(None) == (None, None)


def test_squeue_later_shapes_are_tolerated():
    text = json.dumps({"jobs": [{"job_id": {"set": True, "number": 7}, "job_state": ["PENDING", "REQUEUED"],
                                 "state_reason": "BeginTime", "restart_cnt": {"set": True, "number": 1},
                                 "user_id": 5}]})
    (job,) = parsers.parse_squeue_json(text)
    assert job.job_id == 7 and job.state is JobState.REQUEUED and job.restart_count == 1  # the flag, as Slurm reads it


def test_unknown_state_maps_to_unknown():
    (job,) = parsers.parse_squeue_json('{"jobs": [{"job_id": 1, "job_state": "WEIRD"}]}')
    assert job.state is JobState.UNKNOWN


@pytest.mark.parametrize("text", ["", "not json", "[]", '{"jobs": {"a": 1}}', '{"jobs": [{"name": "x"}]}',
                                  '{"errors": [{"error": "Unable to contact slurm controller"}]}'])
def test_squeue_bad_input_is_a_clear_error(text):
    with pytest.raises(ValueError, match="squeue --json"):
        parsers.parse_squeue_json(text)


def test_recorded_squeue_22_05():
    jobs = _by_id(parsers.parse_squeue_json((DATA / "squeue-22.05-mixed.json").read_text()))
    assert jobs[1].state is JobState.RUNNING and jobs[1].nodes == ("n1", "n2") and jobs[1].batch_host == "n1"
    assert jobs[4].batch_host == ""  # pending: no batch host yet
    assert (jobs[2].state, jobs[2].exit_code, jobs[2].exit_signal) == (JobState.FAILED, 3, None)
    assert (jobs[3].exit_code, jobs[3].exit_signal) == (0, 9)
    requeued = jobs[4]  # scontrol requeue'd while running, submitted with --comment, -x n4, --output
    assert requeued.state is JobState.PENDING and requeued.reason == "BeginTime"
    assert requeued.restart_count == 1
    assert requeued.comment == "slurm-ft: resume_step=47832 note=a b"
    assert requeued.excluded_nodes == ("n4",)
    assert requeued.std_out == "/tmp/lab-slurm-jobs/out-4.txt"
    assert (jobs[5].state, jobs[5].exit_signal) == (JobState.CANCELLED, 15)
    assert (jobs[6].state, jobs[6].exit_code, jobs[6].exit_signal) == (JobState.COMPLETED, 0, None)
    assert jobs[8].reason == "JobHeldUser"


SINFO_SNIPPET = """
{"nodes": [
 {"name": "n1", "state": "mixed", "state_flags": [], "reason": ""},
 {"name": "n3", "state": "idle", "state_flags": ["DRAIN"], "reason": "slurm-ft: xid 79 (gpu fell off the bus)"},
 {"name": "n4", "state": "down", "state_flags": ["NOT_RESPONDING"], "reason": "Not responding"},
 {"name": "n5", "state": "allocated", "state_flags": ["DRAIN"], "reason": "slurm-ft: ecc"},
 {"name": "n1", "state": "mixed", "state_flags": [], "reason": ""}
]}
"""


def test_sinfo_snippet_states_and_reasons():
    nodes = {n.name: n for n in parsers.parse_sinfo_json(SINFO_SNIPPET)}
    assert list(nodes) == ["n1", "n3", "n4", "n5"]  # n1 listed twice (two partitions): once here
    assert nodes["n1"].state == {"MIXED"} and not nodes["n1"].idle
    assert nodes["n3"].drained and not nodes["n3"].idle and nodes["n3"].reason.startswith("slurm-ft: xid 79")
    assert nodes["n4"].down and "NOT_RESPONDING" in nodes["n4"].state
    assert nodes["n5"].drained and "ALLOCATED" in nodes["n5"].state  # draining: busy, no new jobs


def test_sinfo_later_shape_state_list():
    (node,) = parsers.parse_sinfo_json('{"nodes": [{"name": "a", "state": ["IDLE", "DRAIN"], "reason": "x"}]}')
    assert node.state == {"IDLE", "DRAIN"} and node.drained


def test_recorded_sinfo_22_05():
    nodes = {n.name: n for n in parsers.parse_sinfo_json((DATA / "sinfo-22.05-drain-down.json").read_text())}
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]
    assert nodes["n3"].drained and nodes["n3"].reason == "slurm-ft: xid 79 (gpu fell off the bus)"
    assert nodes["n4"].down and nodes["n4"].reason == "Not responding"


SCONTROL_JOB = """JobId=42 JobName=train run
   UserId=ada(1000) GroupId=ada(1000) MCS_label=N/A
   JobState=PENDING Reason=BeginTime Dependency=(null)
   Requeue=1 Restarts=1 BatchFlag=1 Reboot=0 ExitCode=0:9
   AllocNode:Sid=login1:3360 ReqB:S:C:T=0:0:*:*
   ReqNodeList=(null) ExcNodeList=n[3-4]
   TRES=cpu=4,mem=1000M,node=2,billing=4
   Comment=slurm-ft: resume_step=47832 note=a b
   StdOut=/home/ada/run 1/slurm-42.out
"""


def test_scontrol_show_job_keeps_values_with_spaces():
    rec = parsers.parse_scontrol_show(SCONTROL_JOB)
    assert rec["JobId"] == "42" and rec["JobName"] == "train run"
    assert rec["Restarts"] == "1" and rec["ExitCode"] == "0:9"
    assert rec["ExcNodeList"] == "n[3-4]" and rec["TRES"] == "cpu=4,mem=1000M,node=2,billing=4"
    assert rec["Comment"] == "slurm-ft: resume_step=47832 note=a b"
    assert rec["StdOut"] == "/home/ada/run 1/slurm-42.out"
    assert rec["AllocNode:Sid"] == "login1:3360" and rec["ReqB:S:C:T"] == "0:0:*:*"


def test_scontrol_show_one_liner():
    rec = parsers.parse_scontrol_show("NodeName=n3 Arch=x86_64 State=IDLE+DRAIN Reason=bad gpu [root@2024-05-01]")
    assert rec == {"NodeName": "n3", "Arch": "x86_64", "State": "IDLE+DRAIN", "Reason": "bad gpu [root@2024-05-01]"}


def test_recorded_scontrol_show_node_and_job():
    nodes = parsers.parse_scontrol_show_all((DATA / "scontrol-show-node-22.05.txt").read_text())
    assert [n["NodeName"] for n in nodes] == ["n1", "n2", "n3", "n4"]
    n3 = nodes[2]
    assert n3["State"] == "IDLE+DRAIN" and n3["OS"].startswith("Linux ")
    assert parsers.split_node_reason(n3["Reason"])[:2] == ("slurm-ft: xid 79 (gpu fell off the bus)", "root")
    jobs = {j["JobId"]: j for j in parsers.parse_scontrol_show_all((DATA / "scontrol-show-job-22.05.txt").read_text())}
    assert jobs["4"]["Restarts"] == "1" and jobs["4"]["ExcNodeList"] == "n4"
    assert jobs["3"]["ExitCode"] == "0:9" and jobs["2"]["ExitCode"] == "3:0"


def test_split_node_reason_without_suffix():
    assert parsers.split_node_reason("plain") == ("plain", "", "")


@pytest.mark.parametrize(("text", "names"), [
    ("n[1-3,5]", ["n1", "n2", "n3", "n5"]),
    ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
    ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
    ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
    ("n7", ["n7"]),
    ("", []),
    ("(null)", []),
])
def test_expand_hostlist(text, names):
    assert parsers.expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["n[1-", "n1]", "n[3-1]", "n[a-b]"])
def test_expand_hostlist_rejects_bad_input(text):
    with pytest.raises(ValueError, match="hostlist"):
        parsers.expand_hostlist(text)


@pytest.mark.parametrize(("names", "text"), [
    (["n1", "n2", "n3", "n5"], "n[1-3,5]"),
    (["n5", "n1", "n2", "n1"], "n[1-2,5]"),
    (["gpu01", "gpu02"], "gpu[01-02]"),
    (["login", "n4"], "login,n4"),
    ([], ""),
])
def test_compress_hostlist(names, text):
    assert parsers.compress_hostlist(names) == text


def test_hostlist_round_trip():
    names = ["n1", "n2", "n3", "n9", "n10", "n11", "x"]
    assert sorted(parsers.expand_hostlist(parsers.compress_hostlist(names))) == sorted(names)


def test_parse_version():
    assert parsers.parse_version("slurm 22.05.8\n") == "22.05.8"
    with pytest.raises(ValueError):
        parsers.parse_version("nothing here")


def test_hostlist_round_trip_property():
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as st

    @hypothesis.given(st.sets(st.integers(min_value=0, max_value=300), max_size=40),
                      st.sampled_from(["n", "gpu-", "rack1-node"]))
    @hypothesis.settings(max_examples=60, deadline=None)
    def check(numbers, prefix):
        names = [f"{prefix}{i}" for i in numbers]
        assert sorted(parsers.expand_hostlist(parsers.compress_hostlist(names))) == sorted(names)

    check()
