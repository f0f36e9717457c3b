"""The classifier: every input becomes findings, findings reduce to one ``Verdict``. Pure: no I/O, no clock.

Reduction (the rules.toml header documents it for admins):

1. A ``final`` job state (COMPLETED, CANCELLED) decides alone.
2. Node evidence (priority >= 90: Xid, ECC, NVLink, node DOWN, NODE_FAIL) decides; every node with such a
   finding is a culprit. Hardware on a node beats any rank's error.
3. Job-level facts (70-89: PREEMPTED, TIMEOUT, the OOM killer ...).
4. Rank errors (< 70): the root cause is the earliest failing rank (error-file times, when every candidate
   has one), else the most specific error; ranks that failed the same way are culprits too.
5. Only secondary findings (victims, teardown): the strongest one names the category, with low confidence
   and no culprit.

Besides rules.toml's signatures, a log tail is read for meaning: an ``NVRM: Xid`` line gets the Xid table's meaning
(as the job's word: no strike), the step log's numbers are judged as a series (``slurm_ft.classify.metrics``), and
a CUDA OOM inside the first barrier is not taken for the job's size. A verdict decided by a bare exception type
stays below 0.7 confidence (``GENERIC_CONFIDENCE_MAX``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Sequence

from slurm_ft.classify import collectives, metrics
from slurm_ft.classify.records import Evidence, JobEnd, LogTail, NodeEvent
from slurm_ft.classify.rules import Rule, Rules, default_rules
from slurm_ft.classify.scan import LineHit, lower_same_length
from slurm_ft.classify.xid import XidKind
from slurm_ft.core.rundir import ErrorRecord, RankEnd, RankState
from slurm_ft.core.taxonomy import Action, Category, Culprit, Verdict
from slurm_ft.health.kmsg import xid_pid
from slurm_ft.health.records import GpuHealth, NvmlSnapshot, XidEvent, normalize_pci_bus, recovery_action_name

NODE_BAND = 90
JOB_BAND = 70
# A bare exception type (a generic rule: KeyError, SyntaxError ...) names where the job died, not always why (a
# library's version clash raises a SyntaxError too): a verdict it decides stays below 0.7, the confidence from
# which a verdict is meant to be right 95% of the time (``slurm-ft bench classify`` measures it).
GENERIC_CONFIDENCE_MAX = 0.65
MAX_EVIDENCE_CHARS = 300
_REQUEUEING = (Action.REQUEUE, Action.REQUEUE_EXCLUDE, Action.RESTART_IN_PLACE)

_RANK_PREFIX = re.compile(r"^\[rank(\d{1,6})\]:|^(\d{1,6}): ")
_RANK_INLINE = re.compile(r"\[(?:PG [^\]]{0,80}?)?Rank (\d{1,6})\]")
_SUMMARY_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
_SUMMARY_ENTRY = re.compile(r"^\s*\[\d+\]:\s*$")
_INT_PREFIX = re.compile(r"-?\d+")

# Findings that come from records rather than from rules.toml entries.
_XID_RULES = {
    XidKind.DRAIN: Rule(id="xid:drain", category=Category.HARDWARE_GPU, priority=100, confidence=0.95),
    XidKind.RESTART: Rule(id="xid:restart", category=Category.HARDWARE_GPU, priority=60, confidence=0.7,
                          action=Action.REQUEUE),
    XidKind.APPLICATION: Rule(id="xid:application", category=Category.USER_CODE, priority=30, confidence=0.4),
    XidKind.SECONDARY: Rule(id="xid:secondary", category=Category.UNKNOWN, priority=10, confidence=0.2,
                            secondary=True),
}
# An Xid line in a job's own log or error text (a user's dmesg paste, a wrapper that greps the kernel log): the
# table gives its meaning, but it is the job's word: requeue (its own nodes may be excluded), never a strike.
_XID_LOG_RULES = {
    XidKind.DRAIN: Rule(id="xid_log:drain", category=Category.HARDWARE_GPU, priority=62, confidence=0.75),
    XidKind.RESTART: Rule(id="xid_log:restart", category=Category.HARDWARE_GPU, priority=55, confidence=0.6,
                          action=Action.REQUEUE),
    XidKind.APPLICATION: Rule(id="xid_log:application", category=Category.USER_CODE, priority=30, confidence=0.4,
                              blame=False),
    XidKind.SECONDARY: Rule(id="xid_log:secondary", category=Category.UNKNOWN, priority=10, confidence=0.2,
                            secondary=True),
}
# The training loop's numbers read as a series (slurm_ft.classify.metrics): deterministic, so numerical.
_METRIC_RULES = {
    "non_finite": Rule(id="metrics:non_finite", category=Category.NUMERICAL, priority=60, confidence=0.85),
    "scale_collapse": Rule(id="metrics:scale_collapse", category=Category.NUMERICAL, priority=58, confidence=0.8),
    "diverged": Rule(id="metrics:diverged", category=Category.NUMERICAL, priority=35, confidence=0.7),
    "spike": Rule(id="metrics:spike", category=Category.NUMERICAL, priority=12, confidence=0.45),
}
# A CUDA OOM raised inside the process group's first barrier or its set-up: nothing of the model is allocated yet,
# so not the job's size. Either the ranks share one GPU (LOCAL_RANK mapping) or the GPU is already taken or bad.
_OOM_IN_SETUP = Rule(id="cuda_oom:in_setup", category=Category.UNKNOWN, priority=66, confidence=0.3,
                     note="an OOM in the first barrier: ranks sharing one GPU, or a GPU already full or bad")
_SETUP_FRAMES = ("barrier(", "init_process_group(", "new_group(", "ncclCommInitRank")
_OOM_RULE_ID = "cuda_oom"
_NVML_LOST = Rule(id="nvml:gpu_lost", category=Category.HARDWARE_GPU, priority=99, confidence=0.95)
_NVML_FAULT = Rule(id="nvml:fault", category=Category.HARDWARE_GPU, priority=97, confidence=0.9)
_NVML_PENDING = Rule(id="nvml:pending", category=Category.HARDWARE_GPU, priority=93, confidence=0.8)
_NVML_WEAR = Rule(id="nvml:wear", category=Category.HARDWARE_GPU, priority=91, confidence=0.7)
# The driver's own recovery action for the GPU (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): authoritative node evidence.
_NVML_ACTION = Rule(id="nvml:recovery_action", category=Category.HARDWARE_GPU, priority=98, confidence=0.95)
# A GPU that kept a dead attempt's processes (or their memory) past the launcher's wait: it cannot host a rank.
_NVML_HELD = Rule(id="nvml:not_released", category=Category.HARDWARE_GPU, priority=96, confidence=0.85)
# A link of one of the job's nodes went down while it ran (the node's own counters: slurm_ft.health.links): the
# network of that node, recoverable (a restart in place; the quarantine counts repeats). It explains a hang and the
# ranks' network errors (above the hang and trace findings), not a time limit, a preemption or a desync.
_LINK_DOWN = Rule(id="link:down", category=Category.NETWORK, priority=79, confidence=0.85)
_ROOT_CAUSE = Rule(id="torchrun:root_cause", category=Category.UNKNOWN, priority=5, confidence=0.3)
_NOTHING = Rule(id="none", category=Category.UNKNOWN, priority=0, confidence=0.1)


@dataclasses.dataclass(slots=True)
class Finding:
    """One fact and what it means. ``order`` keeps input order for stable tie-breaks.

    Internal to one ``classify`` call (hence mutable: node and time are filled in once all inputs are read).
    """

    rule: Rule
    evidence: str
    kind: str  # which input: job, node, nvml, xid, error, log, kmsg, link
    node: str = ""
    rank: int | None = None
    time: float | None = None
    order: int = 0

    @property
    def category(self) -> Category:
        return self.rule.category

    @property
    def priority(self) -> int:
        return self.rule.priority


class _Context:
    """What ties inputs together: which rank ran where, which pid was which rank, when each rank died."""

    def __init__(self, evidence: Evidence) -> None:
        self.rank_node: dict[int, str] = {}
        self.pid_rank: dict[tuple[str, int], int] = {}
        self.rank_time: dict[int, float] = {}
        self.root_ranks: set[int] = set()
        self.victims: set[int] = set()  # ranks whose error file is only a victim's view ("Connection reset by peer")
        self.job_nodes = frozenset(evidence.job.nodes) if evidence.job is not None else frozenset()
        for record in evidence.errors:
            if record.rank < 0:  # an error file that does not say whose it is
                continue
            if record.host:
                self.rank_node.setdefault(record.rank, record.host)
            if isinstance(record.pid, int) and record.pid > 0:
                self.pid_rank[(record.host, record.pid)] = record.rank
            if record.time == record.time:  # not NaN
                self.rank_time[record.rank] = min(record.time, self.rank_time.get(record.rank, record.time))
        for tail in evidence.logs:
            if tail.rank is not None and tail.node:
                self.rank_node.setdefault(tail.rank, tail.node)
        self._add_ends(evidence.ends)
        for where in (*evidence.hang, *evidence.traces):
            if where.host:
                self.rank_node.setdefault(where.rank, where.host)

    def _add_ends(self, ends: Iterable[RankEnd]) -> None:
        """The wrapper's end records: where each rank ran, its pid, and when it failed (the earlier of its error
        file and its end)."""
        for end in ends:
            if end.host:
                self.rank_node.setdefault(end.rank, end.host)
            if end.pid > 0:
                self.pid_rank.setdefault((end.host, end.pid), end.rank)
            if end.failed and end.time == end.time:
                self.rank_time[end.rank] = min(end.time, self.rank_time.get(end.rank, end.time))

    def first_failure(self) -> float | None:
        """When the first rank failed (error file or end), if any rank's time is known. A victim saw a peer die
        up to ``END_RECORD_LAG_S`` before that peer's end record says: its time counts that much later."""
        return min((t + END_RECORD_LAG_S if r in self.victims else t for r, t in self.rank_time.items()),
                   default=None)

    def on_job(self, node: str) -> bool:
        return not self.job_nodes or not node or node in self.job_nodes

    def rank_for_pid(self, node: str, pid: int | None) -> int | None:
        if pid is None:
            return None
        rank = self.pid_rank.get((node, pid))
        if rank is None:
            rank = self.pid_rank.get(("", pid))
        return rank


