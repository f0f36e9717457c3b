"""Checkpoint interval choice: Young/Daly from the checkpoint cost and the failure rate, adapting as failures arrive.

Young (1974): ``T = sqrt(2 C M)``. Daly (2006) higher-order form, used here:
``T = sqrt(2 C M) * (1 + sqrt(C / (2M)) / 3 + C / (18 M)) - C`` for ``C < 2M``, else ``T = M``,
where ``C`` is the checkpoint cost (seconds the job loses per checkpoint) and ``M`` the mean time between failures.
"""

from __future__ import annotations

import dataclasses
import math

from slurm_ft.config import require


def young_interval(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum ``sqrt(2 C M)``."""
    _check_costs(checkpoint_cost_s, mtbf_s)
    return math.sqrt(2.0 * checkpoint_cost_s * mtbf_s)


def young_daly_interval(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum compute time between checkpoints, in seconds."""
    _check_costs(checkpoint_cost_s, mtbf_s)
    c, m = checkpoint_cost_s, mtbf_s
    if c >= 2.0 * m:
        return m
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(c / (2.0 * m)) / 3.0 + c / (18.0 * m)) - c


def _check_costs(checkpoint_cost_s: float, mtbf_s: float) -> None:
    require(checkpoint_cost_s > 0, "checkpoint_cost_s", f"must be > 0, got {checkpoint_cost_s}")
    require(mtbf_s > 0, "mtbf_s", f"must be > 0, got {mtbf_s}")


@dataclasses.dataclass(kw_only=True, slots=True)
class AdaptiveIntervalConfig:
    """``prior_mtbf_s`` counts as ``prior_weight`` failures' worth of evidence before any is observed."""

    prior_mtbf_s: float = 6 * 3600.0
    prior_weight: float = 1.0
    initial_cost_s: float = 5.0
    cost_alpha: float = 0.3  # EWMA weight of the newest checkpoint cost
    min_s: float = 30.0
    max_s: float = 6 * 3600.0

    def __post_init__(self) -> None:
        require(self.prior_mtbf_s > 0, "prior_mtbf_s", f"must be > 0, got {self.prior_mtbf_s}")
        require(self.prior_weight > 0, "prior_weight", f"must be > 0, got {self.prior_weight}")
        require(self.initial_cost_s > 0, "initial_cost_s", f"must be > 0, got {self.initial_cost_s}")
        require(0 < self.cost_alpha <= 1, "cost_alpha", f"must be in (0, 1], got {self.cost_alpha}")
        require(0 < self.min_s <= self.max_s, "min_s", f"need 0 < min_s <= max_s, got {self.min_s}, {self.max_s}")


class AdaptiveInterval:
    """Tracks checkpoint cost (EWMA) and MTBF (prior plus observed failures over exposure time)."""

    def __init__(self, config: AdaptiveIntervalConfig | None = None) -> None:
        self.config = config or AdaptiveIntervalConfig()
        self.cost_s = self.config.initial_cost_s
        self.failures = 0
        self.exposure_s = 0.0

    def observe_checkpoint_cost(self, seconds: float) -> None:
        if seconds > 0:
            a = self.config.cost_alpha
            self.cost_s = a * seconds + (1 - a) * self.cost_s

    def observe_exposure(self, seconds: float) -> None:
        """Add run time during which failures could have happened."""
        if seconds > 0:
            self.exposure_s += seconds

    def observe_failure(self) -> None:
        self.failures += 1

    @property
    def mtbf_s(self) -> float:
        cfg = self.config
        return (cfg.prior_weight * cfg.prior_mtbf_s + self.exposure_s) / (cfg.prior_weight + self.failures)

    def interval_s(self) -> float:
        chosen = young_daly_interval(self.cost_s, self.mtbf_s)
        return min(max(chosen, self.config.min_s), self.config.max_s)

    def interval_steps(self, step_time_s: float) -> int:
        require(step_time_s > 0, "step_time_s", f"must be > 0, got {step_time_s}")
        return max(1, round(self.interval_s() / step_time_s))
