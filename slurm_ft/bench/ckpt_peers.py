"""The pure half of ``slurm-ft bench checkpoint``: config, per-round records to one row per system, the table,
the JSON payload and the issue's targets. The measuring half (torch, processes) is ``bench/bench_checkpoint.py``.

A round record is one save of one system on one rank: ``{"size_mb", "system", "round", "rank", "stall_s",
"commit_s"}`` (``commit_s`` None for memcpy: nothing durable). A system that cannot run here is one record
``{"size_mb", "system", "unavailable": reason}``. Memory records come from a separate pass (one fresh process
group per system): ``{"size_mb", "system", "rank", "extra_mb"}``.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_ft.core.config import require

SCHEMA = "slurm-ft/bench-checkpoint-peers/1"
MEMCPY, DISK = "memcpy (limit)", "raw disk fsync (limit)"
OURS_ASYNC, OURS_SYNC = "ours async", "ours sync"
OURS_NO_WRITEBACK = "ours async, no early writeback"  # each file waits for its closing fsync
CHUNK_MB = 16
# Targets of issue 15 (part 1).
PERSIST_TARGET = 0.8     # ours: persist bandwidth / raw fsync'd disk bandwidth
MEMORY_TARGET = 1.0      # ours: peak extra host memory / state size, per rank


@dataclasses.dataclass(frozen=True, slots=True)
class SystemInfo:
    """What a system is: ``kind`` ours | peer | limit; ``async_`` whether the caller is released before the
    write; ``verified``: what a load checks."""

    name: str
    kind: str
    async_: bool
    verified: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    """One run: state sizes (MB per rank), measured rounds per size, DCP writer threads, ranks (gloo processes),
    output dir for checkpoints, whether to run the memory pass, an optional subset of systems, and the device
    the state lives on (cuda: every system saves the same GPU state; memcpy is then the device-to-host copy)."""

    sizes: tuple[int, ...] = (64, 256, 512)
    repeats: int = 5
    threads: int = 2
    ranks: int = 1
    dir: str = "/tmp/bench-ckpt"
    memory: bool = True
    systems: tuple[str, ...] = ()
    device: str = "cpu"  # where the state lives: cpu, or cuda (each rank on GPU rank % count)

    def __post_init__(self) -> None:
        require(self.device in ("cpu", "cuda"), "device", f"must be cpu or cuda, got {self.device!r}")
        require(bool(self.sizes) and all(isinstance(s, int) and s >= CHUNK_MB for s in self.sizes), "sizes",
                f"must be integers >= {CHUNK_MB} (MB), got {self.sizes!r}")
        for name, low in (("repeats", 1), ("threads", 1), ("ranks", 1)):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= low, name,
                    f"must be an integer >= {low}, got {value!r}")
        require(str(self.dir) != "", "dir", "must be a non-empty path")


def unavailable_reason(exc: BaseException) -> str:
    """``unavailable: <type>: <first line>``, short enough for a table cell."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = text if len(text) <= 120 else text[:117] + "..."
    return f"unavailable: {type(exc).__name__}" + (f": {text}" if text else "")


def _round_max(records: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], dict[str, float | None]]:
    """(system, round) -> the slowest rank's stall and commit (a step waits for its slowest rank)."""
    out: dict[tuple[str, int], dict[str, float | None]] = {}
    for r in records:
        if r["round"] == 0:  # the cold save: buffers and helper processes are set up
            continue
        key = (r["system"], r["round"])
        cur = out.setdefault(key, {"stall_s": 0.0, "commit_s": None})
        cur["stall_s"] = max(cur["stall_s"], r["stall_s"])
        if r.get("commit_s") is not None:
            cur["commit_s"] = max(cur["commit_s"] or 0.0, r["commit_s"])
    return out


def write_s(stall_s: float, commit_s: float, async_: bool) -> float:
    """Time spent persisting: after the caller was released for an async system, all of it for a sync one."""
    return commit_s - stall_s if async_ and commit_s > stall_s else commit_s