def classify(evidence: Evidence, rules: Rules | None = None, *, reference_scan: bool = False) -> Verdict:
    """The verdict for ``evidence`` under ``rules`` (default: the shipped rules). Pure and deterministic.

    ``reference_scan`` runs every regex on every line instead of the anchored scan: same verdict, much
    slower; tests and the benchmark use it as the reference.
    """
    rules = rules if rules is not None else default_rules()
    job = evidence.job
    if job is not None:
        state_rule = rules.job_states.get(job.state)
        if state_rule is not None and state_rule.final:
            return _final_verdict(job, state_rule, rules)
    findings, ctx = _gather(evidence, rules, reference_scan)
    return _reduce(findings, ctx, rules, evidence)


def explain(evidence: Evidence, rules: Rules | None = None) -> list[Finding]:
    """Every finding ``classify`` weighs (node and time resolved), strongest first: for ``--explain`` and tests."""
    rules = rules if rules is not None else default_rules()
    findings, ctx = _gather(evidence, rules, False)
    return sorted((_resolved(f, ctx) for f in findings), key=_strength, reverse=True)


def _gather(evidence: Evidence, rules: Rules, naive: bool) -> tuple[list[Finding], _Context]:
    scan = _scan_naive if naive else _scan_fast
    job = evidence.job
    ctx = _Context(evidence)
    findings: list[Finding] = []
    xids: list[XidEvent] = list(evidence.kmsg)
    if job is not None:
        findings += _job_findings(job, rules, scan)
    findings += _node_event_findings(evidence.nodes, ctx, rules, scan)
    for snapshot in evidence.nvml:
        if ctx.on_job(snapshot.node):
            findings += _nvml_findings(snapshot, rules)
            xids += snapshot.xids
    findings += [Finding(_NVML_HELD, hold.describe(), "nvml", node=hold.node) for hold in evidence.held_gpus
                 if ctx.on_job(hold.node)]
    findings += [Finding(_LINK_DOWN, loss.describe(), "link", node=loss.node) for loss in evidence.links
                 if loss.node and ctx.on_job(loss.node)]
    for record in evidence.errors:
        said = list(_error_findings(record, rules, scan))
        if _only_secondary(said):
            ctx.victims.add(record.rank)
        findings += said
    for tail in evidence.logs:
        findings += _log_findings(tail, ctx, rules, xids, scan)
    findings += _end_findings(evidence, ctx, rules, xids, scan)
    findings += _hang_findings(evidence.hang)
    findings += _trace_findings(evidence)
    findings += _xid_findings(xids, ctx, rules)
    for i, f in enumerate(findings):
        f.order = i
    return findings, ctx


