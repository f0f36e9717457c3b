import json
import math

import pytest

from slurm_ft.bench import sim
from slurm_ft.core.errors import ConfigError

FAST = dict(replicas=8, horizon_h=24.0 * 14)
ONE_CLASS = (sim.FaultClass(category="user_code", label="crash", share=1.0, exclude_share=0.0, hang_share=0.0),)


def _at(gpus, policies=sim.POLICIES, **kwargs):
    return {r.policy: r for r in sim.sweep((gpus,), policies, **{**FAST, **kwargs})}


def test_same_seed_same_result_other_seed_differs():
    one = sim.policy_by_name("slurm-ft")
    a = sim.sweep((4096,), [one], **FAST)
    assert a == sim.sweep((4096,), [one], **FAST)
    assert a != sim.sweep((4096,), [one], seed=1, **FAST)


def test_matches_the_renewal_formula_for_one_fault_class():
    # crashes only, restart in place, fixed interval, async save durable `lag` after its stall: per cycle of
    # mean 1/rate + detect + restart, the durable work is T * e^(-rate*lag) * q / (1 - q), q = e^(-rate*(T+s))
    config = sim.SimConfig(gpus=16384, faults=ONE_CLASS, lemon_share=0.0, replicas=32, horizon_h=24.0 * 60)
    policy = sim.Policy(name="plain", adaptive_interval=False, fixed_interval_s=600.0, spare_fraction=0.0)
    costs = sim.SimCosts(checkpoint_stall_s=2.0, checkpoint_write_s=30.0, detect_crash_s=5.0,
                         restart_in_alloc_s=100.0)
    rate = 1 / config.mtbf_s
    q = math.exp(-rate * 602.0)
    expected = 600.0 * math.exp(-rate * 30.0) * q / (1 - q) / (1 / rate + 105.0)
    result = sim.simulate(config, policy, costs)
    assert result.ettr == pytest.approx(expected, abs=max(3 * result.ettr_ci95, 0.002))
    assert result.requeues_per_day == 0
    assert result.failures_per_day == pytest.approx(86400 / (config.mtbf_s + 105), rel=0.1)


def test_lost_time_and_productive_time_add_up_to_the_wall():
    r = _at(16384)["slurm --requeue"]
    assert r.ettr + sum(r.lost_fraction.values()) == pytest.approx(1.0)
    assert set(r.lost_fraction) == {"checkpoint_stall", "rework", "detection", "recovery", "queue_wait"}


def test_mtbf_follows_llama3_and_scales_with_gpus():
    assert sim.SimConfig(gpus=16384).mtbf_s == pytest.approx(3 * 3600)
    assert sim.SimConfig(gpus=131072).mtbf_s == pytest.approx(3 * 3600 / 8)
    assert sim.SimConfig(gpus=1000).nodes == 125
    shares = {f.category: f.share for f in sim.LLAMA3_FAULTS}
    assert (shares["hardware_gpu"], shares["user_code"], shares["network"]) == (0.587, 0.129, 0.084)
    assert sum(shares.values()) == pytest.approx(1.0)


def test_more_gpus_lower_ettr_for_every_policy():
    small, large = _at(1024), _at(65536)
    for name, r in small.items():
        assert large[name].ettr < r.ettr, name
        assert large[name].failures_per_day > r.failures_per_day, name


def test_adaptive_interval_beats_a_fixed_interval_too_long_or_too_short():
    too_long = sim.Policy(name="fixed 30 min", adaptive_interval=False, fixed_interval_s=1800)
    too_short = sim.Policy(name="fixed 35 s", adaptive_interval=False, fixed_interval_s=35)
    r = _at(16384, [sim.policy_by_name("slurm-ft"), too_long, too_short])
    assert r["slurm-ft"].ettr > r["fixed 30 min"].ettr + 0.02
    assert r["slurm-ft"].ettr > r["fixed 35 s"].ettr
    assert r["slurm-ft"].lost_fraction["rework"] < r["fixed 30 min"].lost_fraction["rework"]
    assert r["slurm-ft"].lost_fraction["checkpoint_stall"] < r["fixed 35 s"].lost_fraction["checkpoint_stall"]
    assert 35 < r["slurm-ft"].interval_s < 1800


