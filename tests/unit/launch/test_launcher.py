"""The launcher's restart loop with a fake process runner and a fake clock."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys

import pytest

from slurm_ft.classify import classify
from slurm_ft.core.rundir import (
    ErrorRecord,
    Heartbeat,
    RankEnd,
    RankState,
    write_end,
    write_error,
    write_heartbeat,
    write_rank_state,
)
from slurm_ft.core.taxonomy import Action, Category, Verdict
from slurm_ft.launch.cli import config_from_args, register
from slurm_ft.launch.launcher import EX_TEMPFAIL, HangWatch, LaunchConfig, Launcher, choose_nodes, unhealthy
from slurm_ft.slurm.types import NodeInfo
from tests.unit.launch.test_links import _tree  # a node's /sys with eth0's link counters


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Script:
    """One fake srun: writes heartbeats on each poll up to ``hang_after`` steps, then exits with ``code``."""

    def __init__(self, run_dir, *, ranks=2, steps=3, code=0, hang_after=None, error=None) -> None:
        self.run_dir, self.ranks, self.steps, self.code, self.hang_after, self.error = \
            run_dir, ranks, steps, code, hang_after, error
        self.polls = 0
        self.terminated = self.killed = False

    def poll(self):
        if self.killed:
            return -9
        self.polls += 1
        step = min(self.polls, self.hang_after or self.polls)
        for rank in range(self.ranks):
            write_heartbeat(self.run_dir, Heartbeat(rank=rank, step=step, time=0.0))
        if self.hang_after is None and self.polls >= self.steps:
            if self.error is not None:
                write_error(self.run_dir, self.error)
            return self.code
        return None

    def terminate(self):
        self.terminated = True  # a SIGSTOPped rank ignores SIGTERM: only kill() ends it

    def kill(self):
        self.killed = True


class Runner:
    def __init__(self, scripts) -> None:
        self.scripts = list(scripts)
        self.calls = []

    def __call__(self, argv, env):
        self.calls.append((list(argv), dict(env)))
        return self.scripts[len(self.calls) - 1]



def lab_addr(node: str, nodes: int) -> str:
    """The lab's answer for every node (Slurm's NodeAddr there): the tests never ask the resolver or scontrol."""
    return "127.0.0.1"


def make(tmp_path, scripts, *, allocation=("n1", "n2"), states=None, classify_fn=None, probe=None,
         set_comment=None, restart_cause=None, requeues=0, comment="", latch=None, requeue=None, addr_of=lab_addr,
         **cfg):
    clock = Clock()
    config = LaunchConfig(command=("python", "train.py"), run_dir=tmp_path / "run", poll_s=1.0,
                          hang_timeout_s=cfg.pop("hang_timeout_s", 10.0), startup_grace_s=cfg.pop("grace", 5.0),
                          kill_grace_s=3.0, **cfg)
    runner = Runner(scripts)
    ports = iter(range(29500, 29600))
    launcher = Launcher(config, allocation=allocation, environ={"PATH": "/bin"}, runner=runner,
                        node_states=(lambda: states[0]) if states is not None else None, classify_fn=classify_fn,
                        clock=clock, sleep=clock.sleep, port=lambda: next(ports), addr_of=addr_of,
                        resume_step=7, probe=probe, set_comment=set_comment, restart_cause=restart_cause,
                        requeues=requeues, comment=comment, latch=latch, requeue=requeue)
    return launcher, runner, clock


def events(tmp_path):
    return [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]


def test_config_validation_names_field(tmp_path):
    with pytest.raises(ValueError, match="command"):
        LaunchConfig(command=())
    with pytest.raises(ValueError, match="max_restarts"):
        LaunchConfig(command=("x",), max_restarts=-1)
    with pytest.raises(ValueError, match="hang_timeout_s"):
        LaunchConfig(command=("x",), hang_timeout_s=-1)


def test_success_first_try_builds_srun_and_env(tmp_path):
    run = tmp_path / "run"
    launcher, runner, _ = make(tmp_path, [Script(run)])
    assert launcher.run() == 0
    argv, env = runner.calls[0]
    # the launcher ends a failed step itself (srun's kill on a bad exit would leave the ranks to KillWait)
    assert argv[:6] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n2",
                        "--kill-on-bad-exit=0"]
    assert argv[-6:] == [sys.executable, "-m", "slurm_ft.launch.rank", "--", "python", "train.py"]
    assert env["MASTER_PORT"] == "29500" and env["SLURM_FT_RUN_DIR"] == str(run)
    assert env["WORLD_SIZE"] == "2" and env["LOCAL_WORLD_SIZE"] == "1" and env["MASTER_ADDR"]
    assert env["SLURM_FT_RESUME_STEP"] == "7"
    assert [e["event"] for e in events(tmp_path)] == ["attempt_start", "first_step", "exit"]


def test_each_attempt_meets_at_its_first_nodes_address_asked_with_its_node_count(tmp_path):
    """MASTER_ADDR comes from ``slurm_ft.slurm.address`` told how many nodes the attempt spans (a multi-node attempt
    never falls back to loopback); its refusal ends the launcher as a configuration mistake."""
    from slurm_ft.slurm.address import NodeAddressError

    asked = []

    def addr_of(node, nodes):
        asked.append((node, nodes))
        return "10.0.0.1"
    run = tmp_path / "run"
    launcher, runner, _ = make(tmp_path, [Script(run)], allocation=("n1", "n2", "n3"), nodes=2, addr_of=addr_of)
    assert launcher.run() == 0
    assert asked == [("n1", 2)] and runner.calls[0][1]["MASTER_ADDR"] == "10.0.0.1"

    def nowhere(node, nodes):
        raise NodeAddressError(f"node {node!r} has no address")
    launcher, runner, _ = make(tmp_path, [Script(run)], addr_of=nowhere)
    with pytest.raises(NodeAddressError, match="'n1'"):
        launcher.run()
    assert runner.calls == []


def test_the_run_dir_the_launcher_creates_is_the_users_alone(tmp_path):
    """events.jsonl names each attempt's store port: another user must not read it (or the archived attempts)."""
    run = tmp_path / "run"
    old = os.umask(0o022)
    try:
        launcher, _, _ = make(tmp_path, [Script(run, code=1, steps=3), Script(run)])
        launcher._event("launch", note="before any rank wrote a file")
        assert launcher.run() == 0
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [run, *run.iterdir()]}
    assert modes["run"] == 0o700 and modes["events.jsonl"] == 0o600 and modes["attempt-1"] == 0o700


def test_a_requeued_jobs_first_attempt_carries_the_requeue_cause(tmp_path):
    launcher, runner, _ = make(tmp_path, [Script(tmp_path / "run")], restart_cause="preemption")
    assert launcher.run() == 0
    assert runner.calls[0][1]["SLURM_FT_RESTART_CAUSE"] == "preemption"  # not a failure, for the interval


def test_hang_detected_within_timeout_and_killed_then_restarted(tmp_path):
    run = tmp_path / "run"
    hung = Script(run, hang_after=2)
    launcher, runner, clock = make(tmp_path, [hung, Script(run)])
    assert launcher.run() == 0
    assert hung.terminated and hung.killed  # SIGTERM ignored -> SIGKILL after the grace
    fault = next(e for e in events(tmp_path) if e["event"] == "fault_detected")
    assert fault["kind"] == "hung"
    # the step stopped advancing at t=1001 (2nd poll): detected one hang timeout later, within one poll
    assert 10.0 <= fault["time"] - 1001.0 <= 10.0 + 1.0
    assert len(runner.calls) == 2
    assert runner.calls[0][1]["MASTER_PORT"] != runner.calls[1][1]["MASTER_PORT"]  # a fresh port per attempt
    assert "SLURM_FT_RESUME_STEP" not in runner.calls[1][1]  # later attempts resume from the newest checkpoint
    assert "SLURM_FT_RESTART_CAUSE" not in runner.calls[0][1]  # a first run, not a restart
    assert runner.calls[1][1]["SLURM_FT_RESTART_CAUSE"] == "hang"  # the trainer counts it as a failure
    assert (run / "attempt-1" / "heartbeat.rank0.json").exists()  # evidence kept aside