def victims_view(record: ErrorRecord, rules: Rules | None = None) -> bool:
    """Whether an error file is only a victim's view of another rank's failure (every finding in it secondary:
    "Connection closed by peer" ...): it never names the root cause."""
    return _only_secondary(_error_findings(record, rules if rules is not None else default_rules(), _scan_fast))


def _only_secondary(found: Sequence[Finding]) -> bool:
    return bool(found) and all(f.rule.secondary for f in found)


# ---- gathering findings --------------------------------------------------------------------------------------

def _scan_fast(rules: Rules, source: str, text: str) -> list[LineHit]:
    return rules.scanners[source].scan(text)


def _scan_naive(rules: Rules, source: str, text: str) -> list[LineHit]:
    return rules.scanners[source].scan_naive(text)


def _final_verdict(job: JobEnd, rule: Rule, rules: Rules) -> Verdict:
    policy = rules.policy(rule.category)
    action = rule.action or policy.action
    recoverable = rule.recoverable if rule.recoverable is not None else policy.recoverable
    text = f"job: state {job.state}" + (f" ({rule.note})" if rule.note else "")
    return Verdict(category=rule.category, recoverable=recoverable, action=action, evidence=(text,), confidence=1.0)


def _job_findings(job: JobEnd, rules: Rules, scan) -> list[Finding]:
    found = []
    rule = rules.job_states.get(job.state)
    if rule is not None:
        note = f" ({rule.note})" if rule.note else ""
        found.append(Finding(rule, f"job: state {job.state}{note}", "job"))
    if job.reason:
        for hit in scan(rules, "job_reason", job.reason[:512]):
            for sig, _ in hit.signatures:
                found.append(Finding(sig.rule, f"job: reason {job.reason[:100]!r}", "job"))
    signal = job.signal
    if not signal and job.exit_code is not None and 128 < job.exit_code < 128 + 65:
        signal = job.exit_code - 128
    if signal:
        rule = rules.signals.get(signal)
        if rule is not None:
            found.append(Finding(rule, f"job: killed by signal {signal} ({rule.name or 'signal'})", "job"))
    elif job.exit_code is not None:
        rule = rules.exit_codes.get(job.exit_code)
        if rule is not None:
            found.append(Finding(rule, f"job: exit code {job.exit_code} ({rule.note or 'exit code'})", "job"))
    return found


def _node_event_findings(events: Iterable[NodeEvent], ctx: _Context, rules: Rules, scan) -> list[Finding]:
    found = []
    for event in events:
        if not ctx.on_job(event.name):
            continue
        flags = "+".join(sorted(event.state))
        text = f"{event.name}: node state {flags}" + (f", reason {event.reason[:120]!r}" if event.reason else "")
        for flag in sorted(event.state):
            rule = rules.node_states.get(flag)
            if rule is not None:
                found.append(Finding(rule, text, "node", node=event.name))
        if event.reason:
            for hit in scan(rules, "node_reason", event.reason[:512]):
                for sig, _ in hit.signatures:
                    found.append(Finding(sig.rule, text, "node", node=event.name))
    return found


def _nvml_findings(snapshot: NvmlSnapshot, rules: Rules) -> list[Finding]:
    node, limits = snapshot.node, rules.nvml
    found = []
    if not snapshot.available and _is_lost(snapshot.error, limits.lost_gpu_errors):
        found.append(Finding(_NVML_LOST, f"{node} NVML: {snapshot.error[:200]}", "nvml", node=node))
    for gpu in snapshot.gpus:
        where = f"{node} GPU {gpu.index}" + (f" ({gpu.pci_bus})" if gpu.pci_bus else "")
        for rule, what in _gpu_problems(gpu, limits):
            found.append(Finding(rule, f"{where}: {what}", "nvml", node=node))
    return found


def _is_lost(error: str, patterns: tuple[str, ...]) -> bool:
    low = error.lower()
    return bool(error) and any(p.lower() in low for p in patterns)


