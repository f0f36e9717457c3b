"""The launcher's progress as one plain line per event, for the job's output file (the JSON record, with epoch
times and every field, stays in ``<run_dir>/events.jsonl``; ``slurm-ft report`` tabulates it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def _resume(e: Mapping[str, Any]) -> str:
    return "from scratch" if e.get("resume_step") is None else f"resuming from step {e['resume_step']}"


def _fault(e: Mapping[str, Any]) -> str:
    if e.get("kind") == "hung":
        return f"attempt {e.get('attempt')}: hung: rank(s) {_ranks(e.get('hung_ranks'))} made no progress"
    return f"attempt {e.get('attempt')}: a rank failed (exit {e.get('exit_code')})"


def _ranks(ranks: Any) -> str:
    return ", ".join(str(r) for r in ranks or ()) or "?"


def _verdict(e: Mapping[str, Any]) -> str:
    v = e.get("verdict") or {}
    how = "recoverable" if v.get("recoverable") else "not recoverable"
    evidence = "; ".join(v.get("evidence", [])[:2])
    return f"attempt {e.get('attempt')}: verdict {v.get('category')} ({how}){': ' + evidence if evidence else ''}"


def _reclaim(e: Mapping[str, Any]) -> str:
    held = [f"{h.get('node')} GPU {h.get('gpu_index')} (pids {_ranks(h.get('pids'))}, {h.get('used_mb')} MiB)"
            for h in e.get("held") or ()]
    waited = max((e.get("waited_s") or {}).values(), default=0.0)
    line = f"attempt {e.get('attempt')}: GPUs of {','.join(e.get('nodes', [])) or '-'} waited on for {waited:g} s: "
    line += ("still held: " + "; ".join(held)) if held else "released"
    if e.get("unread"):
        line += f"; not reported by {','.join(e['unread'])}" + (f" ({e['why']})" if e.get("why") else "")
    return line


def _exit(e: Mapping[str, Any]) -> str:
    cause = f", cause {e['cause']}" if e.get("cause") else ""
    return f"exit {e.get('code')}: {e.get('why')}{cause} (after {e.get('attempts')} attempt(s))"


LINES: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "attempt_start": lambda e: f"attempt {e.get('attempt')} on {','.join(e.get('nodes', []))}, {_resume(e)}",
    "first_step": lambda e: f"attempt {e.get('attempt')}: training (step {e.get('step')})",
    "fault_detected": _fault,
    "verdict": _verdict,
    "restart_in_place": lambda e: f"restarting in place ({e.get('retries_left')} restart(s) left)",
    "gpu_reclaim": _reclaim,
    "spare_swap": lambda e: f"swapping a spare in for {','.join(e.get('out', []))}",
    "node_probe": lambda e: ("probe: every node answered" if not e.get("failed") else
                             "probe: " + "; ".join(f"{n}: {why}" for n, why in e["failed"].items())),
    "repeated_root_cause": lambda e: (f"rank {e.get('rank')} failed with {e.get('exc_type')} at step "
                                      f"{e.get('step')} again: not a fault, stopping"),
    "signal_forwarded": lambda e: (f"{e.get('signal')}: passed to every rank; waiting up to {e.get('wait_s')} s "
                                   "for their emergency save"),
    "preempted": lambda e: f"{e.get('signal')}: the newest checkpoint is step {e.get('resume_step')}",
    "exit": _exit,
}


def describe(record: Mapping[str, Any]) -> str:
    """``slurm-ft launch: <what happened>``; an event without its own wording lists its fields."""
    line = LINES.get(str(record.get("event")))
    if line is not None:
        return f"slurm-ft launch: {line(record)}"
    fields = " ".join(f"{k}={v}" for k, v in record.items() if k not in ("event", "time"))
    return f"slurm-ft launch: {record.get('event')} {fields}".rstrip()
