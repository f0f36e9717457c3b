"""Monitor decisions and idempotency with a fake SlurmClient and a temp SQLite state dir."""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import urllib.request

import pytest

from slurm_ft.cluster.metrics import Metrics, serve
from slurm_ft.cluster.monitor import Monitor, MonitorConfig, read_registration, require_actor
from slurm_ft.core.comment import parse_restart_cause, parse_resume_step, stopped
from slurm_ft.core.errors import SlurmCommandError, SlurmFtError
from slurm_ft.core.registry import FtJob, registry_path, write_registration
from slurm_ft.core.rundir import ErrorRecord, run_dir_for, write_error
from slurm_ft.core.taxonomy import Action, Category, Culprit, Verdict
from slurm_ft.slurm.types import JobInfo, JobState, NodeInfo

UID = os.geteuid()


class FakeClient:
    """Records calls; requeue bumps restart_count and makes the job PENDING (held)."""

    def __init__(self, jobs: list[JobInfo], nodes: list[NodeInfo] = ()) -> None:
        self.jobs_by_id = {j.job_id: j for j in jobs}
        self.node_list = list(nodes)
        self.calls: list[tuple] = []
        self.fail_on: str | None = None

    def jobs(self):
        self.calls.append(("jobs",))
        return list(self.jobs_by_id.values())

    def job(self, job_id):
        return self.jobs_by_id.get(job_id)

    def nodes(self):
        self.calls.append(("nodes",))
        return list(self.node_list)

    def drain(self, node, reason):
        self.calls.append(("drain", node, reason))

    def resume(self, node):
        self.calls.append(("resume", node))

    def requeue(self, job_id, *, hold=False):
        self.calls.append(("requeue", job_id, hold))
        job = self.jobs_by_id[job_id]
        self.jobs_by_id[job_id] = dataclasses.replace(job, state=JobState.PENDING, restart_count=job.restart_count + 1)
        if self.fail_on == "after_requeue":
            raise KeyboardInterrupt("monitor killed between requeue and done")

    def release(self, job_id):
        self.calls.append(("release", job_id))

    def cancel(self, job_id):
        self.calls.append(("cancel", job_id))
        self.jobs_by_id[job_id] = dataclasses.replace(self.jobs_by_id[job_id], state=JobState.CANCELLED)

    def update_job(self, job_id, *, comment=None, excluded_nodes=None):
        self.calls.append(("update", job_id, comment, excluded_nodes))
        job = self.jobs_by_id[job_id]
        changes = {}
        if comment is not None:
            changes["comment"] = comment
        if excluded_nodes is not None:
            changes["excluded_nodes"] = tuple(excluded_nodes)
        self.jobs_by_id[job_id] = dataclasses.replace(job, **changes)

    def count(self, name):
        return sum(1 for c in self.calls if c[0] == name)


def verdict(category=Category.HARDWARE_NODE, recoverable=True, action=Action.REQUEUE_EXCLUDE, nodes=("n2",),
            attested=None):
    """By default the culprit nodes are named by their own evidence (Slurm's node state)."""
    return Verdict(category=category, recoverable=recoverable, action=action, culprit=Culprit(nodes=nodes),
                   evidence=("node n2 NOT_RESPONDING",), confidence=0.9,
                   attested_nodes=nodes if attested is None else attested)


def failed(job_id=100, **kw):
    base = dict(job_id=job_id, name="train", user_id=UID, state=JobState.NODE_FAIL, nodes=("n1", "n2"),
                exit_code=1)
    base.update(kw)
    return JobInfo(**base)


@pytest.fixture()
def state(tmp_path):
    return tmp_path / "state"


def make(state, client, fn=lambda ev: verdict(), quarantine=None, **cfg):
    return Monitor(MonitorConfig(state_dir=state, poll_interval_s=1, **cfg), client, fn, quarantine=quarantine,
                   clock=lambda: 1000.0)


def register_job(state, tmp_path, job_id=100, max_restarts=3):
    ckpt = tmp_path / f"ckpt{job_id}"
    write_registration(state, FtJob(job_id=job_id, ckpt_dir=str(ckpt), run_dir=str(run_dir_for(ckpt)),
                                    max_restarts=max_restarts, user_id=UID))
    return ckpt