class StuckAfterError(Script):
    """Ranks 0, 1, ... fail one a poll from poll ``at`` on (their error files, ``count`` of them), but srun never
    returns: a task on a dead node."""

    def __init__(self, run_dir, *, at: int, count: int = 1) -> None:
        super().__init__(run_dir, hang_after=10**6)
        self.at, self.count = at, count

    def poll(self):
        code = super().poll()
        rank = self.polls - self.at
        if 0 <= rank < self.count and not self.killed:
            write_error(self.run_dir, ErrorRecord(rank=rank, time=float(self.polls), exc_type="RuntimeError",
                                                  message="Connection reset by peer", step=self.polls))
        return code


def test_a_rank_error_ends_an_attempt_whose_srun_never_returns(tmp_path):
    run = tmp_path / "run"
    stuck = StuckAfterError(run, at=3)
    launcher, runner, clock = make(tmp_path, [stuck, Script(run)], hang_timeout_s=60.0, evidence_wait_s=2.0)
    assert launcher.run() == 0
    assert stuck.terminated and stuck.killed
    fault = next(e for e in events(tmp_path) if e["event"] == "fault_detected")
    assert fault["kind"] == "failed" and fault["exit_code"] == 1
    # the error file appeared on the 3rd poll (t=1002); the step was ended 2 s later, not after the hang timeout
    assert fault["time"] == pytest.approx(1002.0)
    assert len(runner.calls) == 2 and (run / "attempt-1" / "error.rank0.json").exists()
    assert clock.now < 1002.0 + 2.0 + 3.0 + 10.0  # grace + kill grace + the second attempt's polls


def second_start(tmp_path) -> float:
    return next(e["time"] for e in events(tmp_path) if e["event"] == "attempt_start" and e["attempt"] == 2)


def test_the_step_ends_a_second_after_the_first_evidence(tmp_path):
    run = tmp_path / "run"
    launcher, _, _ = make(tmp_path, [StuckAfterError(run, at=3), Script(run)], hang_timeout_s=60.0,
                          evidence_wait_s=1.0)
    assert launcher.run() == 0
    # the error file came at t=1002: the step was ended at the next poll (1003), then the kill's own grace (3 s:
    # a SIGTERM the stuck srun ignores)
    assert second_start(tmp_path) == pytest.approx(1003.0 + 3.0, abs=0.5)


def test_ranks_that_keep_failing_do_not_hold_the_step_open(tmp_path):
    run = tmp_path / "run"
    launcher, _, _ = make(tmp_path, [StuckAfterError(run, at=3, count=20), Script(run)], hang_timeout_s=60.0,
                          evidence_wait_s=1.0)
    assert launcher.run() == 0
    # a new error file every poll (the culprit's victims, one by one): still ended 1 s after the first, then the
    # kill; the victims' records would not change the verdict
    assert second_start(tmp_path) == pytest.approx(1003.0 + 3.0, abs=0.5)


class FailsAt(Script):
    """Rank 0 fails at clock time ``at``: its error file, then its wrapper's end record (``ended``); srun never
    returns (a rank on a dead node, or ranks waiting in a collective)."""

    def __init__(self, run_dir, clock, *, at: float, ended: bool = True) -> None:
        super().__init__(run_dir, hang_after=10**6)
        self.clock, self.at, self.ended = clock, at, ended

    def poll(self):
        code = super().poll()
        if self.clock.now >= self.at and not self.killed:
            write_error(self.run_dir, ErrorRecord(rank=0, time=self.at, exc_type="RuntimeError", message="boom"))
            if self.ended:
                write_end(self.run_dir, RankEnd(rank=0, time=self.at, exit_code=1))
        return code


def test_the_step_ends_at_once_when_the_failed_ranks_records_are_complete(tmp_path):
    run = tmp_path / "run"
    launcher, _, clock = make(tmp_path, [], hang_timeout_s=60.0, evidence_wait_s=1.0)
    launcher.runner.scripts = [FailsAt(run, clock, at=1002.0), Script(run)]
    assert launcher.run() == 0
    # the error file and its end record came at t=1002: no evidence wait, only the kill's grace (3 s)
    assert second_start(tmp_path) == pytest.approx(1002.0 + 3.0, abs=0.2)


def test_an_error_file_without_its_end_record_is_waited_for(tmp_path):
    run = tmp_path / "run"
    launcher, _, clock = make(tmp_path, [], hang_timeout_s=60.0, evidence_wait_s=1.0)
    launcher.runner.scripts = [FailsAt(run, clock, at=1002.0, ended=False), Script(run)]
    assert launcher.run() == 0
    # the rank is still ending (its wrapper has not written how): the full evidence wait, then the kill
    assert second_start(tmp_path) == pytest.approx(1003.0 + 3.0, abs=0.2)


class KilledThenVictim(Script):
    """Rank 1 is killed at ``at`` (its wrapper's end record, no error file); rank 0 records the error the kill
    caused ``victim_after`` later (negative: before the kill) and is still ending: no end record of its own."""

    def __init__(self, run_dir, clock, *, at: float, victim_after: float,
                 message: str = "Connection closed by peer [127.0.0.1]:35233") -> None:
        super().__init__(run_dir, hang_after=10**6)
        self.clock, self.at, self.victim_after, self.message = clock, at, victim_after, message

    def poll(self):
        code = super().poll()
        if self.clock.now >= self.at and not self.killed:
            write_end(self.run_dir, RankEnd(rank=1, time=self.at, signal=9))
            write_error(self.run_dir, ErrorRecord(rank=0, time=self.at + self.victim_after, exc_type="RuntimeError",
                                                  message=self.message))
        return code


@pytest.mark.parametrize("victim_after, message", [
    (0.05, "boom in the loss"),  # any error recorded after the kill's end record
    (-0.004, "Connection closed by peer [127.0.0.1]:35233"),  # a victim's view, stamped before the end (lag)
])
def test_a_victims_error_is_not_waited_for(tmp_path, victim_after, message):
    run = tmp_path / "run"
    launcher, _, clock = make(tmp_path, [], hang_timeout_s=60.0, evidence_wait_s=1.0)
    launcher.runner.scripts = [KilledThenVictim(run, clock, at=1002.0, victim_after=victim_after, message=message),
                               Script(run)]
    assert launcher.run() == 0
    # rank 0 failed because rank 1 was killed: its process still ending changes no verdict, so no evidence wait
    assert second_start(tmp_path) == pytest.approx(1002.0 + 3.0, abs=0.2)


def test_an_error_of_its_own_before_the_first_bad_end_is_still_waited_for(tmp_path):
    run = tmp_path / "run"
    launcher, _, clock = make(tmp_path, [], hang_timeout_s=60.0, evidence_wait_s=1.0)
    launcher.runner.scripts = [KilledThenVictim(run, clock, at=1002.0, victim_after=-0.05, message="boom in the loss"),
                               Script(run)]
    assert launcher.run() == 0
    # rank 0's own error came first: it may be the root cause, so the launcher waits for how its process ends
    assert second_start(tmp_path) == pytest.approx(1003.0 + 3.0, abs=0.2)


class Bell:
    """A fake fault bell on the fake clock: rung at ``at`` (the failed rank's wrapper)."""

    def __init__(self, clock, at: float) -> None:
        self.clock, self.at, self.closed, self.armed = clock, at, False, 0

    def arm(self) -> str:
        self.armed += 1
        return f"10.0.0.1:4242:token{self.armed}"

    def wait(self, seconds: float) -> bool:
        if self.clock.now < self.at <= self.clock.now + seconds:
            self.clock.now = self.at
            return True
        self.clock.sleep(seconds)
        return False

    def close(self) -> None:
        self.closed = True


def test_the_bell_wakes_the_launcher_when_a_rank_ends_badly(tmp_path):
    run = tmp_path / "run"
    launcher, runner, clock = make(tmp_path, [], hang_timeout_s=60.0, evidence_wait_s=1.0)
    launcher.bell = bell = Bell(clock, at=1002.4)
    launcher.runner.scripts = [FailsAt(run, clock, at=1002.4), Script(run)]
    assert launcher.run() == 0
    fault = next(e for e in events(tmp_path) if e["event"] == "fault_detected")
    assert fault["time"] == pytest.approx(1002.4)  # at the ring, not at the next poll (1003)
    bells = [env["SLURM_FT_BELL"] for _, env in runner.calls]
    assert bells == ["10.0.0.1:4242:token1", "10.0.0.1:4242:token2"]  # where the wrappers ring, a token per attempt
    assert bell.closed


