"""The pure half of ``slurm-ft bench step``: the per-step collective's cost model and its extrapolation.

The manager's agreement (``CheckpointManager._agree``) is one gloo all-reduce(MAX) of three int32s: a
latency-bound collective, pipelined (started in one step, waited for in the next) and spaced: one every K steps,
K = max(1, floor(agree_every_s / step_s)). An agreement costs the manager's overhead (``maybe_save`` measured
agreeing every step, the collective already done) plus whatever part of the collective a training step of
``step_s`` does not hide; the K-1 steps between agreements pay only a call that does nothing (``base``). Per step:

    base + (overhead + max(0, t(P) - step_s)) / K

Two models are fitted to the measured bare all-reduce t(P) at P ranks, least squares:

    tree:  t(P) = alpha * log2(P) + beta     (a latency-optimal all-reduce: recursive doubling, a tree)
    ring:  t(P) = alpha * (P - 1) + beta     (a ring: 2(P-1) sequential steps; gloo's default algorithm)

``beta`` is the fixed cost (Python, the manager's bookkeeping, the call into gloo), ``alpha`` the cost per step
of the algorithm. Measured on one host the ranks talk over loopback, so ``alpha`` is a same-host hop (and, with
more ranks than cores, a context switch): it says nothing about a network hop between nodes. The extrapolation is
reported as a fraction of a training step of ``step_s`` seconds.

Beside the fits, a what-if with an assumed network hop of ``hop_us`` (default 30 us: a TCP message between nodes
on datacenter Ethernet; an assumption, not a measurement): tree ``hop * log2(P) + c1``, ring ``hop * 2(P-1) + c1``
(gloo's ring all-reduce is a reduce-scatter then an all-gather, P-1 dependent hops each), where ``c1`` is the cost
measured at the smallest rank count (no hop at 1 rank).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Any

from slurm_ft.core.config import require

SCHEMA = "slurm-ft/bench-step/1"
DEFAULT_RANKS = (1, 2, 4, 8)
EXTRAPOLATE = (1024, 2048, 4096, 8192, 16384)
TARGET_RANKS, TARGET_FRACTION = 1024, 0.001  # issue 15: <= 0.1% of a 1 s step at 1024 ranks
AGREE_EVERY_S = 2.0  # the manager's default (slurm_ft.train.checkpoint.AGREE_EVERY_S; torch-free here)
MODELS = {"tree": lambda p: math.log2(p), "ring": lambda p: p - 1.0}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StepConfig:
    """One run: rank counts (real gloo processes on this host), measured steps per count after ``warmup``
    steps, the training step the cost is compared with (``step_s``), and the rank counts to extrapolate to."""

    ranks: tuple[int, ...] = DEFAULT_RANKS
    steps: int = 300
    warmup: int = 30
    step_s: float = 1.0
    extrapolate: tuple[int, ...] = EXTRAPOLATE
    hop_us: float = 30.0
    compute_ms: float = 20.0
    agree_every_s: float = AGREE_EVERY_S

    def __post_init__(self) -> None:
        require(bool(self.ranks) and all(isinstance(r, int) and r >= 1 for r in self.ranks), "ranks",
                f"must be integers >= 1, got {self.ranks!r}")
        require(len(set(self.ranks)) >= 2, "ranks", f"needs at least two distinct counts to fit, got {self.ranks!r}")
        require(isinstance(self.steps, int) and self.steps >= 1, "steps",
                f"must be an integer >= 1, got {self.steps!r}")
        require(isinstance(self.warmup, int) and self.warmup >= 0, "warmup",
                f"must be an integer >= 0, got {self.warmup!r}")
        require(isinstance(self.step_s, (int, float)) and self.step_s > 0, "step_s",
                f"must be > 0 seconds, got {self.step_s!r}")
        require(isinstance(self.compute_ms, (int, float)) and self.compute_ms >= 0, "compute_ms",
                f"must be >= 0 milliseconds, got {self.compute_ms!r}")
        require(isinstance(self.agree_every_s, (int, float)) and self.agree_every_s >= 0, "agree_every_s",
                f"must be >= 0 seconds (0: every step), got {self.agree_every_s!r}")
        require(isinstance(self.hop_us, (int, float)) and self.hop_us > 0, "hop_us",
                f"must be > 0 microseconds, got {self.hop_us!r}")
        require(bool(self.extrapolate) and all(isinstance(r, int) and r >= 1 for r in self.extrapolate),
                "extrapolate", f"must be integers >= 1, got {self.extrapolate!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class Fit:
    """``t(P) = alpha * x(P) + beta`` with x from :data:`MODELS`; seconds."""

    model: str
    alpha_s: float
    beta_s: float

    def predict_s(self, ranks: int) -> float:
        return self.alpha_s * MODELS[self.model](ranks) + self.beta_s


def fit(model: str, points: Sequence[tuple[int, float]]) -> Fit:
    """Least-squares fit of (ranks, seconds) points; alpha is clamped at 0 (a cost does not fall with P)."""
    if model not in MODELS:
        raise ValueError(f"model: unknown {model!r} (known: {', '.join(MODELS)})")
    xs = [MODELS[model](p) for p, _ in points]
    ys = [t for _, t in points]
    if len(set(xs)) < 2:
        raise ValueError(f"points: needs at least two distinct rank counts, got {[p for p, _ in points]}")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    alpha = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    if alpha < 0:
        return Fit(model, 0.0, my)
    return Fit(model, alpha, my - alpha * mx)


def spacing(agree_every_s: float, step_s: float) -> int:
    """Steps from one agreement to the next, as the manager picks it for steps of ``step_s``."""
    return max(1, int(agree_every_s / step_s)) if agree_every_s > 0 else 1


@dataclasses.dataclass(frozen=True, slots=True)
class Costs:
    """The manager's measured costs, seconds: ``overhead`` of a step that agrees, ``base`` of one that does not."""

    overhead_s: float
    base_s: float = 0.0
    agree_every_s: float = 0.0

    def per_step_s(self, collective_s: float, step_s: float) -> float:
        """What a step pays on average: the base, plus an agreement's overhead and the part of its collective
        the step does not hide, once per ``spacing`` steps."""
        agreement = self.overhead_s + max(0.0, collective_s - step_s)
        return self.base_s + agreement / spacing(self.agree_every_s, step_s)