def commit_step(ckpt, step):
    from slurm_ft.core import layout

    d = layout.step_dir(ckpt, step)
    d.mkdir(parents=True)
    (d / "COMMITTED").write_text(json.dumps({"step": step, "world_size": 2, "files": {}, "rank_hosts": [],
                                             "time": 0.0, "version": 1}))


def test_config_validation_names_field():
    with pytest.raises(ValueError, match="poll_interval_s"):
        MonitorConfig(poll_interval_s=0)
    with pytest.raises(ValueError, match="metrics_port"):
        MonitorConfig(metrics_port=70000)
    with pytest.raises(ValueError, match="default_max_restarts"):
        MonitorConfig(default_max_restarts=-1)


def test_one_jobs_and_one_nodes_call_per_poll_for_many_jobs(state, tmp_path):
    jobs = [failed(job_id=i, state=JobState.RUNNING) for i in range(1, 51)]
    for i in range(1, 51):
        register_job(state, tmp_path, job_id=i)
    client = FakeClient(jobs)
    make(state, client).poll_once()
    assert client.count("jobs") == 1 and client.count("nodes") == 1
    assert len(client.calls) == 2


def test_recoverable_failure_requeues_with_exclusion_and_resume_hint(state, tmp_path):
    ckpt = register_job(state, tmp_path)
    commit_step(ckpt, 40)
    client = FakeClient([failed(excluded_nodes=("n9",))])
    acted = make(state, client).poll_once()
    assert acted == 1
    assert ("requeue", 100, True) in client.calls
    update = next(c for c in client.calls if c[0] == "update")
    assert update[2] == "slurm-ft: restart=1 resume_step=40 cause=hardware_node"
    assert update[3] == ("n2", "n9")
    assert client.calls.index(update) < client.calls.index(("release", 100))
    assert parse_resume_step(client.jobs_by_id[100].comment) == 40
    assert parse_restart_cause(client.jobs_by_id[100].comment) == "hardware_node"  # what the launcher passes on


@pytest.mark.parametrize(("comment", "cause"), [
    ("slurm-ft: restart=2 resume_step=none cause=preemption", "preemption"),
    ("slurm-ft: restart=2 resume_step=40 cause=", None),
    (stopped("user_code", "not recoverable", ["rank 0: KeyError"]), None),  # a stop is no restart
    ("my own comment cause=preemption", None),
    ("", None),
])
def test_restart_cause_is_read_only_from_a_requeue_comment(comment, cause):
    assert parse_restart_cause(comment) == cause


def test_requeue_happens_once_across_polls(state, tmp_path):
    register_job(state, tmp_path)
    client = FakeClient([failed()])
    mon = make(state, client)
    mon.poll_once()
    mon.poll_once()
    assert client.count("requeue") == 1


def test_killed_between_intent_and_done_does_not_requeue_twice(state, tmp_path):
    register_job(state, tmp_path)
    client = FakeClient([failed()])
    client.fail_on = "after_requeue"
    mon = make(state, client)
    with pytest.raises(KeyboardInterrupt):
        mon.poll_once()
    mon.close()
    client.fail_on = None
    restarted = make(state, client)  # a fresh monitor over the same state dir
    restarted.poll_once()
    assert client.count("requeue") == 1
    assert client.count("release") == 1
    assert client.jobs_by_id[100].comment.startswith("slurm-ft: restart=1")
    assert restarted.db.action(100, 0, "requeue")["state"] == "done"


def test_intent_without_requeue_is_retried(state, tmp_path):
    register_job(state, tmp_path)
    client = FakeClient([failed()])
    mon = make(state, client)
    mon.db.intent(100, 0, "requeue", {"excluded": [], "comment": "x", "resume_step": None}, 1.0)
    mon.poll_once()  # job still ended at restart_count 0: the requeue never happened
    assert client.count("requeue") == 1


