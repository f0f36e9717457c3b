"""``slurm-ft bench step``'s model: fits, extrapolation, the target, the config."""

import math

import pytest

from slurm_ft.bench import step_model as sm
from slurm_ft.core.errors import ConfigError


def test_fit_recovers_a_tree_and_a_ring_exactly():
    tree = sm.fit("tree", [(p, 20e-6 * math.log2(p) + 50e-6) for p in (1, 2, 4, 8)])
    assert tree.alpha_s == pytest.approx(20e-6) and tree.beta_s == pytest.approx(50e-6)
    assert tree.predict_s(1024) == pytest.approx(250e-6)
    ring = sm.fit("ring", [(p, 10e-6 * (p - 1) + 40e-6) for p in (1, 2, 4, 8)])
    assert ring.alpha_s == pytest.approx(10e-6) and ring.predict_s(1024) == pytest.approx(10e-6 * 1023 + 40e-6)


def test_fit_clamps_a_falling_cost_and_refuses_one_point():
    flat = sm.fit("tree", [(1, 3.0), (2, 1.0)])
    assert flat.alpha_s == 0.0 and flat.beta_s == pytest.approx(2.0)
    with pytest.raises(ValueError, match="points"):
        sm.fit("tree", [(4, 1.0), (4, 2.0)])
    with pytest.raises(ValueError, match="model"):
        sm.fit("star", [(1, 1.0), (2, 2.0)])


def test_extrapolation_and_target_arithmetic():
    fits = [sm.Fit("tree", 50e-6, 100e-6), sm.Fit("ring", 10e-6, 100e-6)]
    rows = sm.extrapolate(fits, [1024, 16384], step_s=2.0, costs=sm.Costs(50e-6))
    assert rows[0]["tree_s"] == pytest.approx(600e-6)
    assert rows[0]["tree_fraction"] == pytest.approx(50e-6 / 2.0)  # pipelined: 0.6 ms hides in a 2 s step
    assert rows[1]["ring_s"] == pytest.approx(10e-6 * 16383 + 100e-6)


def test_a_pipelined_collective_costs_its_overhead_plus_what_the_step_does_not_hide():
    every_step = sm.Costs(50e-6)
    assert every_step.per_step_s(0.4, 1.0) == pytest.approx(50e-6)
    assert every_step.per_step_s(1.5, 1.0) == pytest.approx(0.5 + 50e-6)


def test_a_spaced_agreement_is_paid_once_per_k_steps_plus_the_base_of_every_step():
    assert sm.spacing(2.0, 1.0) == 2 and sm.spacing(2.0, 0.02) == 100 and sm.spacing(2.0, 3.0) == 1
    assert sm.spacing(0, 0.02) == 1
    spaced = sm.Costs(1.4e-3, base_s=5e-6, agree_every_s=2.0)
    assert spaced.per_step_s(0.061, 1.0) == pytest.approx(5e-6 + 1.4e-3 / 2)  # 0.075% of a 1 s step
    assert spaced.per_step_s(3.5, 3.0) == pytest.approx(5e-6 + 1.4e-3 + 0.5)  # 3 s steps: K = 1
    assert sm.target(sm.what_if(30e-6, spaced, [1024], 1.0), 1.0)["met"] is True
    assert sm.target(sm.what_if(30e-6, sm.Costs(1.4e-3), [1024], 1.0), 1.0)["met"] is False


def test_what_if_counts_hops_of_a_tree_and_a_ring_and_the_target_takes_the_worse():
    rows = sm.what_if(30e-6, sm.Costs(50e-6), [1, 1024, 16384], step_s=1.0)
    assert rows[0]["tree_s"] == 0.0 and rows[0]["ring_s"] == 0.0
    assert rows[1]["tree_s"] == pytest.approx(10 * 30e-6) and rows[1]["ring_s"] == pytest.approx(2 * 1023 * 30e-6)
    assert rows[1]["ring_fraction"] == pytest.approx(50e-6)  # 61 ms of ring hides in a 1 s step
    assert rows[2]["ring_fraction"] == pytest.approx(50e-6)  # 983 ms still hides in a 1 s step
    [short] = sm.what_if(30e-6, sm.Costs(50e-6), [16384], step_s=0.5)  # not in a 0.5 s step: the rest shows
    assert short["ring_fraction"] == pytest.approx((2 * 16383 * 30e-6 - 0.5 + 50e-6) / 0.5)
    t = sm.target(rows, 1.0)
    assert t["met"] is True and t["fraction"] == pytest.approx(50e-6)
    slow = sm.what_if(30e-6, sm.Costs(2e-3), [1024], step_s=1.0)  # 2 ms of overhead per step: 0.2%
    assert sm.target(slow, 1.0)["met"] is False


