"""Fault flags and the recovery summary read from a launcher run directory."""

from __future__ import annotations

import json

import pytest

from slurm_ft.faults import Fault, Recovery, ettr, first_attempt_only, summarize, trainer_flags
from slurm_ft.train.records import Heartbeat, write_heartbeat


def test_trainer_flags():
    assert trainer_flags(Fault.HANG, 1, 6) == "--hang-at 1:6"
    assert trainer_flags(Fault("kill-rank"), 0, 3) == "--crash-at 0:3"
    with pytest.raises(ValueError, match="rank"):
        trainer_flags(Fault.USER_ERROR, -1, 3)
    assert '"$SLURM_FT_ATTEMPT" = 1' in first_attempt_only("python t.py", "--fail-at 1:2")


def test_summarize_crash_then_restart(tmp_path):
    for rank in (0, 1):
        write_heartbeat(tmp_path / "attempt-1", Heartbeat(rank=rank, step=10, time=110.0))
    events = [{"event": "attempt_start", "attempt": 1, "time": 100.0},
              {"event": "fault_detected", "kind": "failed", "time": 112.5},
              {"event": "attempt_start", "attempt": 2, "time": 113.0, "resume_step": 8},
              {"event": "first_step", "attempt": 2, "step": 9, "time": 120.0},
              {"event": "exit", "code": 0, "time": 130.0}]
    (tmp_path / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n{torn")
    got = summarize(tmp_path)
    assert got == Recovery(attempts=2, exit_code=0, fault_kind="failed", detection_s=2.5, recovery_s=7.5,
                           steps_lost=2, wall_s=30.0)
    assert ettr(got, 15.0) == 0.5


def test_summarize_clean_run(tmp_path):
    (tmp_path / "events.jsonl").write_text(json.dumps({"event": "attempt_start", "time": 1.0}) + "\n"
                                           + json.dumps({"event": "exit", "code": 0, "time": 5.0}) + "\n")
    got = summarize(tmp_path)
    assert got.attempts == 1 and got.fault_kind is None and got.wall_s == 4.0
