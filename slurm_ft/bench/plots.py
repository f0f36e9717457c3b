"""PNG plots of benchmark results (matplotlib, Agg backend). Without matplotlib: no plot and a note saying so.

Inputs are the plain dicts the benchmarks write to JSON, so a plot can be redrawn from a results file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

NO_MATPLOTLIB = "matplotlib is not installed: no plots (pip install matplotlib)"


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_ettr_vs_gpus(results: Sequence[Mapping[str, Any]], path: Path, *,
                      target: tuple[int, float] | None = None) -> str | None:
    """Sim results (``gpus``, ``policy``, ``ettr``, optional ``ettr_ci95``): one line per policy, log2 x;
    ``target`` = (gpus, ettr) marks a goal. Returns a note when no plot could be made, else None."""
    plt = _pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    fig, ax = plt.subplots(figsize=(8, 5))
    for policy in dict.fromkeys(r["policy"] for r in results):
        points = sorted((r["gpus"], r["ettr"], r.get("ettr_ci95", 0.0)) for r in results if r["policy"] == policy)
        ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points], marker="o",
                    markersize=4, capsize=2, label=policy)
    if target is not None:
        ax.plot([target[0]], [target[1]], marker="*", markersize=12, color="black", linestyle="none",
                label=f"target: {target[1]:g} at {target[0]:,} GPUs")
    gpus = sorted({r["gpus"] for r in results})
    ax.set_xscale("log", base=2)
    ax.set_xticks(gpus, [f"{g:,}" for g in gpus], fontsize=8)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("ETTR (productive time / wall time)")
    ax.set_ylim(0, 1.0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return _save(plt, fig, path)


def plot_recovery_vs_size(records: Sequence[Mapping[str, Any]], path: Path, *, value: str = "recovery_s",
                          ylabel: str = "recovery time (s): fault to first resumed step") -> str | None:
    """Lab records (``fault``, ``system``, ``nodes``, ``value``): one panel per fault, one line per system.
    Records without the value (the fault was not recovered) are left out. Returns a note, or None."""
    plt = _pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    usable = [r for r in records if r.get(value) is not None]
    faults = list(dict.fromkeys(r["fault"] for r in usable))
    if not faults:
        return f"no records with {value!r}: no recovery plot"
    systems = list(dict.fromkeys(r["system"] for r in records))
    colors = {system: f"C{i}" for i, system in enumerate(systems)}  # one color per system in every panel
    fig, axes = plt.subplots(1, len(faults), figsize=(4.5 * len(faults), 4), squeeze=False)
    for ax, fault in zip(axes[0], faults):
        mine = [r for r in usable if r["fault"] == fault]
        for system in (s for s in systems if any(r["system"] == s for r in mine)):
            points = sorted((int(r["nodes"]), float(r[value])) for r in mine if r["system"] == system)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=system,
                    color=colors[system])
        ax.set_title(fault)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("nodes")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return _save(plt, fig, path)


CHECKPOINT_PANELS = (("stall_s", "training stall per save (s, log)"),
                     ("commit_s", "time to durable commit (s, log)"),
                     ("extra_per_state", "peak extra host memory / state"))


def plot_checkpoint_peers(rows: Sequence[Mapping[str, Any]], path: Path) -> str | None:
    """Checkpoint peer rows (``size_mb``, ``system``, the panels' keys): one panel per figure, one bar per
    system and size; systems that did not run are left out. Returns a note, or None."""
    plt = _pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    usable = [r for r in rows if r.get("status") == "ok"]
    if not usable:
        return "no system ran: no checkpoint plot"
    systems = list(dict.fromkeys(r["system"] for r in usable))
    sizes = sorted({r["size_mb"] for r in usable})
    width = 0.8 / len(sizes)
    fig, axes = plt.subplots(1, len(CHECKPOINT_PANELS), figsize=(5.5 * len(CHECKPOINT_PANELS), 5.5))
    for ax, (key, label) in zip(axes, CHECKPOINT_PANELS):
        for i, size in enumerate(sizes):
            values = {r["system"]: r.get(key) for r in usable if r["size_mb"] == size}
            xs = [j + i * width for j, s in enumerate(systems) if values.get(s) is not None]
            ax.bar(xs, [values[s] for s in systems if values.get(s) is not None], width, label=f"{size:g} MB")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(systems))], systems, rotation=60, ha="right",
                      fontsize=7)
        if key == "extra_per_state":
            ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")  # issue 15's target for ours
        else:
            ax.set_yscale("log")
        ax.set_title(label, fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    return _save(plt, fig, path)


def _save(plt, fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
