"""Flight-recorder dumps as evidence (slurm_ft.classify.collectives, the engine's trace findings), on dumps recorded
from real gloo ranks (tests/data/traces: record.py says how; desync_fsdp and clean_fsdp are the example trainer's)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from slurm_ft.classify import classify
from slurm_ft.classify import collectives as fr
from slurm_ft.classify.records import Evidence
from slurm_ft.core.rundir import UNREAD_STATE, RankState
from slurm_ft.core.taxonomy import Action, Category

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"


def raw(scenario: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((DATA / scenario).glob("trace.rank*.json"))]


def traces(scenario: str) -> list[fr.RankTrace]:
    return [fr.parse_trace(d) for d in raw(scenario)]


def states(world: int, **by_rank: str) -> list[RankState]:
    """Every rank alive and sleeping (state S) on n1 (ranks 0-1) or n2 (2-3), unless ``r1="T"`` ... says else."""
    return [RankState(rank=r, host=f"n{1 + r // 2}", pid=100 + r, state=by_rank.get(f"r{r}", "S"), live=True)
            for r in range(world)]


def test_parse_reads_a_recorded_dump():
    trace = fr.parse_trace(raw("stuck_outside")[0])
    assert (trace.rank, trace.host, trace.reason) == (0, "n1", "signal")
    assert [(c.op, c.seq, c.completed) for c in trace.calls] == [
        ("all_reduce", 1, True), ("all_reduce", 2, True), ("all_reduce", 3, True), ("all_reduce", 4, False)]
    last = trace.calls[-1]
    assert (last.pg, last.pg_desc, last.in_sizes, last.dtypes) == ("0", "default_pg", ((4,),), frozenset({"Float"}))
    assert last.where() == "#4 of process group 0 (default_pg)"
    assert last.text() == "all_reduce(in [[4]], out [[4]], Float)"


@pytest.mark.parametrize("data", [None, [], {"rank": 1}, {"rank": "1", "fr": {}}, {"rank": True, "fr": {}},
                                  {"rank": -1, "fr": {}}])
def test_parse_refuses_what_is_no_dump(data):
    assert fr.parse_trace(data) is None


def test_parse_skips_entries_of_the_wrong_shape_and_clips_names():
    data = copy.deepcopy(raw("stuck_outside")[0])
    entries = data["fr"]["entries"]
    entries[0]["collective_seq_id"] = "1"  # not an int
    entries[1] = ["not", "a", "dict"]
    entries[2]["profiling_name"] = "gloo:" + "x" * 500
    entries[2]["input_sizes"] = [[4], "junk", [True]]
    trace = fr.parse_trace(data)
    assert [c.seq for c in trace.calls] == [3, 4]
    assert len(trace.calls[0].op) == 64 and trace.calls[0].in_sizes == ((4,),)


def test_stuck_outside_a_collective_the_rank_that_never_entered_is_the_culprit():
    clues = fr.clues(traces("stuck_outside"), states(3), hung=True)
    assert [(c.kind, c.ranks, c.node) for c in clues] == [("never_entered", (1,), "n1")]
    assert clues[0].text.startswith("rank 1 (n1): never entered all_reduce #4 of process group 0 (default_pg), "
                                    "which ranks 0,2 (n1, n2) wait in for ")
    assert "its last collective there: all_reduce #3, completed [flight recorder]" in clues[0].text
    verdict = classify(Evidence(traces=tuple(traces("stuck_outside")), hang=tuple(states(3)), in_allocation=True))
    assert (verdict.category, verdict.recoverable, verdict.action) == (Category.HANG, True, Action.RESTART_IN_PLACE)
    assert verdict.culprit.ranks == (1,) and verdict.culprit.nodes == ("n1",)
    assert verdict.evidence[0] == clues[0].text


def test_a_stopped_rank_is_named_with_the_collective_its_peer_waits_for():
    found = traces("stopped")  # rank 1 stopped itself: only rank 0 dumped
    clues = fr.clues(found, states(2, r1="T"), hung=True)
    assert [(c.kind, c.ranks) for c in clues] == [("silent_stuck", (1,))]
    assert clues[0].text.startswith("rank 1 (n1): no flight-recorder dump (process stopped (state T)) while rank 0 "
                                    "(n1) waits in all_reduce #4 of process group 0 (default_pg)")
    assert clues[0].text.endswith("the last collective there every rank completed: all_reduce #3 [flight recorder]")
    verdict = classify(Evidence(traces=tuple(found), hang=tuple(states(2, r1="T")), in_allocation=True))
    assert verdict.category is Category.HANG and verdict.culprit.ranks == (1,)
    assert verdict.evidence[0] == clues[0].text
    assert any(line.startswith("rank 1 (n1): process stopped (state T)") for line in verdict.evidence)


def test_a_silent_rank_nothing_says_is_stuck_is_named_weakly():
    clues = fr.clues(traces("stopped"), states(2), hung=True)
    assert [(c.kind, c.ranks) for c in clues] == [("silent", (1,))]
    assert "no flight-recorder dump (did not answer)" in clues[0].text
    verdict = classify(Evidence(traces=tuple(traces("stopped")), hang=tuple(states(2)), in_allocation=True))
    assert verdict.culprit.ranks == (1,) and verdict.confidence <= 0.6  # 0.5, and the heartbeats agree: a hang


def test_one_nodes_ranks_silent_while_all_others_wait_points_at_that_nodes_network():
    found = traces("node_silent")  # ranks 2-3 (n2) never answered; ranks 0-1 wait in the 4th all-reduce
    unread = states(4, r2=UNREAD_STATE, r3=UNREAD_STATE)
    clues = fr.clues(found, unread, hung=True)
    assert [(c.kind, c.ranks, c.node) for c in clues] == [("network", (2, 3), "n2")]
    assert clues[0].text.startswith("n2: ranks 2-3 did not answer (the node's helper did not report) while ranks "
                                    "0-1 (n1) wait in all_reduce #4 of process group 0 (default_pg)")
    verdict = classify(Evidence(traces=tuple(found), hang=tuple(unread), in_allocation=True))
    assert (verdict.category, verdict.culprit.nodes, verdict.culprit.ranks) == (Category.NETWORK, ("n2",), (2, 3))
    assert verdict.attested_nodes == ()  # the job's word: never a strike on the node
    # the same silence with the node's helper reporting them asleep: no network, two weak hang suspects
    assert {c.kind for c in fr.clues(found, states(4), hung=True)} == {"silent"}


@pytest.mark.parametrize("scenario,others", [("desync2", "rank 0 (n1)"), ("desync3", "ranks 0,2 (n1, n2)")])
def test_a_desync_names_the_odd_rank_and_both_calls(scenario, others):
    found = traces(scenario)
    [mismatch] = fr.mismatches(found)
    assert (mismatch.kind, mismatch.odd, mismatch.sure) == (fr.TYPE_MISMATCH, (1,), True)  # desync2: a tie,
    # settled by history: rank 0's all_reduce completed before in this group, rank 1's all_gather never did
    [clue] = fr.clues(found, states(len(found)), hung=True)
    assert clue.kind == "desync" and clue.ranks == (1,)
    assert clue.text.startswith(f"rank 1 (n1) called all_gather(in [[4]], out [[{len(found)}, 4]], Float) as "
                                f"collective #4 of process group 0 (default_pg) where {others} called "
                                "all_reduce(in [[4]], out [[4]], Float): a desync in the training code "
                                "(COLLECTIVE_TYPE_MISMATCH)")
    verdict = classify(Evidence(traces=tuple(found), hang=tuple(states(len(found))), in_allocation=True))
    assert (verdict.category, verdict.recoverable, verdict.action) == (Category.USER_CODE, False, Action.STOP)
    assert verdict.culprit.ranks == (1,) and verdict.evidence[0] == clue.text


def test_the_example_trainers_desync_after_the_timeout_is_user_code_in_a_failed_attempt_too():
    found = traces("desync_fsdp")  # dumped by record_errors: gloo retired both calls when they timed out
    assert all(t.reason == "error" and t.calls[-1].completed for t in found)
    verdict = classify(Evidence(traces=tuple(found), in_allocation=True))
    assert verdict.category is Category.USER_CODE and verdict.culprit.ranks == (1,)
    assert verdict.evidence[0].startswith("rank 1 (vm) called all_reduce(in [[1]], out [[1]], Float) as collective "
                                          "#38 of process group 0 (default_pg) where rank 0 (vm) called "
                                          "all_gather(in [[272]], out [[2, 272]], Float)")


def test_a_clean_fsdp_run_says_nothing():
    found = traces("clean_fsdp")
    assert len(found[0].calls) > 50 and {c.pg for c in found[0].calls} == {"0", "1", "2"}
    assert fr.mismatches(found) == [] and fr.stalls(found) == [] and fr.clues(found, states(2), hung=True) == []


@pytest.mark.parametrize("field,value,kind", [("input_sizes", [[8]], fr.SIZE_MISMATCH),
                                              ("input_dtypes", ["Double"], fr.DTYPE_MISMATCH)])
def test_size_and_dtype_mismatches(field, value, kind):
    data = raw("desync3")
    for entry in data[1]["fr"]["entries"]:  # rank 1 calls the all-reduce the others call, with other sizes/dtypes
        if entry["collective_seq_id"] == 4:
            entry.update(profiling_name="gloo:all_reduce", output_sizes=[[4]])
            entry[field] = value
    [mismatch] = fr.mismatches([fr.parse_trace(d) for d in data])
    assert (mismatch.kind, mismatch.odd, mismatch.others) == (kind, (1,), (0, 2))


def test_gather_and_scatter_sizes_differ_on_the_root_legitimately():
    def call(op, ins, outs):
        return fr.CollectiveCall(pg="0", pg_desc="", seq=1, op=op, in_sizes=ins, out_sizes=outs,
                                 dtypes=frozenset({"Byte"}), completed=True)
    gather = [fr.RankTrace(rank=0, calls=(call("gather", ((9,),), ((2, 9),)),)),
              fr.RankTrace(rank=1, calls=(call("gather", ((9,),), ()),))]
    scatter = [fr.RankTrace(rank=0, calls=(call("scatter", ((2, 9),), ((9,),)),)),
               fr.RankTrace(rank=1, calls=(call("scatter", (), ((9,),)),))]
    assert fr.mismatches(gather) == [] and fr.mismatches(scatter) == []


def test_a_tie_no_history_settles_names_both_sides_weakly():
    def trace(rank, op):
        return fr.RankTrace(rank=rank, host=f"n{rank + 1}", calls=(fr.CollectiveCall(
            pg="0", pg_desc="default_pg", seq=1, op=op, in_sizes=((4,),), out_sizes=((4,),)),))
    found = [trace(0, "all_reduce"), trace(1, "broadcast")]
    [clue] = fr.clues(found)
    assert clue.ranks == (0, 1) and not clue.sure
    verdict = classify(Evidence(traces=tuple(found), in_allocation=True))
    assert verdict.category is Category.USER_CODE and verdict.confidence == 0.6


def test_dumps_of_a_failed_attempt_blame_nobody_for_waiting():
    # kill-rank: rank 1 was killed, rank 0 waits in the all-reduce: its death record decides, not the silence
    assert fr.clues(traces("stopped"), states(2, r1="T"), hung=False) == []


def test_positions_one_line_per_group_of_ranks():
    lines = fr.positions(traces("stuck_outside"), range(3))
    assert lines[0].startswith("ranks 0,2: waiting in all_reduce #4 of process group 0 (default_pg) for ")
    assert lines[1] == "rank 1: not in #4 of process group 0 (default_pg): last all_reduce #3, completed"
    assert fr.positions(traces("stopped"), range(2))[1] == "rank 1: no dump (did not answer)"
    desync = fr.positions(traces("desync2"), range(2))
    assert desync[0].startswith("rank 0: waiting in all_reduce(in [[4]], out [[4]], Float) #4 of process group 0")
    assert desync[1].startswith("rank 1: waiting in all_gather(in [[4]], out [[2, 4]], Float) #4")
    assert fr.positions(traces("clean_fsdp"), range(2)) == []


def test_ranges():
    assert fr.ranges([5, 0, 2, 1]) == "0-2,5" and fr.ranges([]) == ""


def test_torchs_own_matcher_agrees_on_the_recorded_desyncs():
    """torch.distributed.flight_recorder's Op.match is the reference for what a mismatch is; ours must agree where
    both judge (the calls at the desync's sequence number)."""
    types = pytest.importorskip("torch.distributed.flight_recorder.components.types")
    for scenario in ("desync2", "desync3", "desync_fsdp"):
        data = raw(scenario)
        [mismatch] = fr.mismatches([fr.parse_trace(d) for d in data])
        seq = mismatch.odd_call.seq
        entry = {d["rank"]: next(e for e in d["fr"]["entries"] if e["collective_seq_id"] == seq
                                 and e["process_group"][0] == mismatch.odd_call.pg) for d in data}
        members = {mismatch.odd_call.pg: set(entry)}
        odd = types.Op(entry[mismatch.odd[0]], members, mismatch.odd_call.pg)
        normal = types.Op(entry[mismatch.others[0]], members, mismatch.odd_call.pg)
        assert normal.match(odd).state.name == mismatch.kind == "COLLECTIVE_TYPE_MISMATCH"


@pytest.mark.parametrize("scenario,category,line", [
    ("lab_sigstop", Category.HANG, "rank 1 (n4): no flight-recorder dump (process stopped (state T)) while rank 0 (n3) "
                                   "waits in all_gather #92 of process group 0 (default_pg)"),
    ("lab_stuck_loader", Category.HANG, "rank 1 (n2): never entered all_gather #83 of process group 0 (default_pg), "
                                        "which rank 0 (n1) waits in"),
    ("lab_desync", Category.USER_CODE, "rank 1 (n4) called all_reduce(in [[1]], out [[1]], Float) as collective #83 of "
                                       "process group 0 (default_pg) where rank 0 (n3) called all_gather(in [[272]], "
                                       "out [[2, 272]], Float): a desync in the training code"),
])
def test_the_demos_recorded_attempts(scenario, category, line):
    """The demo's hung attempts on the lab (22.05): the example FSDP trainer with the checkpoint manager's two groups
    beside the default one; dumps and node reports as the launcher found them."""
    from slurm_ft.core.rundir import read_rank_states
    from slurm_ft.launch.verdict import attempt_evidence

    evidence = attempt_evidence(DATA / scenario, hang=read_rank_states(DATA / scenario),
                                nodes=["n1", "n2", "n3", "n4"], ranks=range(2))
    assert {c.pg for t in evidence.traces for c in t.calls} == {"0", "1", "2"}
    verdict = classify(evidence)
    assert verdict.category is category and verdict.culprit.ranks == (1,) and verdict.evidence[0].startswith(line)
    assert fr.positions(evidence.traces, range(2), evidence.hang)[-1].startswith("rank 1: ")
    if scenario == "lab_sigstop":
        assert fr.positions(evidence.traces, range(2), evidence.hang)[-1] == "rank 1: no dump (process stopped (state T))"


def test_the_group_most_ranks_wait_in_comes_before_a_lagging_background_group():
    def call(pg, seq, done):
        return fr.CollectiveCall(pg=pg, pg_desc="default_pg" if pg == "0" else "undefined", seq=seq, op="all_reduce",
                                 in_sizes=((4,),), out_sizes=((4,),), completed=done)
    # ranks 0-2 wait in #5 of group 0 (none completed it); in group 2 (a save thread's) rank 0 is one call ahead
    found = [fr.RankTrace(rank=0, calls=(call("0", 4, True), call("0", 5, False), call("2", 1, True),
                                         call("2", 2, False))),
             *(fr.RankTrace(rank=r, calls=(call("0", 4, True), call("0", 5, False), call("2", 1, True)))
               for r in (1, 2))]
    first = fr.stalls(found, range(3))[0]
    assert (first.call.pg, first.call.seq, first.waiting, first.absent) == ("0", 5, (0, 1, 2), ())
    assert [c.kind for c in fr.clues(found, states(3), hung=True)] == ["all_waiting"]