def test_evidence_wait_must_not_be_negative():
    with pytest.raises(ValueError, match="evidence_wait_s"):
        LaunchConfig(command=("python", "train.py"), evidence_wait_s=-1.0)


def test_failure_on_healthy_nodes_restarts_in_place(tmp_path):
    run = tmp_path / "run"
    states = [{"n1": NodeInfo(name="n1", state=frozenset({"ALLOCATED"})),
               "n2": NodeInfo(name="n2", state=frozenset({"ALLOCATED"}))}]
    launcher, runner, _ = make(tmp_path, [Script(run, code=1), Script(run)], states=states)
    assert launcher.run() == 0
    assert [c[0][4] for c in runner.calls] == ["--nodelist=n1,n2", "--nodelist=n1,n2"]
    assert "restart_in_place" in [e["event"] for e in events(tmp_path)]
    # the failed step may linger as "completing" on the live nodes: later attempts may share its CPUs
    assert "--overlap" not in runner.calls[0][0] and "--overlap" in runner.calls[1][0]
    # one launch id for every attempt (the memory tier keeps to this launch's snapshots), another launch's differs
    ids = {env["SLURM_FT_LAUNCH_ID"] for _argv, env in runner.calls}
    other, _, _ = make(tmp_path, [Script(run)])
    assert len(ids) == 1 and other._launch_id not in ids and len(ids.pop()) == 16


def test_unhealthy_node_swapped_for_a_spare_without_using_a_retry(tmp_path):
    run = tmp_path / "run"
    states = [{"n2": NodeInfo(name="n2", state=frozenset({"DOWN", "NOT_RESPONDING"}))}]
    launcher, runner, _ = make(tmp_path, [Script(run, code=1), Script(run)], allocation=("n1", "n2", "n3"),
                               states=states, spare_nodes=1, max_restarts=0)
    assert launcher.run() == 0
    assert [c[0][4] for c in runner.calls] == ["--nodelist=n1,n2", "--nodelist=n1,n3"]


def test_unhealthy_node_and_no_spare_exits_tempfail(tmp_path):
    run = tmp_path / "run"
    states = [{"n2": NodeInfo(name="n2", state=frozenset({"IDLE", "DRAIN"}))}]
    launcher, runner, _ = make(tmp_path, [Script(run, code=1)], states=states)
    assert launcher.run() == EX_TEMPFAIL
    assert len(runner.calls) == 1
    assert events(tmp_path)[-1]["why"] == "node unhealthy and no spare left"


def test_user_error_is_not_restarted(tmp_path):
    run = tmp_path / "run"
    error = ErrorRecord(rank=1, time=5.0, exc_type="ZeroDivisionError", message="division by zero")
    judged = []

    def judge(ev):
        judged.append(ev)
        return Verdict(category=Category.USER_CODE, recoverable=False, action=Action.STOP)

    launcher, runner, _ = make(tmp_path, [Script(run, code=1, error=error)], classify_fn=judge)
    assert launcher.run() == 1
    assert len(runner.calls) == 1
    assert judged[0].errors[0].rank == 1 and judged[0].in_allocation


def test_restart_budget_is_bounded(tmp_path):
    run = tmp_path / "run"
    launcher, runner, _ = make(tmp_path, [Script(run, code=3) for _ in range(5)], max_restarts=2)
    assert launcher.run() == 3
    assert len(runner.calls) == 3


def test_pure_helpers():
    assert choose_nodes(["a", "b", "c"], wanted=2, bad={"a"}) == ["b", "c"]
    assert choose_nodes(["a", "b"], wanted=2, bad={"a"}) is None
    assert unhealthy(["a", "b"], {"a": NodeInfo(name="a", state=frozenset({"MIXED", "DRAIN"}))}) == {"a"}
    watch = HangWatch(2, 0.0, timeout_s=10, grace_s=5)
    watch.update([Heartbeat(rank=0, step=1, time=0), Heartbeat(rank=1, step=1, time=0)], 1.0)
    assert watch.hung(10.5) == []
    watch.update([Heartbeat(rank=0, step=2, time=0)], 10.5)
    assert watch.hung(11.0) == [1]  # no progress for 10 s since its last step, grace or not
    starting = HangWatch(2, 0.0, timeout_s=10, grace_s=5)
    starting.update([Heartbeat(rank=0, step=1, time=0)], 2.0)
    starting.update([Heartbeat(rank=0, step=2, time=0)], 12.0)
    assert starting.hung(14.9) == [] and starting.hung(15.0) == [1]  # never seen: grace + timeout


def test_a_hang_names_every_rank_without_progress_not_only_the_first_past_the_timeout():
    """Rank 1 stopped after step 6, rank 0 waits for it in step 7: the launcher saw rank 1 reach step 6 one poll
    after rank 0 (seen in the lab), and both are without progress when rank 0 crosses the timeout."""
    watch = HangWatch(3, 0.0, timeout_s=10, grace_s=5)
    watch.update([Heartbeat(rank=0, step=6, time=0), Heartbeat(rank=2, step=6, time=0)], 1.0)
    watch.update([Heartbeat(rank=1, step=6, time=0)], 2.0)
    watch.update([Heartbeat(rank=2, step=7, time=0)], 9.0)  # rank 2 still moves (it has not reached the wait yet)
    assert watch.hung(11.0) == [0, 1]


def test_a_rank_that_finished_its_loop_is_not_hung_until_its_exit_is_overdue():
    """A finished rank (its heartbeat says done) makes no more steps; its process may take long to exit (a
    communicator's teardown, a loaded node: 15 s of interpreter teardown at a load of 12 on 2 cores here)."""
    watch = HangWatch(2, 0.0, timeout_s=10, grace_s=5, exit_grace_s=60)
    watch.update([Heartbeat(rank=0, step=16, time=0), Heartbeat(rank=1, step=16, time=0)], 1.0)
    watch.update([Heartbeat(rank=0, step=16, time=0, done=True)], 2.0)
    assert watch.hung(30.0) == [1]  # rank 1 has not finished: judged as before
    watch.update([Heartbeat(rank=1, step=16, time=0, done=True)], 3.0)
    assert watch.hung(62.9) == [] and watch.hung(63.0) == [0, 1]  # all done: only an overdue exit is a hang