def test_budget_exhausted_stops_with_comment(state, tmp_path):
    register_job(state, tmp_path, max_restarts=2)
    client = FakeClient([failed(restart_count=2)])
    make(state, client).poll_once()
    assert client.count("requeue") == 0
    assert client.jobs_by_id[100].comment.startswith("slurm-ft: stopped cause=hardware_node restart budget exhausted")


def test_crash_loop_without_checkpoint_progress_stops(state, tmp_path):
    ckpt = register_job(state, tmp_path, max_restarts=5)
    commit_step(ckpt, 10)
    client = FakeClient([failed()])
    mon = make(state, client)
    mon.poll_once()  # first failure: requeue, resume at 10
    job = client.jobs_by_id[100]
    client.jobs_by_id[100] = dataclasses.replace(job, state=JobState.RUNNING)
    mon.poll_once()
    client.jobs_by_id[100] = dataclasses.replace(job, state=JobState.FAILED)  # died again, still at step 10
    mon.poll_once()
    assert client.count("requeue") == 1
    assert "crash loop" in client.jobs_by_id[100].comment


def test_progress_since_restart_is_not_a_crash_loop(state, tmp_path):
    ckpt = register_job(state, tmp_path, max_restarts=5)
    commit_step(ckpt, 10)
    client = FakeClient([failed()])
    mon = make(state, client)
    mon.poll_once()
    commit_step(ckpt, 20)
    client.jobs_by_id[100] = dataclasses.replace(client.jobs_by_id[100], state=JobState.FAILED)
    mon.poll_once()
    assert client.count("requeue") == 2
    assert "resume_step=20" in client.jobs_by_id[100].comment


def test_user_code_stops_with_verdict_in_comment(state, tmp_path):
    ckpt = register_job(state, tmp_path)
    write_error(run_dir_for(ckpt), ErrorRecord(rank=1, time=5.0, exc_type="ZeroDivisionError", message="boom"))
    seen = []

    def judge(ev):
        seen.append(ev)
        return Verdict(category=Category.USER_CODE, recoverable=False, action=Action.STOP,
                       evidence=("rank 1: ZeroDivisionError: boom",))

    client = FakeClient([failed(state=JobState.FAILED)])
    make(state, client, judge).poll_once()
    assert client.count("requeue") == 0
    assert client.jobs_by_id[100].comment == \
        "slurm-ft: stopped cause=user_code not recoverable; rank 1: ZeroDivisionError: boom"
    assert [e.exc_type for e in seen[0].errors] == ["ZeroDivisionError"]
    make(state, client, judge).poll_once()
    assert client.count("update") == 1  # stopped once, not again


def test_real_classifier_stops_user_error(state, tmp_path):
    from slurm_ft.classify import classify

    ckpt = register_job(state, tmp_path)
    write_error(run_dir_for(ckpt), ErrorRecord(rank=0, time=5.0, exc_type="ValueError", message="bad shape",
                                               traceback="Traceback...\nValueError: bad shape"))
    client = FakeClient([failed(state=JobState.FAILED, exit_code=1)], [NodeInfo(name="n1", state=frozenset({"IDLE"}))])
    make(state, client, classify).poll_once()
    assert client.count("requeue") == 0
    assert client.jobs_by_id[100].comment.startswith("slurm-ft: stopped cause=")


def test_jobs_not_ours_and_completed_are_left_alone(state, tmp_path):
    register_job(state, tmp_path, job_id=2)
    client = FakeClient([failed(job_id=1), failed(job_id=2, state=JobState.COMPLETED, exit_code=0)])
    make(state, client).poll_once()
    assert client.count("requeue") == 0 and client.count("update") == 0


def test_comment_tag_marks_a_job_ours(state):
    client = FakeClient([failed(job_id=7, comment="slurm-ft: restart=1 resume_step=3 cause=hang")])
    make(state, client).poll_once()
    assert ("requeue", 7, True) in client.calls


