"""The ranks' flight-recorder dumps as evidence: who never entered the collective the others wait in, who called a
different one. Pure: dicts in (``trace.rank<R>.json``, see ``slurm_ft.core.rundir``), records and clues out.

Each dump lists the collectives a rank scheduled, per process group (``process_group[0]``, the rank's own id of it:
the same on every rank when every rank made its groups in the same order, as torch requires) with a sequence
number, the op (``gloo:all_reduce`` -> ``all_reduce``), sizes, dtypes and whether it completed (NCCL's ``state``
``completed``, or ``retired``: gloo records only ``scheduled`` and retires an entry when its work ends).

A desync: in a process group, the first sequence number at which the ranks' calls differ in op, sizes or dtypes
(torch's ``MatchState`` words: ``COLLECTIVE_TYPE_MISMATCH``, ``SIZE_OR_SYNTAX_MISMATCH``,
``COLLECTIVE_DTYPE_MISMATCH``), completed or not (gloo retires a collective that failed too). The odd ranks are the
minority; a tie goes to the call this group never completed before (the normal one repeats every step).

A stall: a process group in which some rank has a collective that did not complete; ``#N`` is the lowest such. Over
the ranks that dumped:

- a rank whose last call in the group is before ``#N``: it never entered the collective the others wait in;
- a rank with no dump: it did not answer (stopped, gone, or its node not reached);
- everyone in ``#N``, none done.

A call is compared only with the same call of the other ranks. torch's own analyser
(``torch.distributed.flight_recorder``, ``Op.match``) also checks each call's own shape, and on gloo dumps it flags
clean FSDP runs (an ``all_gather`` whose recorded output sizes are not world x input); it needs ``pg_config``
memberships gloo does not record, and its loader unpickles files. ``tests/unit/classify/test_collectives.py`` checks
that its ``Op.match`` agrees with ours on the recorded desyncs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from slurm_ft.core.rundir import UNREAD_STATE, RankState

MAX_CALLS = 4096  # the newest entries of one dump that are read
_MAX_TENSORS = 64
_MAX_DIMS = 8
_MAX_NAME = 64

TYPE_MISMATCH = "COLLECTIVE_TYPE_MISMATCH"
SIZE_MISMATCH = "SIZE_OR_SYNTAX_MISMATCH"
DTYPE_MISMATCH = "COLLECTIVE_DTYPE_MISMATCH"
_STUCK_STATES = {"T": "process stopped (state T)", "t": "process stopped by a tracer (state t)",
                 "D": "process in uninterruptible sleep (state D)", "Z": "process exited (state Z)",
                 "": "process gone"}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveCall:
    """One flight-recorder entry: a collective a rank scheduled."""

    pg: str
    pg_desc: str
    seq: int
    op: str
    p2p: bool = False
    in_sizes: tuple[tuple[int, ...], ...] = ()
    out_sizes: tuple[tuple[int, ...], ...] = ()
    dtypes: frozenset[str] = frozenset()
    completed: bool = False
    created_s: float | None = None  # when the rank scheduled it (wall clock)

    def signature(self) -> tuple[Any, ...]:
        """What every rank must agree on: the op, the sizes that must match, the dtypes."""
        free = self.op.startswith("all_to_all") or self.op.endswith("_v")
        ins = None if free or self.op == "scatter" else self.in_sizes
        outs = None if free or self.op == "gather" else self.out_sizes
        return self.op, ins, outs, self.dtypes

    def text(self) -> str:
        """``all_reduce(in [[4]], out [[4]], Float)``."""
        dtypes = ",".join(sorted(self.dtypes))
        parts = [f"in {_sizes(self.in_sizes)}", f"out {_sizes(self.out_sizes)}"] + ([dtypes] if dtypes else [])
        return f"{self.op}({', '.join(parts)})"

    def where(self) -> str:
        """``#42 of process group 0 (default_pg)``."""
        desc = f" ({self.pg_desc})" if self.pg_desc and self.pg_desc != "undefined" else ""
        return f"#{self.seq} of process group {self.pg}{desc}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RankTrace:
    """One rank's dump: where it ran, when and why it dumped, its calls in record order."""

    rank: int
    host: str = ""
    time: float | None = None
    reason: str = ""
    calls: tuple[CollectiveCall, ...] = ()


