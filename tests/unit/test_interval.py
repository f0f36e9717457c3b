import math
import random

import pytest

from slurm_ft.errors import ConfigError
from slurm_ft.interval import AdaptiveInterval, AdaptiveIntervalConfig, young_daly_interval, young_interval


def test_daly_approaches_young_for_cheap_checkpoints():
    c, m = 1.0, 100_000.0
    assert young_daly_interval(c, m) == pytest.approx(young_interval(c, m), rel=0.01)


def test_daly_known_value():
    # sqrt(2*10*3600) * (1 + sqrt(10/7200)/3 + 10/64800) - 10
    expected = math.sqrt(72000) * (1 + math.sqrt(10 / 7200) / 3 + 10 / 64800) - 10
    assert young_daly_interval(10, 3600) == pytest.approx(expected)


def test_daly_saturates_at_mtbf_when_checkpoints_cost_more_than_two_mtbf():
    assert young_daly_interval(250, 100) == 100


def test_interval_grows_with_cost_and_mtbf():
    assert young_daly_interval(5, 3600) < young_daly_interval(20, 3600)
    assert young_daly_interval(5, 3600) < young_daly_interval(5, 7200)


def test_bad_costs_name_the_field():
    with pytest.raises(ConfigError, match="checkpoint_cost_s"):
        young_daly_interval(0, 10)
    with pytest.raises(ConfigError, match="mtbf_s"):
        young_daly_interval(1, -1)


def test_adaptive_estimate_converges_to_true_mtbf():
    rng = random.Random(7)
    est = AdaptiveInterval(AdaptiveIntervalConfig(prior_mtbf_s=24 * 3600))
    for _ in range(500):
        est.observe_exposure(rng.expovariate(1 / 1800))
        est.observe_failure()
    assert est.mtbf_s == pytest.approx(1800, rel=0.1)


def test_adaptive_interval_shrinks_as_failures_arrive_and_respects_bounds():
    est = AdaptiveInterval(AdaptiveIntervalConfig(min_s=60, max_s=3600))
    before = est.interval_s()
    for _ in range(50):
        est.observe_exposure(100)
        est.observe_failure()
    assert est.interval_s() < before
    assert est.interval_s() >= 60
    assert est.interval_steps(step_time_s=2.0) == round(est.interval_s() / 2.0)


def test_adaptive_config_validates():
    with pytest.raises(ConfigError, match="cost_alpha"):
        AdaptiveIntervalConfig(cost_alpha=0)
