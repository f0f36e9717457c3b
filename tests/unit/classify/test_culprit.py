"""The culprit: torch elastic error files, how each rank ended, hung ranks, the last user frame of a traceback."""

from __future__ import annotations

import json

import pytest

from slurm_ft.classify import Category, classify
from slurm_ft.classify.engine import last_user_frame
from slurm_ft.classify.records import UNKNOWN_RANK, Evidence, elastic_error_dict, error_record_from_dict
from slurm_ft.cli import main
from slurm_ft.core.rundir import ErrorRecord, RankEnd, RankState

STACK = ('Traceback (most recent call last):\n'
         '  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/'
         '__init__.py", line 355, in wrapper\n    return f(*args, **kwargs)\n'
         '  File "/home/u/train.py", line 33, in main\n    step(batch)\n'
         '  File "/usr/lib/python3.11/json/__init__.py", line 346, in loads\n    return _default_decoder.decode(s)\n'
         'ValueError: bad batch\n')
OBJECT_FORM = {"message": {"message": "ValueError: bad batch",
                           "extraInfo": {"py_callstack": STACK, "timestamp": "1733280000"}, "errorCode": 1}}
STRING_FORM = {"message": "RuntimeError: boom", "timestamp": "1733280001"}


@pytest.fixture(autouse=True)
def empty_site_config(tmp_path, monkeypatch):
    site = tmp_path / "site.toml"
    site.write_text("")
    monkeypatch.setenv("SLURM_FT_CONFIG", str(site))


def test_torch_elastic_object_form():
    record = error_record_from_dict(OBJECT_FORM, default_rank=3, default_host="n2")
    assert (record.rank, record.host, record.time) == (3, "n2", 1733280000.0)
    assert (record.exc_type, record.message, record.traceback) == ("ValueError", "bad batch", STACK)


def test_torch_elastic_string_form_and_unknown_rank():
    record = error_record_from_dict(STRING_FORM)
    assert (record.rank, record.exc_type, record.message, record.time) == (UNKNOWN_RANK, "RuntimeError", "boom",
                                                                            1733280001.0)
    assert elastic_error_dict({"message": "Signal 9 (SIGKILL) received by PID 12"})["exc_type"] == ""
    assert error_record_from_dict({"message": {"message": 5}}) is None
    assert error_record_from_dict({"message": "x", "timestamp": "soon"}) is None


def test_an_elastic_file_without_a_rank_blames_no_rank():
    record = error_record_from_dict(OBJECT_FORM)
    verdict = classify(Evidence(errors=(record,)))
    assert verdict.category is Category.USER_CODE and verdict.culprit.ranks == ()
    assert verdict.evidence[0].startswith("unattributed error file at /home/u/train.py:33 in main: ValueError")


