"""Hang evidence on a rank's node: process state, stacks on a signal (real processes, no Slurm)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from slurm_ft.core.rundir import Heartbeat, RankState, read_rank_states
from slurm_ft.launch.hang import UNREAD, helper_argv, inspect_node, rank_states

TRAINER = """
import sys, time
from slurm_ft.train.heartbeat import HeartbeatWriter
w = HeartbeatWriter(sys.argv[1], int(sys.argv[2]), liveness_s=0.2)
w.beat(5)
print("up", flush=True)
def waiting_in_a_collective():
    time.sleep(120)
waiting_in_a_collective()
"""


def _trainer(run_dir, rank: int) -> subprocess.Popen:
    env = {**os.environ, "SLURMD_NODENAME": "nX"}
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, str(run_dir), str(rank)], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    return proc


def test_a_stopped_rank_and_a_waiting_one_as_their_node_sees_them(tmp_path):
    waiting, stopped = _trainer(tmp_path, 0), _trainer(tmp_path, 1)
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and open(f"/proc/{stopped.pid}/stat").read().split(") ")[1][0] != "T":
            time.sleep(0.02)
        found = {s.rank: s for s in inspect_node(tmp_path, "nX")}
    finally:
        for proc in (waiting, stopped):
            proc.kill()
            proc.wait()
    assert found[1].state == "T" and found[1].stack == ""  # a stopped process cannot run its handler
    assert found[0].state == "S" and "waiting_in_a_collective" in open(found[0].stack).read()
    assert {s.rank for s in read_rank_states(tmp_path)} == {0, 1}
    assert inspect_node(tmp_path, "elsewhere") == []  # only this node's ranks


def test_rank_states_merge_node_reports_heartbeats_and_liveness():
    beats = [Heartbeat(rank=0, step=9, time=0, host="n1", pid=1), Heartbeat(rank=1, step=9, time=0, host="n2", pid=2)]
    read = [RankState(rank=0, host="n1", pid=1, state="S", step=9)]
    states = rank_states(3, beats, read, {0: True, 1: False})
    assert [(s.rank, s.state, s.live, s.step, s.host) for s in states] == [
        (0, "S", True, 9, "n1"), (1, UNREAD, False, 9, "n2"), (2, UNREAD, None, None, "")]


def test_helper_runs_one_task_per_node_beside_the_step(tmp_path):
    argv = helper_argv(["n1", "n2"], tmp_path)
    assert argv[:6] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n2", "--overlap"]
    assert argv[-4:] == ["-m", "slurm_ft.launch.hang", "--run-dir", str(tmp_path)]


FAULTHANDLER_WAITING = """Thread 0x00007f624dffb6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/work/slurm_ft/train/heartbeat.py", line 85 in _live

Current thread 0x00007f6289039b80 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/work/slurm_ft/train/checkpoint.py", line 422 in _agree
  File "/work/slurm_ft/train/example.py", line 302 in <module>
"""
FAULTHANDLER_LOADING = """Current thread 0x00007f6289039b80 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/home/u/data.py", line 40 in next_batch
  File "/home/u/train.py", line 12 in <module>
"""
PYSPY_WAITING = """Process 4242: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:3252)
    step (train.py:80)
    <module> (train.py:120)
"""


def test_main_thread_in_collective_reads_faulthandler_and_pyspy_dumps():
    from slurm_ft.launch.hang import main_thread_in_collective

    assert main_thread_in_collective(FAULTHANDLER_WAITING) is True
    assert main_thread_in_collective(FAULTHANDLER_LOADING) is False  # the heartbeat thread alone is no collective
    assert main_thread_in_collective(PYSPY_WAITING) is True
    assert main_thread_in_collective("Thread 0x1 (most recent call first):\n  File \"x.py\", line 1 in f\n") is None


def test_the_helper_asks_for_the_signals_the_heartbeat_announces_and_waits_only_for_fresh_files(tmp_path):
    from slurm_ft.core.rundir import trace_path, write_heartbeat
    from slurm_ft.launch.hang import dump_traces

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)
        write_heartbeat(tmp_path, Heartbeat(rank=0, step=3, time=0, host="nX", pid=sleeper.pid, stack_signal=36,
                                            trace_signal=37))
        trace_path(tmp_path, 0).write_text("{}")  # an older dump: not an answer
        sent, naps = [], []
        assert dump_traces(tmp_path, "nX", send=lambda pid, sig: sent.append((pid, sig)), sleep=naps.append) == []
        assert sent == [(sleeper.pid, 37)] and sum(naps) >= 2.0  # waited the whole STACK_WAIT_S in vain

        def answer(pid, sig):
            sent.append((pid, sig))
            if sig == 37:
                time.sleep(0.02)  # a new mtime
                trace_path(tmp_path, 0).write_text('{"rank": 0}')
        sent.clear()
        assert dump_traces(tmp_path, "nX", send=answer, sleep=lambda s: None) == [0]
        sent.clear()
        inspect_node(tmp_path, "nX", send=answer, sleep=lambda s: None)
        assert sent == [(sleeper.pid, 36), (sleeper.pid, 37)]
    finally:
        sleeper.kill()
        sleeper.wait()
    assert helper_argv(["n1"], tmp_path, traces_only=True)[-1] == "--traces-only"
