import math
import random

import pytest

from slurm_ft.core.errors import ConfigError
from slurm_ft.train.interval import AdaptiveInterval, AdaptiveIntervalConfig, young_daly_interval, young_interval


def test_daly_approaches_young_for_cheap_checkpoints():
    c, m = 1.0, 100_000.0
    assert young_daly_interval(c, m) == pytest.approx(young_interval(c, m), rel=0.01)
    # ... and departs from it as the cost nears the MTBF (the -C term and the corrections matter)
    assert abs(young_daly_interval(500, 2000) - young_interval(500, 2000)) / young_interval(500, 2000) > 0.05


def test_daly_known_value():
    expected = math.sqrt(72000) * (1 + math.sqrt(10 / 7200) / 3 + 10 / 64800) - 10
    assert young_daly_interval(10, 3600) == pytest.approx(expected)
    assert young_interval(10, 3600) == pytest.approx(math.sqrt(72000))


def test_daly_is_mtbf_when_a_checkpoint_costs_two_mtbf_or_more():
    assert young_daly_interval(250, 100) == 100
    assert young_daly_interval(200, 100) == 100
    assert young_daly_interval(199, 100) != 100


def test_interval_grows_with_cost_and_with_mtbf():
    costs = [0.5, 1, 5, 20, 60]
    assert [young_daly_interval(c, 3600) for c in costs] == sorted(young_daly_interval(c, 3600) for c in costs)
    mtbfs = [600, 3600, 36_000, 360_000]
    values = [young_daly_interval(5, m) for m in mtbfs]
    assert values == sorted(values) and len(set(values)) == len(values)


@pytest.mark.parametrize("cost, mtbf, field", [(0, 10, "checkpoint_cost_s"), (1, -1, "mtbf_s"),
                                                (float("nan"), 10, "checkpoint_cost_s"),
                                                (1, float("inf"), "mtbf_s")])
def test_bad_costs_name_the_field(cost, mtbf, field):
    with pytest.raises(ConfigError, match=field):
        young_daly_interval(cost, mtbf)


def test_mtbf_is_the_prior_until_evidence_arrives():
    est = AdaptiveInterval(AdaptiveIntervalConfig(prior_mtbf_s=7200, prior_weight=2))
    assert est.mtbf_s == 7200
    est.observe_running(3600)  # an hour without failure lengthens the estimate
    assert est.mtbf_s == pytest.approx((2 * 7200 + 3600) / 2)
    est.observe_failure()
    assert est.mtbf_s == pytest.approx((2 * 7200 + 3600) / 3)


def test_adaptive_estimate_converges_to_true_mtbf_from_a_wrong_prior():
    rng = random.Random(7)
    est = AdaptiveInterval(AdaptiveIntervalConfig(prior_mtbf_s=24 * 3600))
    for _ in range(500):
        est.observe_running(rng.expovariate(1 / 1800))
        est.observe_failure()
    assert est.mtbf_s == pytest.approx(1800, rel=0.1)


def test_timestamped_failures_count_only_run_time_as_exposure():
    est = AdaptiveInterval(AdaptiveIntervalConfig(prior_mtbf_s=1000, prior_weight=1))
    est.mark_running(100.0)
    est.observe_failure(at=400.0)  # ran 300 s
    est.observe_failure(at=900.0)  # not running since the last failure: no exposure added
    est.mark_running(1000.0)
    est.observe_failure(at=1200.0)  # ran 200 s
    assert est.exposure_s == pytest.approx(500.0)
    assert est.failures == 3
    assert est.mtbf_s == pytest.approx((1000 + 500) / 4)


def test_cost_is_an_ewma_and_the_interval_follows_it():
    est = AdaptiveInterval(AdaptiveIntervalConfig(initial_cost_s=10, smoothing=0.5, min_interval_s=1))
    est.observe_checkpoint(2.0)  # the first measurement replaces the initial guess
    assert est.cost_s == pytest.approx(2.0)
    est.observe_checkpoint(4.0)
    assert est.cost_s == pytest.approx(3.0)
    assert est.interval_s() == pytest.approx(young_daly_interval(3.0, est.mtbf_s))
    before = est.interval_s()
    for _ in range(30):
        est.observe_checkpoint(0.5)
    assert est.cost_s == pytest.approx(0.5, rel=1e-3)
    assert est.interval_s() < before


def test_interval_shrinks_as_failures_arrive_and_stays_in_bounds():
    est = AdaptiveInterval(AdaptiveIntervalConfig(min_interval_s=60, max_interval_s=300))
    assert est.interval_s() == 300  # the 6 h prior with a 5 s cost wants ~460 s: capped
    for _ in range(50):
        est.observe_running(100)
        est.observe_failure()
    mid = est.interval_s()  # MTBF ~520 s: ~69 s
    assert 60 < mid < 300
    for _ in range(100):
        est.observe_running(10)
        est.observe_failure()
    assert est.interval_s() == 60  # MTBF ~ 180 s would want ~40 s: floored
    assert est.interval_steps(step_time_s=2.0) == round(est.interval_s() / 2.0)
    assert est.interval_steps(step_time_s=10_000.0) == 1


def test_interval_never_shorter_than_one_background_write():
    est = AdaptiveInterval(AdaptiveIntervalConfig(initial_cost_s=0.1, min_interval_s=1))
    for _ in range(200):
        est.observe_running(60)
        est.observe_failure()
    assert est.interval_s() < 20
    est.observe_checkpoint(0.1, write_s=45.0)
    assert est.interval_s() == pytest.approx(45.0)


def test_state_round_trips_and_bad_state_names_the_key():
    est = AdaptiveInterval()
    est.observe_checkpoint(3.0, write_s=20.0)
    est.observe_running(5000)
    est.observe_failure()
    again = AdaptiveInterval.from_dict(est.to_dict())
    assert again.to_dict() == est.to_dict()
    assert again.interval_s() == est.interval_s()
    with pytest.raises(ConfigError, match="failures"):
        AdaptiveInterval.from_dict({"failures": -1})
    with pytest.raises(ConfigError, match="checkpoints"):
        AdaptiveInterval.from_dict({"checkpoints": 1.5})
    assert AdaptiveInterval.from_dict({"cost_s": 2.0}).checkpoints == 1  # older state: a measured cost
    with pytest.raises(ConfigError, match="exposure_s"):
        AdaptiveInterval.from_dict({"exposure_s": "a lot"})


@pytest.mark.parametrize("kwargs, field", [({"smoothing": 0}, "smoothing"), ({"prior_mtbf_s": 0}, "prior_mtbf_s"),
                                           ({"min_interval_s": 10, "max_interval_s": 5}, "min_interval_s")])
def test_config_validates(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        AdaptiveIntervalConfig(**kwargs)


def test_observations_reject_bad_numbers():
    est = AdaptiveInterval()
    with pytest.raises(ConfigError, match="seconds"):
        est.observe_running(-1)
    with pytest.raises(ConfigError, match="seconds"):
        est.observe_running(float("nan"))
    with pytest.raises(ConfigError, match="step_time_s"):
        est.interval_steps(0)