def test_cli_parses_after_double_dash(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    register(sub, "launch")
    args = parser.parse_args(["launch", "--hang-timeout", "30", "--max-restarts", "2", "--", "python", "-m", "x"])
    config = config_from_args(args, {"SLURM_FT_CKPT_DIR": str(tmp_path)})
    assert config.command == ("python", "-m", "x")
    assert config.hang_timeout_s == 30 and config.max_restarts == 2
    assert config.run_dir == tmp_path / ".slurm-ft"


def test_same_root_cause_twice_stops_even_when_the_verdict_says_recoverable(tmp_path):
    run = tmp_path / "run"
    error = ErrorRecord(rank=1, time=5.0, exc_type="InjectedFault", message="boom", step=5)
    scripts = [Script(run, code=1, error=error) for _ in range(4)]
    launcher, runner, _ = make(tmp_path, scripts, max_restarts=3,
                               classify_fn=lambda ev: Verdict(category=Category.UNKNOWN, recoverable=True,
                                                              action=Action.RESTART_IN_PLACE))
    assert launcher.run() == 1
    assert len(runner.calls) == 2
    assert "repeated_root_cause" in [e["event"] for e in events(tmp_path)]


def test_node_failing_the_probe_is_swapped_for_a_spare(tmp_path):
    run = tmp_path / "run"
    probed = []

    def probe(nodes, since):
        probed.append(list(nodes))
        return {"n2": "probe step failed (exit 233)"} if len(probed) == 1 else {}

    states = [{}]  # Slurm has not noticed anything yet
    launcher, runner, _ = make(tmp_path, [Script(run, code=1), Script(run)], allocation=("n1", "n2", "n3"),
                               states=states, spare_nodes=1, max_restarts=0, probe=probe)
    assert launcher.run() == 0
    assert probed[0] == ["n1", "n2"]
    assert [c[0][4] for c in runner.calls] == ["--nodelist=n1,n2", "--nodelist=n1,n3"]
    probe_events = [e for e in events(tmp_path) if e["event"] == "node_probe"]
    assert probe_events[0]["failed"] == {"n2": "probe step failed (exit 233)"}


def test_no_spare_waits_for_slurm_to_declare_the_node_then_names_it_in_the_comment(tmp_path):
    run = tmp_path / "run"
    states = [{}]
    comments = []
    launcher, runner, clock = make(tmp_path, [Script(run, code=1)], states=states, node_fail_wait_s=30.0,
                                   probe=lambda nodes, since: {"n2": "probe step did not finish within 10s"},
                                   set_comment=comments.append)
    start = clock.now

    def declare_later(seconds):
        clock.now += seconds
        if clock.now - start > 10:
            states[0] = {"n2": NodeInfo(name="n2", state=frozenset({"DOWN", "NOT_RESPONDING"}))}

    launcher.sleep = declare_later
    assert launcher.run() == EX_TEMPFAIL
    assert 10 < clock.now - start < 30  # stopped waiting once Slurm declared the node
    assert comments == ["slurm-ft: tempfail bad_nodes=n2 attempts=1"]
    last = events(tmp_path)[-1]
    assert last["code"] == EX_TEMPFAIL and last["bad"] == ["n2"] and last["unconfirmed"] == []


def test_no_spare_and_slurm_never_declares_gives_up_after_the_wait(tmp_path):
    run = tmp_path / "run"
    launcher, runner, clock = make(tmp_path, [Script(run, code=1)], states=[{}], node_fail_wait_s=20.0,
                                   probe=lambda nodes, since: {"n1": "probe step failed (exit 1)"})
    assert launcher.run() == EX_TEMPFAIL
    assert events(tmp_path)[-1]["unconfirmed"] == ["n1"]


def test_no_spare_and_a_rebooted_node_goes_to_the_monitor_without_waiting_for_slurm(tmp_path):
    """Slurm has a node back from its reboot in service: it will never declare it, so no wait for that."""
    run = tmp_path / "run"
    launcher, runner, clock = make(tmp_path, [Script(run, code=1)], states=[{}], node_fail_wait_s=20.0,
                                   probe=lambda nodes, since: {"n2": "rebooted 9 s after the attempt started: "
                                                                     "nothing it held survived"})
    start = clock.now
    assert launcher.run() == EX_TEMPFAIL
    assert clock.now - start < 20.0 and not [e for e in events(tmp_path) if e["event"] == "node_fail_wait"]
    assert events(tmp_path)[-1]["bad"] == ["n2"] and events(tmp_path)[-1]["unconfirmed"] == []


def test_a_stop_puts_the_verdict_in_the_comment_while_the_job_still_runs(tmp_path):
    from slurm_ft.core.comment import parse_launcher_stop

    run = tmp_path / "run"
    error = ErrorRecord(rank=1, time=5.0, exc_type="ZeroDivisionError", message="division by zero", step=4)
    comments = []
    verdict = Verdict(category=Category.USER_CODE, recoverable=False, action=Action.STOP,
                      evidence=("rank 1 error file: ZeroDivisionError: division by zero",))
    launcher, runner, _ = make(tmp_path, [Script(run, code=1, error=error)], classify_fn=lambda ev: verdict,
                               set_comment=comments.append)
    assert launcher.run() == 1
    assert comments == ["slurm-ft: stopped cause=user_code by=launch not recoverable; "
                        "rank 1 error file: ZeroDivisionError: division by zero"]
    assert parse_launcher_stop(comments[0]).startswith("stopped cause=user_code")


def test_a_requeued_job_sets_the_previous_runs_files_aside(tmp_path):
    run = tmp_path / "run"
    write_heartbeat(run, Heartbeat(rank=0, step=11, time=1.0))
    write_error(run, ErrorRecord(rank=1, time=2.0, exc_type="RuntimeError", message="peer closed"))
    launcher, runner, _ = make(tmp_path, [Script(run, steps=3)])
    assert launcher.run() == 0
    assert (run / "earlier" / "heartbeat.rank0.json").exists() and (run / "earlier" / "error.rank1.json").exists()
    assert not (run / "error.rank1.json").exists()
    first = next(e for e in events(tmp_path) if e["event"] == "first_step")
    assert first["step"] == 1  # not the stale step 11


def test_srun_killed_by_a_signal_exits_like_a_shell(tmp_path):
    run = tmp_path / "run"
    launcher, runner, _ = make(tmp_path, [Script(run, code=-9)], max_restarts=0)
    assert launcher.run() == 137


def test_requeued_past_the_budget_stops_before_running(tmp_path):
    comments = []
    launcher, runner, _ = make(tmp_path, [], max_restarts=2, set_comment=comments.append, requeues=3)
    assert launcher.run() == 1
    assert runner.calls == []
    assert comments[0].startswith("slurm-ft: stopped cause=unknown by=launch restart budget exhausted (3 restarts > 2")


def test_a_restart_does_not_wait_for_a_slow_comment_update_and_the_exit_does(tmp_path):
    """scontrol update blocked 5 s in the lab ("the DB index is being set"); the restart went on without it."""
    import threading

    run = tmp_path / "run"
    written, release = [], threading.Event()

    def slow_scontrol(text):
        assert release.wait(10), "the launcher waited for the Comment before starting the next attempt"
        written.append(text)

    class Released(Script):
        def poll(self):
            release.set()  # the next attempt runs while the restart's Comment is still being written
            return super().poll()

    launcher, runner, _ = make(tmp_path, [Script(run, code=1), Released(run)], max_restarts=1,
                               set_comment=slow_scontrol)
    assert launcher.run() == 0
    assert len(runner.calls) == 2
    assert written == ["slurm-ft: in_place=1"]  # written before the launcher exited


def test_a_failing_comment_update_is_reported_and_the_next_one_still_goes(tmp_path):
    from slurm_ft.core.errors import SlurmFtError
    from slurm_ft.launch.launcher import CommentWriter

    written, errors = [], []

    def scontrol(text):
        if text == "bad":
            raise SlurmFtError("scontrol update JobId=1 Comment=bad failed (exit 1): try again in a bit")
        written.append(text)

    writer = CommentWriter(scontrol, errors.append)
    writer.set("bad")
    assert writer.flush(5)
    writer.set("good")
    assert writer.flush(5)
    assert written == ["good"] and errors == ["scontrol update JobId=1 Comment=bad failed (exit 1): try again in a bit"]


def test_a_job_submitted_with_ft_is_registered_by_the_prolog_not_by_the_launcher(tmp_path, monkeypatch):
    from slurm_ft.launch.cli import _register_with_monitor

    monkeypatch.setenv("SLURM_FT_STATE_DIR", str(tmp_path / "elsewhere"))  # not the lab's or site's state dir
    monkeypatch.setenv("SLURM_FT_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    config = LaunchConfig(command=("x",), run_dir=tmp_path / "run")
    _register_with_monitor(config, {"SLURM_JOB_ID": "42", "SLURM_SPANK_FT_ENABLED": "1"})
    assert not (tmp_path / "elsewhere").exists()
    _register_with_monitor(config, {"SLURM_JOB_ID": "43"})  # no plugin: the launcher registers it itself
    assert (tmp_path / "elsewhere" / "jobs" / "43.json").is_file()
    

def test_without_rank_records_the_command_runs_bare(tmp_path):
    launcher, runner, _ = make(tmp_path, [Script(tmp_path / "run")], rank_records=False)
    assert launcher.run() == 0
    argv = runner.calls[0][0]
    assert argv[-2:] == ["python", "train.py"] and "slurm_ft.launch.rank" not in argv
    assert "--kill-on-bad-exit=1" in argv  # no end records to see a rank fail by: srun's kill is the quick one
    assert "SLURM_FT_BELL" not in runner.calls[0][1]  # no wrapper to ring it


class KilledRank(Script):
    """Rank 1 is SIGKILLed (its wrapper's end record); rank 0 fails on the closed connection a moment later."""

    def poll(self):
        code = super().poll()
        if code is not None and self.polls == self.steps:
            write_end(self.run_dir, RankEnd(rank=1, time=10.0, host="n2", pid=22, signal=9, oom_kills=0))
            write_error(self.run_dir, ErrorRecord(rank=0, time=10.01, exc_type="RuntimeError", host="n1", pid=11,
                                                  message="[gloo/transport/tcp/pair.cc:534] Connection closed by peer"))
            write_end(self.run_dir, RankEnd(rank=0, time=10.05, host="n1", pid=11, exit_code=1))
        return code


def test_a_killed_rank_is_named_in_a_verdict_event_and_the_attempt_restarts(tmp_path, capsys):
    run = tmp_path / "run"
    launcher, runner, _ = make(tmp_path, [KilledRank(run, code=137), Script(run)], classify_fn=classify)
    assert launcher.run() == 0
    [verdict] = [e for e in events(tmp_path) if e["event"] == "verdict"]
    assert verdict["verdict"]["culprit"] == {"nodes": ["n2"], "ranks": [1]}
    assert verdict["verdict"]["category"] == "unknown" and verdict["root_cause"]["node"] == "n2"
    assert "restart_in_place" in [e["event"] for e in events(tmp_path)]
    assert runner.calls[1][1]["SLURM_FT_RESTART_CAUSE"] == "unknown"
    err = capsys.readouterr().err
    assert "slurm-ft: root cause of attempt 1: rank 1 on n2: killed by signal 9 (SIGKILL)" in err
    assert (run / "attempt-1" / "end.rank1.json").exists()


class StoppedRank(Script):
    """Both ranks stop progressing at step 2; rank 0's liveness thread keeps beating, rank 1's does not."""

    def poll(self):
        if self.killed:
            return -9
        self.polls += 1
        step = min(self.polls, 2)
        write_heartbeat(self.run_dir, Heartbeat(rank=0, step=step, time=0.0, host="n1", pid=11,
                                                alive=float(self.polls)))
        write_heartbeat(self.run_dir, Heartbeat(rank=1, step=step, time=0.0, host="n2", pid=22,
                                                alive=float(min(self.polls, 2))))
        return None


def test_a_hang_names_only_the_stopped_rank(tmp_path):
    run = tmp_path / "run"
    gathered = []

    def gather(nodes, run_dir):
        gathered.append(list(nodes))
        write_rank_state(run_dir, RankState(rank=0, host="n1", pid=11, state="S", step=2))
        write_rank_state(run_dir, RankState(rank=1, host="n2", pid=22, state="T", step=2))
        return ""

    launcher, runner, _ = make(tmp_path, [StoppedRank(run), Script(run)], classify_fn=classify)
    launcher.gather_hang = gather
    assert launcher.run() == 0
    assert gathered == [["n1", "n2"]]
    [verdict] = [e for e in events(tmp_path) if e["event"] == "verdict"]
    assert verdict["outcome"] == "hung" and verdict["verdict"]["category"] == "hang"
    assert verdict["verdict"]["culprit"] == {"nodes": ["n2"], "ranks": [1]}
    assert any("process stopped (state T)" in line for line in verdict["verdict"]["evidence"])


def test_a_hang_without_node_reports_still_singles_out_the_rank_whose_liveness_stopped(tmp_path):
    run = tmp_path / "run"
    launcher, _, _ = make(tmp_path, [StoppedRank(run), Script(run)], classify_fn=classify)
    assert launcher.run() == 0
    [verdict] = [e for e in events(tmp_path) if e["event"] == "verdict"]
    assert verdict["verdict"]["culprit"] == {"nodes": ["n2"], "ranks": [1]}
    assert "hang_evidence_partial" in [e["event"] for e in events(tmp_path)]


def test_a_dead_node_keeps_its_name_in_the_verdict(tmp_path):
    run = tmp_path / "run"
    probe = [{"n2": "probe step failed (exit 233)"}, {}]
    launcher, _, _ = make(tmp_path, [KilledRank(run, code=137), Script(run)], allocation=("n1", "n2", "n3"),
                          states=[{}], spare_nodes=1, max_restarts=0, probe=lambda nodes, since: probe.pop(0),
                          classify_fn=classify)
    assert launcher.run() == 0
    [verdict] = [e for e in events(tmp_path) if e["event"] == "verdict"]
    assert verdict["verdict"]["category"] == "hardware_node" and verdict["verdict"]["culprit"]["nodes"] == ["n2"]


class Standby:
    """The warm standby step: runs until told to stop (SIGUSR2, which srun passes on) or killed."""

    def __init__(self) -> None:
        self.signals, self.killed = [], False

    def poll(self):
        return 0 if self.signals == [signal.SIGUSR2] else (-9 if self.killed else None)

    def send_signal(self, sig):
        self.signals.append(sig)

    def terminate(self):
        self.killed = True

    def kill(self):
        self.killed = True


def test_standby_starts_once_the_first_attempt_trains_and_serves_only_restarts(tmp_path):
    run = tmp_path / "run"
    standby = Standby()
    config = LaunchConfig(command=("python3", "train.py", "--lr", "1"), run_dir=run, poll_s=1.0, kill_grace_s=3.0,
                          standby=True)
    clock = Clock()
    runner = Runner([Script(run, code=1, steps=3), standby, Script(run)])
    launcher = Launcher(config, allocation=("n1", "n2"), environ={"PATH": "/bin"}, runner=runner, clock=clock,
                        sleep=clock.sleep, port=lambda: 29500, addr_of=lab_addr)
    assert launcher.run() == 0
    (first, first_env), (argv, _), (_, second_env) = runner.calls
    assert argv[:8] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n2", "--overlap",
                        "--no-kill", "--kill-on-bad-exit=0"]
    assert argv[8:] == ["python3", "-m", "slurm_ft.launch.standby", "--python", "python3"]
    assert "SLURM_FT_STANDBY" not in first_env and second_env["SLURM_FT_STANDBY"] == "python3"
    assert standby.signals == [signal.SIGUSR2] and not standby.killed  # ended quietly with the launcher
    assert [e["event"] for e in events(tmp_path)].count("standby_start") == 1


def test_the_standbys_and_the_wrappers_share_a_random_key_that_only_the_launchers_steps_get(tmp_path):
    """The standbys' socket names carry a key the launcher draws: nobody can bind a slot's name before its keeper
    (job id, node and slot are guessable, for jobs not even started)."""
    keys = []
    for attempt in range(2):
        run = tmp_path / f"run{attempt}"
        clock = Clock()
        runner = Runner([Script(run, code=1, steps=3), Standby(), Script(run)])
        launcher = Launcher(LaunchConfig(command=("python3", "train.py"), run_dir=run, poll_s=1.0,
                                         kill_grace_s=3.0, standby=True),
                            allocation=("n1",), environ={"PATH": "/bin", "SLURM_JOB_ID": "4242"}, runner=runner,
                            clock=clock, sleep=clock.sleep, port=lambda: 29500, addr_of=lab_addr)
        assert launcher.run() == 0
        (_, first_env), (_, standby_env), (_, second_env) = runner.calls
        key = standby_env["SLURM_FT_STANDBY_KEY"]
        assert second_env["SLURM_FT_STANDBY_KEY"] == key and "SLURM_FT_STANDBY_KEY" not in first_env
        assert len(key) == 32 and int(key, 16) >= 0 and "4242" not in key
        keys.append(key)
    assert keys[0] != keys[1]  # drawn anew by every launcher


def test_spare_nodes_get_standbys_too_and_a_node_death_spares_the_others(tmp_path):
    """The spare node's standbys start with the others, so the node swapped in for a dead one starts its rank
    warm; a dead node's part of the standby step dies with it, the standbys on the other nodes (and the ranks they
    run) must not (``--no-kill``)."""
    run = tmp_path / "run"
    standby = Standby()
    probe = [{}, {"n2": "probe step did not finish within 5s"}, {}]
    config = LaunchConfig(command=("python3", "train.py"), run_dir=run, poll_s=1.0, kill_grace_s=3.0, standby=True,
                          spare_nodes=1, max_restarts=2)
    clock = Clock()
    runner = Runner([Script(run, code=1, steps=3), standby, Script(run, code=1, steps=3), Script(run)])
    launcher = Launcher(config, allocation=("n1", "n2", "n3"), environ={"PATH": "/bin"}, runner=runner,
                        clock=clock, sleep=clock.sleep, port=lambda: 29500, addr_of=lab_addr,
                        probe=lambda nodes, since: probe.pop(0))
    assert launcher.run() == 0
    [standby_step] = [argv for argv, _ in runner.calls if "slurm_ft.launch.standby" in argv]
    assert standby_step[1:5] == ["--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--nodelist=n1,n2,n3"]
    assert "--no-kill" in standby_step
    assert "--nodelist=n1,n3" in runner.calls[3][0] and runner.calls[3][1]["SLURM_FT_STANDBY"] == "python3"
    assert standby.signals == [signal.SIGUSR2]  # stopped quietly at the end


def test_nodes_whose_standby_step_ended_get_a_new_one_without_the_bad_node(tmp_path):
    run = tmp_path / "run"
    first, second = Standby(), Standby()
    probe = [{"n2": "probe step did not finish within 5s"}, {}]
    config = LaunchConfig(command=("python3", "train.py"), run_dir=run, poll_s=1.0, kill_grace_s=3.0, standby=True,
                          spare_nodes=1, max_restarts=2)
    clock = Clock()

    class Ends(Script):
        def poll(self):
            first.killed = True  # the standby step ended while this attempt ran (srun lost it)
            return super().poll()

    runner = Runner([Script(run, code=1, steps=3), first, Ends(run), second])
    launcher = Launcher(config, allocation=("n1", "n2", "n3"), environ={"PATH": "/bin"}, runner=runner,
                        clock=clock, sleep=clock.sleep, port=lambda: 29500, addr_of=lab_addr,
                        probe=lambda nodes, since: probe.pop(0))
    assert launcher.run() == 0
    steps = [argv for argv, _ in runner.calls if "slurm_ft.launch.standby" in argv]
    assert [a[4] for a in steps] == ["--nodelist=n1,n2,n3", "--nodelist=n1,n3"]  # not on the bad node n2
    assert second.signals == [signal.SIGUSR2] and first.signals == []  # an ended step gets no stop signal


def test_a_node_that_rebooted_under_the_attempt_is_swapped_out_and_takes_its_standby_step_along(tmp_path):
    """A node back from a reboot answers the probe but held nothing any more: the probe names it (it booted after
    the attempt started) and the launcher ends the standby step it was part of (srun aborts such a step, killing
    the ranks its standbys on the other nodes had just become), so the next attempt starts cold."""
    run = tmp_path / "run"
    first, second = Standby(), Standby()
    asked = []

    def probe(nodes, since):
        asked.append(since)
        return {"n2": "rebooted 20 s after the attempt started: nothing it held survived"} if len(asked) == 1 else {}

    config = LaunchConfig(command=("python3", "train.py"), run_dir=run, poll_s=1.0, kill_grace_s=3.0, standby=True,
                          spare_nodes=1, max_restarts=2)
    clock = Clock()
    runner = Runner([Script(run, code=1, steps=3), first, Script(run), second])
    launcher = Launcher(config, allocation=("n1", "n2", "n3"), environ={"PATH": "/bin"}, runner=runner,
                        clock=clock, sleep=clock.sleep, port=lambda: 29500, addr_of=lab_addr, probe=probe,
                        classify_fn=classify)
    assert launcher.run() == 0
    starts = [e for e in events(tmp_path) if e["event"] == "attempt_start"]
    assert asked[0] == starts[0]["time"]  # the reboot is judged against the failed attempt's start
    [dropped] = [e for e in events(tmp_path) if e["event"] == "standby_dropped"]
    assert dropped["rebooted"] == ["n2"] and dropped["nodes"] == ["n1", "n2", "n3"]
    assert first.killed and first.signals == []
    attempt2 = runner.calls[2]
    assert "--nodelist=n1,n3" in attempt2[0] and "SLURM_FT_STANDBY" not in attempt2[1]  # cold: no stale standby
    steps = [argv for argv, _ in runner.calls if "slurm_ft.launch.standby" in argv]
    assert [a[4] for a in steps] == ["--nodelist=n1,n2,n3", "--nodelist=n1,n3"]  # new standbys, not on n2
    [verdict] = [e for e in events(tmp_path) if e["event"] == "verdict"]
    assert verdict["verdict"]["culprit"]["nodes"] == ["n2"]


@pytest.mark.parametrize("command, standby", [(("bash", "run.sh"), True), (("python", "-u", "train.py"), True),
                                              (("python", "train.py"), False)])
def test_no_standby_for_commands_it_cannot_run_or_when_off(tmp_path, command, standby):
    run = tmp_path / "run"
    config = LaunchConfig(command=command, run_dir=run, poll_s=1.0, kill_grace_s=3.0, standby=standby)
    clock = Clock()
    runner = Runner([Script(run, code=1, steps=3), Script(run)])
    launcher = Launcher(config, allocation=("n1",), environ={"PATH": "/bin"}, runner=runner, clock=clock,
                        sleep=clock.sleep, port=lambda: 29500, addr_of=lab_addr)
    assert launcher.run() == 0
    assert len(runner.calls) == 2 and "SLURM_FT_STANDBY" not in runner.calls[1][1]


def test_the_cli_turns_standby_on_unless_told_not_to(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="cmd"))
    on = config_from_args(parser.parse_args(["launch", "--", "python", "t.py"]), {})
    off = config_from_args(parser.parse_args(["launch", "--no-standby", "--", "python", "t.py"]), {})
    assert on.standby and not off.standby