def _gpu_problems(gpu: GpuHealth, limits) -> Iterator[tuple[Rule, str]]:
    error = getattr(gpu, "error", "") or ""
    if _is_lost(error, limits.lost_gpu_errors):
        yield _NVML_LOST, f"NVML: {error[:200]}"
    action = getattr(gpu, "recovery_action", None)
    if isinstance(action, int) and action != 0:
        yield _NVML_ACTION, (f"the driver asks for recovery action {recovery_action_name(action)} "
                             f"(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION={action})")
    if _over(gpu.ecc_volatile_uncorrected, limits.ecc_volatile_uncorrected_max):
        yield _NVML_FAULT, f"{gpu.ecc_volatile_uncorrected} volatile uncorrected ECC errors"
    if limits.remap_failure and gpu.remap_failure:
        yield _NVML_FAULT, "row remapping failed"
    if limits.nvlink_down and gpu.nvlink_down:
        yield _NVML_FAULT, f"NVLink down: links {', '.join(map(str, gpu.nvlink_down))}"
    if limits.remap_pending and gpu.remap_pending:
        yield _NVML_PENDING, "row remap pending (needs a GPU reset)"
    if limits.retired_pages_pending and gpu.retired_pages_pending:
        yield _NVML_PENDING, "page retirement pending (needs a GPU reset)"
    retired = (gpu.retired_pages_sbe or 0) + (gpu.retired_pages_dbe or 0)
    counted = gpu.retired_pages_sbe is not None or gpu.retired_pages_dbe is not None
    if counted and _over(retired, limits.retired_pages_max):
        yield _NVML_WEAR, f"{retired} retired pages"
    if _over(gpu.ecc_aggregate_uncorrected, limits.ecc_aggregate_uncorrected_max):
        yield _NVML_WEAR, f"{gpu.ecc_aggregate_uncorrected} aggregate uncorrected ECC errors"
    if _over(gpu.remapped_rows_uncorrectable, limits.remapped_rows_uncorrectable_max):
        yield _NVML_WEAR, f"{gpu.remapped_rows_uncorrectable} rows remapped for uncorrectable errors"
    if _over(gpu.nvlink_errors, limits.nvlink_errors_max):
        yield _NVML_WEAR, f"{gpu.nvlink_errors} NVLink errors"
    if _over(gpu.temperature_c, limits.temperature_max_c):
        yield _NVML_WEAR, f"temperature {gpu.temperature_c} C"


def _over(value: int | None, limit: int | None) -> bool:
    return limit is not None and isinstance(value, int) and value > limit


def _xid_findings(events: Iterable[XidEvent], ctx: _Context, rules: Rules) -> list[Finding]:
    found, seen = [], set()
    for event in events:
        if not isinstance(event.xid, int) or not ctx.on_job(event.node):
            continue
        key = (event.node, event.xid, normalize_pci_bus(event.pci_bus) if event.pci_bus else event.gpu_index)
        if key in seen:
            continue
        seen.add(key)
        info = rules.xid(event.xid)
        rule = _XID_RULES.get(info.kind_for(event.text or ""))
        if rule is None:
            continue  # watch: a health-probe matter, not a cause
        where = (f" on GPU {event.gpu_index}" if event.gpu_index is not None
                 else f" on {event.pci_bus}" if event.pci_bus else "")
        line = (event.text or "").strip()
        text = f"{event.node} Xid {event.xid} ({info.name}){where}" + (f": {line}" if line else "")
        rank = ctx.rank_for_pid(event.node, xid_pid(event.text or ""))
        found.append(Finding(rule, text, "xid", node=event.node, rank=rank, time=event.time))
    return found


def _error_findings(record: ErrorRecord, rules: Rules, scan) -> list[Finding]:
    limit = rules.limits.max_error_chars
    text = (f"{record.exc_type}: {record.message}" if record.exc_type else record.message)[:limit]
    if record.traceback:
        text += "\n" + record.traceback[-limit:]
    rank = record.rank if record.rank >= 0 else None  # a torch elastic error file names no rank
    label = (f"rank {rank}" if rank is not None else "unattributed") + (f" ({record.host})" if record.host else "")
    label += " error file"
    frame = last_user_frame(record.traceback)
    if frame:
        label += f" at {frame}"
    hits = _within(scan(rules, "error", text), text)
    found = list(_hit_findings(hits, rules, label, "error", rank=rank, node=record.host, time=record.time,
                               limit=rules.limits.max_findings_per_text, first_line_is_type=True))
    if not any(not f.rule.generic for f in found):
        # An error file is written only for an exception raised in the rank's own code: a type no rule knows
        # (a user's own exception class) is user code, not unknown.
        rule = rules.exception(record.exc_type) or rules.exceptions.get("*")
        if rule is not None:
            first = text.split("\n", 1)[0]
            found.append(Finding(rule, f"{label}: {_clip(first)}", "error", node=record.host, rank=rank,
                                 time=record.time))
    else:
        found = [f for f in found if not f.rule.generic]
    return found


_FRAME = re.compile(r'^\s*File "([^"]{1,400})", line (\d+), in (\S{1,200})')
_LIBRARY_PATHS = ("site-packages/", "dist-packages/", "/lib/python", "<frozen ", "<string>")


def last_user_frame(traceback_text: str) -> str:
    """``path:line in func`` of a traceback's innermost frame outside Python's and installed packages' code
    (where the user's own code raised or called into a library); "" when there is none."""
    found = ""
    for line in traceback_text.splitlines()[-400:]:
        m = _FRAME.match(line)
        if m and not any(part in m.group(1) for part in _LIBRARY_PATHS):
            found = f"{m.group(1)}:{m.group(2)} in {m.group(3)}"
    return found


def _log_findings(tail: LogTail, ctx: _Context, rules: Rules, xids: list[XidEvent], scan,
                  label: str | None = None) -> list[Finding]:
    text = tail.text[-rules.limits.max_tail_chars:]
    hits = _within(scan(rules, tail.kind, text), text)
    node = tail.node_name
    if tail.kind == "kmsg":
        xids += [XidEvent(node=node, xid=h.xid[1], pci_bus=h.xid[0], text=h.line.strip(), source="kmsg")
                 for h in hits if h.xid is not None]
    if label is None and tail.kind == "kmsg" and not node:
        label = "kernel log of an unknown node (culprit node unknown)"
    elif label is None:
        label = (f"rank {tail.rank}" if tail.rank is not None else node or "unattributed") + f" {tail.kind}"
    found = list(_hit_findings(hits, rules, label, tail.kind, rank=tail.rank, node=node, time=None,
                               limit=rules.limits.max_findings_per_text, per_line=True))
    if tail.kind == "log":
        found += _oom_in_setup(hits, text, label, rank=tail.rank, node=node)
        found += _xid_log_findings(hits, rules, label, rank=tail.rank, node=node)
        found += _metric_findings(text, label, rank=tail.rank, node=node)
        if any("ChildFailedError" in h.line for h in hits):
            found += _summary_findings(text, ctx, label)
    return found


