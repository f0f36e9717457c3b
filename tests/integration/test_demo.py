"""``slurm-ft demo`` on its own lab: the clean run and one fault, every check held, the table filled in."""

from __future__ import annotations

import pytest

from slurm_ft.bench.demo import DemoConfig, jobs_dir, run_demo
from slurm_ft.core.rundir import read_ends, read_events

pytestmark = pytest.mark.lab


def test_demo_kill_rank_recovers_and_reports(lab, tmp_path):  # `lab`: skipped where no lab can run
    lines = []
    cfg = DemoConfig(dir=tmp_path / "demo", scenarios=("kill-rank",), steps=16)
    table, failed = run_demo(cfg, lines.append)
    assert failed == []
    rows = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")] for line in table.splitlines()
            if "|" in line}
    assert set(rows) == {"fault", "clean", "kill-rank"}
    assert rows["fault"][1:4] == ["verdict", "culprit", "detection"]
    assert rows["kill-rank"][7] == "equal" and rows["kill-rank"][6] == "0"  # params; no requeue
    assert rows["kill-rank"][9].startswith("memory@") and int(rows["kill-rank"][5]) <= 1  # issue 32: memory tier
    assert rows["kill-rank"][1] == "unknown" and rows["kill-rank"][2].startswith("rank 1 on n")  # not network
    assert any("rank 1 of job" in line and "SIGKILL" in line for line in lines)
    assert any("restart in place" in line for line in lines)
    assert "ETTR over the 1 recovered runs" in table
    # the restarted ranks came from the warm standbys the launcher started while the first attempt trained
    run_dir = jobs_dir(cfg, cfg.dir / "lab") / "ck-kill-rank" / ".slurm-ft"
    events = [e["event"] for e in read_events(run_dir)]
    assert events.count("standby_start") == 1
    ends = sorted((end.rank, end.started, end.exit_code) for end in read_ends(run_dir))
    # spares, not forks of a warm parent: no warm attempt hung (with forks one did once in CI, on 25.11)
    assert "standby_off" not in events and ends == [(0, "standby", 0), (1, "standby", 0)]


def test_demo_flight_recorder_names_the_rank_and_the_collective(lab, tmp_path):
    """Issue 31: a stopped rank, a rank stuck outside any collective, a desync; the ranks' flight-recorder dumps
    name the faulted rank each time, and the desync stops after one attempt as user_code with both calls."""
    lines = []
    cfg = DemoConfig(dir=tmp_path / "demo", scenarios=("hang", "stuck-loader", "desync"), steps=16)
    table, failed = run_demo(cfg, lines.append)
    assert failed == []
    rows = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")] for line in table.splitlines()
            if "|" in line}
    assert [rows[name][1] for name in ("hang", "stuck-loader", "desync")] == ["hang", "hang", "user_code"]
    assert all(rows[name][2].startswith("rank 1 on n") for name in ("hang", "stuck-loader", "desync"))
    assert rows["desync"][6] == "0" and rows["stuck-loader"][7] == "equal"
    assert rows["hang"][9].startswith("memory@") and int(rows["hang"][5]) <= 1  # issue 32: the memory tier
    for name in ("stuck-loader", "desync"):  # the trainer's own faults are announced like the demo's
        assert any(line.startswith(f"{name}: rank 1 of job ") for line in lines)
    desync = jobs_dir(cfg, cfg.dir / "lab") / "ck-desync" / ".slurm-ft"
    [verdict] = [e for e in read_events(desync) if e["event"] == "verdict"]
    assert verdict["outcome"] == "hung" and "all_gather" in verdict["verdict"]["evidence"][0]
    assert sorted(p.name for p in desync.glob("trace.rank*.json")) == ["trace.rank0.json", "trace.rank1.json"]