class Store:
    """A fake keeper of the rendezvous stores: not ready until started, then a new port per attempt."""

    def __init__(self, ports=(41000, 41001, 41002)) -> None:
        self.ports, self.started, self.closed = list(ports), 0, False

    def start(self):
        self.started += 1

    def open(self):
        return ("10.0.0.9", self.ports.pop(0)) if self.started and self.ports else None

    def close(self):
        self.closed = True


def test_restarts_rendezvous_at_the_launchers_store_and_the_first_attempt_at_rank_0(tmp_path):
    """Restarted ranks come up at different times; with rank 0 hosting the store, a rank ahead of rank 0's
    server pays torch's connect backoff (0.6 s for 0.1 s late). The keeper starts once the first attempt trains,
    and every later attempt connects to a fresh store it holds open, all ranks as clients."""
    run = tmp_path / "run"
    store = Store()
    launcher, runner, _ = make(tmp_path, [Script(run, code=1, steps=3), Script(run, code=1, steps=3), Script(run)],
                               max_restarts=2)
    launcher.store = store
    assert launcher.run() == 0
    first, second, third = (env for _, env in runner.calls)
    assert first["MASTER_PORT"] == "29500" and "TORCHELASTIC_USE_AGENT_STORE" not in first
    assert (second["MASTER_ADDR"], second["MASTER_PORT"]) == ("10.0.0.9", "41000")
    assert (third["MASTER_ADDR"], third["MASTER_PORT"]) == ("10.0.0.9", "41001")  # a fresh store per attempt
    assert second["TORCHELASTIC_USE_AGENT_STORE"] == "True" and second["TORCHELASTIC_RESTART_COUNT"] == "1"
    assert third["TORCHELASTIC_RESTART_COUNT"] == "2"
    starts = [e for e in events(tmp_path) if e["event"] == "attempt_start"]
    assert [e["store"] for e in starts] == ["rank 0", "launcher", "launcher"]
    assert store.closed  # the keeper ends with the launcher


