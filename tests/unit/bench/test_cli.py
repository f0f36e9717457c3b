import json
import sys
import types

import pytest

from slurm_ft.bench import plots
from slurm_ft.cli import main

SMALL = ["--replicas", "2", "--days", "3"]


def test_sim_writes_json_table_and_plot(tmp_path, capsys):
    rc = main(["bench", "sim", "--gpus", "1024", "16384", *SMALL, "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "sim.json").read_text())
    assert {"schema", "costs", "costs_source", "config", "policies", "results", "headline", "sensitivity",
            "elapsed_s"} <= set(data)
    assert data["costs_source"] == "defaults" == data["costs"]["source"]
    assert {r["gpus"] for r in data["results"]} == {1024, 16384}
    assert len(data["results"]) == 2 * len(data["policies"])
    assert {"ettr", "ettr_ci95", "policy", "failures_per_day", "lost_fraction", "interval_s",
            "spare_gpu_share"} <= set(data["results"][0])
    assert data["headline"]["gpus"] == 16384 and data["headline"]["policy"] == "slurm-ft"
    assert data["headline"]["met"] == (data["headline"]["ettr"] >= 0.97)
    assert {row["cost"] for row in data["sensitivity"]["rows"]} >= {"restart_in_alloc_s", "checkpoint_stall_s"}
    assert data["config"]["replicas"] == 2 and data["config"]["horizon_h"] == 72
    png = (tmp_path / "ettr_vs_gpus.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    out, err = capsys.readouterr()
    assert "slurm --requeue" in out and "slurm-ft at 16,384 GPUs: ETTR" in out and "sensitivity" in out
    assert "[1/16" in err and "[16/16" in err  # progress on stderr, the table on stdout


def test_sim_policy_subset_and_lemon_flags(tmp_path, capsys):
    rc = main(["bench", "sim", "--gpus", "2048", "--policy", "slurm-ft", "--policy", "slurm --requeue",
               "--lemon-share", "0.3", "--triage-h", "24", "--spare-fraction", "0.05", *SMALL,
               "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "sim.json").read_text())
    assert [r["policy"] for r in data["results"]] == ["slurm-ft", "slurm --requeue"]
    assert [r["spare_nodes"] for r in data["results"]] == [13, 0]  # 5% of 256 nodes; the baseline holds none
    assert data["config"]["lemon_share"] == 0.3 and data["config"]["triage_h"] == 24
    assert data["headline"] is None and "sensitivity" not in data


def test_sim_takes_measured_costs(tmp_path, capsys):
    costs = tmp_path / "lab.json"
    costs.write_text(json.dumps({"sim_costs": {"restart_in_alloc_s": 20.0, "detect_hang_s": 35.0}}))
    assert main(["bench", "sim", "--gpus", "1024", "--costs", str(costs), *SMALL, "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "sim.json").read_text())
    assert data["costs"]["restart_in_alloc_s"] == 20.0
    assert data["costs_source"].startswith(str(costs)) and "defaults for" in data["costs_source"]


@pytest.mark.parametrize("args, words", [
    (["--costs", "{tmp}/missing.json"], ["--costs", "missing.json"]),
    (["--costs", "{tmp}/bad.json"], ["--costs", "requeue_seconds"]),
    (["--policy", "magic"], ["--policy", "'magic'"]),
    (["--replicas", "0"], ["--replicas"]),
    (["--gpus", "-8"], ["--gpus", "-8"]),
    (["--lemon-share", "1.5"], ["lemon_share"]),
    (["--spare-fraction", "0"], ["--spare-fraction"]),
])
def test_sim_bad_input_is_one_line_error(tmp_path, capsys, args, words):
    (tmp_path / "bad.json").write_text(json.dumps({"requeue_seconds": 3}))
    args = [a.format(tmp=tmp_path) for a in args]
    rc = main(["bench", "sim", "--gpus", "1024", *SMALL, *args, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and err.startswith("slurm-ft: ")
    for word in words:
        assert word in err
    assert not (tmp_path / "out" / "sim.json").exists()


def test_sim_without_matplotlib_still_writes_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(plots, "_pyplot", lambda: None)
    assert main(["bench", "sim", "--gpus", "1024", *SMALL, "--out", str(tmp_path)]) == 0
    assert (tmp_path / "sim.json").exists() and not (tmp_path / "ettr_vs_gpus.png").exists()
    assert "matplotlib is not installed" in capsys.readouterr().out


def test_recovery_plot_from_lab_records(tmp_path):
    records = [{"fault": f, "system": s, "nodes": n, "recovery_s": t}
               for f in ("rank_crash", "hang") for s, t in (("slurm-ft", 10.0), ("slurm --requeue", 150.0))
               for n in (1, 2, 4, 8)]
    records.append({"fault": "node_death", "system": "slurm-ft", "nodes": 2, "recovery_s": None})
    assert plots.plot_recovery_vs_size(records, tmp_path / "recovery.png") is None
    assert (tmp_path / "recovery.png").read_bytes()[:4] == b"\x89PNG"
    assert "no records" in plots.plot_recovery_vs_size([records[-1]], tmp_path / "none.png")


def test_lab_missing_is_one_line_error(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "slurm_ft.bench.lab", None)  # as if the module were absent
    rc = main(["bench", "lab", "--nodes", "1"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == "slurm-ft: bench lab: not available in this build (slurm_ft.bench.lab is missing)"


def test_delegated_benchmark_gets_its_arguments_unchanged(monkeypatch):
    seen = []
    fake = types.ModuleType("slurm_ft.bench.lab")
    fake.main = lambda argv: seen.append(argv) or 3
    monkeypatch.setitem(sys.modules, "slurm_ft.bench.lab", fake)
    assert main(["bench", "lab", "--nodes", "1", "2", "--help"]) == 3
    assert main(["bench", "lab", "--", "-x"]) == 3
    assert seen == [["--nodes", "1", "2", "--help"], ["-x"]]


def test_report_table_aligns_numbers_right_text_left_and_shows_missing():
    from slurm_ft.bench.report import Column, records_table, render_table

    text = render_table(["system", Column("recovery s", ".1f"), "runs"],
                        [["slurm-ft", 9.25, 3], ["slurm --requeue", None, 12]])
    lines = text.splitlines()
    assert lines[0].split() == ["system", "recovery", "s", "runs"]
    assert lines[2].startswith("slurm-ft ") and lines[2].endswith("   3")
    assert "9.2" in lines[2] and lines[3].split()[-2:] == ["-", "12"]
    assert len({len(line) for line in lines[:2]}) == 1
    assert records_table([{"a": 1.23456}], {"a": "a", "twice": lambda r: 2 * r["a"]}).splitlines()[2].split() == \
        ["1.2346", "2.4691"]
    with pytest.raises(ValueError, match="rows"):
        render_table(["a", "b"], [[1]])
