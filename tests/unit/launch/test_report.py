"""``slurm-ft report`` over literal launcher events."""

from __future__ import annotations

import json

import pytest

from slurm_ft.cli import main
from slurm_ft.launch.report import LOST, attempts, format_report

EVENTS = [
    {"event": "attempt_start", "time": 100.0, "attempt": 1, "nodes": ["n1", "n2"], "resume_step": None},
    {"event": "first_step", "time": 107.0, "attempt": 1, "step": 1},
    {"event": "attempt_start", "time": 175.0, "attempt": 1, "nodes": ["n2", "n3"], "resume_step": 8},  # requeued
    {"event": "first_step", "time": 183.0, "attempt": 1, "step": 9},
    {"event": "fault_detected", "time": 190.0, "attempt": 1, "kind": "hung"},
    {"event": "restart_in_place", "time": 191.0, "attempt": 1},
    {"event": "attempt_start", "time": 191.0, "attempt": 2, "nodes": ["n2", "n3"], "resume_step": 12},
    {"event": "first_step", "time": 197.0, "attempt": 2, "step": 13},
    {"event": "exit", "time": 205.0, "code": 0, "why": "succeeded"},
]


def test_attempt_rows_count_requeues_as_runs():
    rows = attempts(EVENTS)
    assert [(r.run, r.attempt) for r in rows] == [(1, 1), (2, 1), (2, 2)]
    assert [r.ended for r in rows] == [LOST, "hung", "succeeded"]
    assert [r.resume_step for r in rows] == [None, 8, 12]
    assert rows[1].startup_s == 8.0 and rows[2].nodes == ("n2", "n3")
    text = format_report(rows)
    assert text.splitlines()[-1] == "3 attempt(s) in 2 run(s), 2 fault(s), succeeded, 105.0 s"


def test_a_stop_shows_the_fault_and_the_exit():
    rows = attempts([EVENTS[0], {"event": "fault_detected", "time": 110.0, "kind": "failed"},
                     {"event": "exit", "time": 110.1, "code": 1, "why": "not recoverable in place"}])
    assert rows[0].ended == "failed, then exit 1: not recoverable in place"


def test_cli_reads_a_checkpoint_dir_and_refuses_an_empty_one(tmp_path, capsys):
    run = tmp_path / "ckpt" / ".slurm-ft"
    run.mkdir(parents=True)
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EVENTS) + '{"event": "attempt_st')
    assert main(["report", str(tmp_path / "ckpt"), "--json"]) == 0
    assert [r["run"] for r in json.loads(capsys.readouterr().out)] == [1, 2, 2]
    assert main(["report", str(tmp_path)]) == 2
    assert "no events.jsonl" in capsys.readouterr().err


def test_each_failed_attempt_shows_its_cause_and_culprit():
    verdict = {"event": "verdict", "time": 190.5, "attempt": 1, "outcome": "hung",
               "root_cause": {"rank": 1, "node": "n3", "line": "rank 1 (n3): process stopped (state T) at step 12"},
               "verdict": {"category": "hang", "culprit": {"nodes": ["n3"], "ranks": [1]}}}
    rows = attempts(EVENTS[:5] + [verdict] + EVENTS[5:])
    assert [(r.cause, r.culprit) for r in rows] == [("-", "-"), ("hang", "rank 1 on n3"), ("-", "-")]
    text = format_report(rows)
    assert "hang          rank 1 on n3     hung" in text
    assert "root cause: rank 1 (n3): process stopped (state T) at step 12" in text


def test_a_hang_shows_where_every_group_of_ranks_was():
    where = ["ranks 0,2-3: waiting in all_gather #42 of process group 0 (default_pg) for 11.9 s",
             "rank 1: not in #42 of process group 0 (default_pg): last all_reduce #41, completed"]
    verdict = {"category": "hang", "culprit": {"nodes": ["n2"], "ranks": [1]}, "evidence": ["..."]}
    rows = attempts([EVENTS[0], {"event": "fault_detected", "time": 120.0, "kind": "hung"},
                     {"event": "verdict", "time": 121.0, "attempt": 1, "outcome": "hung", "verdict": verdict,
                      "root_cause": {"rank": 1, "node": "n2", "line": "never entered all_gather #42"},
                      "collectives": where},
                     {"event": "verdict", "time": 122.0, "verdict": verdict, "collectives": "not a list"}])
    assert rows[0].collectives == ()  # the last verdict event's word; a malformed one shows nothing
    rows = attempts([EVENTS[0], {"event": "fault_detected", "time": 120.0, "kind": "hung"},
                     {"event": "verdict", "time": 121.0, "verdict": verdict, "collectives": where}])
    lines = format_report(rows).splitlines()
    at = lines.index("        collectives (flight recorder):")
    assert lines[at + 1:at + 3] == [f"          {line}" for line in where]


def test_the_ranks_resume_event_says_where_the_attempt_resumed_from():
    resumed = {"event": "resume", "time": 193.0, "source": "memory", "step": 14, "took_s": 0.1, "disk_step": 12}
    rows = attempts(EVENTS + [resumed])
    assert [(r.resume_step, r.resume_source) for r in rows] == [(None, ""), (8, ""), (14, "memory")]
    assert "  14 mem " in format_report(rows)
