"""Readable output by default: the launcher's progress as plain lines (JSON stays in events.jsonl), and the
trainer's slurm-ft lines shown without any logging set up by the training script."""

from __future__ import annotations

import subprocess
import sys

from slurm_ft.launch.text import describe
from tests.unit.launch.test_launcher import Script, events, make


def test_launcher_lines_are_plain_and_the_json_stays_in_events(tmp_path, caplog):
    caplog.set_level("INFO", logger="slurm_ft.launch.launcher")
    launcher, _, _ = make(tmp_path, [Script(tmp_path / "run", code=1), Script(tmp_path / "run")])
    assert launcher.run() == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "slurm_ft.launch.launcher"]
    assert lines[0] == "slurm-ft launch: attempt 1 on n1,n2, from scratch"  # no committed checkpoint yet
    assert "slurm-ft launch: attempt 1: a rank failed (exit 1)" in lines
    assert "slurm-ft launch: restarting in place (2 restart(s) left)" in lines
    assert lines[-1] == "slurm-ft launch: exit 0: succeeded (after 2 attempt(s))"
    assert not any(line.lstrip().startswith("{") for line in lines)
    assert [e["event"] for e in events(tmp_path)][:2] == ["attempt_start", "first_step"]  # the record, unchanged


def test_every_event_has_a_line():
    assert describe({"event": "verdict", "attempt": 2, "verdict": {"category": "user_code", "recoverable": False,
                                                                   "evidence": ["rank 1: ZeroDivisionError"]}}) \
        == "slurm-ft launch: attempt 2: verdict user_code (not recoverable): rank 1: ZeroDivisionError"
    assert describe({"event": "fault_detected", "kind": "hung", "attempt": 1, "hung_ranks": [1, 3]}) \
        == "slurm-ft launch: attempt 1: hung: rank(s) 1, 3 made no progress"
    assert describe({"event": "new_kind", "time": 1.0, "x": 1}) == "slurm-ft launch: new_kind x=1"


TRAINER = """
import logging, sys, tempfile
import torch
from slurm_ft.train import CheckpointConfig, CheckpointManager
if sys.argv[1] == "configured":
    logging.basicConfig(level=logging.INFO, format="MINE %(message)s")
mgr = CheckpointManager(CheckpointConfig(dir=tempfile.mkdtemp(), every=1, async_save=False),
                        model=torch.nn.Linear(2, 1))
mgr.resume()
mgr.maybe_save(1)
mgr.close()
"""


def test_the_trainers_progress_shows_without_logging_setup():
    plain = subprocess.run([sys.executable, "-c", TRAINER, "plain"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    assert "[slurm-ft rank 0] no committed checkpoint in " in plain.stderr
    assert "[slurm-ft rank 0] checkpoint step 1 committed" in plain.stderr
    mine = subprocess.run([sys.executable, "-c", TRAINER, "configured"], capture_output=True, text=True, timeout=120)
    assert mine.returncode == 0 and "MINE checkpoint step 1 committed" in mine.stderr
    assert "[slurm-ft rank 0]" not in mine.stderr  # the program's own logging setup decides
