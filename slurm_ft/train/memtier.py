"""The memory tier's store: snapshot files in the job's ``/dev/shm`` directory, their commit rule and the choice of
where a restart's state comes from.

Files in the job's directory (:mod:`slurm_ft.core.shmdir`; all 0600, written to a temp name and renamed):

- ``step_<N>.rank_<R>.snap``: rank R's snapshot of step N (``encode``: a JSON header line with step, rank, world
  size, allocation, epoch, payload size and sha256, then the payload the manager made);
- ``step_<N>.rank_<R>.peer_<H>``: the same bytes, a peer copy of rank R's snapshot held by rank H (on the next node
  of the ring: :func:`peer_ring`);
- ``step_<N>.rank_<R>.commit``: rank R's commit marker, written only after every rank reported its part of step N
  complete (an all-gather in the tier's own gloo group): ``{"step", "world_size", "alloc", "epoch", "peers"}``,
  ``peers`` true when every peer copy was complete too.

The epoch is a random token every attempt of the run agrees on at its start: an attempt that resumed from an older
step writes the same step numbers again, and parts of two attempts must never be mixed.

The commit rule: step N is usable when every rank of the current world has a verified copy of its part (header
and digest good, same world size and allocation) and some rank holds a commit marker of N, all of one epoch (the
marker is the evidence that the agreement happened: a rank killed between the agreement and its own marker still
has a good part); a peer copy counts only when such a marker says ``peers``. :func:`choose` applies it (pure), newest step
first; anything else falls back to disk, with the reason.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_ft.core.shmdir import PRIVATE_FILE

FORMAT = 1
_NAME = re.compile(r"step_(\d{8})\.rank_(\d{5})\.(snap|commit|peer_(\d{5}))")
MEMORY, PEER, DISK = "memory", "peer", "disk"
NOTHING = "no snapshot in memory"  # the why of a disk resume when the tier had nothing at all


class SnapshotError(Exception):
    """A snapshot file that cannot be used (the message says why, one line)."""


def snap_name(step: int, rank: int) -> str:
    return f"step_{step:08d}.rank_{rank:05d}.snap"


def peer_name(step: int, rank: int, holder: int) -> str:
    return f"step_{step:08d}.rank_{rank:05d}.peer_{holder:05d}"


def commit_name(step: int, rank: int) -> str:
    return f"step_{step:08d}.rank_{rank:05d}.commit"


@dataclasses.dataclass(frozen=True, slots=True)
class FileName:
    """A parsed tier file name: ``kind`` is "snap", "peer" or "commit"; ``holder`` the peer copy's keeper."""

    step: int
    rank: int
    kind: str
    holder: int | None = None


def parse_name(name: str) -> FileName | None:
    """The parts of a tier file name; None for anything else (temp files included)."""
    m = _NAME.fullmatch(name)
    if m is None:
        return None
    kind = "peer" if m.group(4) is not None else m.group(3)
    return FileName(int(m.group(1)), int(m.group(2)), kind, int(m.group(4)) if m.group(4) else None)