def _oom_in_setup(hits: list[LineHit], text: str, label: str, *, rank: int | None, node: str) -> list[Finding]:
    """A CUDA OOM whose traceback, in the lines just above it, is in a barrier or process-group set-up."""
    for hit in hits:
        if any(sig.rule.id == _OOM_RULE_ID for sig, _ in hit.signatures):
            before = text[max(0, hit.pos - 600):hit.pos]
            if any(frame in before for frame in _SETUP_FRAMES):
                return [Finding(_OOM_IN_SETUP, f"{label}: CUDA OOM in the process group's set-up: {_clip(hit.line)}",
                                "log", node=node, rank=rank if rank is not None else _line_rank(hit.line))]
    return []


def _xid_log_findings(hits: list[LineHit], rules: Rules, label: str, *, rank: int | None,
                      node: str) -> Iterator[Finding]:
    """An ``NVRM: Xid`` line in the job's own text means what the Xid table says, read by code, not phrase."""
    seen = set()
    for hit in hits:
        if hit.xid is None or hit.xid[:2] in seen:
            continue
        seen.add(hit.xid[:2])
        info = rules.xid(hit.xid[1])
        rule = _XID_LOG_RULES.get(info.kind_for(hit.line))
        if rule is not None:
            yield Finding(rule, f"{label}: Xid {hit.xid[1]} ({info.name}): {_clip(hit.line)}", "log", node=node,
                          rank=rank if rank is not None else _line_rank(hit.line))


def _metric_findings(text: str, label: str, *, rank: int | None, node: str) -> list[Finding]:
    """The step log's loss / grad norm / loss scale series, judged (``slurm_ft.classify.metrics``)."""
    judgement = metrics.judge(text)
    if judgement is None:
        return []
    return [Finding(_METRIC_RULES[judgement.kind], f"{label}: step log: {_clip(judgement.evidence)}", "log",
                    node=node, rank=rank)]


def _within(hits: list[LineHit], text: str) -> list[LineHit]:
    """``hits`` without the signatures whose ``within`` literals are not all somewhere in ``text`` (a line that
    means one thing only in a given context: a C++ error raised while torch builds a process group)."""
    if not any(sig.within for hit in hits for sig, _ in hit.signatures):
        return hits
    low = lower_same_length(text)
    return [dataclasses.replace(hit, signatures=tuple((sig, m) for sig, m in hit.signatures
                                                      if all(w in low for w in sig.within)))
            for hit in hits]


def _hit_findings(hits: list[LineHit], rules: Rules, label: str, kind: str, *, rank: int | None, node: str,
                  time: float | None, limit: int, per_line: bool = False,
                  first_line_is_type: bool = False) -> Iterator[Finding]:
    """Findings for scanned lines. ``per_line``: a generic match counts only on a line no specific rule matched.

    ``first_line_is_type``: line 0 is an error file's ``exc_type: message``, judged by the caller.
    """
    emitted = 0
    for hit in hits:
        if emitted >= limit:
            return
        line_rank = rank if rank is not None else _line_rank(hit.line)
        specific = [(s, m) for s, m in hit.signatures if not s.rule.generic]
        chosen = specific if (specific or not per_line) else list(hit.signatures)
        for sig, match in chosen:
            groups = match.groupdict()
            sig_rank = _int_or(groups.get("rank"), line_rank)
            found_node = groups.get("node") or node
            note = f" ({sig.rule.note})" if sig.rule.note else ""
            yield Finding(sig.rule, f"{label}: {_clip(hit.line)}{note}", kind, node=found_node, rank=sig_rank,
                          time=time)
            emitted += 1
        if not chosen and hit.exception is not None and not (first_line_is_type and hit.pos == 0):
            rule = rules.exception(hit.exception["exc"])
            if rule is not None:
                yield Finding(rule, f"{label}: {_clip(hit.line)}", kind, node=node, rank=line_rank, time=time)
                emitted += 1


def _line_rank(line: str) -> int | None:
    m = _RANK_PREFIX.match(line)
    if m:
        return int(m.group(1) or m.group(2))
    m = _RANK_INLINE.search(line)
    return int(m.group(1)) if m else None


def _int_or(text: str | None, default: int | None) -> int | None:
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        return default


def _summary_findings(text: str, ctx: _Context, label: str) -> list[Finding]:
    """torchrun's ChildFailedError summary: who failed where, and the agent's first observed failure."""
    found = []
    for section, entry in _summary_entries(text):
        rank = _int_or(_first_int(entry.get("rank", "")), None)
        host = entry.get("host", "").strip()
        if rank is None:
            continue
        if host and host != "<N/A>":
            ctx.rank_node.setdefault(rank, host)
        if section != "root":
            continue
        ctx.root_ranks.add(rank)
        code = _int_or(_first_int(entry.get("exitcode", "")), None)
        how = f"exitcode {code}" if code is not None else "failed"
        if code is not None and code < 0:
            how += f" (signal {-code})"
        error_file = entry.get("error_file", "").strip()
        if error_file and error_file != "<N/A>":
            how += f", error file {error_file} (give it to --error-file rank={rank},node={host or '?'}:PATH)"
        text = f"{label}: torchrun first observed failure: rank {rank} on {host or '?'}, {how}"
        found.append(Finding(_ROOT_CAUSE, text, "log", node=host, rank=rank))
    return found