def test_spares_and_in_allocation_restart_beat_requeue():
    r = _at(16384)
    assert r["slurm-ft"].ettr > r["slurm-ft no spares"].ettr > r["slurm-ft requeue only"].ettr
    assert r["slurm-ft"].requeues_per_day < r["slurm-ft no spares"].requeues_per_day
    assert r["slurm-ft"].spare_nodes == math.ceil(0.01 * 2048) and r["slurm-ft no spares"].spare_nodes == 0
    for baseline in ("torchrun --max-restarts", "slurm --requeue"):
        assert r["slurm-ft requeue only"].ettr > r[baseline].ettr
        assert r[baseline].lost_fraction["detection"] > r["slurm-ft"].lost_fraction["detection"]


def test_quarantine_helps_when_lemons_are_common():
    lemony = dict(lemon_share=0.5, lemon_mtbf_h=6.0, triage_h=24.0 * 7)
    requeue = sim.policy_by_name("slurm-ft requeue only")
    pairs = [(sim.policy_by_name("slurm-ft"), sim.policy_by_name("slurm-ft no quarantine")),
             (requeue, sim.Policy(**{**requeue.to_dict(), "recovery": requeue.recovery, "quarantine": False,
                                     "name": "requeue, no quarantine"}))]
    for with_q, without_q in pairs:
        r = _at(16384, [with_q, without_q], **lemony)
        a, b = r[with_q.name], r[without_q.name]
        assert a.ettr >= b.ettr, with_q.name
        assert a.lemon_failures_per_day < b.lemon_failures_per_day, with_q.name
    # the effect is clear where every recovery is a fresh allocation drawn from the pool
    r = _at(16384, pairs[1], **lemony)
    assert r[requeue.name].ettr > r["requeue, no quarantine"].ettr + 0.01


def test_lemon_density_is_rate_times_time_in_service():
    config = sim.SimConfig(gpus=16384)
    exclude = sum(f.share * f.exclude_share for f in config.faults)
    new_per_node_h = exclude * 8 / (3 * 16384) * config.lemon_share
    assert config.lemon_density(quarantine=False) == pytest.approx(new_per_node_h * 72)
    assert config.lemon_density(quarantine=True) == pytest.approx(new_per_node_h / (1 / 72 + 1 / 24))
    assert sim.SimConfig(gpus=8, quarantine_strikes=1).lemon_density(quarantine=True) == 0


def test_a_slower_background_write_costs_rework_even_when_async():
    one = [sim.policy_by_name("slurm-ft")]
    fast = _at(16384, one, costs=sim.SimCosts(checkpoint_write_s=5))["slurm-ft"]
    slow = _at(16384, one, costs=sim.SimCosts(checkpoint_write_s=300))["slurm-ft"]
    assert slow.ettr < fast.ettr
    assert slow.lost_fraction["rework"] > fast.lost_fraction["rework"]
    assert slow.interval_s >= 300  # one save in flight at a time


def test_sensitivity_scales_one_cost_at_a_time():
    config = sim.SimConfig(gpus=16384, replicas=4, horizon_h=24.0 * 7)
    rows = {row["cost"]: row for row in sim.sensitivity(config, sim.policy_by_name("slurm-ft"))}
    assert "baseline_detect_hang_s" not in rows and "spare_swap_s" in rows
    assert rows["restart_in_alloc_s"]["ettr_x0.5"] > rows["restart_in_alloc_s"]["ettr_x2"]
    base = sim.simulate(config, sim.policy_by_name("slurm-ft")).ettr
    assert rows["spare_swap_s"]["ettr_x2"] < base < rows["spare_swap_s"]["ettr_x0.5"]


