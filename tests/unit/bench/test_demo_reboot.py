"""The demo's node-reboot scenario (hosts mode): the batch host dies and boots again empty ``REBOOT_DOWN_S`` later;
its checks hold on the right evidence and fail on the wrong; it needs ``--hosts``."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_ft.bench import demo
from slurm_ft.bench.demo import REBOOT_DOWN_S, DemoConfig, Run, culprit_checks, node_count, reboot_checks
from slurm_ft.bench.faults import culprit_right
from slurm_ft.slurm.types import JobInfo, JobState, NodeInfo


def _final(restarts: int) -> JobInfo:
    return JobInfo(job_id=3, name="x", user_id=0, state=JobState.COMPLETED, restart_count=restarts)


def _rebooted(**changes) -> Run:
    fields = dict(name="node-reboot", ckpt=Path("/c"), victim="n2", fault_time=100.0, final=_final(1),
                  booted=121.0, held_files=["/tmp/x"], left_files=[])
    return Run(**{**fields, **changes})


RESUMED = [{"event": "attempt_start", "time": 10.0, "attempt": 1, "nodes": ["n2", "n3"], "resume_step": None},
           {"event": "attempt_start", "time": 160.0, "attempt": 1, "nodes": ["n1", "n3"], "resume_step": 8}]


def test_node_reboot_needs_hosts_mode_and_runs_on_two_nodes():
    with pytest.raises(ValueError, match="'node-reboot' needs a lab whose nodes are hosts"):
        DemoConfig(dir=Path("/tmp/d"), scenarios=("node-reboot",), hosts=False)
    assert "node-reboot" not in DemoConfig(dir=Path("/tmp/d")).scenarios  # not by default, even on hosts
    assert node_count(Run(name="node-reboot", ckpt=Path("/c"))) == 2


def test_reboot_checks_hold_on_a_requeue_after_an_empty_boot():
    assert all(held for _, held in reboot_checks(_rebooted(), RESUMED))


def test_reboot_checks_name_what_did_not_hold():
    run = _rebooted(final=_final(0), booted=None, left_files=["/tmp/x"])
    failed = [what for what, held in reboot_checks(run, RESUMED[:1]) if not held]
    assert failed == ["requeued once", "n2 booted again, its slurmd registered",
                      "n2 came back with an empty /tmp and /dev/shm",
                      "resumed from a committed checkpoint after the reboot"]


def test_the_verdict_must_name_the_rebooted_node():
    right = {"category": "hardware_node", "culprit": {"nodes": ["n2"], "ranks": []}}
    assert all(held for _, held in culprit_checks(_rebooted(), [], right))
    wrong = {"category": "hardware_node", "culprit": {"nodes": ["n3"], "ranks": []}}
    assert [w for w, held in culprit_checks(_rebooted(), [], wrong) if not held] == ["culprit n2 only"]
    assert culprit_right("node-reboot", "n2", "n3", right) == "yes"
    assert culprit_right("node-reboot", "n2", "n3", wrong).startswith("no (")


class _Lab:
    def __init__(self) -> None:
        self.booted: list[str] = []

    def client(self):
        class _Client:
            def nodes(self):
                return [NodeInfo(name="n2", state=frozenset({"IDLE", "DRAIN"}))]
        return _Client()


def test_the_host_boots_again_after_its_downtime(monkeypatch):
    lab, said = _Lab(), []
    monkeypatch.setattr(demo.lab_faults, "boot_node", lambda lab_, node: lab_.booted.append(node))
    monkeypatch.setattr(demo.lab_faults, "node_local_files", lambda lab_, node: [])
    now = 1000.0
    monkeypatch.setattr(demo.time, "time", lambda: now)
    run = Run(name="node-reboot", ckpt=Path("/c"), victim="n2", fault_time=now - REBOOT_DOWN_S + 1)
    demo._boot_back(lab, [run], said.append)
    assert lab.booted == [] and run.booted is None  # still down
    run.fault_time = now - REBOOT_DOWN_S
    demo._boot_back(lab, [run], said.append)
    assert lab.booted == ["n2"] and run.booted == now and run.left_files == []
    assert "booted again after" in said[0] and "(DRAIN+IDLE)" in said[0]
    demo._boot_back(lab, [run], said.append, force=True)
    assert lab.booted == ["n2"]  # once