def _summary_entries(text: str) -> Iterator[tuple[str, dict[str, str]]]:
    start = text.find("ChildFailedError")
    section, entry = "other", None
    for raw in text[start:].split("\n")[:400]:
        line = _RANK_PREFIX.sub("", raw, count=1)
        if line.startswith("Root Cause"):
            if entry:
                yield section, entry
            section, entry = "root", None
        elif _SUMMARY_ENTRY.match(line):
            if entry:
                yield section, entry
            entry = {}
        elif (m := _SUMMARY_FIELD.match(line)) and entry is not None:
            entry.setdefault(m.group(1), m.group(2)[:200])
        elif line.startswith("====") and section == "root" and entry:
            break
    if entry:
        yield section, entry


def _first_int(text: str) -> str | None:
    m = _INT_PREFIX.search(text)
    return m.group(0) if m else None


def _clip(line: str) -> str:
    line = line.strip()
    return line if len(line) <= MAX_EVIDENCE_CHARS else line[: MAX_EVIDENCE_CHARS - 3] + "..."


# ---- how each rank ended, and the ranks of a hung attempt (the launcher's own records) ------------------------
# A rank that died by a signal, wrote no error file and failed before anyone else is the root cause. What it gets:
# - the OOM killer's kill in its cgroup: oom_host;
# - SIGKILL without OOM evidence: `unknown` with the rank and its node as culprit. Nothing in the rank's own code
#   failed (no traceback), so not `user_code`, which would stop a job that a restart fixes; no peer's connection
#   error makes it `network` either. The operator gets who and where, and the honest "sent from outside, by whom
#   unknown" (an admin, a watchdog, an OOM killer whose count we could not read);
# - SIGSEGV, SIGBUS, SIGABRT ...: the rank's own stderr tail decides (CUDA, NCCL, ...), else the signal table;
# - ranks that ended after it are secondary (killed in the teardown, or failing because it was gone).
# The wrapper records an end when its waitpid returns. On a loaded host that can come after a peer saw the socket
# close, raised and wrote its error file; torch elastic's error files also stamp whole seconds. So a victim's error
# bounds the first failure only this loosely; any other error file or end bounds it exactly.
END_RECORD_LAG_S = 2.0
_END_OOM = Rule(id="rank_end:oom_kill", category=Category.OOM_HOST, priority=80, confidence=0.9)
_END_KILLED = Rule(id="rank_end:killed", category=Category.UNKNOWN, priority=40, confidence=0.6)
_END_CRASHED = Rule(id="rank_end:crashed", category=Category.UNKNOWN, priority=35, confidence=0.5)
_END_EXIT = Rule(id="rank_end:exit", category=Category.UNKNOWN, priority=20, confidence=0.4)
_END_AFTER = Rule(id="rank_end:after_root", category=Category.UNKNOWN, priority=5, confidence=0.2, secondary=True)
_SIGKILL = 9
_SENT_SIGNALS = frozenset({1, 2, 10, 12, 15})  # SIGHUP, SIGINT, SIGUSR1, SIGUSR2, SIGTERM: Slurm, scancel, a user
# A stuck rank (stopped, uninterruptible, gone, or its liveness beat stopped) decides a hang; a rank behind the
# others only when none is stuck; ranks alive and waiting are secondary.
_HANG_STUCK = Rule(id="hang:stuck", category=Category.HANG, priority=75, confidence=0.9)
_HANG_BEHIND = Rule(id="hang:behind", category=Category.HANG, priority=75, confidence=0.6)
_HANG_OUTSIDE = Rule(id="hang:outside_collective", category=Category.HANG, priority=75, confidence=0.6)
_HANG_NONE = Rule(id="hang:no_progress", category=Category.HANG, priority=75, confidence=0.5, blame=False)
_HANG_WAITING = Rule(id="hang:waiting", category=Category.HANG, priority=5, confidence=0.3, secondary=True)
_PROC_STATES = {"T": "stopped (state T)", "t": "stopped by a tracer (state t)", "D": "in uninterruptible sleep "
                "(state D)", "Z": "exited, not reaped (state Z)", "X": "gone (state X)"}


def _end_findings(evidence: Evidence, ctx: _Context, rules: Rules, xids: list[XidEvent], scan) -> list[Finding]:
    first = ctx.first_failure()
    with_error = {r.rank for r in evidence.errors}
    found: list[Finding] = []
    for end in evidence.ends:
        if not end.failed:
            continue
        label = f"rank {end.rank}" + (f" ({end.host})" if end.host else "")
        if first is not None and end.time > first and ctx.rank_time.get(end.rank, end.time) > first:
            found.append(Finding(_END_AFTER, f"{label}: {end.how()} after the first failure", "end",
                                 node=end.host, rank=end.rank, time=end.time))
            continue
        if end.rank in with_error:
            continue  # its error file explains it
        found += _first_end_findings(end, label, rules, xids, scan)
    return found


def _first_end_findings(end: RankEnd, label: str, rules: Rules, xids: list[XidEvent], scan) -> list[Finding]:
    """A rank that failed first and wrote no error file: its cgroup's OOM kills, its tail, then how it ended."""
    found: list[Finding] = []
    where = dict(node=end.host, rank=end.rank, time=end.time)
    if end.oom_kills:
        found.append(Finding(_END_OOM, f"{label}: {end.how()}; the OOM killer killed {end.oom_kills} process(es) "
                                       "in its cgroup", "end", **where))
    if end.tail:  # its own stderr says why (CUDA, NCCL's watchdog ...): that decides, not the bare signal
        tail = LogTail(source=end.rank, text=end.tail, node=end.host)
        said = [f for f in _log_findings(tail, _Context(Evidence()), rules, xids, scan,
                                         label=f"{label}, {end.how()}, its stderr") if not f.rule.secondary]
        if said:
            return found + said
    found.append(Finding(_end_rule(end, rules), f"{label}: {_end_text(end)}, no error file, before any other "
                                                "rank failed", "end", **where))
    return found


