"""The run directory: files that cross process boundaries (heartbeats, error files, end records, events).

Layout under the run directory (``$SLURM_FT_RUN_DIR``, default ``<ckpt_dir>/.slurm-ft``):

- ``heartbeat.rank<R>.json``: ``{"rank", "step", "time", "host", "pid", "alive", "done"}``, rewritten atomically
  every step; ``done`` once the rank finished its loop (its process may still take a while to exit)
- ``error.rank<R>.json``: ``{"rank", "host", "time", "exc_type", "message", "traceback", "step", "pid"}``,
  written once when a rank dies of an exception. The earliest ``time`` is the root cause.
- ``end.rank<R>.json``: how the rank's process ended (``RankEnd``: exit code or signal, time, node, pid, OOM
  kills in its cgroup, the tail of its stderr), written by the launcher's per-rank wrapper
  (``slurm_ft.launch.rank``), also for a death no Python code sees (SIGKILL, SIGSEGV).
- ``hang.rank<R>.json``: a hung attempt's rank as its node saw it before the kill (``RankState``: process state,
  liveness, stack file), written by ``slurm_ft.launch.hang``; ``stack.rank<R>.txt``: its Python stacks.
- ``gpu.rank<R>.json``: the GPU the launcher bound the rank to (``GpuBinding``: the ``CUDA_VISIBLE_DEVICES`` it
  got, the GPU's NVML index, UUID and PCI bus id), written by the per-rank wrapper at the rank's start; the
  topology check compares it with the rank's previous attempt's (``attempt-<N>/gpu.rank<R>.json``).
- ``links.start.<node>.json``, ``links.probe.<node>.json``: the node's link counters (``slurm_ft.health.links``) as
  its first rank started (the per-rank wrapper) and in the probe step after a failed or hung attempt; a counter that
  grew in between names the node whose link went down (``slurm_ft.launch.links``).
- ``reclaim.<node>.json``: after a failed attempt, whether that node's GPUs let go of the attempt's processes
  within the launcher's bound (``slurm_ft.launch.reclaim``), written by a helper on the node.
- ``trace.rank<R>.json``: the rank's collectives as torch's flight recorder saw them (``TORCH_FR_BUFFER_SIZE``):
  ``{"rank", "host", "pid", "time", "reason", "fr"}``, ``fr`` being ``_dump_fr_trace_json``'s dict, written by the
  rank itself (``slurm_ft.train.traces``) on ``TRACE_SIGNAL`` (a hung or failed attempt, before the kill) or when it
  dies of an exception; read by the classifier (``slurm_ft.classify.collectives``), never unpickled or executed.
  ``nccl_trace.rank<R>``: NCCL's own dump on a watchdog timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT``, a pickle): for
  the user's ``python -m torch.distributed.flight_recorder.fr_trace``, never read by slurm-ft.
- ``events.jsonl``: the launcher's events, one JSON object a line (``{"event", "time", ...}``: ``attempt_start``,
  ``fault_detected``, ``verdict``, ``exit`` ...), appended by the launcher and, for a stop the monitor decides after
  the job ended, by the monitor's child as the job's user (``slurm_ft.cluster.stop_note``); read by
  ``slurm-ft report``.

The rule: every file here is written by the job's own processes (or as the job's user), so root reads it only
through ``slurm_ft.health.jobfiles``; everything is created private to that user (``PRIVATE_DIR``, ``PRIVATE_FILE``:
``make_run_dir``, ``append_line``, ``write_json_atomic``; a run dir that exists keeps its mode: the user may share
it); a file is written whole (``write_json_atomic``) or appended a line at a time, and a reader skips what it
cannot parse (a torn last line, a record of the wrong shape).

The heartbeat's ``step`` and ``time`` are progress (written by the training loop); ``alive`` is liveness (rewritten
by a thread every ``HeartbeatWriter.liveness_s`` whatever the loop does): a rank whose ``alive`` stops is stuck
itself, one whose ``alive`` goes on without progress waits for someone else.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HEARTBEAT_GLOB = "heartbeat.rank*.json"
ERROR_GLOB = "error.rank*.json"
END_GLOB = "end.rank*.json"
HANG_GLOB = "hang.rank*.json"
STACK_GLOB = "stack.rank*.txt"
GPU_GLOB = "gpu.rank*.json"
RECLAIM_GLOB = "reclaim.*.json"
TRACE_GLOB = "trace.rank*.json"
NCCL_TRACE_PREFIX = "nccl_trace.rank"  # TORCH_FR_DUMP_TEMP_FILE: NCCL appends the rank
NCCL_TRACE_GLOB = NCCL_TRACE_PREFIX + "*"
MAX_TRACE_BYTES = 16 << 20  # a trace file larger than this is no evidence (2000 entries are ~1 MiB)
_RANK_RE = re.compile(r"\.rank(\d+)\.json$")
RUN_SUBDIR = ".slurm-ft"
EVENTS_FILE = "events.jsonl"
PRIVATE_DIR = 0o700  # the run dir and its folders: the job's user's alone (root reads it anyway)
PRIVATE_FILE = 0o600  # every file in it (events.jsonl names the store's port, end records hold stderr)
STACK_SIGNAL = signal.SIGRTMIN + 2  # a rank's faulthandler writes its stacks on it (sent only to ranks announcing it)
UNREAD_STATE = "?"  # a RankState whose node did not report (its helper did not run there, or timed out)
TRACE_SIGNAL = signal.SIGRTMIN + 3  # a rank dumps its flight recorder on it (sent only to ranks announcing it)


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


def end_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / f"end.rank{rank}.json"


def hang_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / f"hang.rank{rank}.json"


def stack_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / f"stack.rank{rank}.txt"


def gpu_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / f"gpu.rank{rank}.json"


def trace_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / f"trace.rank{rank}.json"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    rank: int
    step: int
    time: float  # when ``step`` was reached (progress)
    host: str = ""
    pid: int = 0
    alive: float | None = None  # the liveness thread's last beat; None: the writer has no liveness thread
    stack_signal: int | None = None  # the signal that makes the rank write its Python stacks (faulthandler)
    done: bool = False  # the rank finished its loop (HeartbeatWriter.close, or its process exiting): no more steps
    trace_signal: int | None = None  # the signal that makes the rank dump its flight recorder (slurm_ft.train.traces)


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


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RankEnd:
    """How one rank's process ended, recorded on its node the moment it did: ``exit_code`` (normal exit) or
    ``signal`` (killed), ``oom_kills`` (the OOM killer's kills in the rank's cgroup while it ran; None: not
    readable), ``tail`` (the end of its stderr), ``started`` how its process started: ``cold`` (a new interpreter)
    or ``standby`` (a warm standby's spare, ``slurm_ft.launch.standby``)."""

    rank: int
    time: float
    host: str = ""
    pid: int = 0
    exit_code: int | None = None
    signal: int | None = None
    oom_kills: int | None = None
    tail: str = ""
    started: str = "cold"

    @property
    def failed(self) -> bool:
        return self.signal is not None or (self.exit_code is not None and self.exit_code != 0)

    def how(self) -> str:
        """``killed by signal 9 (SIGKILL)`` / ``exited with code 1``."""
        if self.signal is not None:
            return f"killed by signal {self.signal} ({signal_name(self.signal)})"
        return f"exited with code {self.exit_code}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RankState:
    """One rank of a hung attempt as its node saw it before the kill: ``state`` is the process state letter from
    ``/proc/<pid>/stat`` (``R`` running, ``S`` sleeping, ``D`` uninterruptible, ``T`` stopped, ``Z`` zombie, ``""``
    gone or not readable), ``live`` whether its liveness beat was fresh, ``step`` its last progress, ``stack``
    the file holding its Python stacks (faulthandler or py-spy; "" none), ``in_collective`` whether its main
    thread waits in a torch.distributed call (None: no stack to tell)."""

    rank: int
    host: str = ""
    pid: int = 0
    state: str = ""
    live: bool | None = None
    step: int | None = None
    wchan: str = ""
    stack: str = ""
    in_collective: bool | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GpuBinding:
    """The GPU one rank of one attempt was bound to: ``devices`` (its ``CUDA_VISIBLE_DEVICES``), and what NVML on
    its node says that device is (``index``: NVML's, -1 unknown; ``uuid``; ``pci_bus``)."""

    rank: int
    host: str = ""
    attempt: int = 0
    devices: str = ""
    index: int = -1
    uuid: str = ""
    pci_bus: str = ""

    def same_gpu(self, other: "GpuBinding") -> bool:
        """Whether both name the same physical GPU (UUID and PCI bus id where both know them)."""
        return (self.uuid, self.pci_bus) == (other.uuid, other.pci_bus)

    def describe(self) -> str:
        return f"{self.host} GPU {self.index if self.index >= 0 else '?'} ({self.uuid or '?'}, {self.pci_bus or '?'})"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def make_run_dir(path: str | os.PathLike[str]) -> Path:
    """Create the run dir (or a folder in it) private to the job's user (``PRIVATE_DIR``) unless it exists; the
    folders above it are made as the user's umask says (the checkpoint dir is the user's to share)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    return path


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open`` for a run-dir file: created ``PRIVATE_FILE``, never through a symlink."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE)


def append_line(path: str | os.PathLike[str], line: str) -> None:
    """Append one line (``line`` without its newline) to a run-dir file, creating it private."""
    fd = open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(fd, "a") as fh:
        fh.write(line + "\n")


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` via a temp file and rename (readers never see half a file); private."""
    make_run_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # one per writing thread
    with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as fh:
        json.dump(payload, fh)
    os.replace(tmp, path)


def write_heartbeat(run_dir: str | os.PathLike[str], beat: Heartbeat) -> None:
    write_json_atomic(heartbeat_path(run_dir, beat.rank), dataclasses.asdict(beat))


def write_error(run_dir: str | os.PathLike[str], record: ErrorRecord) -> None:
    write_json_atomic(error_path(run_dir, record.rank), dataclasses.asdict(record))


def write_end(run_dir: str | os.PathLike[str], record: RankEnd) -> None:
    write_json_atomic(end_path(run_dir, record.rank), dataclasses.asdict(record))


def write_rank_state(run_dir: str | os.PathLike[str], record: RankState) -> None:
    write_json_atomic(hang_path(run_dir, record.rank), dataclasses.asdict(record))


def write_gpu_binding(run_dir: str | os.PathLike[str], record: GpuBinding) -> None:
    write_json_atomic(gpu_path(run_dir, record.rank), dataclasses.asdict(record))


def append_event(run_dir: str | os.PathLike[str], record: Mapping[str, Any]) -> None:
    """Append one event (``{"event", "time", ...}``) to the run's ``events.jsonl``, creating the dir and file private
    (the launcher's and the checkpoint manager's events share it); OSError when it cannot be written."""
    append_line(make_run_dir(run_dir) / EVENTS_FILE, json.dumps(dict(record), default=str))


def read_events(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The launcher's events in file order (a torn last line is not an event)."""
    events = []
    for line in (Path(run_dir) / EVENTS_FILE).read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


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


def read_ends(run_dir: str | os.PathLike[str]) -> list[RankEnd]:
    """How each rank of the last attempt ended, earliest first (a record of the wrong shape is no evidence)."""
    return sorted((r for r in _read_all(Path(run_dir), END_GLOB, RankEnd) if _well_typed(r)), key=lambda r: r.time)


def read_gpu_bindings(run_dir: str | os.PathLike[str]) -> list[GpuBinding]:
    """The GPU each rank of the attempt whose files are in ``run_dir`` was bound to, by rank."""
    return sorted((r for r in _read_all(Path(run_dir), GPU_GLOB, GpuBinding) if _well_typed(r)),
                  key=lambda r: r.rank)


def read_rank_states(run_dir: str | os.PathLike[str]) -> list[RankState]:
    return sorted((r for r in _read_all(Path(run_dir), HANG_GLOB, RankState) if _well_typed(r)),
                  key=lambda r: r.rank)


def read_trace_dicts(run_dir: str | os.PathLike[str], max_bytes: int = MAX_TRACE_BYTES) -> list[dict[str, Any]]:
    """The trace files' JSON objects, by file name (regular files only, each at most ``max_bytes``, its ``rank`` the
    one its name says; a torn, foreign or oversized file is skipped). As the job's user: root reads a job's files
    through ``slurm_ft.health.jobfiles`` only, and slurm-ft's root code reads no trace."""
    found = []
    for path in sorted(Path(run_dir).glob(TRACE_GLOB)):
        named = _RANK_RE.search(path.name)
        if not named or path.is_symlink() or not path.is_file():
            continue
        try:
            if path.stat().st_size > max_bytes:
                continue
            data = json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(data, dict) and data.get("rank") == int(named.group(1)):  # its name and its word agree
            found.append(data)
    return found


_TYPES = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}


def _well_typed(record: Any) -> bool:
    """Every field of ``record`` holds its annotated type (``int | None`` allows None; a bool is no int)."""
    for field in dataclasses.fields(record):
        value, hint = getattr(record, field.name), str(field.type)
        if value is None and "None" in hint:
            continue
        base = hint.split("|")[0].strip()
        wanted = {"int": int, "float": float, "str": str, "bool": bool}.get(base)
        if wanted is None:
            continue
        if (isinstance(value, bool) and wanted is not bool) or not isinstance(value, _TYPES[wanted]):
            return False
    return True
