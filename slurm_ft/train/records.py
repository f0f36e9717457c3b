"""Files that cross process boundaries: per-rank heartbeats and error files (torch-free).

Layout under the run directory (``$SLURM_FT_RUN_DIR``, default ``<ckpt_dir>/.slurm-ft``):

- ``heartbeat.rank<R>.json``: ``{"rank", "step", "time", "host", "pid"}``, rewritten atomically every step
- ``error.rank<R>.json``: ``{"rank", "host", "time", "exc_type", "message", "traceback", "step", "pid"}``,
  written once when a rank dies of an exception. The earliest ``time`` is the root cause.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HEARTBEAT_GLOB = "heartbeat.rank*.json"
ERROR_GLOB = "error.rank*.json"
_RANK_RE = re.compile(r"\.rank(\d+)\.json$")
RUN_SUBDIR = ".slurm-ft"


def node_name(environ: Mapping[str, str] | None = None) -> str:
    """This process's Slurm node name (SLURMD_NODENAME), else the short hostname: the ``host`` of records."""
    env = os.environ if environ is None else environ
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def run_dir_for(ckpt_dir: str | os.PathLike[str]) -> Path:
    """Default run directory for a checkpoint directory."""
    return Path(ckpt_dir) / RUN_SUBDIR


def heartbeat_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / f"heartbeat.rank{rank}.json"


def error_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / f"error.rank{rank}.json"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    rank: int
    step: int
    time: float
    host: str = ""
    pid: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ErrorRecord:
    rank: int
    time: float
    exc_type: str
    message: str
    traceback: str = ""
    host: str = ""
    step: int | None = None
    pid: int = 0


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` via a temp file and rename (readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        json.dump(payload, fh)
    os.replace(tmp, path)


def write_heartbeat(run_dir: str | os.PathLike[str], beat: Heartbeat) -> None:
    write_json_atomic(heartbeat_path(run_dir, beat.rank), dataclasses.asdict(beat))


def write_error(run_dir: str | os.PathLike[str], record: ErrorRecord) -> None:
    write_json_atomic(error_path(run_dir, record.rank), dataclasses.asdict(record))


def _read_all(run_dir: Path, pattern: str, cls: type) -> list:
    fields = {f.name for f in dataclasses.fields(cls)}
    found = []
    for path in sorted(Path(run_dir).glob(pattern)):
        if not _RANK_RE.search(path.name) or path.is_symlink():
            continue
        try:
            data = json.loads(path.read_text())
            found.append(cls(**{k: v for k, v in data.items() if k in fields}))
        except (OSError, ValueError, TypeError):
            continue  # a torn or foreign file is not evidence
    return found


def read_heartbeats(run_dir: str | os.PathLike[str]) -> list[Heartbeat]:
    return _read_all(Path(run_dir), HEARTBEAT_GLOB, Heartbeat)


def read_errors(run_dir: str | os.PathLike[str]) -> list[ErrorRecord]:
    """Error records sorted by time: the first is the root cause."""
    return sorted(_read_all(Path(run_dir), ERROR_GLOB, ErrorRecord), key=lambda r: r.time)
