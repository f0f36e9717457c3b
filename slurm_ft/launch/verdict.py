"""The launcher's judgement of one failed or hung attempt: the evidence it has, and how it tells the user.

Evidence: the ranks' error files and end records (``slurm_ft.launch.rank``), a hung attempt's rank states
(``slurm_ft.launch.hang``), the ranks' flight-recorder dumps (``slurm_ft.train.traces``: only the attempt's ranks,
a node name only when it is one of the attempt's nodes), the nodes found unhealthy after it, the GPUs that kept
its processes past the launcher's wait (``slurm_ft.launch.reclaim``), and the links of its nodes that went down
while it ran (their counters at its start and in the probe after it: ``slurm_ft.launch.links``). ``root_cause``
picks the culprit rank, its node and the first line of its real error; ``paragraph`` is the few lines the launcher
prints at the end of an attempt, so the real error is not lost under the secondary tracebacks of the ranks that
failed because of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from slurm_ft.classify.collectives import RankTrace, parse_trace
from slurm_ft.classify.records import Evidence, NodeEvent
from slurm_ft.core.rundir import RankState, read_ends, read_errors, read_trace_dicts
from slurm_ft.core.taxonomy import Verdict
from slurm_ft.health.records import GpuHold
from slurm_ft.launch import links

PROBE_REASON = "slurm-ft launch: failed the probe step or marked unhealthy by Slurm after the attempt"


def attempt_evidence(run_dir: Path, *, hang: Sequence[RankState] = (), sick: Iterable[str] = (),
                     held: Sequence[GpuHold] = (), nodes: Iterable[str] | None = None,
                     ranks: Iterable[int] | None = None) -> Evidence:
    """What the launcher knows of the attempt whose files are in ``run_dir`` (the allocation still lives); ``nodes``
    and ``ranks`` (the attempt's) bound what the dumps may name."""
    events = tuple(NodeEvent(name=n, state=frozenset({"NOT_RESPONDING"}), reason=PROBE_REASON) for n in sorted(sick))
    return Evidence(errors=tuple(read_errors(run_dir)), ends=tuple(read_ends(run_dir)), hang=tuple(hang),
                    nodes=events, traces=attempt_traces(run_dir, nodes=nodes, ranks=ranks), in_allocation=True,
                    held_gpus=tuple(held), links=links.losses(run_dir, nodes) if nodes is not None else ())


def attempt_traces(run_dir: Path, *, nodes: Iterable[str] | None = None,
                   ranks: Iterable[int] | None = None) -> tuple[RankTrace, ...]:
    """The flight-recorder dumps in ``run_dir``: one per rank (of ``ranks``, when given), its host dropped when it
    is not one of ``nodes`` (the dump is the job's word; a verdict names only the job's own nodes)."""
    allowed_ranks = None if ranks is None else set(ranks)
    allowed_nodes = None if nodes is None else set(nodes)
    found: dict[int, RankTrace] = {}
    for data in read_trace_dicts(run_dir):
        trace = parse_trace(data)
        if trace is None or (allowed_ranks is not None and trace.rank not in allowed_ranks):
            continue
        if allowed_nodes is not None and trace.host not in allowed_nodes:
            trace = dataclasses.replace(trace, host="")
        found.setdefault(trace.rank, trace)
    return tuple(found[rank] for rank in sorted(found))


def root_cause(verdict: Verdict, evidence: Evidence) -> dict[str, Any]:
    """``{rank, node, line}``: the culprit rank (None if none), its node, the first line of its real error."""
    rank = verdict.culprit.ranks[0] if verdict.culprit.ranks else None
    node = _node_of(rank, evidence) or (verdict.culprit.nodes[0] if verdict.culprit.nodes else None)
    return {"rank": rank, "node": node, "line": _first_line(rank, verdict, evidence)}


def _node_of(rank: int | None, evidence: Evidence) -> str | None:
    if rank is None:
        return None
    hosts = [r.host for r in (*evidence.errors, *evidence.ends, *evidence.hang) if r.rank == rank and r.host]
    return hosts[0] if hosts else None


def _first_line(rank: int | None, verdict: Verdict, evidence: Evidence) -> str:
    error = next((e for e in evidence.errors if e.rank == rank), None)
    if error is not None:
        return _clip(f"{error.exc_type}: {error.message}".splitlines()[0] if error.exc_type else error.message)
    end = next((e for e in evidence.ends if e.rank == rank and e.failed), None)
    if end is not None:
        last = next((line.strip() for line in reversed(end.tail.splitlines()) if line.strip()), "")
        return _clip(end.how() + (f"; its last stderr line: {last}" if last else ""))
    line = verdict.evidence[0] if verdict.evidence else "no evidence"
    prefix = f"rank {rank} ("
    if rank is not None and line.startswith(prefix) and "): " in line:  # "rank 1 (n2): stopped": said already
        line = line.split("): ", 1)[1]
    return _clip(line)


def _clip(text: str, limit: int = 240) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."


def paragraph(attempt: int, verdict: Verdict, cause: dict[str, Any]) -> str:
    """The root cause lines for the job's output."""
    who = "no single rank" if cause["rank"] is None else f"rank {cause['rank']}"
    where = f" on {cause['node']}" if cause["node"] else (" (node unknown)" if cause["rank"] is not None else "")
    secondary = [e for e in verdict.evidence if e.startswith("secondary, not the cause")]
    lines = [f"slurm-ft: root cause of attempt {attempt}: {who}{where}: {cause['line']}",
             f"slurm-ft:   verdict {verdict.category.value}, action {verdict.action.value}, "
             f"confidence {verdict.confidence:.2f}"]
    if secondary:
        lines.append(f"slurm-ft:   {secondary[0]} (ranks that failed or waited because of it)")
    return "\n".join(lines)
