"""Fault flags and the recovery summary read from a launcher run directory."""

from __future__ import annotations

import json

import pytest

from slurm_ft.core.rundir import Heartbeat, write_heartbeat
from slurm_ft.lab.faults import Fault, Recovery, ettr, first_attempt_only, summarize, trainer_flags


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


def test_fault_timing_across_a_restart_in_place():
    from slurm_ft.lab.faults import fault_timing

    events = [{"event": "attempt_start", "time": 100.0, "attempt": 1, "resume_step": None},
              {"event": "first_step", "time": 107.0, "attempt": 1, "step": 1},
              {"event": "fault_detected", "time": 121.5, "attempt": 1, "kind": "hung"},
              {"event": "attempt_start", "time": 125.0, "attempt": 2, "resume_step": 8},
              {"event": "first_step", "time": 131.0, "attempt": 2, "step": 9},
              {"event": "exit", "time": 140.0, "code": 0}]
    timing = fault_timing(events, fault_time=111.0, fault_step=10)
    assert timing.detection_s == 10.5 and timing.recovery_s == 20.0
    assert timing.resume_step == 8 and timing.steps_lost == 2 and timing.wall_s == 40.0


def test_fault_timing_when_the_launcher_died_with_its_node():
    from slurm_ft.lab.faults import fault_timing

    events = [{"event": "attempt_start", "time": 100.0, "attempt": 1, "resume_step": None},
              {"event": "attempt_start", "time": 170.0, "attempt": 1, "resume_step": 8},  # after the requeue
              {"event": "first_step", "time": 178.0, "attempt": 1, "step": 9},
              {"event": "exit", "time": 190.0, "code": 0}]
    timing = fault_timing(events, fault_time=112.0, fault_step=11, detected_at=135.0)
    assert timing.detection_s == 23.0 and timing.recovery_s == 66.0 and timing.steps_lost == 3
    assert fault_timing(events[:1], fault_time=112.0, fault_step=11).recovery_s is None
