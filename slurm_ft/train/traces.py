"""A rank's flight-recorder dump: its collectives as torch recorded them, in ``trace.rank<R>.json`` of the run dir.

torch's flight recorder (``TORCH_FR_BUFFER_SIZE`` entries, a ring buffer; ``slurm-ft launch`` turns it on) keeps
every collective a rank scheduled: process group, sequence number, op, sizes, dtypes, and whether it completed.
Two moments dump it (``torch._C._distributed_c10d._dump_fr_trace_json``), wrapped as ``slurm_ft.core.rundir``
describes (``{"rank", "host", "pid", "time", "reason", "fr"}``):

- ``TRACE_SIGNAL``, sent by the launcher's per-node helper (``slurm_ft.launch.hang``) before it kills a hung or
  failed attempt, answered from the signal server's thread (``slurm_ft.train.wakeup``: a rank blocked in a
  collective never runs a Python signal handler). A process that already has a wakeup fd (an asyncio loop in its
  main thread) keeps it: no dumps on signal then, and its heartbeat announces none;
- ``dump(..., reason="error", keep=True)``, called by ``record_errors`` when the rank dies of an exception (a
  collective that failed: its view of which one), unless a dump the launcher asked for is there already: that one
  shows the moment the launcher judged, before the kill made collectives fail.

Nothing here imports torch: a dump happens only in a process that imported it already, with the recorder on.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from slurm_ft.core import env as ft_env
from slurm_ft.core import rundir as records
from slurm_ft.train import wakeup

log = logging.getLogger(__name__)


def recorder_on(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process records its collectives: torch imported and a buffer size above 0 (torch's own
    precedence: ``TORCH_FR_BUFFER_SIZE``, else ``TORCH_NCCL_TRACE_BUFFER_SIZE``)."""
    env = os.environ if environ is None else environ
    text = env.get(ft_env.FR_BUFFER_SIZE) or env.get(ft_env.FR_BUFFER_SIZE_OLD) or "0"
    try:
        size = int(text)
    except ValueError:
        return False
    return size > 0 and "torch" in sys.modules


def _fr_json() -> bytes:
    import torch  # already imported: recorder_on() said so

    raw = torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)
    return raw if isinstance(raw, bytes) else str(raw).encode()


def envelope(raw: bytes, *, rank: int, host: str, pid: int, when: float, reason: str) -> bytes:
    """Pure: torch's JSON dump inside the trace file's record (no re-parse: the rank may be dying)."""
    head = json.dumps({"rank": rank, "host": host, "pid": pid, "time": when, "reason": reason})
    return head[:-1].encode() + b', "fr": ' + (raw.strip() or b"{}") + b"}"


def dump(run_dir: str | os.PathLike[str], rank: int, *, reason: str, keep: bool = False,
         fr_json: Callable[[], bytes] | None = None) -> Path | None:
    """Write this rank's trace file (atomically; ``keep``: not over one already there); None when the recorder is off
    or the dump failed (a warning). ``fr_json`` stands in for torch's dump (tests)."""
    if fr_json is None:
        if not recorder_on():
            return None
        fr_json = _fr_json
    path = records.trace_path(run_dir, rank)
    if keep and path.exists():
        return path
    try:
        data = envelope(fr_json(), rank=rank, host=records.node_name(), pid=os.getpid(), when=time.time(),
                        reason=reason)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except Exception as exc:  # noqa: BLE001 - torch's or the file system's: evidence lost, the rank goes on
        log.warning("slurm-ft: rank %d could not dump its flight recorder to %s: %s", rank, path, exc)
        return None
    return path


_installed: dict[tuple[str, int], int | None] = {}


def install(run_dir: str | os.PathLike[str], rank: int) -> int | None:
    """Dump on ``TRACE_SIGNAL`` from now on (once per process and rank); the signal, or None when the recorder is
    off or the signal cannot be handled here."""
    if not recorder_on():
        return None
    key = (str(Path(run_dir)), rank)
    if _installed.get(key) is None:
        _installed[key] = wakeup.serve(records.TRACE_SIGNAL, lambda: _answer(run_dir, rank))
    return _installed[key]


def _answer(run_dir: str | os.PathLike[str], rank: int) -> None:
    dump(run_dir, rank, reason="signal")