def test_classify_cli_accepts_a_torch_elastic_error_file(tmp_path, capsys):
    path = tmp_path / "error.json"
    path.write_text(json.dumps(OBJECT_FORM))
    assert main(["classify", "--json", "--error-file", f"rank=3,node=n2:{path}"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["category"] == "user_code" and verdict["culprit"] == {"nodes": ["n2"], "ranks": [3]}
    assert main(["classify", "--error-file", str(path)]) == 0
    assert "unattributed error file" in capsys.readouterr().out


def test_last_user_frame_skips_library_and_stdlib_frames():
    assert last_user_frame(STACK) == "/home/u/train.py:33 in main"
    assert last_user_frame("no traceback here") == ""


def _gloo_victim(rank: int, when: float) -> ErrorRecord:
    return ErrorRecord(rank=rank, time=when, exc_type="RuntimeError", host=f"n{rank + 1}", pid=100 + rank,
                       message="[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")


def test_a_rank_sigkilled_first_is_the_culprit_not_network():
    ends = (RankEnd(rank=1, time=10.0, host="n2", pid=101, signal=9, oom_kills=0),
            RankEnd(rank=0, time=10.2, host="n1", pid=100, exit_code=1))
    verdict = classify(Evidence(errors=(_gloo_victim(0, 10.1),), ends=ends, in_allocation=True))
    assert verdict.category is Category.UNKNOWN and verdict.recoverable
    assert (verdict.culprit.ranks, verdict.culprit.nodes) == ((1,), ("n2",))
    assert any(line.startswith("secondary, not the cause") and "ranks 0" in line for line in verdict.evidence)


def test_a_sigkilled_rank_recorded_after_its_victims_error_is_still_the_culprit():
    """The wrapper records the end when its waitpid returns: on a loaded host that can come after the peer saw the
    socket close and wrote its error file (seen in CI: the demo's kill-rank on 25.11). A victim's error does not
    make the dead rank's end "after the first failure"."""
    ends = (RankEnd(rank=1, time=10.3, host="n2", pid=101, signal=9, oom_kills=0),
            RankEnd(rank=0, time=10.4, host="n1", pid=100, exit_code=1))
    verdict = classify(Evidence(errors=(_gloo_victim(0, 10.1),), ends=ends, in_allocation=True))
    assert (verdict.category, verdict.culprit.ranks, verdict.culprit.nodes) == (Category.UNKNOWN, (1,), ("n2",))


def test_a_victims_error_still_orders_ends_long_after_it():
    """Teardown kills of the other ranks, seconds after the victim's error, stay secondary."""
    ends = (RankEnd(rank=1, time=10.3, host="n2", pid=101, signal=9, oom_kills=0),
            RankEnd(rank=2, time=10.6, host="n3", pid=102, signal=9, oom_kills=0),
            RankEnd(rank=3, time=19.0, host="n4", pid=103, signal=9, oom_kills=0))
    verdict = classify(Evidence(errors=(_gloo_victim(0, 10.1),), ends=ends, in_allocation=True))
    assert verdict.culprit.ranks == (1,)
    late = classify(Evidence(errors=(_gloo_victim(0, 10.1),), ends=ends[1:], in_allocation=True))
    assert late.culprit.ranks == (2,)  # the earliest end within the lag; rank 3 died 9 s after the victim saw it


def test_oom_kills_in_the_cgroup_make_it_oom_host():
    end = RankEnd(rank=1, time=10.0, host="n2", pid=101, signal=9, oom_kills=1)
    verdict = classify(Evidence(ends=(end,)))
    assert verdict.category is Category.OOM_HOST and verdict.culprit.ranks == (1,)


def test_a_rank_that_ended_after_an_error_file_is_secondary():
    ends = (RankEnd(rank=1, time=10.5, host="n2", pid=101, signal=9, oom_kills=0),)
    error = ErrorRecord(rank=0, time=10.0, exc_type="ValueError", message="bad batch", host="n1")
    verdict = classify(Evidence(errors=(error,), ends=ends))
    assert verdict.category is Category.USER_CODE and verdict.culprit.ranks == (0,)


def test_a_clean_exit_is_no_evidence():
    ends = (RankEnd(rank=0, time=1.0, host="n1", exit_code=0),)
    assert classify(Evidence(ends=ends)).culprit.ranks == ()


@pytest.mark.parametrize("state, live, step, culprit", [
    ("T", False, 10, (1,)),  # SIGSTOPped
    ("D", None, 10, (1,)),  # uninterruptible
    ("S", False, 10, (1,)),  # liveness stopped
    ("S", True, 9, (1,)),  # behind the others
    ("S", True, 10, ()),  # nothing singles it out
])
def test_hang_names_only_the_stuck_rank(state, live, step, culprit):
    states = (RankState(rank=0, host="n1", pid=1, state="S", live=True, step=10),
              RankState(rank=1, host="n2", pid=2, state=state, live=live, step=step))
    verdict = classify(Evidence(hang=states, in_allocation=True))
    assert verdict.category is Category.HANG
    assert verdict.culprit.ranks == culprit and verdict.culprit.nodes == (("n2",) if culprit else ())


def test_a_link_that_went_down_names_its_node_over_the_ranks_network_errors_but_not_over_a_time_limit():
    from slurm_ft.classify.records import JobEnd
    from slurm_ft.health.links import LinkLoss

    loss = LinkLoss(node="n2", interface="mlx5_0/1", counter="link_downed", before=0, after=1)
    errors = tuple(ErrorRecord(rank=r, host=h, time=5.0 + r, exc_type="torch.distributed.DistBackendError",
                               message="NCCL communicator was aborted: remote process exited or there was a network "
                               "error") for r, h in ((0, "n1"), (1, "n2")))
    verdict = classify(Evidence(errors=errors, links=(loss,), in_allocation=True))
    assert (verdict.category, verdict.culprit.nodes, verdict.culprit.ranks) == (Category.NETWORK, ("n2",), ())
    assert verdict.evidence[0] == "n2: link mlx5_0/1 went down: link_downed 0 -> 1 (+1)"
    other = LinkLoss(node="n9", interface="eth0", counter="carrier_changes", before=2, after=3)
    assert classify(Evidence(job=JobEnd(state="FAILED", nodes=("n1", "n2")), links=(other,))).culprit.nodes == ()
    timed_out = classify(Evidence(job=JobEnd(state="TIMEOUT", nodes=("n1", "n2")), links=(loss,)))
    assert timed_out.category is Category.TIME_LIMIT
