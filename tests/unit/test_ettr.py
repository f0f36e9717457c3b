import pytest

from slurm_ft.bench.ettr import Overhead, Span, StepRecord, ettr, mark_lost


def _steps(attempt, first, last, t0, dt=1.0):
    return [StepRecord(attempt=attempt, step=s, start=t0 + i * dt, end=t0 + (i + 1) * dt)
            for i, s in enumerate(range(first, last + 1))]


def test_ettr_without_faults_is_step_time_over_wall():
    result = ettr(_steps(0, 1, 10, 0.0), 0.0, 12.5)
    assert result.ettr == pytest.approx(10 / 12.5)
    assert result.lost_steps == 0


def test_rollback_marks_rerun_steps_lost():
    # attempt 0 ran steps 1..8 (t 0..8), crashed; attempt 1 resumed from step 5 and ran 6..10 (t 10..15)
    steps = mark_lost(_steps(0, 1, 8, 0.0) + _steps(1, 6, 10, 10.0))
    lost = sorted(s.step for s in steps if s.lost)
    assert lost == [6, 7, 8]
    result = ettr(steps, 0.0, 16.0, [Span(kind=Overhead.RECOVERY, start=8.0, end=10.0)])
    assert result.productive_s == pytest.approx(10.0)
    assert result.lost_work_s == pytest.approx(3.0)
    assert result.ettr == pytest.approx(10 / 16)
    assert result.overhead_s["recovery"] == pytest.approx(2.0)


def test_wall_must_be_positive():
    with pytest.raises(ValueError, match="wall_end"):
        ettr([], 5.0, 5.0)
