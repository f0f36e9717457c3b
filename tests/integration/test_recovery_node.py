"""Node death and a SIGSTOPped rank on the lab, end to end: SPANK ``--ft`` options, the prolog's registration,
``slurm-ft launch`` running the example FSDP trainer, the monitor (in a thread, over the lab's state dir) and
the quarantine store the prolog shares.

- in place: a 3-node ``--no-kill`` allocation with one spare. Rank 1 is SIGSTOPped (a hang: detected within the
  hang timeout, restarted on the same nodes), then a node of the second attempt dies (slurmd, stepds and ranks
  killed): the launcher swaps in the spare, the monitor quarantines the dead node, the job is never requeued;
- requeue: the batch host of a 2-node job dies; Slurm ends the job NODE_FAIL and requeues it (JobRequeue=1);
  the monitor classifies hardware_node, quarantines the node, puts it in ExcNodeList with the resume hint; the
  job resumes elsewhere from its last checkpoint;
- launcher lost: the batch host of a ``--no-kill`` job dies; Slurm drops the node and keeps the job RUNNING with
  nothing left to restart its ranks; the monitor sees the batch host gone from the job's nodes and requeues it
  without that node.

Both finish with the parameters of an uninterrupted run (computed once under torchrun) and lose no more than one
checkpoint interval per fault.
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from labutil import (
    cancel,
    jobs_dir,
    lab_env,
    output_of,
    result_line,
    submit,
    torchrun_reference_sha,
    wait_for,
    wait_job,
)

from slurm_ft.core.comment import parse_resume_step
from slurm_ft.core.rundir import read_ends, read_heartbeats
from slurm_ft.lab.faults import crash_node, signal_rank

pytestmark = pytest.mark.lab

STEPS, EVERY, SEED = 24, 4, 3
TRAINER = [sys.executable, "-m", "slurm_ft.train.example", "--steps", str(STEPS), "--seed", str(SEED), "--sync"]
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


@pytest.fixture(scope="module")
def reference_sha(tmp_path_factory) -> str:
    """The uninterrupted run's parameters (2 ranks, same seed and steps), under torchrun outside Slurm."""
    return torchrun_reference_sha(tmp_path_factory.mktemp("reference"), [*TRAINER[3:], "--ckpt-every", str(EVERY)])


class OnlyJobs:
    """The lab's client, seeing only this test's jobs (other tests' --ft jobs share the lab's state dir)."""

    def __init__(self, client, job_ids: set[int]) -> None:
        self.client, self.job_ids = client, job_ids

    def jobs(self):
        return [j for j in self.client.jobs() if j.job_id in self.job_ids]

    def __getattr__(self, name):
        return getattr(self.client, name)


class MonitorThread:
    """``slurm_ft.cluster.monitor.Monitor`` polling every second over the lab's site state dir, with its quarantine."""

    def __init__(self, lab) -> None:
        from slurm_ft.classify import classify
        from slurm_ft.cluster.monitor import Monitor, MonitorConfig
        from slurm_ft.cluster.quarantine import Quarantine, QuarantineStore, default_db_path

        self.state = lab.state_dir
        self.job_ids: set[int] = set()
        self.quarantine = Quarantine(QuarantineStore(default_db_path(self.state)), client=lab.client())
        self.monitor = Monitor(MonitorConfig(state_dir=self.state, poll_interval_s=1.0),
                               OnlyJobs(lab.client(), self.job_ids), classify, quarantine=self.quarantine)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.monitor.run, kwargs={"stop": self.stop.is_set,
                                                                        "sleep": self.stop.wait}, daemon=True)

    def __enter__(self) -> "MonitorThread":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.monitor.close()


