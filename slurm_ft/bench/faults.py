"""``slurm-ft bench faults``: every fault the lab can inject, on a lab whose nodes are hosts, in one table.

It runs ``slurm-ft demo --hosts`` (``slurm_ft.bench.demo``) with the faults ``kill-rank``, ``hang``,
``user-error``, ``link-down``, ``link-flap``, ``slow-link``, ``node-death`` and ``node-reboot`` (and the clean
reference run) on the Slurm release first on ``PATH``, and prints one row per fault: release, detection (s),
verdict, whether the culprit is right, recovery (s), steps lost, whether the final parameters equal the clean
run's, and the committed checkpoints lost. Run it once per release
(``PATH=/opt/slurm-25.11/bin:/opt/slurm-25.11/sbin:$PATH``) for the matrix. ``--out DIR`` keeps the table
(``faults.txt``) and the rows (``faults.json``).

Culprit right: the verdict names the faulted node (node and network faults: a ``link-flap``'s node by its link
counters) or rank 1 on its node (rank faults); ``slow-link`` must name no other node (``none`` when nothing was
named). Committed checkpoints lost: the checkpoint intervals between the newest checkpoint due before the fault
and the one the restart resumed from (0: nothing committed was lost); ``-`` where nothing restarted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from slurm_ft.bench import demo
from slurm_ft.core.rundir import read_events
from slurm_ft.core.taxonomy import culprit_text
from slurm_ft.lab.faults import fault_timing
from slurm_ft.lab.interrupt import run_to_the_end

FAULTS = ("kill-rank", "hang", "user-error", "link-down", "link-flap", "slow-link", "node-death", "node-reboot")
RANK_FAULTS = ("kill-rank", "hang", "user-error")
HEADER = ("fault", "release", "detection s", "verdict", "culprit right?", "recovery s", "steps lost",
          "resumed from", "parameters equal", "committed checkpoints lost")


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One fault's cell of the matrix, as printed."""

    fault: str
    release: str
    detection_s: str
    verdict: str
    culprit_right: str
    recovery_s: str
    steps_lost: str
    resumed_from: str  # memory@N, peer@N or disk@N: the trainer's own resume event (issue 32)
    params_equal: str
    ckpts_lost: str

    def cells(self) -> tuple[str, ...]:
        return dataclasses.astuple(self)


def culprit_right(name: str, victim: str, rank1_node: str, verdict: dict[str, Any] | None) -> str:
    """``yes``/``no`` (with what was named), ``none`` where a fault with no culprit named none."""
    culprit = (verdict or {}).get("culprit", {})
    nodes, ranks = culprit.get("nodes", []), culprit.get("ranks", [])
    named = culprit_text(verdict) if verdict else "-"
    if name in RANK_FAULTS:
        return "yes" if ranks == [1] and nodes == [rank1_node] else f"no ({named})"
    if name == "slow-link" and not nodes:
        return "yes (none named)"
    return "yes" if nodes == [victim] else f"no ({named if nodes else 'none named'})"


