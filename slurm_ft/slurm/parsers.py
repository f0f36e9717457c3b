"""Pure parsers for Slurm output (squeue/sinfo --json, scontrol show, hostlists). No subprocess, no clock."""

from __future__ import annotations

import json
import re
from typing import Any

from slurm_ft.slurm.types import JobInfo, JobState, NodeInfo


def parse_squeue_json(text: str) -> list[JobInfo]:
    data = _load(text, "squeue --json")
    return [_job(j) for j in data.get("jobs", [])]


def parse_sinfo_json(text: str) -> list[NodeInfo]:
    data = _load(text, "sinfo --json")
    return [_node(n) for n in data.get("nodes", [])]


def parse_version(text: str) -> str:
    match = re.search(r"(\d+\.\d+(?:\.\d+)?)", text)
    if not match:
        raise ValueError(f"no Slurm version in {text.strip()!r}")
    return match.group(1)


def _load(text: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{what}: output is not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{what}: expected a JSON object, got {type(data).__name__}")
    return data


def _job(j: dict[str, Any]) -> JobInfo:
    return JobInfo(job_id=int(j["job_id"]), name=str(j.get("name", "")), state=JobState.parse(str(j.get("job_state", ""))),
                   nodes=tuple(expand_hostlist(j.get("nodes") or "")))


def _node(n: dict[str, Any]) -> NodeInfo:
    state = {str(n.get("state", "")).upper()} | {str(f).upper() for f in n.get("state_flags", [])}
    return NodeInfo(name=str(n["name"]), state=frozenset(s for s in state if s), reason=str(n.get("reason", "")))


def expand_hostlist(text: str) -> list[str]:
    out = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", text):
        m = re.match(r"^(.*)\[([^\]]*)\](.*)$", part)
        if not m:
            out.append(part)
            continue
        for rng in m.group(2).split(","):
            lo, _, hi = rng.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                out.append(f"{m.group(1)}{str(i).zfill(len(lo))}{m.group(3)}")
    return out


def compress_hostlist(names: list[str]) -> str:
    return ",".join(names)