def test_an_attempt_without_a_store_falls_back_to_rank_0_and_drops_the_switch(tmp_path):
    run = tmp_path / "run"
    launcher, runner, _ = make(tmp_path, [Script(run, code=1, steps=3), Script(run)])
    launcher.store = Store(ports=())  # the keeper died or answered late: no store for the restart
    launcher.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # inherited: must not make rank 0 a client
    assert launcher.run() == 0
    restart = runner.calls[1][1]
    assert restart["MASTER_PORT"] == "29501" and "TORCHELASTIC_USE_AGENT_STORE" not in restart


@pytest.mark.parametrize("argv, environ, held", [
    (["--", "python", "t.py"], {"SLURMD_NODENAME": "n1"}, True),
    (["--no-launcher-store", "--", "python", "t.py"], {"SLURMD_NODENAME": "n1"}, False),
    (["--", "torchrun", "--nproc-per-node=2", "t.py"], {"SLURMD_NODENAME": "n1"}, False),  # its agent's store
    (["--", "python", "t.py"], {"SLURMD_NODENAME": "n1", "MASTER_ADDR": "10.1.1.1"}, False),  # the user's
    (["--", "python", "t.py"], {"SLURMD_NODENAME": "login1"}, False),  # outside the allocation
])
def test_the_launcher_holds_the_store_only_where_every_rank_can_use_it(argv, environ, held):
    import argparse

    from slurm_ft.launch.cli import store_keeper

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="cmd"))
    config = config_from_args(parser.parse_args(["launch", *argv]), environ)
    keeper = store_keeper(config, ["n1", "n2"], environ, addr="10.0.0.1")
    assert (keeper is not None) == held
    if held:
        assert keeper.python == "python" and keeper.addr == "10.0.0.1"  # the launcher's own node's address
        assert keeper.peers == "n1,n2"  # only the allocation's nodes may connect
        assert store_keeper(config, ["n1", "n2"], {**environ, "SLURM_JOB_NODELIST": "n[1-2]"},
                            addr="10.0.0.1").peers == "n[1-2]"