def test_bad_job_is_logged_and_the_poll_goes_on(state, tmp_path, caplog):
    register_job(state, tmp_path, job_id=1)
    register_job(state, tmp_path, job_id=2)
    registry_path(state, 1).write_text("{not json")
    client = FakeClient([failed(job_id=1), failed(job_id=2)])
    with caplog.at_level("INFO", logger="slurm_ft.cluster.monitor"):
        make(state, client).poll_once()
    assert ("requeue", 2, True) in client.calls
    events = [json.loads(r.getMessage()) for r in caplog.records]
    assert any(e["event"] == "job_error" and e["job_id"] == 1 for e in events)


def test_registry_symlink_is_refused(state, tmp_path):
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps({"ckpt_dir": "/x"}))
    registry_path(state, 5).parent.mkdir(parents=True)
    registry_path(state, 5).symlink_to(real)
    with pytest.raises(OSError):
        read_registration(state, failed(job_id=5))


def test_registry_uid_mismatch_is_refused(state, tmp_path):
    write_registration(state, FtJob(job_id=6, user_id=UID + 1))
    with pytest.raises(ValueError, match="uid"):
        read_registration(state, failed(job_id=6))


def test_dry_run_changes_nothing(state, tmp_path):
    register_job(state, tmp_path)
    client = FakeClient([failed()])
    make(state, client, dry_run=True).poll_once()
    assert client.count("requeue") == 0 and client.count("update") == 0


def test_culprits_get_a_quarantine_strike(state, tmp_path):
    register_job(state, tmp_path)
    strikes = []

    class FakeQuarantine:
        def strike(self, node, category, evidence, job_id=None):
            strikes.append((node, Category(category), job_id))
            return "suspect"

        def list(self):
            return []

    make(state, FakeClient([failed()]), quarantine=FakeQuarantine()).poll_once()
    assert strikes == [("n2", Category.HARDWARE_NODE, 100)]


def test_nodes_named_only_by_the_jobs_word_are_excluded_from_it_never_struck(state, tmp_path):
    """Issue 16: forged error files ("host": "n3") drained nodes the job never ran on."""
    register_job(state, tmp_path)
    strikes = []

    class FakeQuarantine:
        def strike(self, node, category, evidence, job_id=None):
            strikes.append(node)
            return "suspect"

        def list(self):
            return []

    word = verdict(category=Category.HARDWARE_GPU, nodes=("n2", "n3"), attested=())
    client = FakeClient([failed(state=JobState.FAILED)])
    make(state, client, fn=lambda ev: word, quarantine=FakeQuarantine()).poll_once()
    assert strikes == []
    assert client.jobs_by_id[100].excluded_nodes == ("n2",)  # its own node, off this job only; n3 never ran it


def test_recovery_time_observed_when_running_again(state, tmp_path):
    register_job(state, tmp_path)
    client = FakeClient([failed()])
    now = [1000.0]
    mon = Monitor(MonitorConfig(state_dir=state), client, lambda ev: verdict(), clock=lambda: now[0])
    mon.poll_once()
    now[0] = 1130.0
    client.jobs_by_id[100] = dataclasses.replace(client.jobs_by_id[100], state=JobState.RUNNING)
    mon.poll_once()
    assert mon.metrics.recovery_count == 1 and mon.metrics.recovery_sum == pytest.approx(130.0)
    assert mon.metrics.restarts == 1 and mon.metrics.failures == {"hardware_node": 1}


def test_metrics_served_on_loopback():
    metrics = Metrics()
    metrics.failure("hang")
    metrics.restart()
    server = serve(metrics, 0)
    try:
        port = server.server_address[1]
        assert server.server_address[0] == "127.0.0.1"
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
    assert 'slurm_ft_failures_total{category="hang"} 1' in body
    assert "slurm_ft_restarts_total 1" in body


def test_acting_needs_root_or_slurm_user():
    require_actor(True, euid=12345)
    require_actor(False, euid=0)
    with pytest.raises(SlurmFtError, match="requeueing and draining needs root or SlurmUser 'slurm'"):
        require_actor(False, euid=12345, slurm_user=lambda: "slurm")