def test_costs_from_json_partial_wrapped_and_bad(tmp_path):
    partial = tmp_path / "costs.json"
    partial.write_text(json.dumps({"restart_in_alloc_s": 12.5}))
    costs = sim.SimCosts.from_json(partial)
    assert costs.restart_in_alloc_s == 12.5 and costs.requeue_wait_s == sim.SimCosts().requeue_wait_s
    assert costs.source.startswith(str(partial)) and "defaults for" in costs.source
    full = tmp_path / "lab.json"
    full.write_text(json.dumps({"runs": [], "sim_costs": {name: 1.0 for name in sim.cost_names()}}))
    assert sim.SimCosts.from_json(full).source == str(full)
    for bad, field in (({"requeue_seconds": 3}, "requeue_seconds"), ({"requeue_wait_s": -1}, "requeue_wait_s"),
                       ({"job_start_s": "soon"}, "job_start_s"), ([1, 2], "costs")):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match=field):
            sim.SimCosts.from_json(path)


@pytest.mark.parametrize("kwargs, field", [({"gpus": 0}, "gpus"), ({"gpus": 8, "replicas": 0}, "replicas"),
                                           ({"gpus": 8, "lemon_share": 2}, "lemon_share"),
                                           ({"gpus": 8, "faults": ONE_CLASS * 2}, "faults")])
def test_config_validates(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        sim.SimConfig(**kwargs)


def test_memory_snapshot_usable_after_its_write_from_the_restart_point():
    tier = sim.MemoryTier(every_s=10.0, stall_s=1.0, write_s=3.0)
    assert tier.period_s == 11.0 and tier.stall_share == pytest.approx(1 / 11)
    assert [tier.restore_point(c) for c in (2.0, 13.0, 14.0, 25.0, 24.9)] == [0.0, 0.0, 11.0, 22.0, 11.0]
    spaced = sim.MemoryTier.from_costs(sim.SimCosts(step_s=2.0, mem_snapshot_stall_s=0.5, mem_snapshot_write_s=1.0))
    assert spaced.every_s == 10.0  # the trainer's auto rule: 0.5 s within 5% of the training between snapshots
    young = sim.MemoryTier.from_costs(sim.SimCosts(step_s=2.0, mem_snapshot_stall_s=0.5, mem_snapshot_write_s=1.0),
                                      mtbf_s=3600.0)
    assert young.every_s == 60.0  # sqrt(2 * 0.5 s * 1 h) = 60 s: the failure rate spaces it further


def test_memory_tier_budget_is_the_trainers():
    from slurm_ft.train import memory

    assert sim.MEM_STALL_BUDGET == memory.STALL_BUDGET


def test_memory_tier_loses_since_the_snapshot_in_allocation_and_since_disk_after_a_requeue():
    config = sim.SimConfig(gpus=16384, faults=ONE_CLASS, lemon_share=0.0, replicas=8, horizon_h=24.0 * 14)
    costs = sim.SimCosts(step_s=1.0, mem_snapshot_stall_s=0.01, mem_snapshot_write_s=0.5)
    plain = sim.Policy(name="plain", spare_fraction=0.0)
    tier = sim.Policy(name="tier", spare_fraction=0.0, memory_tier=True)
    off, on = sim.simulate(config, plain, costs), sim.simulate(config, tier, costs)
    # Young's spacing for a 0.01 s stall at a ~3 h MTBF: ~15 s between snapshots; half of it lost per fault
    assert 10.0 <= on.mem_every_s <= 20.0 and off.mem_every_s == 0.0
    assert off.rework_per_failure_s > 60 and on.rework_per_failure_s < on.mem_every_s  # not a disk interval's
    extra = on.lost_fraction["checkpoint_stall"] - off.lost_fraction["checkpoint_stall"]
    assert extra == pytest.approx(0.01 / (on.mem_every_s + 0.01), rel=0.2)  # each snapshot's stall, fault or not
    assert on.ettr > off.ettr
    requeue = dict(recovery=sim.Recovery.REQUEUE)
    on_disk = sim.simulate(config, sim.Policy(name="tier requeue", memory_tier=True, spare_fraction=0.0, **requeue),
                           costs)
    assert on_disk.rework_per_failure_s > 60  # a new allocation resumes from disk
