"""A rank's flight-recorder dumps (slurm_ft.train.traces): the file, the error path, and the signal answered from a
thread while the main thread is blocked in a gloo collective (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from slurm_ft.classify.collectives import parse_trace
from slurm_ft.core.rundir import TRACE_SIGNAL, read_heartbeats, trace_path
from slurm_ft.launch.hang import dump_traces
from slurm_ft.train import traces
from slurm_ft.train.errors import record_errors

FR = b'{"version": "2.10", "entries": [], "pg_config": {}}'


def test_envelope_wraps_torchs_json_without_parsing_it():
    data = json.loads(traces.envelope(FR, rank=3, host="n2", pid=7, when=1.5, reason="signal"))
    assert data == {"rank": 3, "host": "n2", "pid": 7, "time": 1.5, "reason": "signal",
                    "fr": {"version": "2.10", "entries": [], "pg_config": {}}}
    assert json.loads(traces.envelope(b"  ", rank=0, host="", pid=0, when=0, reason="x"))["fr"] == {}


def test_dump_writes_the_file_and_keep_leaves_an_earlier_one(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "n9")
    path = traces.dump(tmp_path, 2, reason="signal", fr_json=lambda: FR)
    assert path == trace_path(tmp_path, 2) and json.loads(path.read_text())["host"] == "n9"
    traces.dump(tmp_path, 2, reason="error", keep=True, fr_json=lambda: b"{}")
    assert json.loads(path.read_text())["reason"] == "signal"  # the launcher's moment stays
    traces.dump(tmp_path, 2, reason="error", fr_json=lambda: b"{}")
    assert json.loads(path.read_text())["reason"] == "error"


def test_a_failed_dump_is_a_warning_not_an_error(tmp_path, caplog):
    def broken() -> bytes:
        raise RuntimeError("the recorder is gone")
    assert traces.dump(tmp_path, 0, reason="signal", fr_json=broken) is None
    assert "could not dump its flight recorder" in caplog.text and not list(tmp_path.iterdir())


@pytest.mark.parametrize("env,on", [({}, False), ({"TORCH_FR_BUFFER_SIZE": "0"}, False),
                                    ({"TORCH_FR_BUFFER_SIZE": "x"}, False), ({"TORCH_FR_BUFFER_SIZE": "2000"}, True),
                                    ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}, True)])
def test_recorder_on_reads_torchs_variables(env, on, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or object())
    assert traces.recorder_on(env) is on


def test_no_dump_without_the_recorder(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    with pytest.raises(ValueError), record_errors(tmp_path, 0):
        raise ValueError("boom")
    assert (tmp_path / "error.rank0.json").exists() and not trace_path(tmp_path, 0).exists()


RANKS = """
import datetime, os, sys, time
import torch, torch.distributed as dist
from slurm_ft.train.heartbeat import HeartbeatWriter
from slurm_ft.train.errors import record_errors
run_dir, rank = sys.argv[1], int(sys.argv[2])
with record_errors(run_dir, rank):
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    t = torch.ones(4)
    dist.all_reduce(t)
    HeartbeatWriter(run_dir, rank, liveness_s=0).beat(1)
    print("up", flush=True)
    if rank == 1:
        time.sleep(120)  # outside any collective
    dist.all_reduce(t)  # rank 0 blocks here, in C++: no Python handler would run
"""


def test_a_rank_blocked_in_a_collective_dumps_on_the_signal(tmp_path):
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "100", "SLURMD_NODENAME": "nT", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port())}
    procs = [subprocess.Popen([sys.executable, "-c", RANKS, str(tmp_path), str(r)], env=env, stdout=subprocess.PIPE,
                              text=True) for r in (0, 1)]
    try:
        assert [p.stdout.readline() for p in procs] == ["up\n", "up\n"]
        time.sleep(0.5)  # rank 0 into its second all-reduce
        beats = {b.rank: b for b in read_heartbeats(tmp_path)}
        assert beats[0].trace_signal == int(TRACE_SIGNAL)
        assert dump_traces(tmp_path, "nT") == [0, 1]
        assert dump_traces(tmp_path, "elsewhere") == []
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    found = {r: parse_trace(json.loads(trace_path(tmp_path, r).read_text())) for r in (0, 1)}
    assert [(c.op, c.seq, c.completed) for c in found[0].calls] == [("all_reduce", 1, True), ("all_reduce", 2, False)]
    assert [(c.op, c.seq, c.completed) for c in found[1].calls] == [("all_reduce", 1, True)]
    assert found[0].host == "nT" and found[0].reason == "signal"


def _free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


EXITING = """
import atexit, signal, sys
from slurm_ft.core.rundir import STACK_SIGNAL, TRACE_SIGNAL
from slurm_ft.train.heartbeat import HeartbeatWriter
import torch  # the recorder needs torch imported
# registered first, so it runs last of the atexit handlers (LIFO): how the rest of the exit will treat the signals
atexit.register(lambda: print(*(signal.getsignal(s) == signal.SIG_IGN for s in (STACK_SIGNAL, TRACE_SIGNAL))))
beat = HeartbeatWriter(sys.argv[1], 0, liveness_s=0)
beat.beat(1)
print(beat._stack_signal, beat._trace_signal, flush=True)
"""


def test_a_rank_that_is_exiting_ignores_the_helpers_signals(tmp_path):
    """A finished run slower to exit than the hang timeout may get the helper's signals while it finalizes (seen on
    the lab under load: ranks killed by signal 36 and 37 after their last step). Finalization puts the default,
    deadly for a real-time signal, back in place of a Python handler and of faulthandler's, but leaves SIG_IGN: both
    signals are ignored from the atexit handlers on."""
    done = subprocess.run([sys.executable, "-c", EXITING, str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TORCH_FR_BUFFER_SIZE": "10"})
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.split() == [str(int(TRACE_SIGNAL) - 1), str(int(TRACE_SIGNAL)), "True", "True"]
