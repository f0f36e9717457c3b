"""The launcher's root cause: the culprit rank, its node, the first line of its real error."""

from __future__ import annotations

import json
import os

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


def test_the_dumps_name_only_the_attempts_ranks_and_nodes(tmp_path):
    from slurm_ft.launch.verdict import attempt_traces
    for rank, host in ((0, "n1"), (1, "elsewhere"), (7, "n1")):
        (tmp_path / f"trace.rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "host": host, "time": 1.0, "reason": "signal", "fr": {"entries": []}}))
    (tmp_path / "trace.rank2.json").write_text(json.dumps({"rank": 0, "host": "n1", "fr": {}}))  # says rank 0
    found = attempt_traces(tmp_path, nodes=["n1", "n2"], ranks=range(4))
    assert [(t.rank, t.host) for t in found] == [(0, "n1"), (1, "")]
    assert [t.rank for t in attempt_traces(tmp_path)] == [0, 1, 7]
    elsewhere = tmp_path / "sub"
    elsewhere.mkdir()
    (elsewhere / "t.json").write_text(json.dumps({"rank": 3, "host": "n1", "fr": {"entries": []}}))
    os.symlink(elsewhere / "t.json", tmp_path / "trace.rank3.json")  # a link is no file of the rank's
    (tmp_path / "trace.rank4.json").write_text("{torn")
    assert [t.rank for t in attempt_traces(tmp_path)] == [0, 1, 7]


def test_a_link_that_went_down_while_both_ranks_waited_names_its_node(tmp_path):
    from slurm_ft.health.links import LinkCounters, LinkSnapshot
    from slurm_ft.launch import links

    def reading(node: str, changes: int, downs: int) -> dict:
        return LinkSnapshot(node=node, time=1.0, links=(LinkCounters(
            interface="eth0", counters={"carrier_changes": changes, "carrier_down_count": downs}),)).to_dict()

    for node, when, counts in (("n1", links.START, (2, 1)), ("n2", links.START, (2, 1)),
                               ("n1", links.PROBE, (2, 1)), ("n2", links.PROBE, (4, 2))):
        links.links_path(tmp_path, when, node).write_text(json.dumps(reading(node, *counts)))
    states = (RankState(rank=0, host="n1", state="S", live=True, step=10, in_collective=True),
              RankState(rank=1, host="n2", state="S", live=True, step=10, in_collective=True))
    verdict = classify(attempt_evidence(tmp_path, hang=states, nodes=["n1", "n2"], ranks=[0, 1]))
    assert (verdict.category.value, verdict.recoverable, verdict.action.value) == ("network", True,
                                                                                  "restart_in_place")
    assert verdict.culprit.nodes == ("n2",) and verdict.culprit.ranks == ()
    assert verdict.evidence[0] == "n2: link eth0 went down: carrier_down_count 1 -> 2 (+1)"
    assert verdict.attested_nodes == ()  # the job's own reading: it names the node, never strikes it
