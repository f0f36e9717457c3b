"""The accuracy figures of `slurm-ft bench classify`: shares, confusion matrix, confidence buckets, held-back list."""

from __future__ import annotations

import pytest

from slurm_ft.bench.classify_accuracy import Outcome, Score, load_held_back, render


def _o(name, want, got, want_rec=True, got_rec=True, conf=0.5):
    return Outcome(name=name, want_category=want, got_category=got, want_recoverable=want_rec,
                   got_recoverable=got_rec, confidence=conf)


SCORE = Score("part", (_o("a", "config", "config", False, False, 0.85),
                       _o("b", "config", "user_code", False, False, 0.4),
                       _o("c", "hang", "hang", False, True, 0.6), _o("d", "unknown", "unknown", conf=0.1)))


def test_shares_count_category_and_recoverable_separately():
    assert SCORE.n == 4
    assert SCORE.category_accuracy == 0.75
    assert SCORE.recoverable_accuracy == 0.75


def test_confusion_and_buckets():
    assert SCORE.confusion()[("config", "user_code")] == 1
    assert SCORE.confusion()[("config", "config")] == 1
    buckets = {label: (n, share) for label, n, share in SCORE.buckets()}
    assert buckets["0.0-0.3"] == (1, 1.0)
    assert buckets["0.3-0.5"] == (1, 0.0)
    assert buckets["0.7-0.9"] == (1, 1.0)
    assert buckets["0.9-1.0"] == (0, 0.0)
    assert sum(n for n, _ in buckets.values()) == SCORE.n


def test_render_says_whether_the_goal_is_met():
    text = render(SCORE)
    assert "category accuracy     75.0%  (goal 90%: NOT met)" in text
    assert "config" in text and "user_cod" in text
    assert render(Score("all right", (_o("a", "hang", "hang"),))).count("(goal 90%: met)") == 2


def test_held_back_list_skips_comments_and_blank_lines(tmp_path):
    path = tmp_path / "held.txt"
    path.write_text("# a comment\n\nowner/repo\n  other/repo  \n")
    assert load_held_back(path) == {"owner/repo", "other/repo"}


def test_held_back_list_missing_names_the_file(tmp_path):
    with pytest.raises(ValueError, match="nope.txt"):
        load_held_back(tmp_path / "nope.txt")


def test_cost_figures_per_outcome():
    """A wasted restart: deterministic, restarted; a savable stop: transient, stopped; struck: non-hardware only."""
    wasted = Outcome("w", "numerical", "unknown", False, True, 0.1)
    stopped = Outcome("s", "hardware_gpu", "oom_gpu", True, False, 0.9, got_action="stop")
    none_action = Outcome("n", "time_limit", "cancelled", True, True, 1.0, got_action="none")
    struck = Outcome("k", "user_code", "hardware_gpu", False, True, 0.95, struck=("n7",))
    hw = Outcome("h", "hardware_gpu", "hardware_gpu", True, True, 0.95, struck=("n8",))
    assert (wasted.wasted_restart, wasted.stopped_savable, wasted.healthy_struck) == (1, 0, 0)
    assert (stopped.wasted_restart, stopped.stopped_savable) == (0, 1)
    assert none_action.stops and none_action.stopped_savable == 1
    assert (struck.wasted_restart, struck.healthy_struck) == (1, 1)
    assert hw.healthy_struck == 0
    score = Score("p", (wasted, stopped, none_action, struck, hw))
    assert (score.deterministic, score.wasted_restarts, score.stopped_savable, score.healthy_struck) == (2, 2, 2, 1)
    assert score.calibration() == (4, 0.25)


CASES = {
    "no_signal_numerical": ('category = "numerical"\nrecoverable = false', "[[log]]\ntext = 'hello'"),
    "driver_too_old": ('category = "config"\nrecoverable = false',
                       "[[log]]\ntext = 'CUDA driver version is insufficient for CUDA runtime version'"),
    "oom_on_bad_gpu": ('category = "hardware_gpu"\nrecoverable = true',
                       "[[log]]\ntext = 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB'"),
    "xid79_labelled_user_code": ('category = "user_code"\nrecoverable = false',
                                 "[[log]]\nnode = 'n7'\nkind = 'kmsg'\n"
                                 "text = 'NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.'"),
}


def test_cost_figures_on_a_tiny_literal_corpus(tmp_path, capsys):
    """The bench's cost lines for four literal cases: two restarts wasted (no signal -> unknown; Xid 79 called
    hardware for a case labelled user_code), one savable job stopped (OOM on a bad GPU), one healthy node struck."""
    from slurm_ft.bench.classify_bench import main

    for name, (expect, body) in CASES.items():
        (tmp_path / f"{name}.toml").write_text(f"{body}\n\n[expect]\n{expect}\n")
    empty = tmp_path / "none.txt"
    empty.write_text("")
    assert main(["--corpus", str(tmp_path), "--held-back", str(empty), "--held-back-kinds", str(empty)]) == 0
    out = capsys.readouterr().out
    part = out[out.index("rules written from"):]
    assert "cost: 2 restarts wasted on 3 deterministic failures (0.67 each" in part
    assert "1 jobs stopped that a retry would have saved (of 1 transient)" in part
    assert "1 healthy nodes struck (goal 0: NOT met)" in part
    assert "confidence >= 0.7: 3 verdicts,  33.3% right" in part