def encode(*, step: int, rank: int, world_size: int, alloc: str, epoch: str, payload: bytes) -> bytes:
    header = {"v": FORMAT, "step": step, "rank": rank, "world_size": world_size, "alloc": alloc, "epoch": epoch,
              "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    return json.dumps(header, sort_keys=True).encode() + b"\n" + payload


def decode(data: bytes) -> tuple[dict[str, Any], bytes]:
    """(header, payload) of a snapshot; SnapshotError when torn (short), foreign or its digest does not match."""
    head, sep, payload = data.partition(b"\n")
    try:
        header = json.loads(head) if sep else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("v") != FORMAT:
        raise SnapshotError("no snapshot header")
    if header.get("size") != len(payload):
        raise SnapshotError(f"torn: {len(payload)} of {header.get('size')} bytes")
    if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        raise SnapshotError("digest mismatch")
    return header, payload


def check_header(header: Mapping[str, Any], *, step: int, rank: int, world_size: int, alloc: str) -> str:
    """Why a verified snapshot does not fit this restart ("" when it does)."""
    if header.get("alloc") != alloc:
        return f"from allocation {header.get('alloc')!r}, not this one ({alloc!r})"
    if header.get("world_size") != world_size:
        return f"world size changed ({header.get('world_size')} -> {world_size})"
    if (header.get("step"), header.get("rank")) != (step, rank):
        return f"holds rank {header.get('rank')} step {header.get('step')}, named rank {rank} step {step}"
    return ""


# ---- placement ----
def peer_ring(rank_hosts: Sequence[str]) -> dict[int, tuple[int | None, int | None]]:
    """rank -> (the rank it sends its peer copy to, the rank it receives one from): the rank at the same local
    index on the next (previous) node, nodes in order of their first rank; None where that node has no such rank
    or there is one node only."""
    nodes: list[str] = []
    for host in rank_hosts:
        if host not in nodes:
            nodes.append(host)
    local = {host: [r for r, h in enumerate(rank_hosts) if h == host] for host in nodes}

    def at(host_index: int, index: int) -> int | None:
        ranks = local[nodes[host_index % len(nodes)]]
        return ranks[index] if index < len(ranks) else None

    ring: dict[int, tuple[int | None, int | None]] = {}
    for rank, host in enumerate(rank_hosts):
        if len(nodes) < 2:
            ring[rank] = (None, None)
            continue
        h, i = nodes.index(host), local[host].index(rank)
        ring[rank] = (at(h + 1, i), at(h - 1, i))
    return ring


def local_ranks(rank_hosts: Sequence[str], rank: int) -> list[int]:
    """The ranks on ``rank``'s node (itself included), in order."""
    return [r for r, h in enumerate(rank_hosts) if h == rank_hosts[rank]]


def checker(parsed: FileName, local: Sequence[int]) -> int:
    """Which rank of the node verifies a file: the rank it is about (a peer copy: its holder) when that rank is on
    this node, else one of the node's ranks by that number (so the node's files are checked once, in parallel)."""
    owner = parsed.holder if parsed.kind == "peer" else parsed.rank
    return owner if owner in local else local[owner % len(local)]


# ---- the choice of source ----
@dataclasses.dataclass(frozen=True, slots=True)
class Copy:
    """A verified copy of rank ``rank``'s part of ``step`` in the node dir of the rank that found it."""

    step: int
    rank: int
    kind: str  # "snap" or "peer"
    name: str
    epoch: str = ""


@dataclasses.dataclass(slots=True)
class Inventory:
    """What one rank found in its share of its node's files: verified copies, commit markers ((step, epoch) ->
    peers flag) and problems (one line each)."""

    copies: list[Copy] = dataclasses.field(default_factory=list)
    markers: dict[tuple[int, str], bool] = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True)
class Choice:
    """Where the restart's state comes from: ``source`` memory/peer/disk, the step (None: disk's newest),
    per rank the (holder rank, file name) to read, and why not memory when it is disk."""

    source: str
    step: int | None = None
    plan: tuple[tuple[int, str], ...] = ()
    why: str = ""


def choose(inventories: Sequence[Inventory], world_size: int, *, disk_step: int | None) -> Choice:
    """The newest step the commit rule allows (module docstring), if not older than disk's newest committed step;
    each rank's part from its own copy when it has one, else from any verified copy another rank holds."""
    markers: dict[tuple[int, str], bool] = {}
    for inv in inventories:
        for key, peers in inv.markers.items():
            markers[key] = markers.get(key, False) or peers
    steps = sorted({c.step for inv in inventories for c in inv.copies} | {s for s, _ in markers}, reverse=True)
    whys = []
    for step in steps:
        if disk_step is not None and step < disk_step:
            whys.append(f"disk step {disk_step} is newer than memory step {step}")
            break
        epochs = sorted(e for s, e in markers if s == step)
        if not epochs:
            whys.append(f"step {step}: no commit marker (torn)")
            continue
        for epoch in epochs:
            plan, missing = _plan(inventories, world_size, step, epoch, peers_ok=markers[step, epoch])
            if missing is None:
                used_peer = any(holder != rank for rank, (holder, _name) in enumerate(plan))
                return Choice(PEER if used_peer else MEMORY, step, tuple(plan))
        whys.append(f"step {step}: no verified part of rank {missing}")
    problems = sorted({p for inv in inventories for p in inv.problems})
    reasons = whys[:3] + problems[:3] or [NOTHING]
    return Choice(DISK, why="; ".join(reasons))


def _plan(inventories: Sequence[Inventory], world_size: int, step: int, epoch: str, *,
          peers_ok: bool) -> tuple[list[tuple[int, str]], int | None]:
    plan: list[tuple[int, str]] = []
    for rank in range(world_size):
        found = [(holder, c) for holder, inv in enumerate(inventories) for c in inv.copies
                 if c.step == step and c.rank == rank and c.epoch == epoch and (c.kind == "snap" or peers_ok)]
        found.sort(key=lambda hc: (hc[0] != rank, hc[1].kind != "snap", hc[0]))
        if not found:
            return plan, rank
        plan.append((found[0][0], found[0][1].name))
    return plan, None


