"""The demo's steps lost with the memory tier: counted from the restart's own ``resume`` event (issue 32)."""

from __future__ import annotations

from pathlib import Path

from slurm_ft.bench.demo import Run, resumed_state
from slurm_ft.lab.faults import fault_timing


def _events(source: str, step: int) -> list[dict]:
    return [{"event": "attempt_start", "attempt": 1, "time": 0.0, "resume_step": None},
            {"event": "resume", "source": "disk", "step": 0, "time": 1.0},  # the first attempt's: before the fault
            {"event": "fault_detected", "kind": "failed", "time": 11.0},
            {"event": "attempt_start", "attempt": 2, "time": 12.0, "resume_step": 8},
            {"event": "resume", "source": source, "step": step, "time": 13.0},
            {"event": "first_step", "attempt": 2, "step": step + 1, "time": 13.5}]


def test_a_restart_from_memory_counts_the_steps_lost_from_the_memory_step():
    run = Run(name="kill-rank", ckpt=Path("/tmp/ck"), fault_time=10.0, fault_step=10)
    events = _events("memory", 10)
    timing, source = resumed_state(run, fault_timing(events, fault_time=10.0, fault_step=10), events)
    assert (source, timing.resume_step, timing.steps_lost) == ("memory@10", 10, 0)
    events = _events("memory", 11)  # the ranks went one step past the progress the demo saw
    assert resumed_state(run, fault_timing(events, fault_time=10.0, fault_step=10), events)[0].steps_lost == 0


def test_a_restart_from_disk_keeps_the_launchers_count():
    run = Run(name="kill-rank", ckpt=Path("/tmp/ck"), fault_time=10.0, fault_step=10)
    events = _events("disk", 8)
    timing, source = resumed_state(run, fault_timing(events, fault_time=10.0, fault_step=10), events)
    assert (source, timing.steps_lost) == ("disk@8", 2)
    assert resumed_state(Run(name="clean", ckpt=Path("/tmp/ck")), None, events) == (None, "-")
