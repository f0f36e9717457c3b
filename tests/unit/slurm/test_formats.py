"""The JSON generations per Slurm release: v0.0.42 read from output recorded on the real 25.11 lab, the format
choice by version, the fallback when a release drops the pinned format, and clear errors for unknown shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_ft.core.errors import SlurmFormatError
from slurm_ft.slurm import formats, json_v0042, parsers
from slurm_ft.slurm.cli_backend import CliSlurmClient
from slurm_ft.slurm.runner import CommandResult
from slurm_ft.slurm.types import JobState

DATA = Path(__file__).resolve().parents[2] / "data" / "slurm"
SQUEUE_25_11 = (DATA / "squeue-25.11-v0.0.42-mixed.json").read_text()
SINFO_25_11 = (DATA / "sinfo-25.11-v0.0.42-drain-down.json").read_text()


def test_recorded_squeue_25_11_every_state_slurm_ft_acts_on():
    jobs = {j.job_id: j for j in json_v0042.parse_squeue(SQUEUE_25_11, "25.11.7")}
    assert jobs[1].state is JobState.COMPLETED and (jobs[1].exit_code, jobs[1].exit_signal) == (0, None)
    assert jobs[2].state is JobState.FAILED and (jobs[2].exit_code, jobs[2].exit_signal) == (3, None)
    assert jobs[2].reason == "NonZeroExitCode" and jobs[2].nodes == ("n1",)
    assert jobs[3].state is JobState.FAILED and (jobs[3].exit_code, jobs[3].exit_signal) == (0, 9)
    requeued = jobs[4]
    assert requeued.state is JobState.RUNNING and requeued.restart_count == 1 and requeued.requeue  # started again
    assert requeued.comment == "restart=1 resume_step=40 cause=hardware_gpu"
    assert requeued.excluded_nodes == ("n3",)
    assert requeued.std_out == "/tmp/slurm-4.out" and requeued.std_err == "/tmp/slurm-4.out"
    assert jobs[5].state is JobState.PENDING and jobs[5].nodes == ()
    assert jobs[6].state is JobState.CANCELLED
    assert {j.user_id for j in jobs.values()} == {0}


def test_a_job_whose_epilog_still_runs_is_completing_as_pyslurm_says_not_yet_failed():
    """Recorded on the real 25.11 lab: ``["FAILED", "COMPLETING"]`` while the epilog runs. pyslurm (Slurm's
    job_state_string) says COMPLETING; reading the base state made the CLI monitor judge the job before the epilog
    wrote its evidence, and the two backends disagree for that moment (a lab test failed on it in CI)."""
    (job,) = json_v0042.parse_squeue((DATA / "squeue-25.11-v0.0.42-completing.json").read_text(), "25.11.7")
    assert job.state is JobState.COMPLETING and not job.state.finished
    assert (job.exit_code, job.exit_signal) == (1, None)


@pytest.mark.parametrize("states, word", [
    (["FAILED"], "FAILED"), (["PENDING", "REQUEUED"], "REQUEUED"), (["PENDING", "EXPEDITING"], "EXPEDITING"),
    (["RUNNING", "CONFIGURING"], "CONFIGURING"), (["PENDING", "RESV_DEL_HOLD"], "RESV_DEL_HOLD"),
])
def test_state_flags_are_read_as_slurms_job_state_string_reads_them(states, word):
    record = {"job_id": 7, "job_state": states}
    job = parsers.parse_job_record(record)
    assert job.state.value == word and not (job.state.finished and word != "FAILED")


def test_recorded_sinfo_25_11_one_record_per_node_with_its_own_reason():
    nodes = {n.name: n for n in json_v0042.parse_sinfo(SINFO_25_11, "25.11.7")}
    assert sorted(nodes) == ["n1", "n2", "n3"]
    assert nodes["n2"].state == {"IDLE", "DRAIN"} and nodes["n2"].reason == "slurm-ft: test drain"
    assert "DOWN" in nodes["n3"].state
    assert nodes["n1"].reason == ""


def test_a_resumed_nodes_stale_reason_is_not_its_reason():
    """25.11 keeps the last reason after State=RESUME; the quarantine must not read it as a live drain."""
    entry = {"nodes": {"nodes": ["n1"]}, "node": {"state": ["IDLE"]},
             "reason": {"description": "slurm-ft: hardware_gpu: Xid 79", "time": 1, "user": "root"}}
    drained = {**entry, "node": {"state": ["IDLE", "DRAIN"]}}
    (resumed,) = json_v0042.parse_sinfo(json.dumps({"sinfo": [entry]}), "25.11.7")
    (still,) = json_v0042.parse_sinfo(json.dumps({"sinfo": [drained]}), "25.11.7")
    assert resumed.reason == "" and still.reason == "slurm-ft: hardware_gpu: Xid 79"


def test_the_22_05_adapter_finds_nothing_it_reads_in_25_11_json_and_says_so():
    """Before the v0.0.42 adapter, 25.11's JSON gave an empty node list: the lab and the monitor saw nothing."""
    with pytest.raises(SlurmFormatError, match=r"Slurm 25.11.7 sinfo --json: no 'nodes' list"):
        parsers.parse_sinfo_json(SINFO_25_11, "25.11.7")