# ---- auto spacing ----
def auto_spacing(*, step_s: float, stall_s: float, write_s: float, budget: float, mtbf_s: float = 0.0) -> int:
    """Steps between snapshots for ``auto``: Young's interval ``sqrt(2 * stall * MTBF)`` of training between them
    (``mtbf_s`` > 0: snapshots more often than that cost more stall than the work they save; a job that fails
    rarely snapshots rarely), never a stall above ``budget`` of the training time, never a snapshot before the
    previous one's background write is done, at most every step."""
    if step_s <= 0:
        return 1
    by_stall = math.ceil(stall_s / (budget * step_s)) if budget > 0 else 1
    by_write = math.ceil(write_s / step_s)
    by_rate = round(math.sqrt(2.0 * stall_s * mtbf_s) / step_s) if mtbf_s > 0 and stall_s > 0 else 1
    return max(1, min(1 << 20, max(by_stall, by_write, by_rate)))


# ---- files ----
def write_file(directory: Path, name: str, data: bytes) -> None:
    """``data`` to ``directory/name`` via a private temp file and rename; never through a symlink."""
    tmp = directory / f".tmp-{name}-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    except BaseException:
        _unlink(tmp)
        raise
    os.replace(tmp, directory / name)


def read_file(directory: Path, name: str, limit: int = -1) -> bytes:
    """A tier file's bytes (at most ``limit``; -1: all), never through a symlink."""
    fd = os.open(directory / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        return fh.read(limit)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def names(directory: Path) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except FileNotFoundError:
        return []


def retain(directory: Path, rank: int, keep_from: int) -> list[str]:
    """Remove this rank's files (its snapshots and markers, the peer copies it holds) of steps before
    ``keep_from``, and its temp files; returns the names removed."""
    gone = []
    for name in names(directory):
        parsed = parse_name(name)
        mine = parsed is not None and parsed.step < keep_from and (
            (parsed.kind != "peer" and parsed.rank == rank) or parsed.holder == rank)
        if mine or (name.startswith(".tmp-") and name.endswith(f"-{os.getpid()}")):
            _unlink(directory / name)
            gone.append(name)
    return gone


def inventory(directory: Path, rank: int, local: Sequence[int], *, world_size: int, alloc: str) -> Inventory:
    """Verify the node's tier files this rank checks (:func:`checker`)."""
    inv = Inventory()
    for name in names(directory):
        parsed = parse_name(name)
        if parsed is None or checker(parsed, local) != rank:
            continue
        try:
            data = read_file(directory, name)
        except OSError as exc:
            inv.problems.append(f"{name}: {exc.strerror or exc}")
            continue
        if parsed.kind == "commit":
            marker = _marker(data)
            if marker is not None and marker.get("alloc") == alloc and marker.get("world_size") == world_size \
                    and marker.get("step") == parsed.step:
                key = (parsed.step, str(marker.get("epoch", "")))
                inv.markers[key] = inv.markers.get(key, False) or bool(marker.get("peers"))
            continue
        try:
            header, _payload = decode(data)
        except SnapshotError as exc:
            inv.problems.append(f"{name}: {exc}")
            continue
        why = check_header(header, step=parsed.step, rank=parsed.rank, world_size=world_size, alloc=alloc)
        if why:
            inv.problems.append(f"{name}: {why}")
            continue
        inv.copies.append(Copy(parsed.step, parsed.rank, parsed.kind, name, str(header.get("epoch", ""))))
    return inv


def _marker(data: bytes) -> dict[str, Any] | None:
    try:
        marker = json.loads(data)
    except ValueError:
        return None
    return marker if isinstance(marker, dict) else None


def marker_bytes(*, step: int, world_size: int, alloc: str, epoch: str, peers: bool) -> bytes:
    return json.dumps({"step": step, "world_size": world_size, "alloc": alloc, "epoch": epoch,
                       "peers": peers}).encode()


def clear_foreign(directory: Path, alloc: str) -> list[str]:
    """At start: remove temp files left by dead processes and snapshots of another allocation (a requeued job
    keeps its id: its new allocation resumes from disk). Markers of another allocation go too."""
    gone = []
    for name in names(directory):
        path = directory / name
        if name.startswith(".tmp-"):
            pid = name.rsplit("-", 1)[-1]
            if pid.isdigit() and not _alive(int(pid)):
                _unlink(path)
                gone.append(name)
            continue
        if parse_name(name) is None:
            continue
        try:
            head = read_file(directory, name, limit=4096).partition(b"\n")[0]
            found = json.loads(head).get("alloc")
        except (OSError, ValueError, AttributeError):
            found = None
        if found != alloc:
            _unlink(path)
            gone.append(name)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