def _sizes(sizes: tuple[tuple[int, ...], ...]) -> str:
    return "[" + ", ".join("[" + ", ".join(map(str, s)) + "]" for s in sizes) + "]"


# ---- parsing -----------------------------------------------------------------------------------------------------
def parse_trace(data: Any) -> RankTrace | None:
    """A ``RankTrace`` from a trace file's JSON object; None when it is not one (foreign, torn, wrong types). Entries
    of the wrong shape are skipped; only the newest ``MAX_CALLS`` are read."""
    if not isinstance(data, Mapping) or not isinstance(data.get("fr"), Mapping):
        return None
    rank = data.get("rank")
    if not _is_int(rank) or rank < 0:
        return None
    entries = data["fr"].get("entries")
    entries = entries[-MAX_CALLS:] if isinstance(entries, list) else []
    calls = tuple(call for call in (parse_call(e) for e in entries) if call is not None)
    when = data.get("time")
    return RankTrace(rank=rank, host=_name(data.get("host")), calls=calls, reason=_name(data.get("reason")),
                     time=float(when) if _is_number(when) else None)


def parse_call(entry: Any) -> CollectiveCall | None:
    """One flight-recorder entry, or None when it lacks what a call needs (group, sequence number, op)."""
    if not isinstance(entry, Mapping):
        return None
    group, name = entry.get("process_group"), entry.get("profiling_name")
    p2p = entry.get("is_p2p") is True
    seq = entry.get("p2p_seq_id" if p2p else "collective_seq_id")
    if not (isinstance(group, list) and len(group) == 2 and isinstance(name, str) and _is_int(seq)):
        return None
    created = entry.get("time_created_ns")
    state = entry.get("state")
    return CollectiveCall(
        pg=_name(group[0]), pg_desc=_name(group[1]), seq=seq, op=_name(name.split(":", 1)[-1].split(" ")[0]),
        p2p=p2p, in_sizes=_shape_list(entry.get("input_sizes")), out_sizes=_shape_list(entry.get("output_sizes")),
        dtypes=frozenset(_names(entry.get("input_dtypes")) + _names(entry.get("output_dtypes"))),
        completed=entry.get("retired") is True or state == "completed",
        created_s=created / 1e9 if _is_int(created) and created > 0 else None)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _name(value: Any) -> str:
    return str(value)[:_MAX_NAME] if isinstance(value, (str, int)) and not isinstance(value, bool) else ""


def _names(value: Any) -> list[str]:
    return [_name(v) for v in value[:_MAX_TENSORS] if isinstance(v, str)] if isinstance(value, list) else []


def _shape_list(value: Any) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list):
        return ()
    shapes = []
    for shape in value[:_MAX_TENSORS]:
        if isinstance(shape, list) and all(_is_int(d) for d in shape[:_MAX_DIMS]):
            shapes.append(tuple(shape[:_MAX_DIMS]))
    return tuple(shapes)


