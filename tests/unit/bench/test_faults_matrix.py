"""``slurm-ft bench faults``: whether a row's culprit is right, the committed checkpoints lost, bad --faults."""

from __future__ import annotations

from slurm_ft.bench.faults import checkpoints_lost, culprit_right, main


def _verdict(nodes, ranks=()):
    return {"category": "hardware_node", "culprit": {"nodes": list(nodes), "ranks": list(ranks)}}


def test_the_culprit_is_the_faulted_node_or_rank_1_on_its_node():
    assert culprit_right("link-down", "n4", "n4", _verdict(["n4"])) == "yes"
    assert culprit_right("link-down", "n4", "n4", _verdict(["n3", "n4"])).startswith("no (")
    assert culprit_right("kill-rank", "", "n2", _verdict(["n2"], [1])) == "yes"
    assert culprit_right("hang", "", "n2", _verdict([], [0])).startswith("no (")
    assert culprit_right("link-flap", "n3", "n3", _verdict(["n3"])) == "yes"  # its link counters name it
    assert culprit_right("link-flap", "n3", "n3", _verdict([])) == "no (none named)"
    assert culprit_right("link-flap", "n3", "n3", _verdict(["n2"])).startswith("no (")
    assert culprit_right("slow-link", "n3", "n3", None) == "yes (none named)"


def test_committed_checkpoints_lost_counts_intervals_behind_the_newest_due():
    assert checkpoints_lost(10, 8, 4) == "0"
    assert checkpoints_lost(10, 4, 4) == "1" and checkpoints_lost(13, 0, 4) == "3"
    assert checkpoints_lost(10, None, 4) == "-"


def test_an_unknown_fault_is_named(capsys):
    assert main(["--faults", "kill-rank,cosmic-ray"]) == 2
    assert "'cosmic-ray'" in capsys.readouterr().err


def test_slow_link_cost_is_its_wall_time_against_the_clean_runs(tmp_path):
    import json
    from pathlib import Path

    from slurm_ft.bench.demo import DemoConfig, Run
    from slurm_ft.bench.faults import slow_cost

    runs = []
    for name, wall in (("clean", 26.0), ("slow-link", 31.5)):
        run = Run(name=name, ckpt=tmp_path / name)
        run.run_dir.mkdir(parents=True)
        lines = [{"time": 100.0, "event": "attempt_start", "attempt": 1},
                 {"time": 100.0 + wall, "event": "exit", "code": 0}]
        (run.run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
        runs.append(run)
    line = slow_cost(runs, DemoConfig(dir=Path("/tmp/d"), hosts=False))
    assert "31.5 s of wall time against the clean run's 26.0 s (+5.5 s)" in line
    assert slow_cost(runs[:1], DemoConfig(dir=Path("/tmp/d"), hosts=False)) == ""


def test_a_row_counts_steps_lost_from_where_the_restart_resumed(tmp_path):
    """The matrix said 2 steps lost (disk at 8, fault at 10) where the restart resumed memory@9 and lost 1."""
    import json

    from slurm_ft.bench import demo
    from slurm_ft.bench.faults import row_of

    run = demo.Run(name="kill-rank", ckpt=tmp_path / "ck", fault_time=100.0, fault_step=10, victim="n2",
                   result={"param_sha256": "x", "step": 24})
    run.run_dir.mkdir(parents=True)
    events = [{"event": "attempt_start", "time": 90.0, "attempt": 1, "nodes": ["n1", "n2"], "resume_step": None},
              {"event": "fault_detected", "time": 100.2, "kind": "failed"},
              {"event": "attempt_start", "time": 101.0, "attempt": 2, "nodes": ["n1", "n2"], "resume_step": 8},
              {"event": "resume", "time": 103.0, "source": "memory", "step": 9},
              {"event": "first_step", "time": 104.0, "attempt": 2, "step": 10},
              {"event": "exit", "time": 110.0, "code": 0}]
    (run.run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    row = row_of(run, "25.11.7", "x", None)
    assert (row.steps_lost, row.resumed_from, row.ckpts_lost, row.params_equal) == ("1", "memory@9", "0", "yes")
