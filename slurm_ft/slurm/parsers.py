"""Pure parsers for Slurm output: ``squeue --json``, ``sinfo --json``, ``scontrol show`` text, hostlists.

No subprocess and no clock here; every function takes text and returns plain records. ``parse_squeue_json`` and
``parse_sinfo_json`` are the adapter for 22.05's JSON (openapi v0.0.38); ``json_v0042`` is the one for 24.11 and
later, and shares the record readers below (they accept both generations' value shapes: state lists,
``{"set", "number"}`` numbers, structured exit codes). A document without the list slurm-ft reads is a
``SlurmFormatError``, never an empty result.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from slurm_ft.core.errors import SlurmFormatError
from slurm_ft.slurm.types import JobInfo, JobState, NodeInfo

# --- squeue / sinfo --json --------------------------------------------------------------------------------------


def parse_squeue_json(text: str, slurm_version: str = "22.05") -> list[JobInfo]:
    """Every job in one ``squeue --json`` document (openapi v0.0.38)."""
    what = f"Slurm {slurm_version} squeue --json"
    data = load_json_document(text, what, "jobs")
    return [parse_job_record(record) for record in record_list(data, "jobs", what)]


def parse_sinfo_json(text: str, slurm_version: str = "22.05") -> list[NodeInfo]:
    """Every node in one ``sinfo --json`` document (openapi v0.0.38; a node in several partitions appears once)."""
    what = f"Slurm {slurm_version} sinfo --json"
    data = load_json_document(text, what, "nodes")
    nodes: dict[str, NodeInfo] = {}
    for record in record_list(data, "nodes", what):
        node = parse_node_record(record)
        nodes.setdefault(node.name, node)
    return list(nodes.values())


def parse_job_record(job: Mapping[str, Any]) -> JobInfo:
    """One job object of ``squeue --json``."""
    if "job_id" not in job:
        raise SlurmFormatError(f"squeue --json: job record without job_id: {sorted(job)[:8]}")
    state = JobState.parse(_first_state(job.get("job_state")))
    exit_code, exit_signal = (decode_exit(job.get("exit_code")) if _has_ended(state) else (None, None))
    user_id = _number(job.get("user_id"))
    job_id = int(_number(job["job_id"]) or 0)
    work_dir = str(job.get("current_working_directory") or "")
    std_out = _output_path(job, "standard_output", job_id, work_dir)
    return JobInfo(
        job_id=job_id,
        name=str(job.get("name") or ""),
        user_id=user_id,
        state=state,
        reason=_reason(job.get("state_reason")),
        nodes=tuple(expand_hostlist(str(job.get("nodes") or ""))),
        batch_host=str(job.get("batch_host") or ""),
        exit_code=exit_code,
        exit_signal=exit_signal,
        restart_count=int(_number(job.get("restart_cnt")) or 0),
        comment=str(job.get("comment") or ""),
        excluded_nodes=tuple(expand_hostlist(str(job.get("excluded_nodes") or ""))),
        requeue=bool(job.get("requeue", False)),
        work_dir=work_dir,
        std_err=_output_path(job, "standard_error", job_id, work_dir) or std_out,
        std_out=std_out,
    )


def parse_node_record(node: Mapping[str, Any]) -> NodeInfo:
    """One node object of ``sinfo --json``: base state plus flags, upper case (``IDLE``, ``DRAIN`` ...)."""
    if "name" not in node:
        raise SlurmFormatError(f"sinfo --json: node record without name: {sorted(node)[:8]}")
    raw = node.get("state")
    states = list(raw) if isinstance(raw, list) else [raw]
    states += list(node.get("state_flags") or [])
    return NodeInfo(
        name=str(node["name"]),
        state=frozenset(str(s).strip().upper() for s in states if s),
        reason=str(node.get("reason") or ""),
    )


def decode_exit(value: Any) -> tuple[int | None, int | None]:
    """``(exit code, signal)`` from squeue's exit_code.

    22.05 gives the raw wait status (``768`` = exit 3, ``9`` = killed by SIGKILL, ``35584`` = exit 139). Like
    ``scontrol``'s ``ExitCode=code:signal`` a signalled job reads ``(0, signal)``; the signal is None otherwise.
    A shell reporting its child's death as ``128+N`` stays an exit code: judging that is the classifier's job.
    Later Slurm versions give ``{"return_code": ..., "signal": {"id": ...}}``; that is read too.
    """
    if value is None:
        return None, None
    if isinstance(value, Mapping):
        code = _number(value.get("return_code"))
        signal = value.get("signal") or {}
        sig = _number(signal.get("id")) if isinstance(signal, Mapping) else _number(signal)
        return (code if code is not None else 0), (sig or None)
    status = _number(value)
    if status is None:
        return None, None
    if status & 0x7F:  # WIFSIGNALED (0x7f would be "stopped"; a finished job is never stopped)
        return 0, status & 0x7F
    return (status >> 8) & 0xFF, None


def parse_version(text: str) -> str:
    """``"22.05.8"`` from ``scontrol --version`` (``slurm 22.05.8``) or similar."""
    match = re.search(r"(\d+\.\d+(?:\.\d+)?)", text)
    if not match:
        raise ValueError(f"no Slurm version in {text.strip()!r}")
    return match.group(1)


def _output_path(job: Mapping[str, Any], key: str, job_id: int, work_dir: str) -> str:
    """The batch script's stdout/stderr path: Slurm's default ``slurm-%j.out`` when unset, ``%j %x %u %%``
    expanded, relative to the work dir. Other patterns (``%N``, ``%a`` ...) are left as they are."""
    pattern = str(job.get(key) or "")
    if not pattern:
        if key == "standard_error" or not job.get("batch_flag", True) or not work_dir:
            return ""
        pattern = "slurm-%j.out"
    replacements = {"j": str(job_id), "x": str(job.get("name") or ""), "u": str(job.get("user_name") or ""),
                    "%": "%"}
    text = re.sub(r"%(.)", lambda m: replacements.get(m.group(1), m.group(0)), pattern)
    if work_dir and not text.startswith("/"):
        text = f"{work_dir.rstrip('/')}/{text}"
    return text


# Slurm's job_state_string (src/common/slurm_protocol_defs.c): the first flag set names the state.
STATE_FLAG_ORDER = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "EXPEDITING", "RESIZING", "REQUEUED", "REQUEUE_FED",
                    "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING")


def _has_ended(state: JobState) -> bool:
    return state.finished or state is JobState.COMPLETING


def _first_state(value: Any) -> str:
    """One word for a job's state: v0.0.38's string as is; v0.0.42's list (base state and flags) read the way
    Slurm's own ``job_state_string`` reads it, a flag before the base state. A job that ended but is still
    ``COMPLETING`` (its epilog running) is thus COMPLETING on every backend (pyslurm gives that word), and is
    judged only once the epilog has written its evidence."""
    if isinstance(value, list):
        words = [str(v).strip().upper() for v in value if v]
        return next((flag for flag in STATE_FLAG_ORDER if flag in words), words[0] if words else "")
    return str(value or "")


def _number(value: Any) -> int | None:
    """An int from ``5``, ``"5"`` or ``{"set": true, "infinite": false, "number": 5}`` (None when unset)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        return _number(value.get("number"))
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def load_json_document(text: str, what: str, key: str) -> dict[str, Any]:
    """The JSON object of one Slurm ``--json`` document, which must hold the list ``key``."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SlurmFormatError(f"{what}: output is not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise SlurmFormatError(f"{what}: expected a JSON object, got {type(data).__name__}")
    errors = [e for e in data.get("errors") or [] if e]
    if errors and not data.get(key):
        raise SlurmFormatError(f"{what}: Slurm reported errors: {errors}")
    if key not in data:
        raise SlurmFormatError(f"{what}: no {key!r} list (top-level fields: {sorted(data)[:8]}); "
                               "not the JSON generation this adapter reads")
    return data


def record_list(data: Mapping[str, Any], key: str, what: str) -> list[Mapping[str, Any]]:
    records = data.get(key, [])
    if not isinstance(records, list) or not all(isinstance(r, Mapping) for r in records):
        raise SlurmFormatError(f"{what}: {key!r} must be a list of objects")
    return records


# --- scontrol show ----------------------------------------------------------------------------------------------

# Fields scontrol prints alone on their line whose values may contain spaces (and '=').
_REST_OF_LINE = frozenset({"Reason", "Comment", "AdminComment", "SystemComment", "OS", "Command", "WorkDir",
                           "StdErr", "StdIn", "StdOut", "Power", "Extra"})
_KEY = re.compile(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_scontrol_show(text: str) -> dict[str, str]:
    """One record of ``scontrol show job|node`` (multi-line or ``-o``) as ``{key: value}``.

    Values with spaces (``Reason=slurm-ft: xid 79 [root@2024-...]``, ``Comment=...``, ``OS=Linux ...``) are kept
    whole: on their own line they run to the end of it; inline, a value ends where the next ``Key=`` starts.
    """
    record: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        head, sep, rest = stripped.partition("=")
        if sep and head in _REST_OF_LINE:
            record[head] = rest.strip()
            continue
        record.update(_split_inline(stripped))
    return record


def parse_scontrol_show_all(text: str) -> list[dict[str, str]]:
    """Every record of ``scontrol show job|node`` output (records are separated by blank lines)."""
    blocks = re.split(r"\n\s*\n", text.strip())
    if len(blocks) == 1 and "\n" in text.strip() and _looks_one_line(text):
        blocks = text.strip().splitlines()
    return [parse_scontrol_show(block) for block in blocks if block.strip()]


def split_node_reason(reason: str) -> tuple[str, str, str]:
    """``("slurm-ft: xid 79", "root", "2024-05-01T10:00:00")`` from scontrol's ``Reason=... [root@time]``."""
    match = re.match(r"^(.*?)\s*\[([^@\]]+)@([^\]]+)\]$", reason.strip())
    if not match:
        return reason.strip(), "", ""
    return match.group(1), match.group(2), match.group(3)


