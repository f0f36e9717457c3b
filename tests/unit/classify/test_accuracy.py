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