def extrapolate(fits: Sequence[Fit], ranks: Sequence[int], step_s: float, costs: Costs) -> list[dict[str, Any]]:
    """One row per rank count: each model's collective seconds and the fraction of a step it costs."""
    rows = []
    for p in ranks:
        row: dict[str, Any] = {"ranks": p}
        for f in fits:
            row[f"{f.model}_s"] = f.predict_s(p)
            row[f"{f.model}_fraction"] = costs.per_step_s(f.predict_s(p), step_s) / step_s
        rows.append(row)
    return rows


def what_if(hop_s: float, costs: Costs, ranks: Sequence[int], step_s: float) -> list[dict[str, Any]]:
    """Per rank count: an assumed per-hop latency through a tree (log2 P hops) and gloo's ring (2(P-1) hops);
    the collective's seconds and the fraction of a ``step_s`` step it costs."""
    rows = []
    for p in ranks:
        tree, ring = hop_s * math.log2(p), hop_s * 2 * (p - 1)
        rows.append({"ranks": p, "tree_s": tree, "tree_fraction": costs.per_step_s(tree, step_s) / step_s,
                     "ring_s": ring, "ring_fraction": costs.per_step_s(ring, step_s) / step_s})
    return rows


def target(rows: Sequence[dict[str, Any]], step_s: float) -> dict[str, Any]:
    """Issue 15's target on the pipelined cost at 1024 ranks, judged on the worse of the two what-if collectives
    (gloo's ring)."""
    row = next(r for r in rows if r["ranks"] == TARGET_RANKS)
    worst = max(row["tree_fraction"], row["ring_fraction"])
    return {"target": f"per-step cost <= {TARGET_FRACTION:.1%} of a {step_s:g} s step at {TARGET_RANKS} ranks "
                      "(pipelined, spaced agreement, the worse of tree and ring)", "fraction": worst,
            "met": worst <= TARGET_FRACTION, "ring_fraction": row["ring_fraction"]}