@pytest.mark.parametrize("text, field", [
    ('{"jobs": [{"job_id": 1}]}', "job_state"),
    ('{"sinfo": [{"node": {"state": ["IDLE"]}}]}', "nodes"),
    ('{"sinfo": [{"nodes": {"nodes": ["n1"]}, "node": {}}]}', "node.state"),
    ('{"nodes": []}', "no 'sinfo' list"),
])
def test_unknown_v0042_shapes_name_the_version_and_the_field(text, field):
    parse = json_v0042.parse_squeue if '"jobs"' in text else json_v0042.parse_sinfo
    with pytest.raises(SlurmFormatError, match=r"Slurm 26\.05\.1 .*--json=v0\.0\.42") as info:
        parse(text, "26.05.1")
    assert field in str(info.value)


@pytest.mark.parametrize("version, name, squeue", [
    ("22.05.8", "v0.0.38", ("squeue", "--all", "--json")),
    ("23.11.10", "default", ("squeue", "--all", "--states=all", "--json")),
    ("24.11.5", "v0.0.42", ("squeue", "--all", "--states=all", "--json=v0.0.42")),
    ("25.11.7", "v0.0.42", ("squeue", "--all", "--states=all", "--json=v0.0.42")),
    ("26.05.0", "v0.0.42", ("squeue", "--all", "--states=all", "--json=v0.0.42")),
])
def test_format_for_version(version, name, squeue):
    fmt = formats.for_version(version)
    assert (fmt.name, fmt.squeue_args) == (name, squeue)


def test_newest_listed_data_parser():
    listing = "Possible data_parser plugins:\ndata_parser/v0.0.43\ndata_parser/v0.0.42\ndata_parser/v0.0.44\n"
    assert formats.newest_listed(listing) == "v0.0.44"
    assert formats.newest_listed("nothing") is None


class VersionedRunner:
    """squeue/sinfo as a release that ships ``parsers`` (a set of data_parser versions)."""

    def __init__(self, version, parsers_shipped):
        self.version, self.shipped, self.calls = version, parsers_shipped, []

    def __call__(self, argv, *, env=None, timeout=30.0):
        self.calls.append(tuple(argv))
        if argv[0] == "scontrol":
            return CommandResult(argv=tuple(argv), returncode=0, stdout=f"slurm {self.version}\n")
        flag = next(a for a in argv if a.startswith("--json"))
        if flag == "--json=list":
            listing = "".join(f"data_parser/{v}\n" for v in self.shipped)
            return CommandResult(argv=tuple(argv), returncode=0, stdout="Possible data_parser plugins:\n" + listing)
        if flag.partition("=")[2] not in self.shipped:
            return CommandResult(argv=tuple(argv), returncode=1,
                                 stderr=f"{argv[0]}: error: load_plugins: unable to find plugin: data_parser/x")
        return CommandResult(argv=tuple(argv), returncode=0,
                             stdout=SQUEUE_25_11 if argv[0] == "squeue" else SINFO_25_11)


def test_client_asks_the_version_once_and_pins_v0042():
    runner = VersionedRunner("25.11.7", {"v0.0.42", "v0.0.44"})
    client = CliSlurmClient(runner=runner)
    assert len(client.jobs()) == 6 and len(client.nodes()) == 3 and len(client.jobs()) == 6
    assert [c for c in runner.calls if c[0] == "scontrol"] == [("scontrol", "--version")]
    assert ("squeue", "--all", "--states=all", "--json=v0.0.42") in runner.calls


def test_client_falls_back_to_the_newest_listed_when_v0042_is_gone():
    runner = VersionedRunner("27.05.1", {"v0.0.45", "v0.0.46"})
    client = CliSlurmClient(runner=runner)
    assert len(client.nodes()) == 3
    assert client.json_format().name == "v0.0.46"
    assert len(client.jobs()) == 6
    assert ("squeue", "--all", "--states=all", "--json=v0.0.46") in runner.calls


def test_monitor_errors_from_json_are_the_projects_errors():
    with pytest.raises(SlurmFormatError):
        parsers.parse_squeue_json(json.dumps({"errors": [{"error": "slurm_load_jobs error"}]}))