class Silent(Script):
    """An attempt whose ranks never reach a step (no heartbeat) and never exit: hung before its first step."""

    def poll(self):
        return -9 if self.killed else None


def test_a_warm_attempt_hung_before_its_first_step_turns_standbys_off_for_the_job(tmp_path):
    run = tmp_path / "run"
    standby = Standby()
    config = LaunchConfig(command=("python3", "train.py"), run_dir=run, poll_s=1.0, kill_grace_s=3.0, standby=True,
                          hang_timeout_s=10.0, startup_grace_s=5.0)
    clock = Clock()
    hung = Silent(run)
    runner = Runner([Script(run, code=1, steps=3), standby, hung, Script(run)])
    launcher = Launcher(config, allocation=("n1", "n2"), environ={"PATH": "/bin"}, runner=runner, clock=clock,
                        sleep=clock.sleep, port=lambda: 29500, addr_of=lab_addr)
    assert launcher.run() == 0
    (_, first), _, (_, warm), (_, cold) = runner.calls  # no second standby step either
    assert warm["SLURM_FT_STANDBY"] == "python3" and "SLURM_FT_STANDBY" not in cold
    assert hung.killed and standby.signals == [signal.SIGUSR2]  # the standbys stopped when turned off
    kinds = [e["event"] for e in events(tmp_path)]
    assert kinds.count("standby_off") == 1 and kinds.count("standby_start") == 1
    assert kinds[kinds.index("standby_off") - 1] == "fault_detected"  # decided as the hang was seen


def test_an_attempt_hung_at_the_launchers_store_before_its_first_step_hands_the_store_back_to_rank_0(tmp_path):
    """The store's peer filter drops ranks that come from an address their node's name does not resolve to
    (asymmetric routing): they wait in connect. The next attempts rendezvous at rank 0, as torch does."""
    run = tmp_path / "run"
    store = Store()
    hung = Silent(run)
    launcher, runner, _ = make(tmp_path, [Script(run, code=1, steps=3), hung, Script(run)], max_restarts=2,
                               hang_timeout_s=10.0, grace=5.0)
    launcher.store = store
    assert launcher.run() == 0
    _, at_store, after = (env for _, env in runner.calls)
    assert at_store["MASTER_ADDR"] == "10.0.0.9" and "TORCHELASTIC_USE_AGENT_STORE" not in after
    assert hung.killed and store.closed
    kinds = [e["event"] for e in events(tmp_path)]
    assert kinds.count("launcher_store_off") == 1
    assert [e["store"] for e in events(tmp_path) if e["event"] == "attempt_start"] == ["rank 0", "launcher", "rank 0"]


def test_a_cold_attempt_hung_before_its_first_step_leaves_standbys_on(tmp_path):
    run = tmp_path / "run"
    config = LaunchConfig(command=("python3", "train.py"), run_dir=run, poll_s=1.0, kill_grace_s=3.0, standby=True,
                          hang_timeout_s=10.0, startup_grace_s=5.0)
    clock = Clock()
    runner = Runner([Silent(run), Script(run), Standby()])  # the standbys start once the second attempt trains
    launcher = Launcher(config, allocation=("n1",), environ={"PATH": "/bin"}, runner=runner, clock=clock,
                        sleep=clock.sleep, port=lambda: 29500, addr_of=lab_addr)
    assert launcher.run() == 0
    kinds = [e["event"] for e in events(tmp_path)]
    assert "standby_off" not in kinds and kinds.count("standby_start") == 1


# --- the flight recorder (slurm_ft.launch.traces) ---------------------------------------------------------------
TRACES = __import__("pathlib").Path(__file__).resolve().parents[2] / "data" / "traces"


def test_the_ranks_get_the_flight_recorder_unless_the_job_sets_it(tmp_path):
    run = tmp_path / "run"
    launcher, runner, _ = make(tmp_path, [Script(run)])
    assert launcher.run() == 0
    env = runner.calls[0][1]
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(run / "nccl_trace.rank")
    launcher, runner, _ = make(tmp_path, [Script(run)], flight_recorder=0)
    launcher.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "0"
    assert launcher.run() == 0
    env = runner.calls[0][1]
    assert "TORCH_FR_BUFFER_SIZE" not in env and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"


def test_a_hung_desync_stops_after_one_attempt_without_using_a_restart(tmp_path):
    run = tmp_path / "run"
    comments = []

    def gather(nodes, run_dir):  # the helpers: both ranks alive, each dumps its flight recorder (a real desync)
        for rank in (0, 1):
            write_rank_state(run_dir, RankState(rank=rank, host="n1", pid=11 + rank, state="S", step=2))
            (run_dir / f"trace.rank{rank}.json").write_text((TRACES / "desync2" / f"trace.rank{rank}.json").read_text())
        return ""

    launcher, runner, _ = make(tmp_path, [Script(run, hang_after=2), Script(run)], classify_fn=classify,
                               set_comment=comments.append)
    launcher.gather_hang = gather
    assert launcher.run() == 1
    assert len(runner.calls) == 1 and launcher.budget.in_place == 0
    kinds = [e["event"] for e in events(tmp_path)]
    assert "restart_in_place" not in kinds and kinds[-1] == "exit"
    [verdict] = [e for e in events(tmp_path) if e["event"] == "verdict"]
    assert verdict["outcome"] == "hung" and verdict["verdict"]["category"] == "user_code"
    assert verdict["verdict"]["culprit"] == {"nodes": ["n1"], "ranks": [1]}
    assert "all_gather" in verdict["verdict"]["evidence"][0] and "all_reduce" in verdict["verdict"]["evidence"][0]
    assert verdict["collectives"][1].startswith("rank 1: waiting in all_gather(in [[4]], out [[2, 4]], Float) #4")
    assert comments[-1].startswith("slurm-ft: stopped cause=user_code by=launch not recoverable; rank 1 (n1) called")
    assert "in_place=" not in comments[-1]


class Request:
    def __init__(self, log, nodes, run_dir) -> None:
        self.log = log
        log.append(("asked", list(nodes)))

    def wait(self, wait_s, done=lambda: False):
        self.log.append(("waited", wait_s))
        return "" if done() else "the flight-recorder dumps were not all in within 3 s"


def test_a_failed_attempt_asks_the_live_ranks_for_their_dumps_before_the_kill(tmp_path):
    run = tmp_path / "run"
    log = []
    launcher, _, clock = make(tmp_path, [], hang_timeout_s=60.0, evidence_wait_s=1.0)
    failing = FailsAt(run, clock, at=1002.0)
    launcher.runner.scripts = [failing, Script(run)]
    launcher.request_traces = lambda nodes, run_dir: Request(log, nodes, run_dir)
    killed_when = []
    real_kill = failing.terminate
    failing.terminate = lambda: (killed_when.append(list(log)), real_kill())
    assert launcher.run() == 0
    assert log == [("asked", ["n1", "n2"]), ("waited", 3.0)]  # once, at the first failure
    assert killed_when == [log]  # the wait came before the kill
    assert "trace_dumps_partial" in [e["event"] for e in events(tmp_path)]