def payload(config: StepConfig, measured: Sequence[dict[str, Any]], host: dict[str, Any]) -> dict[str, Any]:
    """JSON-ready: config, host, the measured rows (``ranks``; ``manager_s``: ``maybe_save`` agreeing every
    step; ``base_s``: a spaced call that does not agree (median); ``spaced_mean_s``: the spaced mean;
    ``allreduce_s``), fits of the bare all-reduce, the extrapolation and what-if, and the target. The overhead
    and base are the largest measured (conservative: on this host the overhead includes waiting for a collective
    the sleep did not hide)."""
    points = [(m["ranks"], m["allreduce_s"]) for m in measured]
    fits = [fit(name, points) for name in MODELS]
    costs = Costs(max(m["manager_s"] for m in measured), max(m.get("base_s", 0.0) for m in measured),
                  config.agree_every_s)
    extent = sorted(set(config.extrapolate) | {TARGET_RANKS})
    what = what_if(config.hop_us * 1e-6, costs, extent, config.step_s)
    return {"schema": SCHEMA, "config": dataclasses.asdict(config), "host": host, "measured": list(measured),
            "fits": [dataclasses.asdict(f) for f in fits], "overhead_s": costs.overhead_s, "base_s": costs.base_s,
            "spacing": spacing(config.agree_every_s, config.step_s),
            "extrapolated": extrapolate(fits, config.extrapolate, config.step_s, costs),
            "what_if": what, "target": target(what, config.step_s)}


def recorder_row(ranks: int, entries: int, collectives: int, off: Sequence[dict[str, float]],
                 on: Sequence[dict[str, float]]) -> dict[str, Any]:
    """The flight recorder's cost at ``ranks`` from runs taken in turn with it off and on (``entries``), each run a
    ``{"wall_s", "cpu_s"}``: the median step's collectives, wall time of the slowest rank and CPU time of the ranks
    (all their threads; what a host busy with other work inflates least). Overhead: the median over the on runs
    minus the median over the off runs; noise: the larger spread of the off and of the on runs."""
    require(bool(off) and bool(on), "runs", "needs at least one run with the recorder off and one on")
    row: dict[str, Any] = {"ranks": ranks, "entries": entries, "collectives": collectives,
                           "runs_off": list(off), "runs_on": list(on)}
    for key in ("wall", "cpu"):
        offs, ons = [r[f"{key}_s"] for r in off], [r[f"{key}_s"] for r in on]
        row[f"{key}_off_s"], row[f"{key}_on_s"] = statistics.median(offs), statistics.median(ons)
        row[f"{key}_overhead_s"] = row[f"{key}_on_s"] - row[f"{key}_off_s"]
        row[f"{key}_per_collective_s"] = row[f"{key}_overhead_s"] / max(1, collectives)
        row[f"{key}_noise_s"] = max(max(offs) - min(offs), max(ons) - min(ons))
    return row


def noise_verdict(overhead_s: float, noise_s: float) -> str:
    """``within the noise``, ``above the noise`` (a cost), or ``below the noise`` (faster with it on: the host)."""
    if abs(overhead_s) <= noise_s:
        return "within the noise"
    return "above the noise" if overhead_s > 0 else "below the noise (faster with it on: the host's noise)"