def test_job_requeued_by_slurm_after_node_failure_gets_exclusion_and_hint(state, tmp_path):
    ckpt = register_job(state, tmp_path)
    commit_step(ckpt, 12)
    running = failed(state=JobState.RUNNING)
    client = FakeClient([running], [NodeInfo(name="n2", state=frozenset({"DOWN", "NOT_RESPONDING"}))])
    mon = make(state, client, lambda ev: verdict(nodes=()))
    mon.poll_once()  # seen running on n1, n2
    client.jobs_by_id[100] = dataclasses.replace(running, state=JobState.PENDING, nodes=(), restart_count=1)
    mon.poll_once()  # Slurm requeued it (JobRequeue=1): adopt, do not requeue again
    mon.poll_once()
    assert client.count("requeue") == 0
    assert client.count("update") == 1
    job = client.jobs_by_id[100]
    assert job.excluded_nodes == ("n2",)
    assert job.comment == "slurm-ft: restart=1 resume_step=12 cause=hardware_node"


def test_stop_verdict_kept_when_slurm_refuses_the_comment(state, tmp_path):
    register_job(state, tmp_path)
    client = FakeClient([failed(state=JobState.FAILED)])

    def refuse(job_id, **kw):
        client.calls.append(("update", job_id))
        raise SlurmCommandError("scontrol update failed: Job has already finished")

    client.update_job = refuse
    mon = make(state, client, lambda ev: verdict(recoverable=False, action=Action.STOP))
    mon.poll_once()
    mon.poll_once()
    row = mon.db.action(100, 0, "stop")
    assert row["state"] == "done" and "stopped cause=hardware_node" in json.loads(row["detail"])["comment"]
    assert client.count("update") == 1  # not retried every poll


class RecordingQuarantine:
    def __init__(self):
        self.strikes = []

    def strike(self, node, category, evidence, job_id=None):
        self.strikes.append((node, str(getattr(category, "value", category)), job_id))
        return "quarantined"

    def list(self):
        return []


def test_launcher_bad_nodes_are_excluded_but_not_struck(state, tmp_path):
    register_job(state, tmp_path)
    quarantine = RecordingQuarantine()
    job = failed(state=JobState.FAILED, exit_code=75, comment="slurm-ft: tempfail bad_nodes=n2+n7 attempts=1")
    client = FakeClient([job])
    make(state, client, lambda ev: verdict(category=Category.NETWORK, nodes=()), quarantine=quarantine).poll_once()
    update = next(c for c in client.calls if c[0] == "update")
    assert update[3] == ("n2",)  # n7 was never the job's: a user's Comment cannot exclude it
    assert quarantine.strikes == []  # the user's word keeps the job off a node; only Slurm's drains it


def test_launcher_stop_is_respected_when_no_node_is_to_blame(state, tmp_path):
    register_job(state, tmp_path)
    job = failed(state=JobState.FAILED, comment="slurm-ft: stopped cause=unknown by=launch same root cause twice")
    client = FakeClient([job])
    mon = make(state, client, lambda ev: verdict(category=Category.UNKNOWN, nodes=()))
    mon.poll_once()
    assert client.count("requeue") == 0
    assert mon.db.job(100)["status"] == "stopped"
    assert "stopped by slurm-ft launch" in json.loads(mon.db.action(100, 0, "stop")["detail"])["comment"]


def test_launcher_stop_is_overruled_by_hardware_evidence(state, tmp_path):
    register_job(state, tmp_path)
    job = failed(state=JobState.FAILED, comment="slurm-ft: stopped cause=user_code by=launch ...")
    client = FakeClient([job])
    make(state, client).poll_once()  # the verdict names n2 (hardware_node)
    assert client.count("requeue") == 1