def test_no_dumps_asked_for_when_the_recorder_is_off(tmp_path):
    run = tmp_path / "run"
    log = []
    launcher, _, clock = make(tmp_path, [], hang_timeout_s=60.0, flight_recorder=0)
    launcher.runner.scripts = [FailsAt(run, clock, at=1002.0), Script(run)]
    launcher.request_traces = lambda nodes, run_dir: Request(log, nodes, run_dir)
    assert launcher.run() == 0 and log == []


def test_an_attempts_dumps_move_aside_with_its_other_files(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "trace.rank0.json").write_text("{}")
    (run / "nccl_trace.rank0").write_bytes(b"\x80")
    launcher, _, _ = make(tmp_path, [Script(run)])
    assert launcher.run() == 0
    assert (run / "earlier" / "trace.rank0.json").exists() and (run / "earlier" / "nccl_trace.rank0").exists()


def test_flight_recorder_flag_and_validation(tmp_path):
    import argparse
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(), "launch")
    args = parser.parse_args(["launch", "--flight-recorder", "500", "--", "python", "t.py"])
    assert config_from_args(args, {"SLURM_FT_CKPT_DIR": str(tmp_path)}).flight_recorder == 500
    with pytest.raises(ValueError, match="flight_recorder"):
        LaunchConfig(command=("x",), flight_recorder=-1)
    with pytest.raises(ValueError, match="trace_wait_s"):
        LaunchConfig(command=("x",), trace_wait_s=61)


def test_a_pending_dump_request_is_dropped_when_the_step_ends_by_itself(tmp_path):
    run = tmp_path / "run"
    log = []

    class Ends(FailsAt):
        def poll(self):
            code = super().poll()
            return 1 if code is None and self.clock.now >= self.at + 0.5 else code

    launcher, _, clock = make(tmp_path, [], hang_timeout_s=60.0, evidence_wait_s=5.0)
    launcher.runner.scripts = [Ends(run, clock, at=1002.0, ended=False), Script(run)]
    launcher.request_traces = lambda nodes, run_dir: Request(log, nodes, run_dir)
    assert launcher.run() == 0
    assert log == [("asked", ["n1", "n2"]), ("waited", 0.0)]


def test_the_dump_wait_ends_once_every_rank_has_dumped_or_ended(tmp_path):
    run = tmp_path / "run"
    log = []
    launcher, _, clock = make(tmp_path, [], hang_timeout_s=60.0, evidence_wait_s=1.0)
    failing = FailsAt(run, clock, at=1002.0)  # rank 0 ended; rank 1 dumped on its way out
    launcher.runner.scripts = [failing, Script(run)]
    launcher.request_traces = lambda nodes, run_dir: (
        (run_dir / "trace.rank1.json").write_text("{}"), Request(log, nodes, run_dir))[1]
    assert launcher.run() == 0
    assert log == [("asked", ["n1", "n2"]), ("waited", 3.0)]
    assert "trace_dumps_partial" not in [e["event"] for e in events(tmp_path)]


def test_mem_every_reaches_the_ranks_and_bad_values_name_themselves(tmp_path):
    import argparse

    from slurm_ft.core.errors import SlurmFtError

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="cmd"))
    config = config_from_args(parser.parse_args(["launch", "--mem-every", "4", "--", "python", "t.py"]), {})
    assert config.mem_every == "4"
    with pytest.raises(SlurmFtError, match="mem_every: .*got '0'"):
        config_from_args(parser.parse_args(["launch", "--mem-every", "0", "--", "python", "t.py"]), {})
    launcher, runner, _ = make(tmp_path, [Script(tmp_path / "run")], mem_every="off")
    assert launcher.run() == 0
    assert runner.calls[0][1]["SLURM_FT_MEM_EVERY"] == "off"
    launcher, runner, _ = make(tmp_path, [Script(tmp_path / "run")])
    assert launcher.run() == 0
    assert "SLURM_FT_MEM_EVERY" not in runner.calls[0][1]  # the job's own setting (or the default) stands


def test_the_launcher_removes_its_node_s_memory_tier_dir_at_its_end(tmp_path):
    from slurm_ft.core import shmdir

    root = tmp_path / "shm"
    root.mkdir()
    job_dir = shmdir.open_job_dir(root, "321")
    (job_dir / "step_00000001.rank_00000.snap").write_bytes(b"x")
    other = shmdir.open_job_dir(root, "322")  # another job's: left alone
    launcher, _runner, _ = make(tmp_path, [Script(tmp_path / "run")])
    launcher.environ = {**launcher.environ, "SLURM_JOB_ID": "321", "SLURM_FT_MEM_ROOT": str(root)}
    assert launcher.run() == 0
    assert not job_dir.exists() and other.is_dir()


class StaleRankElsewhere(Script):
    """Healthy ranks on n1 and n2, and rank 1 of an earlier run on n9 (its link down: Slurm's kill never reached it)
    still writing its old heartbeat and, later, its error into the shared run dir."""

    def poll(self):
        code = super().poll()
        for rank in range(self.ranks):  # the healthy ranks name their nodes
            write_heartbeat(self.run_dir, Heartbeat(rank=rank, step=self.polls, time=0.0, host=f"n{rank + 1}"))
        write_heartbeat(self.run_dir, Heartbeat(rank=1, step=1, time=0.0, host="n9"))
        if self.polls == 3:
            write_error(self.run_dir, ErrorRecord(rank=1, time=0.0, exc_type="RuntimeError", host="n9",
                                                  message="Connection reset by peer"))
        return code


def test_records_from_a_node_outside_the_attempt_are_not_its_ranks(tmp_path):
    """Issue 30 (link-down on the hosts lab): the stale rank 1 on the cut-off node made the requeued run look hung
    (its heartbeat, stuck at an old step, overwrote the live rank 1's) and could fail it with its late error."""
    run = tmp_path / "run"
    launcher, runner, _ = make(tmp_path, [StaleRankElsewhere(run, steps=15)])
    assert launcher.run() == 0
    assert len(runner.calls) == 1
    assert "fault_detected" not in [e["event"] for e in events(tmp_path)]


class FlappedLink(Script):
    """A fake srun whose ranks record their nodes' link counters at the start, then hang (both waiting)."""

    def poll(self):
        from slurm_ft.launch import links

        if self.polls == 0:
            for node in ("n1", "n2"):
                links.record(self.run_dir, links.START, node, links.SysfsLinks(_tree(self.run_dir.parent / node, 2, 1)))
        return super().poll()


def test_a_hang_while_a_nodes_link_flapped_names_that_node_and_restarts_in_place(tmp_path):
    from slurm_ft.launch import links

    run = tmp_path / "run"

    def probe(nodes, since):  # the probe step: each node records its counters; n2's cable was out and is back
        _tree(tmp_path / "n2", 4, 2)
        for node in nodes:
            links.record(run, links.PROBE, node, links.SysfsLinks(tmp_path / node))
        return {}

    launcher, runner, _ = make(tmp_path, [FlappedLink(run, hang_after=2), Script(run)], probe=probe,
                               classify_fn=classify)
    assert launcher.run() == 0
    (verdict,) = [e["verdict"] for e in events(tmp_path) if e["event"] == "verdict"]
    assert (verdict["category"], verdict["action"], verdict["culprit"]["nodes"]) == (
        "network", "restart_in_place", ["n2"])
    assert "n2: link eth0 went down: carrier_down_count 1 -> 2 (+1)" in verdict["evidence"]
    assert [e["event"] for e in events(tmp_path)].count("restart_in_place") == 1
    assert "--nodelist=n1,n2" in runner.calls[1][0]  # the same nodes
    assert runner.calls[1][1]["SLURM_FT_RESTART_CAUSE"] == "network"
    assert (run / "attempt-1" / "links.start.n2.json").exists()  # the next attempt takes its own reading
    assert not (run / "links.probe.n2.json").exists()