def _end_rule(end: RankEnd, rules: Rules) -> Rule:
    """SIGKILL: killed from outside; a signal the table takes as a cause (SIGSEGV, SIGILL ...) or as sent by
    Slurm or a user (SIGTERM, SIGUSR1 ...: secondary): the table's rule; any other signal: a crash."""
    if end.signal is None:
        return _END_EXIT
    if end.signal == _SIGKILL:
        return _END_KILLED
    table = rules.signals.get(end.signal)
    if table is not None and (not table.secondary or end.signal in _SENT_SIGNALS):
        return table
    return _END_CRASHED


def _end_text(end: RankEnd) -> str:
    if end.signal is None or end.oom_kills:
        return end.how()
    return end.how() + ("; OOM kills in its cgroup not readable" if end.oom_kills is None
                        else "; no OOM-killer kill in its cgroup")


def _hang_findings(states: Iterable[RankState]) -> list[Finding]:
    states = list(states)
    if not states:
        return []
    stuck, behind, outside = _hang_suspects(states)
    stacked = sorted(s.rank for s in states if s.stack)
    stacks = f"; Python stacks of ranks {_ranges(stacked)} saved (stack.rank<R>.txt)" if stacked else ""
    waiting = _ranges(sorted(w.rank for w in states if w.in_collective))
    found = []
    for s in states:
        label = f"rank {s.rank}" + (f" ({s.host})" if s.host else "")
        at = f" at step {s.step}" if s.step is not None else ""
        if s in stuck:
            text, rule = f"{label}: {_stuck_reason(s)}{at}{stacks}", _HANG_STUCK
        elif s in behind:
            text, rule = f"{label}: behind the others{at}, its peers wait for it{stacks}", _HANG_BEHIND
        elif s in outside:
            text, rule = f"{label}: not in a collective{at} while ranks {waiting} wait in one{stacks}", _HANG_OUTSIDE
        else:
            state = f", state {s.state}" if s.state else ""
            text, rule = f"{label}: alive and waiting{at}{state}", _HANG_WAITING
        found.append(Finding(rule, text, "hang", node=s.host, rank=s.rank))
    if not (stuck or behind or outside):
        found.append(Finding(_HANG_NONE, f"no progress on any of {len(states)} ranks, all alive: no rank singled "
                                         f"out{stacks}", "hang"))
    return found


def _hang_suspects(states: list[RankState]) -> tuple[list[RankState], list[RankState], list[RankState]]:
    """(stuck, behind, outside a collective), each tried only when the one before found nobody: stuck (stopped,
    uninterruptible, gone, liveness stopped); behind the others' step (no heartbeat: before step 1); its main
    thread not in a collective while others wait in one."""
    stuck = [s for s in states if _stuck_reason(s)]
    if stuck:
        return stuck, [], []
    steps = {s.rank: -1 if s.step is None else s.step for s in states}
    if min(steps.values()) < max(steps.values()):
        return [], [s for s in states if steps[s.rank] == min(steps.values())], []
    if any(s.in_collective for s in states):
        return [], [], [s for s in states if s.in_collective is False]
    return [], [], []


def _stuck_reason(s: RankState) -> str:
    if s.state in _PROC_STATES:
        why = f"process {_PROC_STATES[s.state]}" + (f" in {s.wchan}" if s.wchan and s.state == "D" else "")
    elif s.pid and not s.state and s.live is not True:
        why = "process gone or not readable"
    elif s.live is False:
        why = "liveness beat stopped (the whole process is stuck, not only its training loop)"
    else:
        return ""
    return why


# ---- the ranks' flight-recorder dumps (slurm_ft.classify.collectives) ----------------------------------------------
# A desync (calls that differ at one sequence number) is the training code's: it decides over a hang (it explains
# it) and over rank errors (the ranks that failed on it), and a restart would only repeat it. For a hung attempt the
# dumps say whom the others waited for: a rank that never entered the collective, one that did not answer (stopped,
# gone; weak when nothing says it is stuck), or one node's ranks that did not answer while all others sit in the
# collective (its network). They come before the heartbeat and stack findings (same band, one point higher).
_TRACE_RULES = {
    "desync": Rule(id="trace:desync", category=Category.USER_CODE, priority=80, confidence=0.9),
    "desync_unsure": Rule(id="trace:desync", category=Category.USER_CODE, priority=80, confidence=0.6),
    "network": Rule(id="trace:network", category=Category.NETWORK, priority=77, confidence=0.6),
    "never_entered": Rule(id="trace:never_entered", category=Category.HANG, priority=76, confidence=0.9),
    "silent_stuck": Rule(id="trace:silent_stuck", category=Category.HANG, priority=76, confidence=0.9),
    "silent": Rule(id="trace:silent", category=Category.HANG, priority=76, confidence=0.5),
    "all_waiting": Rule(id="trace:all_waiting", category=Category.HANG, priority=75, confidence=0.5, blame=False),
}


def _trace_findings(evidence: Evidence) -> list[Finding]:
    found = []
    for clue in collectives.clues(evidence.traces, evidence.hang, hung=bool(evidence.hang)):
        rule = _TRACE_RULES["desync_unsure" if clue.kind == "desync" and not clue.sure else clue.kind]
        for rank in clue.ranks or (None,):
            found.append(Finding(rule, clue.text, "trace", node=clue.node if rank is None else "", rank=rank))
    return found


# ---- reduction -----------------------------------------------------------------------------------------------