def _fresh_dir(lab, prefix: str) -> Path:
    """A new checkpoint dir in the lab's jobs dir (a reused lab keeps earlier runs' checkpoints)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=jobs_dir(lab)))
    path.chmod(0o755)
    return path




def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _script(*launch_args: str, step_time: float = 0.3) -> str:
    return (f"exec {sys.executable} -m slurm_ft.cli launch --startup-grace 40 --probe-timeout 5 --node-fail-wait 40 "
            f"{' '.join(launch_args)} -- {' '.join(TRAINER)} --step-time {step_time}\n")


def _ft_flags(ckpt: Path, **extra: str) -> list[str]:
    flags = {"ckpt-dir": str(ckpt), "ckpt-every": str(EVERY), "max-restarts": "2", "hang-timeout": "10", **extra}
    return ["--ft", *(f"--ft-{k}={v}" for k, v in flags.items())]


def _wait_step(run_dir: Path, step: int, *, attempt: int, timeout: float) -> int:
    """Wait until every rank of launcher attempt ``attempt`` has passed ``step``; return the newest step."""
    def reached():
        starts = [e for e in _events(run_dir) if e["event"] == "attempt_start"]
        if not starts or starts[-1]["attempt"] != attempt:
            return None
        beats = [b for b in read_heartbeats(run_dir) if b.time >= starts[-1]["time"] - 1]
        return max(b.step for b in beats) if len(beats) == 2 and min(b.step for b in beats) >= step else None

    return wait_for(reached, timeout, interval=0.2, message=f"attempt {attempt} past step {step}")


def _restore(lab, monitor: MonitorThread, node: str) -> None:
    lab.start_node(node)
    monitor.quarantine.release(node, by="test")
    wait_for(lambda: next(n for n in lab.client().nodes() if n.name == node).idle, 60,
             message=f"{node} back in service")


def _requeued_once(lab, job_id: int, timeout: float, message: str):
    """The job once slurm-ft's first requeue Comment is on it, and the resume step that Comment names."""
    requeued = wait_for(lambda: (j := lab.client().job(job_id)) and j.restart_count == 1
                        and j.comment.startswith("slurm-ft: restart=1") and j, timeout, message=message)
    resume_step = parse_resume_step(requeued.comment)
    assert resume_step is not None, requeued.comment
    return requeued, resume_step


def _completed_elsewhere(lab, job_id: int, victim: str, resume_step: int, reference_sha: str) -> None:
    """The requeued job finished off ``victim``, resumed from ``resume_step``, with the reference parameters."""
    done = wait_job(lab, job_id, TERMINAL, timeout=240)
    assert done.state.value == "COMPLETED", output_of(lab, job_id)[-3000:]
    assert victim not in done.nodes and done.restart_count == 1
    result = result_line(output_of(lab, job_id))
    assert result["resumed_from"] == resume_step and result["param_sha256"] == reference_sha


def test_hang_then_node_death_recovered_in_place_with_a_spare(lab, reference_sha):
    ckpt = _fresh_dir(lab, "ck-spare-")
    run_dir = ckpt / ".slurm-ft"
    with MonitorThread(lab) as monitor:
        # 2.5 s steps: the attempt after the swap still runs when Slurm declares the dead node DOWN (10-25 s)
        job_id = submit(lab, _script(step_time=2.5), "-N3", "--no-kill", "-J", "rec-spare",
                        *_ft_flags(ckpt, **{"spare-nodes": "1"}), env=lab_env(lab))
        monitor.job_ids.add(job_id)
        victim = None
        try:
            job = wait_job(lab, job_id, ["RUNNING"], timeout=60)
            hung_at = _wait_step(run_dir, 6, attempt=1, timeout=120)
            signal_rank(lab, job_id, 1, signal.SIGSTOP)
            crashed_at = _wait_step(run_dir, hung_at + 1, attempt=2, timeout=150)
            victim = next(e for e in _events(run_dir) if e["event"] == "attempt_start" and e["attempt"] == 2)["nodes"][1]
            crash_node(lab, victim)
            wait_for(lambda: next(n for n in lab.client().nodes() if n.name == victim).down, 90,
                     message=f"Slurm declares {victim} DOWN")
            # Slurm now kills the job's steps on the dead node; the standbys' step must lose that node's tasks
            # only, not the warm rank it runs on a survivor for the attempt after the swap (srun --no-kill)
            assert lab.client().job(job_id).state.value == "RUNNING", "the job ended before the node went DOWN"
            done = wait_job(lab, job_id, TERMINAL, timeout=240)
            assert done.state.value == "COMPLETED", output_of(lab, job_id)[-3000:]
            assert done.restart_count == 0  # recovered inside the allocation, never requeued
            assert result_line(output_of(lab, job_id))["param_sha256"] == reference_sha

            events = _events(run_dir)
            starts = [e for e in events if e["event"] == "attempt_start"]
            faults = [e for e in events if e["event"] == "fault_detected"]
            assert [s["nodes"] for s in starts][:2] == [list(job.nodes[:2])] * 2  # the hang: same nodes
            assert victim not in starts[2]["nodes"] and job.nodes[2] in starts[2]["nodes"]  # the spare swapped in
            assert len(starts) == 3 and len(faults) == 2, faults  # nothing failed after the swap
            # the restarts rendezvoused at the store the launcher held open, not at one rank 0 had to start
            assert [s["store"] for s in starts] == ["rank 0", "launcher", "launcher"]
            # the spare node had standbys from the start: both ranks of the attempt after the swap started warm
            assert {e.rank: e.started for e in read_ends(run_dir)} == {0: "standby", 1: "standby"}
            assert faults[0]["kind"] == "hung" and 1 in faults[0]["hung_ranks"]
            beats = {b.rank: b for b in read_heartbeats(run_dir / "attempt-1")}
            assert faults[0]["time"] - beats[1].time <= 10 + 5  # within the hang timeout (plus polling)
            assert any(e["event"] == "spare_swap" and e["out"] == [victim] for e in events)
            assert hung_at - starts[1]["resume_step"] <= EVERY and crashed_at - starts[2]["resume_step"] <= EVERY
            node = wait_for(lambda: next(n for n in lab.client().nodes() if n.name == victim and n.drained), 60,
                            message=f"{victim} drained by the monitor")
            assert node.reason.startswith("slurm-ft: hardware_node")
            assert monitor.quarantine.is_quarantined(victim)
        finally:
            cancel(lab, job_id)
            if victim is not None:
                _restore(lab, monitor, victim)