def summarize(size_mb: float, infos: Sequence[SystemInfo], records: Sequence[Mapping[str, Any]],
              memory: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """One row per system for one size. Ratios are medians of per-round ratios against the limits measured in the
    same round (neighbours in time); the times are medians of the slowest rank's."""
    ran = [r for r in records if "unavailable" not in r]
    rounds = _round_max(ran)
    limits = {n: {k[1]: v for k, v in rounds.items() if k[0] == n} for n in (MEMCPY, DISK)}
    down = {r["system"]: r["unavailable"] for r in records if "unavailable" in r}
    extra = {}
    for m in memory:
        extra[m["system"]] = max(extra.get(m["system"], 0.0), m["extra_mb"])
    rows = [_row(size_mb, info, {k[1]: v for k, v in rounds.items() if k[0] == info.name}, limits,
                 down.get(info.name), extra.get(info.name)) for info in infos]
    for row in rows:
        cold = [r["stall_s"] for r in ran if r["system"] == row["system"] and r["round"] == 0]
        row["cold_stall_s"] = max(cold) if cold else None
    return rows


def _row(size_mb: float, info: SystemInfo, mine: Mapping[int, Mapping[str, float | None]],
         limits: Mapping[str, Mapping[int, Mapping[str, float | None]]], down: str | None,
         extra_mb: float | None) -> dict[str, Any]:
    row: dict[str, Any] = {"size_mb": size_mb, "system": info.name, "kind": info.kind, "async": info.async_,
                           "verified_on_load": info.verified, "status": down or "ok", "rounds": len(mine),
                           "extra_mb": extra_mb, "extra_per_state": None if extra_mb is None else extra_mb / size_mb}
    keys = ("stall_s", "commit_s", "persist_mbps", "persist_per_disk", "stall_per_memcpy")
    row.update(dict.fromkeys(keys))
    if down or not mine:
        row["status"] = down or "no rounds"
        return row
    med = statistics.median
    row["stall_s"] = med(v["stall_s"] for v in mine.values())
    commits = {k: v["commit_s"] for k, v in mine.items() if v["commit_s"] is not None}
    copies = {k: limits[MEMCPY][k]["stall_s"] for k in mine if k in limits[MEMCPY]}
    if copies and info.kind != "limit":
        row["stall_per_memcpy"] = med(mine[k]["stall_s"] / c for k, c in copies.items() if c > 0)
    if commits:
        row["commit_s"] = med(commits.values())
        writes = {k: write_s(mine[k]["stall_s"], c, info.async_) for k, c in commits.items()}
        row["persist_mbps"] = med(size_mb / w for w in writes.values() if w > 0)
        disk = {k: limits[DISK][k]["commit_s"] for k in writes if k in limits[DISK]}
        ratios = [d / writes[k] for k, d in disk.items() if d and writes[k] > 0]
        row["persist_per_disk"] = med(ratios) if ratios else None
    return row


def _best_peer(rows: Sequence[Mapping[str, Any]], key: str) -> Mapping[str, Any] | None:
    peers = [r for r in rows if r["kind"] == "peer" and r.get(key) is not None]
    return min(peers, key=lambda r: r[key]) if peers else None


def targets(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets for one size's rows, each with the figures it was judged on and ``met`` (None: not
    measurable, e.g. no peer ran)."""
    ours = next((r for r in rows if r["system"] == OURS_ASYNC), None)
    out = []
    for key, what in (("stall_s", "stall"), ("commit_s", "durable commit")):
        best = _best_peer(rows, key)
        mine = ours.get(key) if ours else None
        ok = None if best is None or mine is None else mine <= best[key]
        out.append({"target": f"ours {what} <= best peer's", "ours": mine, "best_peer": best and best["system"],
                    "peer_value": best and best[key], "ratio": _ratio(mine, best and best[key]), "met": ok})
    persist = ours.get("persist_per_disk") if ours else None
    out.append({"target": f"ours persist bandwidth >= {PERSIST_TARGET} x raw disk", "ours": persist,
                "met": None if persist is None else persist >= PERSIST_TARGET})
    mem = ours.get("extra_per_state") if ours else None
    out.append({"target": f"ours extra host memory <= {MEMORY_TARGET:g} x state per rank", "ours": mem,
                "met": None if mem is None else mem <= MEMORY_TARGET})
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The side-by-side table of all sizes' rows; a system that did not run shows its reason."""
    from slurm_ft.bench.report import Column, records_table

    return records_table(rows, {
        "MB": lambda r: int(r["size_mb"]), "system": "system",
        Column("stall s", ".4f"): "stall_s", Column("commit s", ".3f"): "commit_s",
        Column("persist MB/s", ".0f"): "persist_mbps", Column("persist/disk", ".2f"): "persist_per_disk",
        Column("stall/memcpy", ".2f"): "stall_per_memcpy", Column("extra MB", ".0f"): "extra_mb",
        Column("extra/state", ".2f"): "extra_per_state", "verified on load": "verified_on_load",
        "status": lambda r: r["status"] if r["status"] != "ok" else None})


def targets_text(size_mb: float, checks: Sequence[Mapping[str, Any]]) -> str:
    """One line per target: met / NOT met / not measured, with the figures."""
    lines = []
    for c in checks:
        verdict = {True: "met", False: "NOT met", None: "not measured"}[c["met"]]
        detail = f"ours {_fmt(c['ours'])}"
        if "best_peer" in c:
            detail += f", best peer {c['best_peer']} {_fmt(c['peer_value'])}, ratio {_fmt(c['ratio'])}"
        lines.append(f"{int(size_mb)} MB: {c['target']}: {verdict} ({detail})")
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    return "-" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))


def payload(config: BenchConfig, infos: Sequence[SystemInfo], records: Sequence[Mapping[str, Any]],
            memory: Sequence[Mapping[str, Any]], host: Mapping[str, Any]) -> dict[str, Any]:
    """Everything of one run, JSON-ready: config, host, raw records, rows and targets per size."""
    rows, checks = [], {}
    for size in config.sizes:
        mine = [r for r in records if r["size_mb"] == size]
        size_rows = summarize(size, infos, mine, [m for m in memory if m["size_mb"] == size])
        rows += size_rows
        checks[str(size)] = targets(size_rows)
    return {"schema": SCHEMA, "config": dataclasses.asdict(config), "host": dict(host),
            "systems": [dataclasses.asdict(i) for i in infos], "rows": rows, "targets": checks,
            "records": list(records), "memory": list(memory)}


def render(data: Mapping[str, Any]) -> str:
    """The terminal report of a payload: the table, then each size's targets."""
    parts = [table(data["rows"]), ""]
    parts += [targets_text(float(size), checks) for size, checks in data["targets"].items()]
    return "\n".join(parts)


def write(out: Path, data: Mapping[str, Any]) -> list[Path]:
    """checkpoint_peers.json, .txt and .png (the plot only with matplotlib); the paths written."""
    import json

    from slurm_ft.bench.plots import plot_checkpoint_peers

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "checkpoint_peers.json", out / "checkpoint_peers.txt"]
    paths[0].write_text(json.dumps(data, indent=2) + "\n")
    paths[1].write_text(render(data) + "\n")
    png = out / "checkpoint_peers.png"
    if plot_checkpoint_peers(data["rows"], png) is None:
        paths.append(png)
    return paths
