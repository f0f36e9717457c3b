"""The benchmark timeline: writing it, and reading throughput, ETTR and one fault's outcome from literal records."""

import json

import pytest

from slurm_ft.bench import timeline as tl
from slurm_ft.train.timeline import TimelineWriter


def _steps(first, last, t0, dt=1.0):
    return [{"ev": "step", "step": s, "t0": t0 + i * dt, "t1": t0 + (i + 1) * dt}
            for i, s in enumerate(range(first, last + 1))]


# attempt 1: launch at 0, start at 2, steps 1..8 over 2..10, a 0.5 s save after step 5 (steps shift by 0.5);
# the fault at 10.2; attempt 2 launches at 14, resumes from step 5 at 16, runs 6..10 over 16..21
RECORDS = ([{"ev": "launch", "t": 0.0}, {"ev": "start", "t": 2.0, "resumed_from": 0, "world": 2, "pid": 1}]
           + _steps(1, 5, 2.0) + [{"ev": "save", "step": 5, "t0": 7.0, "t1": 7.5}] + _steps(6, 8, 7.5)
           + [{"ev": "launch", "t": 14.0}, {"ev": "start", "t": 16.0, "resumed_from": 5, "world": 2, "pid": 2}]
           + _steps(6, 10, 16.0) + [{"ev": "end", "t": 21.0, "step": 10}])


def test_writer_appends_one_json_line_per_record_and_reader_skips_a_torn_line(tmp_path):
    path = tmp_path / "sub" / "timeline.jsonl"
    cpu = iter([0.25, 0.75])
    writer = TimelineWriter(path, clock=lambda: 12.5, cpu_clock=lambda: next(cpu))
    writer.write("launch")
    writer.write("step", step=1, t0=1.0, t1=2.0)
    writer.close()
    with open(path, "a") as fh:
        fh.write('{"ev": "step", "st')  # the writer was killed mid-line
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"ev": "launch", "t": 12.5, "cpu": 0.25}
    assert json.loads(lines[1]) == {"ev": "step", "step": 1, "t0": 1.0, "t1": 2.0, "cpu": 0.75}  # no "t" beside t0
    assert tl.read_timeline(path) == [json.loads(line) for line in lines[:2]]


def test_the_writer_records_this_processs_cpu_time(tmp_path):
    path = tmp_path / "timeline.jsonl"
    writer = TimelineWriter(path)
    writer.write("launch")
    sum(i * i for i in range(2_000_000))  # burn some CPU
    writer.write("start")
    writer.close()
    launch, start = tl.read_timeline(path)
    assert start["cpu"] > launch["cpu"] >= 0.0


def test_step_records_number_attempts_and_mark_the_redone_steps_lost():
    steps = tl.step_records(RECORDS)
    assert [(s.attempt, s.step) for s in steps if s.lost] == [(1, 6), (1, 7), (1, 8)]
    assert sum(1 for s in steps if not s.lost) == 10
    assert tl.attempts(RECORDS) == 2 and tl.last_step(RECORDS) == 10


def test_ettr_of_the_timeline_names_stalls_and_rework():
    result = tl.timeline_ettr(RECORDS, 0.0, 21.0)
    assert result.productive_s == pytest.approx(10.0)
    assert result.overhead_s["checkpoint_stall"] == pytest.approx(0.5)
    assert result.overhead_s["rework"] == pytest.approx(3.0)
    assert result.overhead_s["other"] == pytest.approx(21.0 - 10.0 - 0.5 - 3.0)
    assert result.ettr == pytest.approx(10 / 21)


def test_fault_outcome_counts_from_the_fault_to_the_next_attempts_first_step():
    outcome = tl.fault_outcome(RECORDS, fault_time=10.2, torn_down_at=11.0)
    assert outcome.fault_step == 8 and outcome.resume_step == 5 and outcome.steps_lost == 3
    assert outcome.lost_work_s == pytest.approx(3.0)
    assert outcome.detection_s == pytest.approx(0.8)
    assert outcome.recovery_s == pytest.approx(17.0 - 10.2)


def test_fault_outcome_splits_the_restart_and_reads_rank_0s_cpu_for_it():
    cpu = {"launch": 1.0, "start": 1.5}
    records = [{**r, "cpu": cpu.get(r["ev"], 2.0 + r.get("step", 0) / 10)} if r.get("t", r.get("t0")) >= 14.0 else r
               for r in RECORDS]
    outcome = tl.fault_outcome(records, fault_time=10.2)
    assert outcome.relaunch_s == pytest.approx(14.0 - 10.2) and outcome.resume_s == pytest.approx(2.0)
    assert outcome.restart_cpu_s == pytest.approx(2.6 - 1.0)  # launch -> the end of step 6
    assert tl.fault_outcome(RECORDS, fault_time=10.2).restart_cpu_s is None  # older timelines: no cpu
    assert tl.fault_outcome(RECORDS, fault_time=10.2).relaunch_s == pytest.approx(3.8)


def test_a_step_finishing_after_the_fault_still_belongs_to_the_faulted_attempt():
    # the fault lands during step 8 (9.5 .. 10.5): the survivor finishes it, then the attempt dies
    outcome = tl.fault_outcome(RECORDS, fault_time=9.7)
    assert outcome.fault_step == 8 and outcome.steps_lost == 3 and outcome.detection_s is None


def test_fault_outcome_without_a_later_attempt_is_unknown_not_zero():
    records = [r for r in RECORDS if r.get("t", r.get("t0", 0)) < 12]
    outcome = tl.fault_outcome(records, fault_time=10.2)
    assert outcome.fault_step == 8
    assert outcome.recovery_s is None and outcome.resume_step is None and outcome.steps_lost is None


def test_throughput_leaves_out_warmup_and_counts_stalls_in_the_rate():
    records = ([{"ev": "launch", "t": 0.0}, {"ev": "start", "t": 1.0}] + _steps(1, 4, 1.0, dt=2.0)
               + _steps(5, 10, 9.0) + [{"ev": "save", "step": 8, "t0": 12.0, "t1": 12.25}])
    # the saves shift nothing here on purpose: the rate is steps over the window's wall time
    t = tl.throughput(records, warmup=4)
    assert t.steps == 6 and t.step_s == pytest.approx(1.0)
    assert t.steps_per_s == pytest.approx(6 / 6.0)
    assert t.saves == 1 and t.stall_s == pytest.approx(0.25)
    assert t.startup_s == pytest.approx(3.0)  # launch -> first step done


def test_throughput_of_an_empty_timeline_says_so():
    with pytest.raises(ValueError, match="no steps"):
        tl.throughput([{"ev": "launch", "t": 0.0}])