def _split_inline(line: str) -> dict[str, str]:
    matches = list(_KEY.finditer(line))
    out: dict[str, str] = {}
    for current, following in itertools.zip_longest(matches, matches[1:]):
        end = following.start() if following is not None else len(line)
        out[current.group(1)] = line[current.end():end].strip()
    return out


def _looks_one_line(text: str) -> bool:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return all(re.match(r"^(JobId|NodeName|PartitionName)=", line) for line in lines)


# --- hostlists --------------------------------------------------------------------------------------------------

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """``"n[1-3,5],gpu07"`` -> ``["n1", "n2", "n3", "n5", "gpu07"]`` (zero padding kept; several bracket groups
    in one name multiply out). ``""``/``"(null)"``/``"None assigned"`` -> ``[]``."""
    text = text.strip()
    if text in ("", "(null)", "None assigned", "N/A"):
        return []
    names: list[str] = []
    for part in _split_top_level(text):
        names.extend(_expand_one(part))
    return names


def compress_hostlist(names: Iterable[str]) -> str:
    """``["n1", "n2", "n3", "n5"]`` -> ``"n[1-3,5]"``; names are grouped by prefix and padding, duplicates dropped."""
    groups: dict[tuple[str, int], set[int]] = {}
    order: list[tuple[str, int] | str] = []
    for name in names:
        match = re.match(r"^(.*?)(\d+)$", name)
        if not match:
            if name not in order:
                order.append(name)
            continue
        prefix, digits = match.groups()
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        key = (prefix, width)
        if key not in groups:
            groups[key] = set()
            order.append(key)
        groups[key].add(int(digits))
    parts = []
    for item in order:
        if isinstance(item, str):
            parts.append(item)
            continue
        prefix, width = item
        numbers = sorted(groups[item])
        if len(numbers) == 1:
            parts.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        parts.append(f"{prefix}[{','.join(_ranges(numbers, width))}]")
    return ",".join(parts)


