"""Adapter for Slurm's data_parser v0.0.42 JSON (``squeue/sinfo --json=v0.0.42``; Slurm 24.11 through 26.05).

Pure functions from text to records. The shape differs from 22.05's openapi v0.0.38 (``parsers``):
- ``sinfo`` lists ``sinfo`` entries (one per node with ``-N``) holding ``nodes.nodes``, ``node.state`` and a
  ``reason`` object, not a ``nodes`` list;
- numbers are ``{"set", "infinite", "number"}`` objects, states are lists, ``exit_code`` is
  ``{"status", "return_code", "signal": {"id", "name"}}``.
A document without the fields slurm-ft reads is a ``SlurmFormatError`` naming the Slurm version and the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurm_ft.core.errors import SlurmFormatError
from slurm_ft.slurm import parsers
from slurm_ft.slurm.types import JobInfo, NodeInfo

VERSION = "v0.0.42"
SQUEUE_ARGS = ("squeue", "--all", "--states=all", f"--json={VERSION}")  # --states=all: finished jobs too
SINFO_ARGS = ("sinfo", "--all", "--Node", f"--json={VERSION}")  # --Node: one entry per node (and partition)


OUT_OF_SERVICE = frozenset({"DOWN", "DRAIN", "FAIL", "INVALID_REG"})


def parse_squeue(text: str, slurm_version: str) -> list[JobInfo]:
    """Every job in one ``squeue --json=v0.0.42`` document."""
    what = _what("squeue", slurm_version)
    data = parsers.load_json_document(text, what, "jobs")
    return [_job(record, what) for record in parsers.record_list(data, "jobs", what)]


def parse_sinfo(text: str, slurm_version: str) -> list[NodeInfo]:
    """Every node in one ``sinfo --Node --json=v0.0.42`` document, once each."""
    what = _what("sinfo", slurm_version)
    data = parsers.load_json_document(text, what, "sinfo")
    nodes: dict[str, NodeInfo] = {}
    for entry in parsers.record_list(data, "sinfo", what):
        for node in _nodes_of(entry, what):
            nodes.setdefault(node.name, node)
    return list(nodes.values())


def _job(record: Mapping[str, Any], what: str) -> JobInfo:
    for field in ("job_id", "job_state"):
        if field not in record:
            raise SlurmFormatError(f"{what}: job record without {field!r} (fields: {sorted(record)[:8]})")
    return parsers.parse_job_record(record)


def _nodes_of(entry: Mapping[str, Any], what: str) -> list[NodeInfo]:
    names = _field(_field(entry, "nodes", what), "nodes", what, "nodes.nodes")
    state = _field(_field(entry, "node", what), "state", what, "node.state")
    if not isinstance(names, list) or not isinstance(state, list):
        raise SlurmFormatError(f"{what}: nodes.nodes and node.state must be lists")
    reason = entry.get("reason") or {}
    text = str(reason.get("description") or "") if isinstance(reason, Mapping) else str(reason)
    states = frozenset(str(s).strip().upper() for s in state if s)
    if not states & OUT_OF_SERVICE:
        text = ""  # 25.11 keeps a resumed node's last reason; like `sinfo -R`, only an out-of-service node has one
    return [NodeInfo(name=str(name), state=states, reason=text) for name in names]


def _field(record: Any, key: str, what: str, path: str | None = None) -> Any:
    if not isinstance(record, Mapping) or key not in record:
        raise SlurmFormatError(f"{what}: entry without {path or key!r}")
    return record[key]


def _what(tool: str, slurm_version: str) -> str:
    return f"Slurm {slurm_version} {tool} --json={VERSION}"