def render_recorder(rows: Sequence[dict[str, Any]], compute_ms: float) -> str:
    """The flight recorder's section of the report."""
    from slurm_ft.bench.report import Column, records_table

    if not rows:
        return ""
    us = lambda key: (lambda r: r[key] * 1e6)  # noqa: E731
    head = (f"flight recorder (TORCH_FR_BUFFER_SIZE={rows[0]['entries']}): a step's {rows[0]['collectives']} "
            f"gloo all-reduces after {compute_ms:g} ms of compute, median step of {len(rows[0]['runs_off'])} runs "
            "each with it off and on, taken in turn; wall: the slowest rank, CPU: the ranks' own")
    columns: dict[Any, Any] = {"ranks": "ranks"}
    for key, name in (("wall", "wall"), ("cpu", "CPU")):
        columns.update({Column(f"{name} bare us", ".1f"): us(f"{key}_off_s"),
                        Column(f"{name} on us", ".1f"): us(f"{key}_on_s"),
                        Column(f"{name} +us/collective", "+.2f"): us(f"{key}_per_collective_s"),
                        Column(f"{name} noise us", ".1f"): us(f"{key}_noise_s")})
    verdicts = [f"{r['ranks']} rank(s): wall {noise_verdict(r['wall_overhead_s'], r['wall_noise_s'])}, CPU "
                f"{noise_verdict(r['cpu_overhead_s'], r['cpu_noise_s'])}" for r in rows]
    return "\n".join([head, records_table(list(rows), columns), *verdicts])


def render(data: dict[str, Any]) -> str:
    """The terminal report: measured costs, the fits, the extrapolation and the target."""
    from slurm_ft.bench.report import Column, records_table

    us = lambda key: (lambda r: None if r.get(key) is None else r[key] * 1e6)  # noqa: E731
    lines = [records_table(data["measured"], {"ranks": "ranks",
                                              Column("agreeing every step us", ".1f"): us("manager_s"),
                                              Column("p90 us", ".1f"): us("manager_p90_s"),
                                              Column("spaced: mean us", ".1f"): us("spaced_mean_s"),
                                              Column("between agreements us", ".1f"): us("base_s"),
                                              Column("bare all_reduce us", ".1f"): us("allreduce_s")}), ""]
    for f in data["fits"]:
        x = "log2(P)" if f["model"] == "tree" else "(P-1)"
        lines.append(f"{f['model']}: all-reduce t(P) = {f['alpha_s'] * 1e6:.2f} us * {x} + {f['beta_s'] * 1e6:.1f} us")
    k, every = data.get("spacing", 1), data["config"].get("agree_every_s", 0)
    lines.append(f"pipelined, one agreement every {k} step(s) of {data['config']['step_s']:g} s (agree_every_s "
                 f"{every:g}): a step pays {data.get('base_s', 0.0) * 1e6:.1f} us + ({data['overhead_s'] * 1e6:.1f} "
                 f"us + max(0, t(P) - step)) / {k}; % of step below")
    lines += ["", records_table(data["extrapolated"], {
        "ranks": lambda r: f"{r['ranks']:,}", Column("tree ms", ".3f"): lambda r: r["tree_s"] * 1e3,
        Column("tree % of step", ".4%"): "tree_fraction", Column("ring ms", ".2f"): lambda r: r["ring_s"] * 1e3,
        Column("ring % of step", ".3%"): "ring_fraction"})]
    if data.get("what_if"):
        hop = data["config"]["hop_us"]
        lines += ["", f"what-if, an assumed {hop:g} us network hop (tree: log2(P) hops, gloo's ring: 2(P-1) hops):",
                  records_table(data["what_if"], {
                      "ranks": lambda r: f"{r['ranks']:,}", Column("tree ms", ".3f"): lambda r: r["tree_s"] * 1e3,
                      Column("tree % of step", ".4%"): "tree_fraction",
                      Column("ring ms", ".2f"): lambda r: r["ring_s"] * 1e3,
                      Column("ring % of step", ".3%"): "ring_fraction"})]
    t = data["target"]
    lines.append(f"target: {t['target']}: {'met' if t['met'] else 'NOT met'} ({t['fraction']:.4%})")
    if data.get("flight_recorder"):
        lines += ["", render_recorder(data["flight_recorder"], data["config"].get("compute_ms", 0.0))]
    return "\n".join(lines)
