"""Checkpoint interval choice: Young/Daly from the checkpoint cost and the failure rate, adapting as failures arrive.

With ``C`` the checkpoint cost (seconds of training the job loses per save: the whole write when synchronous, only
the stall when asynchronous) and ``M`` the mean time between failures:

- Young (1974), first order: ``T = sqrt(2 C M)``.
- Daly (2006), higher order, used here: ``T = sqrt(2 C M) * (1 + sqrt(C / (2M)) / 3 + C / (18 M)) - C`` for
  ``C < 2M``, else ``T = M`` (checkpointing more often than once per MTBF cannot pay off).

``T`` is the compute time between the ends of two saves. Daly's form approaches Young's when ``C << M``.

:class:`AdaptiveInterval` feeds it with estimates that improve as the job runs: the cost is an EWMA of measured
stalls; the MTBF is a conjugate (gamma-prior) estimate ``(w * prior_mtbf + exposure) / (w + failures)``, so a
prior counts as ``w`` failures' worth of evidence and observed run time without failures lengthens the estimate.
It holds plain numbers only (no clock, no I/O); :meth:`AdaptiveInterval.to_dict` lets a job carry it across
restarts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from slurm_ft.core.config import require
from slurm_ft.core.errors import ConfigError


def young_interval(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum ``sqrt(2 C M)``, in seconds."""
    _check_costs(checkpoint_cost_s, mtbf_s)
    return math.sqrt(2.0 * checkpoint_cost_s * mtbf_s)