def test_node_lost_under_a_running_job_is_struck_once(state, tmp_path):
    register_job(state, tmp_path)
    quarantine = RecordingQuarantine()
    running = failed(state=JobState.RUNNING, nodes=("n1", "n2", "n3"))
    client = FakeClient([running])
    mon = make(state, client, lambda ev: verdict(nodes=("n2",)), quarantine=quarantine)
    mon.poll_once()  # seen running on n1..n3
    client.node_list = [NodeInfo(name="n2", state=frozenset({"DOWN", "NOT_RESPONDING"}))]
    client.jobs_by_id[100] = dataclasses.replace(running, nodes=("n1", "n3"))  # --no-kill: n2 dropped
    mon.poll_once()
    mon.poll_once()
    assert quarantine.strikes == [("n2", "hardware_node", 100)]
    client.jobs_by_id[100] = dataclasses.replace(running, state=JobState.FAILED, nodes=("n1", "n3"))
    mon.poll_once()  # the job fails later: judged on every node it had, n2 excluded, no second strike
    update = next(c for c in client.calls if c[0] == "update")
    assert "n2" in update[3]
    assert quarantine.strikes == [("n2", "hardware_node", 100)]


def test_slurm_requeue_seen_midway_is_still_adopted_once(state, tmp_path):
    """squeue shows a NODE_FAIL requeue in steps: RUNNING on (n1, n2), then REQUEUED on n2 alone with the restart
    count already bumped, then PENDING. None of them may hide the requeue from the monitor."""
    register_job(state, tmp_path)
    running = failed(state=JobState.RUNNING, requeue=True)
    client = FakeClient([running], [NodeInfo(name="n1", state=frozenset({"DOWN", "NOT_RESPONDING"}))])
    mon = make(state, client, lambda ev: verdict(nodes=()))
    mon.poll_once()
    for view in (dict(state=JobState.NODE_FAIL), dict(state=JobState.REQUEUED, nodes=("n2",), restart_count=1),
                 dict(state=JobState.PENDING, nodes=(), restart_count=1)):
        client.jobs_by_id[100] = dataclasses.replace(client.jobs_by_id[100], **view)
        mon.poll_once()
    assert client.count("requeue") == 0  # Slurm did it
    assert client.count("update") == 1
    assert client.jobs_by_id[100].excluded_nodes == ("n1",)
    assert client.jobs_by_id[100].comment.startswith("slurm-ft: restart=1 ")


def test_nodes_are_this_runs_after_a_requeue(state, tmp_path):
    register_job(state, tmp_path)
    client = FakeClient([failed()])
    mon = make(state, client, lambda ev: verdict(nodes=("n2",)))
    mon.poll_once()  # requeued by us, excluding n2
    client.jobs_by_id[100] = dataclasses.replace(client.jobs_by_id[100], state=JobState.RUNNING, nodes=("n3", "n4"))
    mon.poll_once()
    assert json.loads(mon.db.job(100)["nodes"]) == ["n3", "n4"]


def test_cli_flags_beat_env_beats_site_config(tmp_path, monkeypatch):
    import argparse

    from slurm_ft.cluster.monitor import config_from_args, register
    from slurm_ft.core.config import SiteConfig
    from slurm_ft.core.errors import ConfigError

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(), "monitor")
    site = SiteConfig(sections={"state_dir": str(tmp_path / "site"),
                                "monitor": {"poll_interval_s": 5.0, "default_max_restarts": 7}}, source="t.toml")
    monkeypatch.delenv("SLURM_FT_STATE_DIR", raising=False)
    cfg = config_from_args(parser.parse_args(["monitor"]), site)
    assert (cfg.poll_interval_s, cfg.default_max_restarts, cfg.state_dir) == (5.0, 7, tmp_path / "site")
    monkeypatch.setenv("SLURM_FT_STATE_DIR", str(tmp_path / "env"))
    cfg = config_from_args(parser.parse_args(["monitor", "--poll", "2", "--max-restarts", "1"]), site)
    assert (cfg.poll_interval_s, cfg.default_max_restarts, cfg.state_dir) == (2.0, 1, tmp_path / "env")
    cfg = config_from_args(parser.parse_args(["monitor", "--state-dir", str(tmp_path / "flag")]), site)
    assert cfg.state_dir == tmp_path / "flag"
    bad = SiteConfig(sections={"monitor": {"poll_every": 3}}, source="t.toml")
    with pytest.raises(ConfigError, match="poll_every"):
        config_from_args(parser.parse_args(["monitor"]), bad)