def _ranges(numbers: list[int], width: int) -> list[str]:
    out = []
    for _, run in itertools.groupby(enumerate(numbers), key=lambda pair: pair[1] - pair[0]):
        values = [v for _, v in run]
        lo, hi = values[0], values[-1]
        out.append(f"{lo:0{width}d}" if lo == hi else f"{lo:0{width}d}-{hi:0{width}d}")
    return out


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"hostlist {text!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise ValueError(f"hostlist {text!r}: unbalanced '['")
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _expand_one(part: str) -> list[str]:
    match = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", part)
    if not match:
        return [part]
    prefix, inner, suffix = match.groups()
    values = []
    for item in inner.split(","):
        rng = _RANGE.match(item.strip())
        if not rng:
            raise ValueError(f"hostlist {part!r}: bad range {item!r}")
        lo_text, hi_text = rng.group(1), rng.group(2) or rng.group(1)
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise ValueError(f"hostlist {part!r}: range {item!r} runs backwards")
        if hi - lo > 100_000:
            raise ValueError(f"hostlist {part!r}: range {item!r} is too large")
        width = len(lo_text) if lo_text.startswith("0") else 0
        values.extend(f"{i:0{width}d}" for i in range(lo, hi + 1))
    return [f"{prefix}{v}{tail}" for v in values for tail in _expand_one(suffix)]


def _reason(value: Any) -> str:
    text = str(value or "")
    return "" if text == "None" else text
