"""The job Comment grammar (slurm_ft.core.comment): every form written, then read back by the other side."""

from __future__ import annotations

from slurm_ft.core import comment


def test_a_requeue_carries_the_restart_the_resume_step_and_the_cause():
    text = comment.requeue(2, 40, "hardware_node")
    assert text == "slurm-ft: restart=2 resume_step=40 cause=hardware_node"
    assert (comment.parse_resume_step(text), comment.parse_restart_cause(text)) == (40, "hardware_node")
    assert comment.parse_resume_step(comment.requeue(1, None, "hang")) is None


def test_the_launchers_own_preemption_requeue_is_told_apart_by_run():
    text = comment.requeue(3, 12, "preemption", by=comment.BY_LAUNCH)
    assert comment.is_launcher_requeue(text, 3) and not comment.is_launcher_requeue(text, 2)
    assert not comment.is_launcher_requeue(comment.requeue(3, 12, "preemption"), 3)  # the monitor's


def test_a_stop_is_one_line_without_commas_and_bounded():
    text = comment.stopped("user_code", "by=launch not recoverable", ["rank 0: KeyError, 'x'", "line\ntwo"])
    assert text == "slurm-ft: stopped cause=user_code by=launch not recoverable; rank 0: KeyError; 'x'; line two"
    assert comment.parse_launcher_stop(text).startswith("stopped cause=user_code")
    assert comment.parse_launcher_stop(comment.stopped("config", "by=prolog: dir")) is None
    assert len(comment.stopped("unknown", "x" * 1000)) == comment.MAX_COMMENT


def test_a_tempfail_names_the_nodes_to_exclude():
    text = comment.tempfail({"n5", "n2"}, 3)
    assert text == "slurm-ft: tempfail bad_nodes=n2+n5 attempts=3"
    assert comment.parse_bad_nodes(text) == ("n2", "n5")
    assert comment.parse_resume_step(comment.tempfail_preempted(7, 1)) == 7


def test_the_budget_counts_ride_on_any_form_and_only_on_ours():
    text = comment.with_counts(comment.requeue(1, 5, "hang"), in_place=2, free=0)
    assert text.endswith("cause=hang in_place=2") and comment.counts(text) == {"in_place": 2, "free": 0}
    assert comment.counts(comment.with_counts(text, in_place=2, free=1)) == {"in_place": 2, "free": 1}
    assert comment.with_counts("the user's own note", in_place=1, free=0) == "slurm-ft: in_place=1"


def test_a_comment_that_is_not_ours_says_nothing():
    for other in ("restart=9 resume_step=99 cause=hang", "", "SLURM-FT: tempfail bad_nodes=n1"):
        assert not comment.is_ours(other) and comment.words(other) == {}
        assert (comment.parse_resume_step(other), comment.parse_restart_cause(other)) == (None, None)
        assert comment.parse_bad_nodes(other) == () and comment.counts(other) == {"in_place": 0, "free": 0}