def test_no_requeue_job_is_stopped_even_when_recoverable(state, tmp_path):
    ckpt = tmp_path / "ck"
    write_registration(state, FtJob(job_id=100, ckpt_dir=str(ckpt), run_dir=str(run_dir_for(ckpt)), user_id=UID,
                                    no_requeue=True))
    client = FakeClient([failed()])
    mon = make(state, client)
    mon.poll_once()
    assert client.count("requeue") == 0
    assert "--ft-no-requeue" in json.loads(mon.db.action(100, 0, "stop")["detail"])["comment"]


def _orphan_setup(state, tmp_path, **register):
    """A --no-kill job whose batch host n1 died: Slurm dropped n1 and keeps the job RUNNING on n2."""
    from slurm_ft.classify import classify

    ckpt = register_job(state, tmp_path, **register)
    commit_step(ckpt, 12)
    running = failed(state=JobState.RUNNING, nodes=("n1", "n2"), batch_host="n1", exit_code=None)
    client = FakeClient([running], [NodeInfo(name="n1", state=frozenset({"DOWN", "NOT_RESPONDING"})),
                                    NodeInfo(name="n2", state=frozenset({"ALLOCATED"}))])
    quarantine = RecordingQuarantine()
    mon = make(state, client, classify, quarantine=quarantine)
    mon.poll_once()  # seen running on n1, n2: nothing to do yet
    assert client.count("requeue") == 0
    client.jobs_by_id[100] = dataclasses.replace(running, nodes=("n2",))
    return client, mon, quarantine


def test_a_job_that_lost_its_batch_host_is_requeued_without_it(state, tmp_path):
    client, mon, quarantine = _orphan_setup(state, tmp_path)
    assert mon.poll_once() == 1
    assert ("requeue", 100, True) in client.calls and client.count("cancel") == 0
    update = next(c for c in client.calls if c[0] == "update")
    assert update[2] == "slurm-ft: restart=1 resume_step=12 cause=hardware_node" and "n1" in update[3]
    assert ("n1", "hardware_node", 100) in quarantine.strikes
    mon.poll_once()
    assert client.count("requeue") == 1  # once


def test_a_job_that_lost_its_batch_host_with_no_budget_left_is_stopped_and_cancelled(state, tmp_path):
    client, mon, _ = _orphan_setup(state, tmp_path, max_restarts=0)
    assert mon.poll_once() == 1
    assert client.count("requeue") == 0 and client.calls[-1] == ("cancel", 100)  # not left idle to its time limit
    assert "restart budget exhausted" in client.jobs_by_id[100].comment
    mon.poll_once()
    assert client.count("cancel") == 1


def test_a_running_job_on_its_batch_host_is_left_alone(state, tmp_path):
    register_job(state, tmp_path)
    client = FakeClient([failed(state=JobState.RUNNING, nodes=("n2", "n3"), batch_host="n2", exit_code=None)])
    assert make(state, client).poll_once() == 0
    assert not [c for c in client.calls if c[0] not in ("jobs", "nodes")]


def test_a_refused_requeue_of_a_job_that_lost_its_batch_host_is_retried(state, tmp_path):
    client, mon, _ = _orphan_setup(state, tmp_path)
    requeue = client.requeue

    def refused_once(job_id, *, hold=False):
        client.requeue = requeue
        raise SlurmCommandError("scontrol requeuehold 100: Slurm busy")

    client.requeue = refused_once
    mon.poll_once()  # the requeue fails after its intent was recorded
    assert client.count("requeue") == 0 and client.jobs_by_id[100].state is JobState.RUNNING
    mon.poll_once()  # still RUNNING at the same count: it never happened, so it is tried again
    assert client.count("requeue") == 1 and client.jobs_by_id[100].restart_count == 1


