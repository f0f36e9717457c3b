"""The launcher's root cause: the culprit rank, its node, the first line of its real error."""

from __future__ import annotations

from slurm_ft.classify import classify
from slurm_ft.core.rundir import ErrorRecord, RankEnd, RankState, write_end, write_error
from slurm_ft.launch.verdict import attempt_evidence, paragraph, root_cause


def test_the_root_cause_of_a_user_error_is_its_first_line_not_the_peers(tmp_path):
    write_error(tmp_path, ErrorRecord(rank=1, time=5.0, exc_type="ValueError", message="bad shape\nmore", host="n2",
                                      traceback='  File "/home/u/train.py", line 9, in step\nValueError: bad shape'))
    write_error(tmp_path, ErrorRecord(rank=0, time=5.1, exc_type="RuntimeError", host="n1",
                                      message="[gloo/transport/tcp/pair.cc:534] Connection closed by peer"))
    evidence = attempt_evidence(tmp_path)
    verdict = classify(evidence)
    cause = root_cause(verdict, evidence)
    assert cause == {"rank": 1, "node": "n2", "line": "ValueError: bad shape"}
    text = paragraph(1, verdict, cause)
    assert text.splitlines()[0] == "slurm-ft: root cause of attempt 1: rank 1 on n2: ValueError: bad shape"
    assert "secondary, not the cause" in text and "verdict user_code" in text


def test_a_signal_death_shows_its_last_stderr_line(tmp_path):
    write_end(tmp_path, RankEnd(rank=3, time=1.0, host="n4", signal=11, oom_kills=0,
                                tail="loading shard 7\nsomething odd\n"))
    evidence = attempt_evidence(tmp_path)
    cause = root_cause(classify(evidence), evidence)
    assert cause == {"rank": 3, "node": "n4",
                     "line": "killed by signal 11 (SIGSEGV); its last stderr line: something odd"}


def test_a_hang_and_a_dead_node(tmp_path):
    states = (RankState(rank=0, host="n1", state="S", live=True, step=4),
              RankState(rank=1, host="n2", state="T", live=False, step=4))
    evidence = attempt_evidence(tmp_path, hang=states)
    cause = root_cause(classify(evidence), evidence)
    assert cause == {"rank": 1, "node": "n2", "line": "process stopped (state T) at step 4"}
    evidence = attempt_evidence(tmp_path, sick={"n3"})
    verdict = classify(evidence)
    assert root_cause(verdict, evidence)["node"] == "n3" and verdict.culprit.nodes == ("n3",)
    assert "no single rank on n3" in paragraph(2, verdict, root_cause(verdict, evidence))