def test_payload_and_render():
    measured = [{"ranks": p, "manager_s": 60e-6, "manager_p90_s": 1e-4, "base_s": 2e-6, "spaced_mean_s": 3e-6,
                 "allreduce_s": 30e-6 * math.log2(p) + 60e-6} for p in (1, 2, 4, 8)]
    data = sm.payload(sm.StepConfig(), measured, {"cpus": 2})
    assert [f["model"] for f in data["fits"]] == ["tree", "ring"]
    assert [r["ranks"] for r in data["extrapolated"]] == list(sm.EXTRAPOLATE)
    assert data["overhead_s"] == pytest.approx(60e-6) and data["base_s"] == pytest.approx(2e-6)
    assert data["spacing"] == 2  # the manager's default 2 s between agreements, 1 s steps
    assert data["target"]["fraction"] == pytest.approx(2e-6 + 30e-6)
    text = sm.render(data)
    assert "tree: all-reduce t(P) = 30.00 us * log2(P) + 60.0 us" in text and "16,384" in text
    assert "one agreement every 2 step(s) of 1 s (agree_every_s 2): a step pays 2.0 us + (60.0 us" in text
    assert "(pipelined, spaced agreement, the worse of tree and ring): met" in text


def test_the_models_default_spacing_is_the_managers():
    from slurm_ft.train.checkpoint import AGREE_EVERY_S, CheckpointConfig

    manager_default = CheckpointConfig(dir="/x").agree_every_s
    assert sm.StepConfig().agree_every_s == sm.AGREE_EVERY_S == AGREE_EVERY_S == manager_default


@pytest.mark.parametrize("kwargs, field", [({"ranks": (2, 2)}, "ranks"), ({"ranks": (0, 2)}, "ranks"),
                                           ({"steps": 0}, "steps"), ({"warmup": -1}, "warmup"),
                                           ({"step_s": 0}, "step_s"), ({"extrapolate": ()}, "extrapolate"),
                                           ({"hop_us": 0}, "hop_us"), ({"compute_ms": -1}, "compute_ms"),
                                           ({"agree_every_s": -1}, "agree_every_s")])
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=f"^{field}:"):
        sm.StepConfig(**kwargs)


def test_slowest_rank_per_step_and_cli_parse():
    from slurm_ft.bench import step_bench

    assert step_bench.slowest_rank([[1.0, 5.0], [2.0, 3.0]]) == [2.0, 5.0]
    config, _, recorder = step_bench.parse(["--ranks", "1,2", "--steps", "10"])
    assert config.ranks == (1, 2) and config.steps == 10
    assert recorder == {"entries": 2000, "ranks": (2, 4), "collectives": 8, "runs": 2}
    assert step_bench.parse(["--ranks", "1,2", "--fr-entries", "0"])[2]["ranks"] == ()
    with pytest.raises(SystemExit):
        step_bench.parse(["--ranks", "4"])
    with pytest.raises(SystemExit):
        step_bench.parse(["--ranks", "1,2", "--fr-collectives", "0"])


def test_the_flight_recorders_cost_is_the_difference_of_medians_beside_the_noise():
    def runs(*pairs):
        return [{"wall_s": w, "cpu_s": c} for w, c in pairs]
    row = sm.recorder_row(2, 2000, 8, off=runs((0.0010, 0.0004), (0.0012, 0.0004), (0.0011, 0.0005)),
                          on=runs((0.0013, 0.0006), (0.0012, 0.0006), (0.0014, 0.0006)))
    assert row["wall_off_s"] == pytest.approx(0.0011) and row["wall_on_s"] == pytest.approx(0.0013)
    assert row["wall_overhead_s"] == pytest.approx(0.0002) and row["wall_per_collective_s"] == pytest.approx(0.000025)
    assert row["wall_noise_s"] == pytest.approx(0.0002)  # the off runs' spread; the on runs' is the same
    assert row["cpu_overhead_s"] == pytest.approx(0.0002) and row["cpu_noise_s"] == pytest.approx(0.0001)
    text = sm.render_recorder([row], compute_ms=20).splitlines()
    assert text[0].startswith("flight recorder (TORCH_FR_BUFFER_SIZE=2000): a step's 8 gloo all-reduces")
    assert text[-1] == "2 rank(s): wall within the noise, CPU above the noise"
    assert sm.noise_verdict(-0.003, 0.001).startswith("below the noise")
    assert sm.render_recorder([], compute_ms=20) == ""