# ---- analysis ----------------------------------------------------------------------------------------------------
def mismatches(traces: Iterable[RankTrace]) -> list[Mismatch]:
    """The first call that differs between ranks in each process group (after a desync the rest is misaligned)."""
    by_rank = {t.rank: t for t in traces}
    found = []
    for pg in dict.fromkeys(c.pg for t in by_rank.values() for c in t.calls if not c.p2p):
        calls = {r: [c for c in t.calls if c.pg == pg and not c.p2p] for r, t in by_rank.items()}
        seqs: dict[int, dict[int, CollectiveCall]] = {}
        for rank, cs in calls.items():
            for call in cs:
                seqs.setdefault(call.seq, {}).setdefault(rank, call)
        for seq in sorted(seqs):
            mismatch = _mismatch(seqs[seq], calls) if len(seqs[seq]) > 1 else None
            if mismatch is not None:
                found.append(mismatch)
                break
    return found


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Mismatch:
    """Calls at one sequence number that differ: ``odd`` ranks called ``odd_call``, ``others`` ``other_call``.
    ``sure`` is False when a tie could not be settled (both sides are then culprits)."""

    kind: str
    odd: tuple[int, ...]
    odd_call: CollectiveCall
    others: tuple[int, ...]
    other_call: CollectiveCall
    sure: bool = True


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Stall:
    """A process group in which a collective did not complete: the calls at its lowest unfinished ``#N``."""

    call: CollectiveCall  # what the ranks waiting at #N called (the majority's call when they differ)
    waiting: tuple[int, ...]  # ranks whose #N did not complete
    absent: tuple[int, ...]  # ranks that dumped, whose last call in the group is before #N: never entered it
    silent: tuple[int, ...]  # ranks of the attempt with no dump
    last_done: CollectiveCall | None = None  # the call before #N that the waiting ranks completed
    waited_s: float | None = None  # how long the longest waiter had waited when it dumped
    mismatch: Mismatch | None = None


def stalls(traces: Iterable[RankTrace], ranks: Iterable[int] = ()) -> list[Stall]:
    """Every stalled process group, the one most ranks wait in first (a group a background thread uses, the
    checkpoint's, may lag legitimately); then one with ranks that never entered, then with ranks that did not
    answer; then the default group. ``ranks``: all ranks of the attempt (those without a dump are ``silent``)."""
    by_rank = {t.rank: t for t in traces}
    silent = tuple(sorted(set(ranks) - set(by_rank)))
    found = []
    for pg in dict.fromkeys(c.pg for t in by_rank.values() for c in t.calls if not c.p2p):
        calls = {r: [c for c in t.calls if c.pg == pg and not c.p2p] for r, t in by_rank.items()}
        calls = {r: cs for r, cs in calls.items() if cs}
        stall = _stall(calls, by_rank, silent if len(calls) == len(by_rank) else ())
        if stall is not None:
            found.append(stall)
    return sorted(found, key=lambda s: (-len(s.waiting), not s.absent, not s.silent, s.call.pg_desc != "default_pg"))


def _stall(calls: dict[int, list[CollectiveCall]], traces: Mapping[int, RankTrace],
           silent: tuple[int, ...]) -> Stall | None:
    pending = [c.seq for cs in calls.values() for c in cs if not c.completed]
    if not pending:
        return None
    seq = min(pending)
    at = {r: next(c for c in cs if c.seq == seq) for r, cs in calls.items() if any(c.seq == seq for c in cs)}
    waiting = tuple(sorted(r for r, c in at.items() if not c.completed))
    mismatch = _mismatch(at, calls)
    call = mismatch.other_call if mismatch is not None else at[waiting[0]]
    done = [c for r in waiting for c in calls[r] if c.seq < seq and c.completed]
    waited = [traces[r].time - at[r].created_s for r in waiting
              if traces[r].time is not None and at[r].created_s is not None]
    absent = tuple(sorted(r for r, cs in calls.items() if r not in at and max(c.seq for c in cs) < seq))
    return Stall(call=call, waiting=waiting, absent=absent, silent=silent,
                 last_done=max(done, key=lambda c: c.seq) if done else None,
                 waited_s=max(waited) if waited else None, mismatch=mismatch)


def _mismatch(at: dict[int, CollectiveCall], calls: dict[int, list[CollectiveCall]]) -> Mismatch | None:
    groups: dict[tuple[Any, ...], list[int]] = {}
    for rank in sorted(at):
        groups.setdefault(at[rank].signature(), []).append(rank)
    if len(groups) < 2:
        return None
    seq = next(iter(at.values())).seq
    seen = {c.signature() for cs in calls.values() for c in cs if c.completed and c.seq < seq}
    ordered = sorted(groups.items(), key=lambda g: (-len(g[1]), g[0] not in seen, g[1][0]))
    (top_sig, top), (next_sig, nxt) = ordered[0], ordered[1]
    sure = len(top) > len(nxt) or ((top_sig in seen) != (next_sig in seen))
    odd = sorted(r for _, ranks in ordered[1:] for r in ranks) if sure else sorted(at)
    other, odd_call = at[top[0]], at[nxt[0]]
    return Mismatch(kind=_kind(odd_call, other), odd=tuple(odd), odd_call=odd_call, others=tuple(top),
                    other_call=other, sure=sure)


