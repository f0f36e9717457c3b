import json

import pytest

from slurm_ft.bench import sim
from slurm_ft.cli import main
from slurm_ft.errors import ConfigError

FAST = dict(replicas=4, horizon_h=24.0 * 7)


def _by_policy(gpus):
    return {r.policy: r for r in sim.sweep((gpus,), sim.POLICIES, **FAST)}


def test_same_seed_same_result_and_other_seed_differs():
    a = sim.sweep((4096,), sim.POLICIES[:1], **FAST)
    b = sim.sweep((4096,), sim.POLICIES[:1], **FAST)
    c = sim.sweep((4096,), sim.POLICIES[:1], seed=1, **FAST)
    assert a == b
    assert a != c


def test_more_gpus_lower_ettr():
    small = sim.simulate(sim.SimConfig(gpus=1024, **FAST), sim.POLICIES[0])
    large = sim.simulate(sim.SimConfig(gpus=65536, **FAST), sim.POLICIES[0])
    assert large.ettr < small.ettr
    assert large.failures_per_day > small.failures_per_day


def test_policy_ordering_at_16k():
    r = _by_policy(16384)
    assert r["slurm-ft"].ettr > r["slurm-ft fixed 1h interval"].ettr
    assert r["slurm-ft"].ettr > r["slurm-ft without quarantine"].ettr
    assert r["slurm-ft"].ettr > r["slurm-ft requeue only"].ettr
    assert r["slurm-ft requeue only"].ettr > r["slurm --requeue"].ettr


def test_failure_rate_follows_llama3():
    config = sim.SimConfig(gpus=16384)
    assert config.mtbf_s == pytest.approx(3 * 3600)


def test_costs_reject_negative_and_unknown(tmp_path):
    with pytest.raises(ConfigError, match="requeue_s"):
        sim.SimCosts(requeue_s=-1)
    bad = tmp_path / "costs.json"
    bad.write_text(json.dumps({"requeue_seconds": 3}))
    with pytest.raises(ConfigError, match="requeue_seconds"):
        sim.SimCosts.from_json(bad)


def test_cli_writes_json_and_plot(tmp_path, capsys):
    rc = main(["bench", "sim", "--gpus", "1024", "2048", "--replicas", "2", "--horizon-h", "48", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "sim.json").read_text())
    assert {r["gpus"] for r in data["results"]} == {1024, 2048}
    assert {"ettr", "ettr_ci95", "policy", "lost_fraction"} <= set(data["results"][0])
    assert data["costs"]["source"] == "defaults"
    assert (tmp_path / "ettr_vs_gpus.png").stat().st_size > 1000
    assert "slurm --requeue" in capsys.readouterr().out


def test_cli_bad_costs_file_is_one_line_error(tmp_path, capsys):
    rc = main(["bench", "sim", "--costs", str(tmp_path / "missing.json"), "--out", str(tmp_path)])
    assert rc == 2
    assert "missing.json" in capsys.readouterr().err