def checkpoints_lost(fault_step: int | None, resume_step: int | None, every: int) -> str:
    """Checkpoint intervals between the newest checkpoint due before the fault and the resume point."""
    if fault_step is None or resume_step is None:
        return "-"
    return str(max(0, (fault_step // every) * every - resume_step) // every)


def row_of(run: demo.Run, release: str, reference: str | None, monitor_verdict: dict[str, Any] | None) -> Row:
    events = read_events(run.run_dir) if (run.run_dir / "events.jsonl").exists() else []
    timing = None if run.fault_time is None else fault_timing(
        events, fault_time=run.fault_time, fault_step=run.fault_step or 0, detected_at=run.detected_at)
    timing, source = demo.resumed_state(run, timing, events)  # steps lost from the step the restart resumed at
    verdict = demo.verdict_of(run, events, monitor_verdict)
    same = run.result is not None and run.result.get("param_sha256") == reference

    def secs(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    return Row(fault=run.name, release=release, detection_s=secs(timing and timing.detection_s),
               verdict=verdict["category"] if verdict else "-",
               culprit_right=culprit_right(run.name, run.victim, demo.rank_node(run, 1), verdict),
               recovery_s=secs(timing and timing.recovery_s),
               steps_lost="-" if timing is None or timing.steps_lost is None else str(timing.steps_lost),
               resumed_from=source,
               params_equal="-" if run.result is None else ("yes" if same else "NO"),
               ckpts_lost=checkpoints_lost(run.fault_step, timing and timing.resume_step, demo.EVERY))


def slurm_release() -> str:
    """``slurmctld -V`` of the Slurm on PATH (``slurm 25.11.7`` -> ``25.11.7``)."""
    done = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True, timeout=30, check=False)
    return done.stdout.strip().split()[-1] if done.returncode == 0 and done.stdout.strip() else "unknown"


def wall_s(run: demo.Run) -> float | None:
    """First attempt start to last exit, from the run's events."""
    if not (run.run_dir / "events.jsonl").exists():
        return None
    return fault_timing(read_events(run.run_dir), fault_time=0.0, fault_step=0).wall_s


def slow_cost(runs: list[demo.Run], cfg: demo.DemoConfig) -> str:
    """What the throttled link cost: slow-link's wall time against the clean run's (a line, or nothing)."""
    walls = {r.name: wall_s(r) for r in runs if r.name in ("clean", "slow-link")}
    clean, slow = walls.get("clean"), walls.get("slow-link")
    if not clean or not slow:
        return ""
    return (f"slow-link ({demo.SLOW_RATE} both ways from step {cfg.fault_step} of {cfg.steps}):"
            f" {slow:.1f} s of wall time against the clean run's {clean:.1f} s (+{slow - clean:.1f} s)\n")


def table(rows: list[Row]) -> str:
    return demo._table([HEADER, *(r.cells() for r in rows)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slurm-ft bench faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="working directory (default: a new one under /tmp)")
    parser.add_argument("--out", type=Path, help="write faults.txt and faults.json here")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"a subset of {','.join(FAULTS)}")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for all jobs (default 900)")
    args = parser.parse_args(argv)
    chosen = tuple(f.strip() for f in args.faults.split(",") if f.strip())
    unknown = [f for f in chosen if f not in FAULTS]
    if unknown or not chosen:
        print(f"slurm-ft bench faults: --faults: unknown {unknown[0]!r} (known: {', '.join(FAULTS)})" if unknown
              else "slurm-ft bench faults: --faults: give at least one", file=sys.stderr)
        return 2
    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="slurm-ft-faults-", dir="/tmp"))
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o755)
    cfg = demo.DemoConfig(dir=workdir, scenarios=chosen, steps=24, timeout_s=args.timeout, hosts=True)
    return run_to_the_end("bench faults", lambda: _run(cfg, args.out))


def _run(cfg: demo.DemoConfig, out: Path | None) -> int:
    def say(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    release, started = slurm_release(), time.monotonic()
    collected: dict[str, Any] = {}
    demo_table, failed = demo.run_demo(cfg, say, collect=collected)
    runs = collected.get("runs", [])
    clean = next((r for r in runs if r.name == "clean"), None)
    reference = (clean.result or {}).get("param_sha256") if clean else None
    rows = [row_of(r, release, reference, collected["verdicts"].get(r.job_id))
            for r in sorted(runs, key=lambda r: FAULTS.index(r.name) if r.name in FAULTS else -1) if r.name != "clean"]
    text = (f"{time.strftime('%Y-%m-%d')}, Slurm {release}, {len(rows)} faults on a 5-node lab of hosts\n\n"
            f"{table(rows)}\n\n{slow_cost(runs, cfg)}quarantined at the end: "
            f"{', '.join(collected.get('quarantined', [])) or 'none'}\n"
            f"the demo's table:\n{demo_table}\n"
            + "".join(f"FAILED CHECK  {line}\n" for line in failed)
            + f"{'all checks held' if not failed else f'{len(failed)} check(s) failed'} in "
              f"{time.monotonic() - started:.0f} s; evidence in {cfg.dir}\n")
    print()
    print(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "faults.txt").write_text(text)
        (out / "faults.json").write_text(json.dumps({"release": release, "rows": [dataclasses.asdict(r) for r in rows],
                                                     "quarantined": collected.get("quarantined", []),
                                                     "failed_checks": failed}, indent=1) + "\n")
    return 0 if not failed else 1
