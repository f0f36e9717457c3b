"""``slurm-ft report DIR``: one job's attempts, faults and recoveries, from the launcher's ``events.jsonl``.

DIR is the run directory or the checkpoint directory (``<ckpt>/.slurm-ft``). A requeued job appends to the same
file: its launcher starts again at attempt 1, which the report counts as the next run of the job. Each failed
attempt shows its cause (the launcher's verdict, in the design's category words) and its culprit: the rank and
node that failed first, the first line of its error below the row. For an attempt whose ranks' flight-recorder
dumps show a stalled collective (a hang, a desync), the collective each rank was in follows, one line per group of
ranks in the same place (the verdict event's ``collectives``): who waited for whom. RESUME is the step the
attempt's ranks resumed from and where it came from, from rank 0's own ``resume`` event (``9 mem``: the memory
tier, ``9 peer``, ``8 disk``); without one, the newest disk checkpoint the launcher saw at the attempt's start.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from slurm_ft.core.errors import SlurmFtError
from slurm_ft.core.rundir import EVENTS_FILE, RUN_SUBDIR, read_events
from slurm_ft.core.taxonomy import culprit_text

LOST = "no end recorded (the launcher died: its node?)"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRow:
    """One launcher attempt: where it ran, what it resumed from, how it ended."""

    run: int  # 1 + the requeues before it
    attempt: int
    start: float
    nodes: tuple[str, ...]
    resume_step: int | None
    startup_s: float | None  # start -> first heartbeat
    ended: str  # "succeeded", "failed", "hung", "exit <code>: <why>", or LOST
    end: float | None
    cause: str = "-"  # the verdict's category ("-": no verdict recorded)
    culprit: str = "-"  # "rank 1 on n2", "n3", "-"
    error: str = ""  # the first line of the culprit's real error
    collectives: tuple[str, ...] = ()  # where each group of ranks was, from their flight-recorder dumps
    resume_source: str = ""  # memory, peer or disk: the ranks' own resume event ("": none recorded)


SOURCE_WORDS = {"memory": "mem"}  # the RESUME column's short words for a resume event's source


def attempts(events: list[dict[str, Any]]) -> list[AttemptRow]:
    """Pure: the attempt rows of an events list (``slurm_ft.launch.launcher`` events, in file order)."""
    rows: list[dict[str, Any]] = []
    run = 0
    for event in events:
        kind = event.get("event")
        if kind == "attempt_start":
            run += event.get("attempt") == 1
            rows.append({"run": run, "attempt": event.get("attempt", 0), "start": event["time"],
                         "nodes": tuple(event.get("nodes", ())), "resume_step": event.get("resume_step"),
                         "startup_s": None, "ended": LOST, "end": None})
        elif not rows:
            continue
        elif kind == "resume" and isinstance(event.get("step"), int) and "resume_source" not in rows[-1]:
            rows[-1].update(resume_step=event["step"], resume_source=str(event.get("source", "")))
        elif kind == "first_step" and rows[-1]["startup_s"] is None:
            rows[-1]["startup_s"] = event["time"] - rows[-1]["start"]
        elif kind == "fault_detected" and rows[-1]["end"] is None:
            rows[-1].update(ended=event.get("kind", "failed"), end=event["time"])
        elif kind == "verdict" and isinstance(event.get("verdict"), dict):
            rows[-1].update(_cause(event))
        elif kind == "exit":
            code = event.get("code")
            ended = "succeeded" if code == 0 else f"exit {code}: {event.get('why', '')}"
            if rows[-1]["end"] is None or code == 0:
                rows[-1].update(ended=ended, end=event["time"])
            else:
                rows[-1]["ended"] += f", then {ended}"
        elif kind == "stopped":  # the monitor's final word (slurm_ft.cluster.stop_note)
            rows[-1]["ended"] += f"; stopped by the monitor: {event.get('category')} ({event.get('reason')})"
    return [AttemptRow(**row) for row in rows]


def _cause(event: dict[str, Any]) -> dict[str, str]:
    verdict = event["verdict"]
    cause = event.get("root_cause") if isinstance(event.get("root_cause"), dict) else {}
    where = event.get("collectives")
    lines = tuple(str(line) for line in where if isinstance(line, str)) if isinstance(where, list) else ()
    return {"cause": str(verdict.get("category", "-")), "culprit": culprit_text(verdict),
            "error": str(cause.get("line") or ""), "collectives": lines}


def find_run_dir(path: Path) -> Path:
    """The run dir holding ``events.jsonl``: ``path`` itself or ``path/.slurm-ft``."""
    for candidate in (path, path / RUN_SUBDIR):
        if (candidate / EVENTS_FILE).is_file():
            return candidate
    raise SlurmFtError(f"report: no {EVENTS_FILE} in {path} or {path / RUN_SUBDIR} "
                       "(give the run dir or the checkpoint dir of a job run with `slurm-ft launch`)")


def format_report(rows: list[AttemptRow]) -> str:
    if not rows:
        return "no attempts recorded"
    t0 = rows[0].start
    lines = [f"{'RUN':>3} {'ATT':>3} {'START':>8} {'RESUME':>10} {'STARTUP':>8}  {'NODES':<16} {'CAUSE':<13} "
             f"{'CULPRIT':<16} ENDED"]
    for r in rows:
        resume = "-" if r.resume_step is None else f"{r.resume_step} {SOURCE_WORDS.get(r.resume_source, r.resume_source)}".strip()
        startup = "-" if r.startup_s is None else f"{r.startup_s:.1f}s"
        lines.append(f"{r.run:>3} {r.attempt:>3} {r.start - t0:>7.1f}s {resume:>10} {startup:>8}  "
                     f"{','.join(r.nodes):<16} {r.cause:<13} {r.culprit:<16} {r.ended}")
        if r.error:
            lines.append(f"{'':>8}root cause: {r.error}")
        if r.collectives:
            lines.append(f"{'':>8}collectives (flight recorder):")
            lines += [f"{'':>10}{line}" for line in r.collectives]
    last = rows[-1]
    wall = (last.end or last.start) - t0
    faults = sum(1 for r in rows if r.ended != "succeeded")
    lines.append(f"{len(rows)} attempt(s) in {rows[-1].run} run(s), {faults} fault(s), "
                 f"{'succeeded' if last.ended == 'succeeded' else 'did not succeed'}, {wall:.1f} s")
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction, name: str = "report") -> None:
    parser = subparsers.add_parser(name, help="a job's attempts, faults and recoveries (from its events.jsonl)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", type=Path, help="the job's run dir or checkpoint dir")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    rows = attempts(read_events(find_run_dir(args.dir)))
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
    else:
        print(format_report(rows))
    return 0
