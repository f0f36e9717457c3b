"""PNG plots for the benchmark results (matplotlib, Agg backend). Missing matplotlib: no plot, a note."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_ettr_vs_gpus(results: Sequence[Mapping[str, Any]], path: Path) -> str | None:
    """One line per policy; returns a note when no plot could be made."""
    plt = _pyplot()
    if plt is None:
        return "matplotlib is not installed: no plot (pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy in dict.fromkeys(r["policy"] for r in results):
        points = sorted((r["gpus"], r["ettr"]) for r in results if r["policy"] == policy)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=policy)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("ETTR (productive time / wall time)")
    ax.set_ylim(0, 1.0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def plot_recovery_vs_size(recovery: Mapping[str, Mapping[str, Mapping[int, float]]], path: Path) -> str | None:
    """``recovery[fault][system][nodes] = seconds``: one panel per fault, one line per system."""
    plt = _pyplot()
    if plt is None:
        return "matplotlib is not installed: no plot (pip install matplotlib)"
    faults = list(recovery)
    fig, axes = plt.subplots(1, max(1, len(faults)), figsize=(4.5 * max(1, len(faults)), 4), squeeze=False)
    for ax, fault in zip(axes[0], faults):
        for system, by_nodes in recovery[fault].items():
            points = sorted((int(n), s) for n, s in by_nodes.items())
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=system)
        ax.set_title(fault)
        ax.set_xlabel("nodes")
        ax.set_ylabel("recovery time (s)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