def test_node_death_ends_node_fail_and_the_job_resumes_elsewhere(lab, reference_sha):
    ckpt = _fresh_dir(lab, "ck-nodefail-")
    run_dir = ckpt / ".slurm-ft"
    with MonitorThread(lab) as monitor:
        job_id = submit(lab, _script(), "-N2", "-J", "rec-nodefail", *_ft_flags(ckpt), env=lab_env(lab))
        monitor.job_ids.add(job_id)
        victim = None
        try:
            job = wait_job(lab, job_id, ["RUNNING"], timeout=60)
            registered = monitor.state / "jobs" / f"{job_id}.json"  # by the prolog, from the SPANK options
            wait_for(registered.exists, 30, message=f"{registered} written by the prolog")
            assert json.loads(registered.read_text())["ckpt_dir"] == str(ckpt)
            crashed_at = _wait_step(run_dir, 9, attempt=1, timeout=120)  # meanwhile the monitor saw it running
            victim = job.nodes[0]  # the batch host: the launcher dies with it
            crash_node(lab, victim)
            requeued, resume_step = _requeued_once(lab, job_id, 90, "Slurm's requeue adopted by the monitor")
            assert victim in requeued.excluded_nodes
            assert "cause=hardware_node" in requeued.comment
            assert crashed_at - resume_step <= EVERY
            assert monitor.quarantine.is_quarantined(victim)
            assert next(n for n in lab.client().nodes() if n.name == victim).reason.startswith("slurm-ft:")
            _completed_elsewhere(lab, job_id, victim, resume_step, reference_sha)
        finally:
            cancel(lab, job_id)
            if victim is not None:
                _restore(lab, monitor, victim)


def test_batch_host_death_under_no_kill_is_requeued_by_the_monitor(lab, reference_sha):
    ckpt = _fresh_dir(lab, "ck-orphan-")
    run_dir = ckpt / ".slurm-ft"
    with MonitorThread(lab) as monitor:
        job_id = submit(lab, _script(), "-N3", "--no-kill", "-J", "rec-orphan",
                        *_ft_flags(ckpt, **{"spare-nodes": "1"}), env=lab_env(lab))
        monitor.job_ids.add(job_id)
        victim = None
        try:
            job = wait_job(lab, job_id, ["RUNNING"], timeout=60)
            crashed_at = _wait_step(run_dir, 9, attempt=1, timeout=120)
            victim = job.batch_host  # the launcher dies with it; Slurm keeps the job on the other two nodes
            assert victim == job.nodes[0]
            crash_node(lab, victim)
            requeued, resume_step = _requeued_once(lab, job_id, 120, "the orphaned job requeued by the monitor")
            assert victim in requeued.excluded_nodes and "cause=hardware_node" in requeued.comment
            assert crashed_at - resume_step <= EVERY
            _completed_elsewhere(lab, job_id, victim, resume_step, reference_sha)
        finally:
            cancel(lab, job_id)
            if victim is not None:
                _restore(lab, monitor, victim)
