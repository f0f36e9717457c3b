"""The launcher on SIGUSR1/SIGTERM (slurm_ft.launch.preempt) and the one restart budget (slurm_ft.core.budget)."""

from __future__ import annotations

import os
import signal

from slurm_ft.core.budget import Budget
from slurm_ft.core.comment import counts, with_counts
from slurm_ft.launch.launcher import EX_TEMPFAIL
from slurm_ft.launch.preempt import PreemptConfig, SignalLatch, parse_kill_wait
from slurm_ft.train.checkpoint import CheckpointConfig
from tests.unit.launch.test_launcher import Script, events, make


class Latch:
    signum = None


class Saving(Script):
    """srun whose ranks get a signal at poll ``at`` (the latch), save, and exit ``save_polls`` polls after it;
    never, when ``save_polls`` is None."""

    def __init__(self, run_dir, latch, *, at=2, sig=signal.SIGUSR1, save_polls=2) -> None:
        super().__init__(run_dir, steps=10**6)
        self.latch, self.at, self.sig, self.save_polls = latch, at, sig, save_polls
        self.forwarded: list[int] = []

    def poll(self):
        code = super().poll()
        if self.polls == self.at:
            self.latch.signum = self.sig
        if self.forwarded and self.save_polls is not None:
            self.save_polls -= 1
            if self.save_polls <= 0:
                return 0  # the example trainer exits 0 after its emergency save
        return code

    def send_signal(self, sig):
        self.forwarded.append(sig)


def test_sigusr1_is_forwarded_then_the_job_requeues_itself_from_the_saved_step(tmp_path):
    latch, comments, requeued = Latch(), [], []
    script = Saving(tmp_path / "run", latch)
    launcher, runner, _ = make(tmp_path, [script], latch=latch, set_comment=comments.append,
                               requeue=lambda: requeued.append(True), requeues=2,
                               comment="slurm-ft: restart=2 resume_step=4 cause=hang in_place=1")
    launcher._committed = lambda: 12  # the emergency save's step
    assert launcher.run() == 0
    assert script.forwarded == [signal.SIGUSR1] and requeued == [True]
    assert len(runner.calls) == 1  # no restart in place: the job leaves the allocation
    assert comments == ["slurm-ft: restart=3 resume_step=12 cause=preemption by=launch in_place=1 free=1"]
    last = events(tmp_path)[-1]
    assert last["event"] == "exit" and last["cause"] == "preemption" and last["resume_step"] == 12


def test_sigterm_waits_within_killwait_and_leaves_the_requeue_to_slurm(tmp_path):
    latch, requeued = Latch(), []
    script = Saving(tmp_path / "run", latch, sig=signal.SIGTERM, save_polls=None)  # the ranks never finish
    launcher, runner, clock = make(tmp_path, [script], latch=latch, requeue=lambda: requeued.append(True))
    launcher.preempt = PreemptConfig(deadline_s=60.0, kill_wait_s=30.0)
    assert launcher.run() == 143
    assert script.forwarded == [signal.SIGTERM] and script.killed and requeued == []
    forwarded = next(e for e in events(tmp_path) if e["event"] == "signal_forwarded")
    assert forwarded["wait_s"] == 25.0  # KillWait 30 - 5, not the 60 asked for
    assert clock.now - forwarded["time"] <= 25.0 + 1.0


def test_a_refused_requeue_leaves_it_to_the_monitor(tmp_path):
    from slurm_ft.core.errors import SlurmCommandError

    def refuse():
        raise SlurmCommandError("scontrol requeue: Requested operation is presently disabled")

    latch, comments = Latch(), []
    launcher, runner, _ = make(tmp_path, [Saving(tmp_path / "run", latch)], latch=latch, requeue=refuse,
                               set_comment=comments.append)
    launcher._committed = lambda: 8
    assert launcher.run() == EX_TEMPFAIL
    assert comments[-1] == "slurm-ft: tempfail cause=preemption resume_step=8 attempts=1 free=1"


def test_default_deadlines_fit_slurms_default_killwait():
    kill_wait = 30.0  # Slurm's default
    launcher_wait = PreemptConfig(kill_wait_s=kill_wait).wait_s(signal.SIGTERM)
    assert CheckpointConfig(dir="/x").emergency_deadline_s < launcher_wait < kill_wait
    assert PreemptConfig().wait_s(signal.SIGUSR1) < kill_wait


def test_the_latch_catches_the_real_signal_and_kill_wait_parses():
    latch = SignalLatch()
    latch.install()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)  # the first one is what counts
    finally:
        latch.restore()
    assert latch.signum == signal.SIGUSR1
    assert parse_kill_wait("JobRequeue              = 1\nKillWait                = 30 sec\n") == 30.0
    assert parse_kill_wait("KillOnBadExit = 0\n") is None


# --- the restart budget -----------------------------------------------------------------------------------------
def test_budget_counts_in_place_restarts_and_requeues_together():
    assert Budget(limit=3, requeues=1, in_place=1).left == 1
    assert Budget(limit=3, requeues=2, free=2, in_place=3).left == 0  # two preemptions were free
    assert counts("slurm-ft: restart=2 resume_step=5 cause=hang in_place=3 free=1") == {"in_place": 3, "free": 1}
    assert counts("not ours in_place=9") == {"in_place": 0, "free": 0}
    assert with_counts("slurm-ft: restart=2 in_place=1", in_place=2, free=0) == "slurm-ft: restart=2 in_place=2"
    assert with_counts("user words", in_place=1, free=0) == "slurm-ft: in_place=1"


def test_in_place_restarts_of_earlier_runs_count_against_the_budget(tmp_path):
    run = tmp_path / "run"
    comments = []
    # --ft-max-restarts=3: one requeue and one in-place restart already used -> one restart left in this run
    launcher, runner, _ = make(tmp_path, [Script(run, code=1) for _ in range(4)], max_restarts=3, requeues=1,
                               comment="slurm-ft: restart=1 resume_step=4 cause=hang in_place=1",
                               set_comment=comments.append)
    assert launcher.run() == 1
    assert len(runner.calls) == 2
    assert comments == ["slurm-ft: restart=1 resume_step=4 cause=hang in_place=2"]  # for the monitor
    assert "restart budget exhausted (3 of 3 used" in events(tmp_path)[-1]["why"]


def test_the_monitor_counts_the_same_budget():
    from slurm_ft.cluster.monitor import decide
    from slurm_ft.core.registry import FtJob
    from slurm_ft.core.taxonomy import Action, Category, Verdict
    from slurm_ft.slurm.types import JobInfo, JobState

    verdict = Verdict(category=Category.HANG, recoverable=True, action=Action.REQUEUE)
    ft = FtJob(job_id=5)

    def job(comment):
        return JobInfo(job_id=5, name="j", state=JobState.FAILED, restart_count=1, comment=comment)

    kwargs = dict(resume_step=9, budget=3, previous_resume_step=4, restarted_before=True)
    assert decide(job("slurm-ft: restart=1 resume_step=4 cause=hang"), ft, verdict, **kwargs).requeue
    spent = decide(job("slurm-ft: restart=1 resume_step=4 cause=hang in_place=2"), ft, verdict, **kwargs)
    assert not spent.requeue and spent.reason.startswith("restart budget exhausted (3 of 3")
    preempted = Verdict(category=Category.PREEMPTION, recoverable=True, action=Action.REQUEUE)
    assert decide(job("slurm-ft: restart=1 in_place=2"), ft, preempted, **kwargs).requeue  # not a fault: free