def _reduce(findings: list[Finding], ctx: _Context, rules: Rules, evidence: Evidence) -> Verdict:
    findings = [_resolved(f, ctx) for f in findings]
    primaries = [f for f in findings if not f.rule.secondary]
    secondaries = [f for f in findings if f.rule.secondary]
    if primaries:
        top = max(primaries, key=_strength)
        if top.priority >= NODE_BAND:
            deciding = sorted((f for f in primaries if f.priority >= NODE_BAND), key=_strength, reverse=True)
        elif top.priority >= JOB_BAND:
            same_band = (f for f in primaries if JOB_BAND <= f.priority < NODE_BAND and f.category == top.category)
            deciding = sorted(same_band, key=_strength, reverse=True)
        else:
            top, deciding = _root_cause(primaries, ctx)
        confidence = top.rule.confidence
        if len({f.kind for f in primaries if f.category == top.category}) > 1:
            confidence = min(1.0, confidence + 0.1)  # independent inputs agree
        if top.rule.generic:
            confidence = min(confidence, GENERIC_CONFIDENCE_MAX)
        chosen = {id(f) for f in deciding}
        overruled = [f for f in primaries if id(f) not in chosen and f.category != top.category]
        return _verdict(top, deciding, secondaries, confidence, rules, evidence, overruled=overruled)
    if secondaries:
        top = max(secondaries, key=_strength)
        victims = sorted(secondaries, key=_strength, reverse=True)
        return _verdict(top, victims, [], min(top.rule.confidence, 0.3), rules, evidence, blame=False)
    what = f"job: state {evidence.job.state}" if evidence.job is not None and evidence.job.state else "no input"
    return _verdict(Finding(_NOTHING, f"{what}; no rule matched", "none"), [], [], _NOTHING.confidence, rules,
                    evidence, blame=False)


def _resolved(finding: Finding, ctx: _Context) -> Finding:
    """Fill in a rank's node and death time from the other inputs."""
    if finding.rank is not None:
        finding.node = finding.node or ctx.rank_node.get(finding.rank, "")
        if finding.time is None:
            finding.time = ctx.rank_time.get(finding.rank)
    return finding


def _strength(f: Finding) -> tuple[int, float, bool, int]:
    return f.priority, f.rule.confidence, bool(f.node), -f.order


def _root_cause(primaries: list[Finding], ctx: _Context) -> tuple[Finding, list[Finding]]:
    """The earliest failing rank's error; ranks that failed the same way are culprits with it."""
    best: dict[int | None, Finding] = {}
    for f in primaries:
        key = f.rank if f.rank is not None else None
        if key not in best or _strength(f) > _strength(best[key]):
            best[key] = f
    candidates = list(best.values())
    if len(candidates) > 1 and all(f.time is not None for f in candidates):
        root = min(candidates, key=lambda f: (f.time, -f.priority, f.order))
    else:
        root = max(candidates, key=lambda f: (f.priority, f.rank in ctx.root_ranks, f.rule.confidence, -f.order))
    same = [f for f in candidates if f is not root and f.rule.id == root.rule.id]
    corroborating = [f for f in primaries if f.rank == root.rank and f is not root and f.category == root.category]
    return root, [root] + sorted(same, key=lambda f: (f.rank is None, f.rank or 0)) + corroborating


def _verdict(top: Finding, deciding: list[Finding], secondaries: list[Finding], confidence: float, rules: Rules,
             evidence: Evidence, *, blame: bool = True, overruled: list[Finding] = ()) -> Verdict:
    category = top.category
    policy = rules.policy(category)
    action = top.rule.action or (policy.in_allocation_action if evidence.in_allocation else policy.action)
    if top.rule.recoverable is not None:
        recoverable = top.rule.recoverable
    elif top.rule.action is not None:
        recoverable = action in _REQUEUEING
    else:
        recoverable = policy.recoverable
    blamed = [f for f in deciding if f.rule.blame] if blame else []
    job_nodes = frozenset(evidence.job.nodes) if evidence.job is not None else frozenset()
    # A node named by the job's word (an error file's host, a log line) is a culprit only if it is one of the
    # job's own nodes; only a node named by its own evidence may be struck (``attested_nodes``).
    nodes = tuple(sorted({f.node for f in blamed if f.node and (f.kind in NODE_EVIDENCE_KINDS or not job_nodes
                                                                 or f.node in job_nodes)}))
    attested = tuple(sorted({f.node for f in blamed if f.node and f.kind in NODE_EVIDENCE_KINDS}))
    ranks = tuple(sorted({f.rank for f in blamed if f.rank is not None}))
    lines = _evidence_lines(deciding or [top], overruled, secondaries, rules.limits.max_evidence)
    if action is Action.REQUEUE_EXCLUDE and not nodes:
        action = Action.REQUEUE
        lines.append("no node to exclude: plain requeue")
    return Verdict(category=category, recoverable=recoverable, action=action, culprit=Culprit(nodes=nodes, ranks=ranks),
                   evidence=tuple(lines), confidence=round(confidence, 3), attested_nodes=attested)


# Finding kinds that are the node's own evidence, gathered by root: Slurm's node state, NVML, Xids and the kernel
# log read on the node. ("link": the counters as the launcher read them, as the job's user: they name the job's own
# nodes; the epilog's own reading strikes, slurm_ft.cluster.hooks.) "error" and "log" findings are the job's word.
NODE_EVIDENCE_KINDS = frozenset({"node", "nvml", "xid", "kmsg"})


def _evidence_lines(deciding: list[Finding], overruled: list[Finding], secondaries: list[Finding],
                    limit: int) -> list[str]:
    """The deciding lines, then one line each for what was outweighed and what were victims."""
    lines: list[str] = []
    for f in deciding:
        if f.evidence not in lines:
            lines.append(f.evidence)
        if len(lines) >= limit:
            break
    for label, group in (("outweighed", overruled), ("secondary, not the cause", secondaries)):
        if group:
            ranks = sorted({f.rank for f in group if f.rank is not None})
            who = f" on ranks {_ranges(ranks)}" if ranks else ""
            ids = ", ".join(dict.fromkeys(f.rule.id for f in group))
            lines.append(f"{label}: {len(group)} finding{'s' if len(group) > 1 else ''}{who} ({_clip(ids)})")
    return lines


def _ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    parts, start, prev = [], None, None
    for r in ranks:
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            parts.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = r
    if start is not None:
        parts.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(parts)