def _kind(a: CollectiveCall, b: CollectiveCall) -> str:
    if a.op != b.op:
        return TYPE_MISMATCH
    if a.signature()[1:3] != b.signature()[1:3]:
        return SIZE_MISMATCH
    return DTYPE_MISMATCH


# ---- clues for the classifier --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Clue:
    """What the traces say, for one finding: ``kind`` (desync, never_entered, silent, silent_stuck, network,
    all_waiting), the ranks it blames (none: context only), the node, the evidence line."""

    kind: str
    text: str
    ranks: tuple[int, ...] = ()
    node: str = ""
    sure: bool = True


def clues(traces: Sequence[RankTrace], states: Sequence[RankState] = (), *, hung: bool = False) -> list[Clue]:
    """The clues of an attempt's dumps: desyncs always; for a hung attempt (``hung``; ``states``: every rank as its
    node saw it) also who the others waited for."""
    found = [_desync_clue(m, traces) for m in mismatches(traces)]
    found_stalls = stalls(traces, (s.rank for s in states))
    if hung and not found and found_stalls:  # a desync explains the hang
        found += _hang_clues(found_stalls[0], traces, states)
    return found


def _hosts(traces: Sequence[RankTrace], states: Sequence[RankState] = ()) -> dict[int, str]:
    hosts = {s.rank: s.host for s in states if s.host}
    hosts.update({t.rank: t.host for t in traces if t.host})
    return hosts


def _who(ranks: Sequence[int], hosts: Mapping[int, str]) -> str:
    nodes = sorted({hosts[r] for r in ranks if hosts.get(r)})
    where = f" ({', '.join(nodes)})" if nodes else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {ranges(ranks)}{where}"


def _desync_clue(m: Mismatch, traces: Sequence[RankTrace]) -> Clue:
    hosts = _hosts(traces)
    text = (f"{_who(m.odd if m.sure else [r for r in m.odd if r not in m.others], hosts)} called "
            f"{m.odd_call.text()} as collective {m.odd_call.where()} where {_who(m.others, hosts)} called "
            f"{m.other_call.text()}: a desync in the training code ({m.kind}); every restart repeats it "
            "[flight recorder]")
    nodes = {hosts.get(r, "") for r in m.odd}
    return Clue(kind="desync", text=text, ranks=m.odd, node=nodes.pop() if len(nodes) == 1 else "", sure=m.sure)


def _waited(stall: Stall) -> str:
    return f" for {stall.waited_s:.1f} s" if stall.waited_s is not None and stall.waited_s >= 0 else ""


def _hang_clues(stall: Stall, traces: Sequence[RankTrace], states: Sequence[RankState]) -> list[Clue]:
    hosts = _hosts(traces, states)
    verb = "wait" if len(stall.waiting) > 1 else "waits"
    waiters = f"{_who(stall.waiting, hosts)} {verb} in {stall.call.op} {stall.call.where()}{_waited(stall)}"
    last = stall.last_done
    if stall.absent:
        mine = {t.rank: [c for c in t.calls if c.pg == stall.call.pg and not c.p2p] for t in traces}
        return [Clue(kind="never_entered", ranks=(r,), node=hosts.get(r, ""),
                     text=f"{_who([r], hosts)}: never entered {stall.call.op} {stall.call.where()}, which "
                          f"{_who(stall.waiting, hosts)} {verb} in{_waited(stall)}; its last collective there: "
                          f"{_last(mine.get(r))} [flight recorder]")
                for r in stall.absent]
    if stall.silent:
        return _silent_clues(stall, waiters, last, hosts, {s.rank: s for s in states})
    return [Clue(kind="all_waiting", text=f"all {len(stall.waiting)} ranks entered {stall.call.op} "
                                          f"{stall.call.where()} and none completed it{_waited(stall)} "
                                          "[flight recorder]")]