def young_daly_interval(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum compute time between checkpoints, in seconds (see the module docstring)."""
    _check_costs(checkpoint_cost_s, mtbf_s)
    return _daly(checkpoint_cost_s, mtbf_s)


def _daly(c: float, m: float) -> float:
    if c >= 2.0 * m:
        return m
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(c / (2.0 * m)) / 3.0 + c / (18.0 * m)) - c


def _check_costs(checkpoint_cost_s: float, mtbf_s: float) -> None:
    require(_finite(checkpoint_cost_s) and checkpoint_cost_s > 0, "checkpoint_cost_s",
            f"must be a finite number > 0, got {checkpoint_cost_s!r}")
    require(_finite(mtbf_s) and mtbf_s > 0, "mtbf_s", f"must be a finite number > 0, got {mtbf_s!r}")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class AdaptiveIntervalConfig:
    """The Young/Daly interval estimator of ``--ft-ckpt-every=auto``."""

    prior_mtbf_s: float = 6 * 3600.0
    """MTBF assumed before any failure is seen."""
    prior_weight: float = 1.0
    """How many failures of evidence the prior MTBF is worth."""
    initial_cost_s: float = 5.0
    """Checkpoint cost assumed before the first save is measured."""
    smoothing: float = 0.3
    """EWMA weight of the newest measured cost and write time."""
    min_interval_s: float = 30.0
    """Lower bound on the chosen interval."""
    max_interval_s: float = 6 * 3600.0
    """Upper bound on the chosen interval (it is also never shorter than one background write, so at most one save is in
    flight)."""

    def __post_init__(self) -> None:
        for name in ("prior_mtbf_s", "prior_weight", "initial_cost_s", "min_interval_s", "max_interval_s"):
            value = getattr(self, name)
            require(_finite(value) and value > 0, name, f"must be a finite number > 0, got {value!r}")
        require(_finite(self.smoothing) and 0 < self.smoothing <= 1, "smoothing",
                f"must be in (0, 1], got {self.smoothing!r}")
        require(self.min_interval_s <= self.max_interval_s, "min_interval_s",
                f"must not exceed max_interval_s ({self.min_interval_s} > {self.max_interval_s})")


class AdaptiveInterval:
    """Young/Daly interval from an EWMA of checkpoint costs and a prior-weighted MTBF estimate.

    Feed it measured checkpoint costs (:meth:`observe_checkpoint`), time the job ran (:meth:`observe_running`,
    or :meth:`mark_running` then a timestamped :meth:`observe_failure`), and failures. Only run time counts as
    exposure: time spent detecting and recovering is not time in which the job could fail.
    """

    def __init__(self, config: AdaptiveIntervalConfig | None = None) -> None:
        self.config = config or AdaptiveIntervalConfig()
        self.cost_s = self.config.initial_cost_s
        self.write_s = 0.0
        self.checkpoints = 0  # saves measured; the first replaces ``initial_cost_s`` (a guess, not evidence)
        self.failures = 0
        self.exposure_s = 0.0
        self._running_since: float | None = None

    def observe_checkpoint(self, cost_s: float, *, write_s: float | None = None) -> None:
        """One save: ``cost_s`` the training lost to it (stall), ``write_s`` how long it was in flight."""
        require(_finite(cost_s) and cost_s >= 0, "cost_s", f"must be a finite number >= 0, got {cost_s!r}")
        a = self.config.smoothing
        self.cost_s = max(cost_s, 1e-6) if self.checkpoints == 0 else a * max(cost_s, 1e-6) + (1 - a) * self.cost_s
        self.checkpoints += 1
        if write_s is not None:
            require(_finite(write_s) and write_s >= 0, "write_s", f"must be a finite number >= 0, got {write_s!r}")
            self.write_s = write_s if self.write_s == 0 else a * write_s + (1 - a) * self.write_s

    def observe_running(self, seconds: float) -> None:
        """Add ``seconds`` of run time during which a failure could have happened."""
        if not 0 <= seconds < math.inf:  # hot in the simulator: one comparison, no helper call
            raise ConfigError(f"seconds: must be a finite number >= 0, got {seconds!r}")
        self.exposure_s += seconds

    def mark_running(self, at: float) -> None:
        """The job (re)started running at time ``at``; a later timestamped failure closes the span."""
        self._running_since = at

    def observe_failure(self, at: float | None = None) -> None:
        """One failure; with ``at``, the run time since :meth:`mark_running` is added as exposure."""
        if at is not None and self._running_since is not None:
            self.observe_running(max(0.0, at - self._running_since))
        self._running_since = None
        self.failures += 1

    @property
    def mtbf_s(self) -> float:
        cfg = self.config
        return (cfg.prior_weight * cfg.prior_mtbf_s + self.exposure_s) / (cfg.prior_weight + self.failures)

    def interval_s(self) -> float:
        """Seconds of training between checkpoints, within the configured bounds."""
        cfg = self.config
        chosen = _daly(self.cost_s, self.mtbf_s)  # both validated on the way in
        return min(max(chosen, cfg.min_interval_s, self.write_s), cfg.max_interval_s)

    def interval_steps(self, step_time_s: float) -> int:
        """The interval in whole steps (at least one) for a measured ``step_time_s``."""
        require(_finite(step_time_s) and step_time_s > 0, "step_time_s",
                f"must be a finite number > 0, got {step_time_s!r}")
        return max(1, round(self.interval_s() / step_time_s))

    def to_dict(self) -> dict[str, float]:
        """The learned state (not the config), for carrying across restarts."""
        return {"cost_s": self.cost_s, "write_s": self.write_s, "failures": self.failures,
                "exposure_s": self.exposure_s, "checkpoints": self.checkpoints}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any], config: AdaptiveIntervalConfig | None = None) -> "AdaptiveInterval":
        est = cls(config)
        for key in ("cost_s", "write_s", "exposure_s"):
            value = state.get(key, getattr(est, key))
            require(_finite(value) and value >= 0, key, f"must be a finite number >= 0, got {value!r}")
            setattr(est, key, float(value))
        for key, default in (("failures", 0), ("checkpoints", 1 if "cost_s" in state else 0)):
            count = state.get(key, default)
            require(isinstance(count, int) and not isinstance(count, bool) and count >= 0, key,
                    f"must be an integer >= 0, got {count!r}")
            setattr(est, key, count)
        est.cost_s = max(est.cost_s, 1e-6)
        return est
