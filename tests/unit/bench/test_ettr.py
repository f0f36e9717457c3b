import pytest

from slurm_ft.bench.ettr import Overhead, Span, StepRecord, ettr, mark_lost


def _steps(attempt, first, last, t0, dt=1.0):
    return [StepRecord(attempt=attempt, step=s, start=t0 + i * dt, end=t0 + (i + 1) * dt)
            for i, s in enumerate(range(first, last + 1))]


def test_without_faults_ettr_is_step_time_over_wall_and_the_rest_is_named():
    # 10 one-second steps, a 1.5 s checkpoint stall after step 5, 1 s nobody accounted for
    steps = _steps(0, 1, 5, 0.0) + _steps(0, 6, 10, 6.5)
    result = ettr(steps, 0.0, 12.5, [Span(kind=Overhead.CHECKPOINT_STALL, start=5.0, end=6.5)])
    assert result.ettr == pytest.approx(10 / 12.5)
    assert result.lost_steps == 0 and result.productive_steps == 10
    assert result.overhead_s["checkpoint_stall"] == pytest.approx(1.5)
    assert result.overhead_s["other"] == pytest.approx(1.0)


def test_rollback_marks_rerun_steps_lost_and_counts_them_as_rework():
    # attempt 0 ran steps 1..8 (t 0..8) and crashed at 8; detected at 9; restarted and resumed from the
    # checkpoint of step 5 at 11; attempt 1 ran 6..10 (t 11..16)
    steps = mark_lost(_steps(0, 1, 8, 0.0) + _steps(1, 6, 10, 11.0))
    assert sorted(s.step for s in steps if s.lost) == [6, 7, 8]
    assert all(s.attempt == 0 for s in steps if s.lost)
    spans = [Span(kind=Overhead.DETECTION, start=8.0, end=9.0), Span(kind=Overhead.RECOVERY, start=9.0, end=11.0)]
    result = ettr(steps, 0.0, 16.0, spans)
    assert result.productive_s == pytest.approx(10.0)
    assert result.lost_work_s == pytest.approx(3.0)
    assert result.lost_steps == 3
    assert result.ettr == pytest.approx(10 / 16)
    assert result.overhead_s == pytest.approx({"checkpoint_stall": 0.0, "detection": 1.0, "recovery": 2.0,
                                               "queue_wait": 0.0, "rework": 3.0, "other": 0.0})
    assert sum(result.overhead_s.values()) + result.productive_s == pytest.approx(result.wall_s)


def test_requeue_timeline_with_queue_wait():
    # crash at 4 (steps 1..4 done, checkpoint after 2); 1 s detection; 120 s in the queue; 10 s start-up;
    # attempt 1 resumes at step 3 and runs 3..6
    steps = mark_lost(_steps(0, 1, 4, 0.0) + _steps(1, 3, 6, 135.0))
    spans = [Span(kind=Overhead.DETECTION, start=4, end=5), Span(kind=Overhead.QUEUE_WAIT, start=5, end=125),
             Span(kind=Overhead.RECOVERY, start=125, end=135)]
    result = ettr(steps, 0.0, 139.0, spans)
    assert result.ettr == pytest.approx(6 / 139)
    assert result.overhead_s["queue_wait"] == pytest.approx(120)
    assert result.lost_work_s == pytest.approx(2)
    assert result.to_dict()["lost_work_s"] == pytest.approx(2)


def test_records_are_clipped_to_the_wall_window():
    steps = _steps(0, 1, 4, 0.0)  # t 0..4
    result = ettr(steps, 1.0, 3.5, [Span(kind=Overhead.RECOVERY, start=-5, end=100)])
    assert result.productive_s == pytest.approx(2.5)
    assert result.wall_s == pytest.approx(2.5)
    assert result.ettr == pytest.approx(1.0)


def test_an_explicit_lost_flag_is_kept():
    steps = mark_lost([StepRecord(attempt=0, step=1, start=0, end=1, lost=True)])
    assert steps[0].lost
    assert ettr(steps, 0, 2).ettr == 0


def test_bad_records_are_rejected_with_the_field():
    with pytest.raises(ValueError, match="wall_end"):
        ettr([], 5.0, 5.0)
    with pytest.raises(ValueError, match="end"):
        StepRecord(attempt=0, step=1, start=2.0, end=1.0)
    with pytest.raises(ValueError, match="rework"):
        Span(kind=Overhead.REWORK, start=0, end=1)