def test_the_monitor_survives_any_error_of_one_poll_and_backs_off(state, tmp_path, caplog):
    """Issue 16: a ValueError from one poll (a bad hostlist, slurmctld restarting) ended the daemon."""
    register_job(state, tmp_path)
    client = FakeClient([failed()])
    real_jobs = client.jobs
    errors = iter([ValueError("hostlist 'n[1-': unbalanced '['"), KeyError("job_id")])

    def flaky_jobs():
        err = next(errors, None)
        if err is not None:
            raise err
        return real_jobs()

    client.jobs = flaky_jobs
    pauses, polls = [], iter(range(3))
    monitor = make(state, client)
    with caplog.at_level("INFO", logger="slurm_ft.cluster.monitor"):
        monitor.run(stop=lambda: next(polls, None) is None, sleep=pauses.append)
    assert pauses == [2, 4, 1]  # 1 s interval, doubled per failed poll, back to normal after a good one
    assert ("requeue", 100, True) in client.calls
    assert sum(json.loads(r.getMessage())["event"] == "poll_error" for r in caplog.records) == 2


def test_a_broken_monitor_database_ends_the_monitor(state, tmp_path):
    client = FakeClient([])
    client.jobs = lambda: (_ for _ in ()).throw(sqlite3.DatabaseError("database disk image is malformed"))
    with pytest.raises(sqlite3.DatabaseError):
        make(state, client).run(stop=lambda: False, sleep=lambda s: None)


def test_one_monitor_per_state_dir(tmp_path):
    from slurm_ft.cluster.monitor import single_instance

    held = single_instance(tmp_path)
    with pytest.raises(SlurmFtError, match="another slurm-ft monitor holds"):
        single_instance(tmp_path)
    held.close()
    single_instance(tmp_path).close()


def _monitor_telling(state, client, told, fn=lambda ev: verdict(Category.USER_CODE, False, Action.STOP, nodes=())):
    return Monitor(MonitorConfig(state_dir=state, poll_interval_s=1), client, fn, clock=lambda: 1000.0,
                   tell_user=lambda **kw: told.append(kw) or "")


def test_a_job_that_ended_and_was_purged_while_the_monitor_was_down_is_still_judged(state, tmp_path):
    """Registered, then gone from Slurm's listing (MinJobAge passed while no monitor ran): judged from what is
    left, the verdict told to the user, once; not requeued (Slurm no longer has it)."""
    ckpt = register_job(state, tmp_path, job_id=7)
    commit_step(ckpt, 40)
    client, told = FakeClient([]), []
    monitor = _monitor_telling(state, client, told)
    assert monitor.poll_once() == 1
    assert told[0]["uid"] == UID and told[0]["run_dir"] == str(run_dir_for(ckpt))
    assert told[0]["record"]["category"] == "user_code"
    assert "resubmit to resume from step 40" in told[0]["record"]["reason"]
    assert monitor.db.job(7)["status"] == "gone"
    assert monitor.poll_once() == 0 and len(told) == 1  # judged once
    assert client.count("requeue") == 0 and client.count("update") == 0


def test_a_purged_job_whose_epilog_saw_exit_0_is_done_not_a_failure(state, tmp_path):
    from slurm_ft.health.records import NodeReport

    register_job(state, tmp_path, job_id=8)
    folder = state / "reports" / "8"
    folder.mkdir(parents=True)
    (folder / "n1.json").write_text(json.dumps(NodeReport(job_id=8, node="n1", time=1.0, exit_code=0).to_dict()))
    told = []
    monitor = _monitor_telling(state, FakeClient([]), told, fn=lambda ev: pytest.fail("judged a completed job"))
    assert monitor.poll_once() == 0
    assert monitor.db.job(8)["status"] == "done" and told == []


def test_a_listed_job_is_not_judged_as_gone_and_a_bad_registry_entry_is_logged_once(state, tmp_path, caplog):
    register_job(state, tmp_path, job_id=9)
    (state / "jobs" / "10.json").write_text("[1, 2]")  # not an object
    told = []
    monitor = _monitor_telling(state, FakeClient([failed(job_id=9, state=JobState.RUNNING)]), told)
    monitor.poll_once()
    monitor.poll_once()
    assert told == [] and monitor.db.job(9)["status"] == "watching"
    assert caplog.text.count('"job_error"') == 1 and "registry entry of job 10" in caplog.text
