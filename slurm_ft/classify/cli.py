"""``slurm-ft classify``: judge one failed job from files and flags, print the verdict.

Whose log is it (``--log``, ``--kmsg``):

- ``PATH``                 unattributed (per-line ``[rank3]:`` / ``3: `` prefixes are still read)
- ``rank=3:PATH`` or ``3:PATH``   global rank 3's log
- ``node=n2:PATH``         node n2's log (all its ranks, or the batch script's output)
- ``rank=3,node=n2:PATH``  rank 3's log, written on n2

A path that really starts like that is written ``./3:file``. ``--kmsg [node=NAME:]PATH`` is a kernel log
(dmesg / journal); without ``node=`` it belongs to ``--node``. ``--trace DIR`` reads the ranks' flight-recorder
dumps (``trace.rank<R>.json``) of a run dir or of one attempt's folder (``<run_dir>/attempt-N``); where the folder
holds the hung attempt's node reports (``hang.rank<R>.json``) it is judged as the launcher judged that hang. Exit status 0 with a verdict; 2 when an input
cannot be read or parsed (one line naming it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal as signal_mod
from pathlib import Path
from typing import Any

from slurm_ft.classify.collectives import parse_trace
from slurm_ft.classify.engine import classify, explain
from slurm_ft.classify.records import UNKNOWN_RANK, Evidence, JobEnd, LogTail, NodeEvent, error_record_from_dict
from slurm_ft.classify.rules import load_rules
from slurm_ft.core.config import load_site_config
from slurm_ft.core.errors import SlurmFtError
from slurm_ft.core.rundir import ERROR_GLOB, TRACE_GLOB, read_rank_states, read_trace_dicts
from slurm_ft.core.taxonomy import Verdict
from slurm_ft.health.records import NodeReport, XidEvent, snapshot_from_dict
from slurm_ft.slurm.types import JobState

READ_TAIL_BYTES = 256 * 1024  # read at most this much of the end of a log (the engine scans less)
MAX_JSON_BYTES = 16 * 1024 * 1024
_SPEC_RE = re.compile(r"^(?P<tags>(?:(?:rank|node)=[^:,=/]+)(?:,(?:rank|node)=[^:,=/]+)?):(?P<path>.+)$")
_SHORT_RANK_RE = re.compile(r"^(?P<rank>\d+):(?P<path>.+)$")
_NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def register(subparsers: Any, name: str) -> None:
    p = subparsers.add_parser(name, help="classify a job failure from logs, error files, NVML and Slurm state",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log", action="append", default=[], metavar="[rank=N,][node=NAME:]PATH",
                   help="a log tail (repeatable); see above for attribution")
    p.add_argument("--error-file", action="append", default=[], metavar="[rank=N,][node=NAME:]PATH",
                   help="a rank error file (error.rankN.json), a run directory holding them, or a torch elastic "
                        "error file (TORCHELASTIC_ERROR_FILE; rank= and node= say whose) (repeatable)")
    p.add_argument("--trace", metavar="DIR", help="a run dir or attempt folder holding the ranks' flight-recorder "
                                                  "dumps (trace.rank<R>.json) and, for a hung attempt, hang.rank<R>.json")
    p.add_argument("--kmsg", action="append", default=[], metavar="[node=NAME:]PATH",
                   help="a kernel log: dmesg / journalctl -k output (repeatable)")
    p.add_argument("--slurm-state", metavar="STATE", help="the job's end state, e.g. FAILED, NODE_FAIL, TIMEOUT")
    p.add_argument("--reason", default="", help="the job's Slurm reason, e.g. NonZeroExitCode")
    p.add_argument("--exit-code", type=int, metavar="N", help="the job's exit code")
    p.add_argument("--signal", metavar="N|NAME", help="the signal that ended the job, e.g. 9 or SIGKILL")
    p.add_argument("--job-nodes", default="", metavar="N1,N2", help="the job's nodes (comma separated)")
    p.add_argument("--xid", action="append", type=int, default=[], metavar="N", help="an Xid seen on --node")
    p.add_argument("--node", default="", metavar="NAME", help="the node --xid and unattributed --kmsg belong to")
    p.add_argument("--node-event", action="append", default=[], metavar="NAME:STATE[+FLAG...][:REASON]",
                   help="a node's Slurm state at job end, e.g. 'n3:DOWN+NOT_RESPONDING:Not responding'")
    p.add_argument("--nvml-snapshot", action="append", default=[], metavar="PATH",
                   help="an NVML snapshot JSON (health records format; one object or a list)")
    p.add_argument("--node-report", action="append", default=[], metavar="PATH", help="an epilog node report JSON")
    p.add_argument("--rules", action="append", default=[], metavar="PATH", help="extra rules TOML (repeatable)")
    p.add_argument("--in-allocation", action="store_true",
                   help="the allocation is still alive: prefer restart_in_place where recoverable")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    out.add_argument("--explain", action="store_true", help="also list every finding weighed, strongest first")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rules = load_rules(extra_paths=args.rules, site_config=load_site_config())
    evidence = build_evidence(args)
    verdict = classify(evidence, rules)
    print(json.dumps(verdict.to_dict()) if args.json else format_verdict(verdict))
    if args.explain:
        print("findings (strongest first):")
        for f in explain(evidence, rules):
            where = ", ".join(x for x in (f.node, f"rank {f.rank}" if f.rank is not None else "") if x)
            role = "secondary" if f.rule.secondary else ("generic" if f.rule.generic else "primary")
            print(f"  {f.priority:>3} {f.category.value:<13} {role:<9} {f.rule.id} [{where or '-'}]: {f.evidence}")
    return 0


def build_evidence(args: argparse.Namespace) -> Evidence:
    """Read every input named on the command line into one Evidence (errors name the offending input)."""
    reports = [NodeReport.from_dict(_node_report_dict(p)) for p in args.node_report]
    job = _job_end(args)
    base = Evidence.from_node_reports(job, reports) if reports else Evidence(job=job)
    logs = list(base.logs) + [_log_tail(spec) for spec in args.log] + [_kmsg_tail(s, args.node) for s in args.kmsg]
    errors = list(base.errors) + [r for path in args.error_file for r in _error_records(path)]
    nvml = list(base.nvml) + [s for path in args.nvml_snapshot for s in _snapshots(path)]
    if args.xid and not args.node:
        raise SlurmFtError("--xid needs --node NAME (the node that logged it)")
    kmsg = list(base.kmsg) + [XidEvent(node=args.node, xid=x, source="cli", text=f"Xid {x} (command line)")
                              for x in args.xid]
    nodes = [_node_event(spec) for spec in args.node_event]
    traces, hang = _traces(args.trace) if getattr(args, "trace", None) else ((), ())
    return Evidence(job=base.job, nodes=tuple(nodes), nvml=tuple(nvml), kmsg=tuple(kmsg), errors=tuple(errors),
                    logs=tuple(logs), traces=traces, hang=hang, in_allocation=args.in_allocation)


def format_verdict(v: Verdict) -> str:
    """A few readable lines: category and action, culprits, confidence, evidence."""
    recover = "recoverable" if v.recoverable else "not recoverable"
    who = []
    if v.culprit.nodes:
        who.append("nodes " + ", ".join(v.culprit.nodes))
    if v.culprit.ranks:
        who.append("ranks " + ", ".join(map(str, v.culprit.ranks)))
    lines = [f"category:   {v.category.value}", f"action:     {v.action.value} ({recover})",
             f"culprit:    {'; '.join(who) or '-'}", f"confidence: {v.confidence:.2f}", "evidence:"]
    lines += [f"  - {e}" for e in v.evidence]
    return "\n".join(lines)


# ---- parsing the flags ------------------------------------------------------------------------------------------

def _job_end(args: argparse.Namespace) -> JobEnd | None:
    if args.slurm_state is None and args.exit_code is None and args.signal is None and not args.reason:
        return None
    state = ""
    if args.slurm_state is not None:
        state = args.slurm_state.strip().split(" ")[0].upper()  # squeue prints "CANCELLED by 1000"
        if state not in JobState._value2member_map_:
            known = ", ".join(s.value for s in JobState)
            raise SlurmFtError(f"--slurm-state {args.slurm_state!r}: not a Slurm job state (known: {known})")
    nodes = tuple(n for n in (x.strip() for x in args.job_nodes.split(",")) if n)
    return JobEnd(state=state, reason=args.reason, exit_code=args.exit_code, signal=_signal(args.signal), nodes=nodes)


def _signal(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    if text.isdigit() and 0 < int(text) < 65:
        return int(text)
    name = text.upper() if text.upper().startswith("SIG") else "SIG" + text.upper()
    try:
        return int(signal_mod.Signals[name])
    except KeyError:
        raise SlurmFtError(f"--signal {text!r}: not a signal number (1-64) or name like SIGKILL") from None


def parse_log_spec(spec: str) -> tuple[int | None, str, str]:
    """``(rank, node, path)`` of a ``--log`` value (the syntax is in the module docstring)."""
    if m := _SPEC_RE.match(spec):
        rank, node = None, ""
        for tag in m["tags"].split(","):
            key, _, value = tag.partition("=")
            if key == "rank":
                if not value.isdigit():
                    raise SlurmFtError(f"--log {spec!r}: rank must be a number, got {value!r}")
                rank = int(value)
            elif not _NODE_NAME_RE.match(value):
                raise SlurmFtError(f"--log {spec!r}: bad node name {value!r}")
            else:
                node = value
        return rank, node, m["path"]
    if m := _SHORT_RANK_RE.match(spec):
        return int(m["rank"]), "", m["path"]
    return None, "", spec


def _log_tail(spec: str) -> LogTail:
    rank, node, path = parse_log_spec(spec)
    text = _read_tail(path, "log", hint=spec)
    if rank is not None:
        return LogTail(source=rank, text=text, node=node)
    return LogTail(source=node, text=text) if node else LogTail(source="", text=text)


def _kmsg_tail(spec: str, default_node: str) -> LogTail:
    """A kernel log of ``node=``, else ``--node``, else the host its journalctl lines name; judged without a
    node too (its culprit node is then unknown, and the evidence says so)."""
    from slurm_ft.health.kmsg import journal_host

    rank, node, path = parse_log_spec(spec)
    if rank is not None:
        raise SlurmFtError(f"--kmsg {spec!r}: a kernel log belongs to a node (node=NAME:PATH), not a rank")
    text = _read_tail(path, "kernel log", hint=spec)
    return LogTail(source=node or default_node or journal_host(text), text=text, kind="kmsg")


def _node_event(spec: str) -> NodeEvent:
    name, sep, rest = spec.partition(":")
    state, _, reason = rest.partition(":")
    flags = [f for f in state.replace(",", "+").split("+") if f]
    if not sep or not _NODE_NAME_RE.match(name) or not flags:
        raise SlurmFtError(f"--node-event {spec!r}: expected NAME:STATE[+FLAG...][:REASON], "
                           "e.g. n3:DOWN:Not responding")
    return NodeEvent(name=name, state=frozenset(flags), reason=reason)


# ---- reading files ---------------------------------------------------------------------------------------------

def _read_tail(path: str, what: str, *, hint: str) -> str:
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > READ_TAIL_BYTES:
                fh.seek(size - READ_TAIL_BYTES)
            data = fh.read(READ_TAIL_BYTES)
    except FileNotFoundError:
        extra = ""
        if ":" in hint and not Path(hint).exists() and _NODE_NAME_RE.match(hint.split(":", 1)[0]):
            extra = f" (for a node's log write node={hint})"
        raise SlurmFtError(f"{what} {path!r}: no such file{extra}") from None
    except OSError as exc:
        raise SlurmFtError(f"{what} {path!r}: cannot read: {exc.strerror or exc}") from None
    return data.decode("utf-8", errors="replace")


def _read_json(path: str | Path, what: str) -> Any:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        raise SlurmFtError(f"{what} {str(path)!r}: no such file") from None
    except OSError as exc:
        raise SlurmFtError(f"{what} {str(path)!r}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_JSON_BYTES:
        raise SlurmFtError(f"{what} {str(path)!r}: larger than {MAX_JSON_BYTES} bytes")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SlurmFtError(f"{what} {str(path)!r}: not valid JSON: {exc}") from None
    except RecursionError:
        raise SlurmFtError(f"{what} {str(path)!r}: JSON nested too deeply") from None


def _error_records(spec: str) -> list:
    """slurm-ft's error files (a file, or a run directory of them) or a torch elastic error file, whose rank and
    node ``rank=N,node=NAME:PATH`` gives (it names neither)."""
    rank, node, path = parse_log_spec(spec) if not Path(spec).exists() else (None, "", spec)
    if Path(path).is_dir():
        files = sorted(p for p in Path(path).glob(ERROR_GLOB) if not p.is_symlink())
        if not files:
            raise SlurmFtError(f"error file directory {path!r}: no {ERROR_GLOB} in it")
    else:
        files = [Path(path)]
    records = []
    for file in files:
        record = error_record_from_dict(_read_json(file, "error file"), default_host=node,
                                        default_rank=UNKNOWN_RANK if rank is None else rank)
        if record is None:
            raise SlurmFtError(f"error file {str(file)!r}: not an error record (slurm-ft's needs rank, time, exc_type, "
                               "message; torch elastic's a message)")
        records.append(record)
    return records


def _traces(path: str) -> tuple[tuple, tuple]:
    """The dumps of a run dir or attempt folder, and its hung attempt's node reports (none: not a hang)."""
    if not Path(path).is_dir():
        raise SlurmFtError(f"--trace {path!r}: not a directory (give the run dir or an attempt-N folder)")
    traces = tuple(t for t in (parse_trace(d) for d in read_trace_dicts(path)) if t is not None)
    if not traces:
        raise SlurmFtError(f"--trace {path!r}: no flight-recorder dump ({TRACE_GLOB}) in it")
    return traces, tuple(read_rank_states(path))


def _snapshots(path: str) -> list:
    data = _read_json(path, "NVML snapshot")
    items = data if isinstance(data, list) else [data]
    try:
        return [snapshot_from_dict(item) for item in items]
    except (AttributeError, TypeError, ValueError) as exc:
        raise SlurmFtError(f"NVML snapshot {path!r}: malformed: {exc}") from None


def _node_report_dict(path: str) -> dict[str, Any]:
    data = _read_json(path, "node report")
    try:
        NodeReport.from_dict(data)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise SlurmFtError(f"node report {path!r}: malformed: {exc!r}") from None
    return data