def _last(calls: Sequence[CollectiveCall] | None) -> str:
    if not calls:
        return "none recorded"
    call = calls[-1]
    return f"{call.op} #{call.seq}, {'completed' if call.completed else 'not completed'}"


def _silent_clues(stall: Stall, waiters: str, last: CollectiveCall | None, hosts: Mapping[int, str],
                  states: Mapping[int, RankState]) -> list[Clue]:
    done = f"; the last collective there every rank completed: {last.op} #{last.seq}" if last else ""
    unread = [r for r in stall.silent if r in states and states[r].state == UNREAD_STATE]
    nodes = {hosts.get(r, "") for r in stall.silent}
    if unread == list(stall.silent) and len(nodes) == 1 and "" not in nodes and stall.waiting:
        node = nodes.pop()
        text = (f"{node}: {_who(stall.silent, {})} did not answer (the node's helper did not report) while "
                f"{waiters} and none completed it{done}: {node}'s network, or the node [flight recorder]")
        return [Clue(kind="network", text=text, ranks=stall.silent, node=node)]
    why = {rank: _stuck(states.get(rank)) for rank in stall.silent}
    stuck = [rank for rank in stall.silent if why[rank]]  # when some are stuck, the others' silence says little
    return [Clue(kind="silent_stuck" if why[rank] else "silent", ranks=(rank,), node=hosts.get(rank, ""),
                 text=f"{_who([rank], hosts)}: no flight-recorder dump ({why[rank] or 'did not answer'}) while "
                      f"{waiters}{done} [flight recorder]")
            for rank in (stuck or stall.silent)]


def _stuck(state: RankState | None) -> str:
    """Why a rank cannot answer, from its node's view: "" when nothing says it is stuck."""
    if state is None or state.state == UNREAD_STATE:
        return ""
    if state.state in _STUCK_STATES:
        return _STUCK_STATES[state.state]
    return "liveness beat stopped" if state.live is False else ""


# ---- one line per rank group (slurm-ft report) ---------------------------------------------------------------------
def positions(traces: Sequence[RankTrace], ranks: Iterable[int] = (), states: Sequence[RankState] = ()) -> list[str]:
    """Where every rank was in the most telling stalled process group, one line per group of ranks in the same place:
    ``ranks 0,2-3: waiting in all_gather #42 of process group 0 (default_pg) for 12.0 s``; a rank without a dump
    with why, as its node saw it (``states``). Empty: no stall."""
    all_ranks = sorted(set(ranks) | {t.rank for t in traces} | {s.rank for s in states})
    found = stalls(traces, all_ranks)
    if not found:
        return []
    stall, by_rank, state_of = found[0], {t.rank: t for t in traces}, {s.rank: s for s in states}
    places: dict[str, list[int]] = {}
    for rank in all_ranks:
        places.setdefault(_place(stall, by_rank.get(rank), state_of.get(rank)), []).append(rank)
    return [f"{'ranks' if len(rs) > 1 else 'rank'} {ranges(rs)}: {place}" for place, rs in places.items()]


def _place(stall: Stall, trace: RankTrace | None, state: RankState | None) -> str:
    if trace is None:
        return f"no dump ({_stuck(state) or 'did not answer'})"
    calls = [c for c in trace.calls if c.pg == stall.call.pg and not c.p2p]
    at = next((c for c in calls if c.seq == stall.call.seq), None)
    if at is None:
        return f"not in {stall.call.where()}: last {_last(calls)}"
    state = "completed" if at.completed else "waiting in"
    return f"{state} {at.text() if stall.mismatch else at.op} {at.where()}" + (
        _waited(dataclasses.replace(stall, waited_s=trace.time - at.created_s))
        if not at.completed and trace.time is not None and at.created_s is not None else "")


def ranges(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    parts: list[tuple[int, int]] = []
    for r in sorted(set(ranks)):
        if parts and parts[-1][1] == r - 1:
            parts[-1] = (parts[-1][0], r)
        else:
            parts.append((r, r))
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in parts)
