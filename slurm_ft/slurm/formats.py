"""Which JSON generation to ask the running Slurm for, and the adapter that reads it.

- 22.05 to 23.02: plain ``--json`` (openapi v0.0.38/39), read by ``parsers``;
- 23.11 to 24.05: plain ``--json`` (data_parser v0.0.40/41, the v0.0.42 shape in all fields slurm-ft reads);
- 24.11 and later: ``--json=v0.0.42`` pinned (every release from 24.11 to 26.05 ships it), read by
  ``json_v0042``. Where a later release has dropped it, the newest that ``squeue --json=list`` names is used.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from slurm_ft.slurm import json_v0042, parsers
from slurm_ft.slurm.types import JobInfo, NodeInfo

PINNED_SINCE = (24, 11)
DATA_PARSER_SINCE = (23, 11)


@dataclasses.dataclass(frozen=True, slots=True)
class JsonFormat:
    """How to ask for and read jobs and nodes in one JSON generation."""

    name: str
    squeue_args: tuple[str, ...]
    sinfo_args: tuple[str, ...]
    parse_jobs: Callable[[str, str], list[JobInfo]]
    parse_nodes: Callable[[str, str], list[NodeInfo]]


OPENAPI_V0038 = JsonFormat("v0.0.38", ("squeue", "--all", "--json"), ("sinfo", "--all", "--json"),
                           parsers.parse_squeue_json, parsers.parse_sinfo_json)
V0042 = JsonFormat(json_v0042.VERSION, json_v0042.SQUEUE_ARGS, json_v0042.SINFO_ARGS,
                   json_v0042.parse_squeue, json_v0042.parse_sinfo)


def release(version: str) -> tuple[int, int]:
    """``(25, 11)`` from ``"25.11.7"``."""
    match = re.match(r"^(\d+)\.(\d+)", version.strip())
    if not match:
        raise ValueError(f"not a Slurm version: {version!r}")
    return int(match.group(1)), int(match.group(2))


def same_release(a: str, b: str) -> bool:
    """Whether two versions share major.minor (``25.11.7`` and ``25.11.2`` do; ``22.05.8`` and ``25.11.7`` and an
    unparsable version do not)."""
    try:
        return release(a) == release(b)
    except ValueError:
        return False


def for_version(version: str) -> JsonFormat:
    """The format to use with Slurm ``version``."""
    rel = release(version)
    if rel >= PINNED_SINCE:
        return V0042
    if rel >= DATA_PARSER_SINCE:
        return _asking(V0042, "default", "--json")
    return OPENAPI_V0038


def newest_listed(listing: str) -> str | None:
    """The newest ``data_parser/vX.Y.Z`` in ``squeue --json=list`` output (``v0.0.44``), None when none."""
    found = re.findall(r"data_parser/(v\d+\.\d+\.\d+)", listing)
    return max(found, key=lambda v: tuple(int(p) for p in v[1:].split(".")), default=None)


def with_version(fmt: JsonFormat, data_parser: str) -> JsonFormat:
    """``fmt``'s adapter asking for ``data_parser`` instead of its pinned version (a fallback)."""
    return _asking(fmt, data_parser, f"--json={data_parser}")


def _asking(fmt: JsonFormat, name: str, flag: str) -> JsonFormat:
    """``fmt`` with its ``--json...`` argument replaced by ``flag``."""
    def swap(args: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(flag if a.startswith("--json") else a for a in args)
    return dataclasses.replace(fmt, name=name, squeue_args=swap(fmt.squeue_args), sinfo_args=swap(fmt.sinfo_args))
