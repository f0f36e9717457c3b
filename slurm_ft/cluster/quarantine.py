"""Node quarantine: a SQLite store (WAL, safe for concurrent prolog, epilog and monitor writers) and the policy.

States (``NodeState``)::

    healthy --soft strikes >= suspect_after--> suspect --soft strikes >= quarantine_after--> quarantined
    healthy/suspect --hardware strike--> quarantined          probation --any node strike--> quarantined
    quarantined --health check passed, >= min_quarantine_s--> probation --probation_s without strikes--> healthy
    any --admin release--> healthy                            suspect --strikes age out of the window--> healthy

Soft strikes (``network``, ``hang``, ``unknown`` by default) count within ``strike_window_s`` since the last
release: a node that keeps failing jobs for unclear reasons is a "lemon". Other categories (``user_code`` ...)
are recorded as history and change nothing.

Entering ``quarantined`` drains the node in Slurm with ``slurm-ft: <category>: <evidence>``; leaving it resumes
the node. A drain reason that does not start with ``slurm-ft:`` belongs to someone else: it is never
overwritten and never lifted. Decisions are made inside one ``BEGIN IMMEDIATE`` transaction, so concurrent
writers cannot both miss (or both make) a transition; Slurm is called after the commit.

Trust: strikes come only from the node's own evidence (NVML, kernel log, Slurm's node state, the prolog's
probes); a job's files and Comment never strike a node. A store that is not a database raises ``StoreCorrupt``
(with how to repair it): the prolog then skips the store, never the node's own checks, and drains nothing for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import os
import pwd
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from slurm_ft.core.comment import TAG  # the one tag: every drain reason slurm-ft sets starts with it
from slurm_ft.core.config import require
from slurm_ft.core.errors import SlurmFtError
from slurm_ft.core.taxonomy import Category
from slurm_ft.slurm.types import NodeInfo, SlurmClient

log = logging.getLogger(__name__)

DB_NAME = "quarantine.db"
_SCHEMA_VERSION = 1


class NodeState(str, enum.Enum):
    """Where a node stands with slurm-ft (see the module docstring for the transitions)."""

    HEALTHY = "healthy"  # in service, no recent strikes that matter
    SUSPECT = "suspect"  # in service, repeated soft failures within the window: one more may quarantine it
    QUARANTINED = "quarantined"  # drained in Slurm by slurm-ft (or held back: the prolog refuses jobs)
    PROBATION = "probation"  # back in service after a passing health check; any strike sends it back


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QuarantineConfig:
    """``[quarantine]``: the lemon-detection and release policy."""

    strike_window_s: float = 86_400.0
    """Soft strikes older than this many seconds do not count."""
    suspect_after: int = 2
    """Soft strikes within the window that make a node suspect."""
    quarantine_after: int = 3
    """Soft strikes within the window that quarantine it (drain, tagged ``slurm-ft:``)."""
    min_quarantine_s: float = 300.0
    """A passing health check releases a quarantined node to probation only after this many seconds."""
    probation_s: float = 3_600.0
    """Strike-free seconds on probation before a node is healthy again."""
    hardware_categories: tuple[str, ...] = (Category.HARDWARE_GPU.value, Category.HARDWARE_NODE.value)
    """Categories whose node-attested evidence quarantines a node at once (one strike is enough)."""
    soft_categories: tuple[str, ...] = (Category.NETWORK.value, Category.HANG.value, Category.UNKNOWN.value)
    """Categories that give a soft strike: a node is quarantined only after ``quarantine_after`` of them."""
    reason_max_chars: int = 200
    """Drain reasons are cut to this length."""
    slurm_user: str = ""
    """Who besides root may change the quarantine; empty: the SlurmUser from ``scontrol show config``."""

    def __post_init__(self) -> None:
        for name in ("strike_window_s", "min_quarantine_s", "probation_s"):
            value = getattr(self, name)
            require(isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0, name,
                    f"must be a non-negative number of seconds, got {value!r}")
        for name in ("suspect_after", "quarantine_after"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, name,
                    f"must be a positive integer, got {value!r}")
        require(self.suspect_after <= self.quarantine_after, "suspect_after",
                f"must not exceed quarantine_after ({self.suspect_after} > {self.quarantine_after})")
        for name in ("hardware_categories", "soft_categories"):
            values = getattr(self, name)
            require(isinstance(values, (list, tuple)), name, f"must be a list of categories, got {values!r}")
            known = {c.value for c in Category}
            bad = [v for v in values if v not in known]
            require(not bad, name, f"unknown category {bad[0]!r} (known: {', '.join(sorted(known))})" if bad else "")
            object.__setattr__(self, name, tuple(values))
        overlap = set(self.hardware_categories) & set(self.soft_categories)
        require(not overlap, "soft_categories", f"{sorted(overlap)} also listed in hardware_categories")
        require(isinstance(self.reason_max_chars, int) and self.reason_max_chars >= 40, "reason_max_chars",
                f"must be an integer >= 40, got {self.reason_max_chars!r}")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Strike:
    node: str
    time: float
    category: str
    evidence: str
    job_id: int | None = None
    source: str = ""  # who recorded it: prolog, epilog, monitor, admin


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HistoryEntry:
    node: str
    time: float
    from_state: str
    to_state: str
    actor: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeRecord:
    """One node's standing. ``drained``: Slurm holds our drain for it (False while the drain is pending)."""

    node: str
    state: NodeState
    since: float
    category: str = ""
    reason: str = ""
    drained: bool = False
    recent_strikes: int = 0  # soft strikes inside the window since the last release

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "state": self.state.value}


_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    node TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    since REAL NOT NULL,
    category TEXT NOT NULL DEFAULT '',
    reason TEXT NOT NULL DEFAULT '',
    drained INTEGER NOT NULL DEFAULT 0,
    counted_after INTEGER NOT NULL DEFAULT 0  -- strikes up to this id were forgiven by a release
);
CREATE TABLE IF NOT EXISTS strikes (
    id INTEGER PRIMARY KEY,
    node TEXT NOT NULL,
    time REAL NOT NULL,
    category TEXT NOT NULL,
    evidence TEXT NOT NULL,
    job_id INTEGER,
    source TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS strikes_by_node ON strikes (node, time);
CREATE TABLE IF NOT EXISTS history (
    id INTEGER PRIMARY KEY,
    node TEXT NOT NULL,
    time REAL NOT NULL,
    from_state TEXT NOT NULL,
    to_state TEXT NOT NULL,
    actor TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS history_by_node ON history (node, time);
"""


class StoreCorrupt(SlurmFtError):
    """The quarantine store is not a readable database. The node's own checks still decide; nothing is drained
    because of it. The message says how to repair it."""

    def __init__(self, path: Path, exc: BaseException) -> None:
        super().__init__(f"quarantine store {str(path)!r} is unreadable ({exc}): quarantine decisions are off "
                         f"until it is repaired; the node's own health checks still decide. Repair: "
                         f"mv {path} {path}.corrupt (slurm-ft starts a new store; re-add quarantined nodes with "
                         "`slurm-ft quarantine add`)")


class QuarantineStore:
    """The SQLite file. Each operation opens a short connection (fork- and thread-safe), WAL, busy timeout."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_s: float = 15.0) -> None:
        self.path = Path(path)
        self._timeout = busy_timeout_s
        self._ready = False

    @contextlib.contextmanager
    def connect(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        """A connection inside one transaction (``BEGIN IMMEDIATE`` when ``write``), committed on success."""
        if write and not self._ready:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        if not write and not self.path.exists():
            raise SlurmFtError(f"quarantine store {str(self.path)!r} does not exist")
        conn = self._open(write)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
            if write and not self._ready:
                self._initialise(conn)
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError):
                raise SlurmFtError(f"quarantine store {str(self.path)!r}: {exc}") from exc
            raise StoreCorrupt(self.path, exc) from exc
        except sqlite3.Error as exc:
            raise SlurmFtError(f"quarantine store {str(self.path)!r}: {exc}") from exc
        finally:
            conn.close()

    def _open(self, write: bool) -> sqlite3.Connection:
        """A connection; an unprivileged reader (no write access to the WAL files) reads the last checkpoint."""
        try:
            conn = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None)
            if not write:
                conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
            return conn
        except sqlite3.OperationalError as exc:
            if write or os.access(self.path.parent, os.W_OK):
                raise SlurmFtError(f"quarantine store {str(self.path)!r}: {exc}") from exc
            uri = f"file:{self.path}?mode=ro&immutable=1"
            return sqlite3.connect(uri, uri=True, timeout=self._timeout, isolation_level=None)
        except sqlite3.DatabaseError as exc:  # not a database at all: corrupt, truncated, overwritten
            raise StoreCorrupt(self.path, exc) from exc

    def _initialise(self, conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        if conn.execute("PRAGMA user_version").fetchone()[0] < _SCHEMA_VERSION:
            conn.executescript(f"BEGIN IMMEDIATE; {_SCHEMA} PRAGMA user_version = {_SCHEMA_VERSION}; COMMIT;")
        self._ready = True


def drain_reason(category: str, evidence: str, max_chars: int = 200) -> str:
    """``slurm-ft: <category>: <evidence>`` on one line, cut to ``max_chars`` with an ellipsis."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in evidence).split())
    text = f"{TAG} {category}: {flat}" if flat else f"{TAG} {category}"
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def category_of_reason(reason: str) -> str:
    """The category in a ``slurm-ft: <category>: ...`` drain reason, or ``unknown``."""
    head = reason[len(TAG):].strip().split(":", 1)[0].strip()
    return head if head in {c.value for c in Category} else Category.UNKNOWN.value


class Quarantine:
    """The policy over a store; drains/resumes through ``client`` (None: record only, e.g. where no Slurm)."""

    def __init__(self, store: QuarantineStore, config: QuarantineConfig | None = None,
                 client: SlurmClient | None = None, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.config = config or QuarantineConfig()
        self.client = client
        self.clock = clock

    # --- public API --------------------------------------------------------------------------------------
    def strike(self, node: str, category: Category | str, evidence: str, job_id: int | None = None,
               *, source: str = "monitor") -> NodeState:
        """Record a strike against ``node`` and apply the policy; drains the node if it becomes quarantined."""
        cat = Category(category).value
        now = self.clock()
        with self.store.connect(write=True) as conn:
            row = self._settled(conn, node, now)
            conn.execute("INSERT INTO strikes (node, time, category, evidence, job_id, source) VALUES (?,?,?,?,?,?)",
                         (node, now, cat, evidence, job_id, source))
            recent = self._recent_soft(conn, node, row, now)
            new = self._decide(NodeState(row["state"]), cat, recent)
            reason = drain_reason(cat, evidence, self.config.reason_max_chars)
            if new is not NodeState(row["state"]):
                self._move(conn, node, row, new, now, actor=source, reason=reason, category=cat)
        if new is NodeState.QUARANTINED and NodeState(row["state"]) is not NodeState.QUARANTINED:
            self._apply_drain(node, reason)
        return new

    def add(self, node: str, reason: str, *, category: Category | str = Category.UNKNOWN,
            by: str = "admin", job_id: int | None = None) -> NodeState:
        """Quarantine ``node`` now, whatever the policy says (admin or prolog); drains it."""
        cat = Category(category).value
        now = self.clock()
        text = drain_reason(cat, reason, self.config.reason_max_chars)
        with self.store.connect(write=True) as conn:
            row = self._settled(conn, node, now)
            conn.execute("INSERT INTO strikes (node, time, category, evidence, job_id, source) VALUES (?,?,?,?,?,?)",
                         (node, now, cat, reason, job_id, by))
            was = NodeState(row["state"])
            if was is not NodeState.QUARANTINED:
                self._move(conn, node, row, NodeState.QUARANTINED, now, actor=by, reason=text, category=cat)
        if was is not NodeState.QUARANTINED:
            self._apply_drain(node, text)
        return NodeState.QUARANTINED

    def release(self, node: str, *, by: str = "admin") -> NodeState:
        """Put ``node`` back in service now: healthy, strikes no longer count, our drain lifted."""
        now = self.clock()
        with self.store.connect(write=True) as conn:
            row = self._settled(conn, node, now)
            self._move(conn, node, row, NodeState.HEALTHY, now, actor=by, reason="released", reset=True)
        self._apply_resume(node)  # also lifts a slurm-ft drain the store never heard of; never a foreign one
        return NodeState.HEALTHY

    def health_passed(self, node: str, *, by: str = "health-check") -> NodeState:
        """A health check passed on ``node``: a quarantined node past ``min_quarantine_s`` goes to probation."""
        now = self.clock()
        with self.store.connect(write=True) as conn:
            row = self._settled(conn, node, now)
            state = NodeState(row["state"])
            if state is NodeState.QUARANTINED and now - row["since"] >= self.config.min_quarantine_s:
                self._move(conn, node, row, NodeState.PROBATION, now, actor=by, reason="health check passed",
                           reset=True)
                state = NodeState.PROBATION
                resume = True
            else:
                resume = False
        if resume:
            self._apply_resume(node)
        return state

    def state(self, node: str) -> NodeState:
        return self.record(node).state

    def is_quarantined(self, node: str) -> bool:
        return self.state(node) is NodeState.QUARANTINED

    def record(self, node: str) -> NodeRecord:
        """``node``'s standing now (a node never seen is healthy)."""
        now = self.clock()
        with self._reader() as conn:
            if conn is None:
                return NodeRecord(node=node, state=NodeState.HEALTHY, since=0.0)
            return self._record(conn, self._settle_view(conn, self._row(conn, node), now), now)

    def list(self) -> list[NodeRecord]:  # noqa: A003 - the API name the monitor uses
        """Every node slurm-ft has an opinion on, sorted by name."""
        now = self.clock()
        with self._reader() as conn:
            if conn is None:
                return []
            rows = conn.execute("SELECT * FROM nodes ORDER BY node").fetchall()
            return [self._record(conn, self._settle_view(conn, dict(r), now), now) for r in rows]

    def strikes(self, node: str, limit: int = 50) -> list[Strike]:
        with self._reader() as conn:
            if conn is None:
                return []
            rows = conn.execute("SELECT * FROM strikes WHERE node = ? ORDER BY time DESC, id DESC LIMIT ?",
                                (node, limit)).fetchall()
        return [Strike(node=r["node"], time=r["time"], category=r["category"], evidence=r["evidence"],
                       job_id=r["job_id"], source=r["source"]) for r in rows]

    def history(self, node: str, limit: int = 50) -> list[HistoryEntry]:
        with self._reader() as conn:
            if conn is None:
                return []
            rows = conn.execute("SELECT * FROM history WHERE node = ? ORDER BY time DESC, id DESC LIMIT ?",
                                (node, limit)).fetchall()
        return [HistoryEntry(node=r["node"], time=r["time"], from_state=r["from_state"], to_state=r["to_state"],
                             actor=r["actor"], reason=r["reason"]) for r in rows]

    def reconcile(self) -> list[str]:
        """Bring store and Slurm into line (the monitor calls this each poll); returns what it changed.

        - a node drained with a ``slurm-ft:`` reason the store does not hold (e.g. set by a prolog that could
          not reach the store) becomes quarantined;
        - a quarantined node whose drain we placed but which was resumed outside slurm-ft is released
          (the admin's ``scontrol update state=resume`` wins);
        - a quarantined node whose drain is still pending (failed before, or a foreign drain was lifted) is
          drained again.
        """
        if self.client is None:
            return []
        live = {n.name: n for n in self.client.nodes()}
        changes = []
        by_node = {r.node: r for r in self.list()}
        for name, info in live.items():
            ours = info.drained and info.reason.startswith(TAG)
            rec = by_node.get(name)
            if ours and (rec is None or rec.state is not NodeState.QUARANTINED):
                self._adopt(name, info)
                changes.append(f"{name}: adopted drain {info.reason!r}")
            elif rec is not None and rec.state is NodeState.QUARANTINED and not info.drained:
                if rec.drained:
                    self.release(name, by="slurm (resumed outside slurm-ft)")
                    changes.append(f"{name}: released (resumed outside slurm-ft)")
                elif self._apply_drain(name, rec.reason, live=info):
                    changes.append(f"{name}: drained {rec.reason!r}")
        return changes

    # --- policy (pure) -----------------------------------------------------------------------------------
    def _decide(self, state: NodeState, category: str, recent_soft: int) -> NodeState:
        cfg = self.config
        node_fault = category in cfg.hardware_categories or category in cfg.soft_categories
        if state is NodeState.QUARANTINED:
            return state
        if category in cfg.hardware_categories or (state is NodeState.PROBATION and node_fault):
            return NodeState.QUARANTINED
        if category in cfg.soft_categories:
            if recent_soft >= cfg.quarantine_after:
                return NodeState.QUARANTINED
            if recent_soft >= cfg.suspect_after:
                return NodeState.SUSPECT
        return state

    # --- store helpers -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection | None]:
        if not self.store.path.exists():
            yield None
            return
        with self.store.connect(write=False) as conn:
            yield conn

    @staticmethod
    def _row(conn: sqlite3.Connection, node: str) -> dict[str, Any]:
        row = conn.execute("SELECT * FROM nodes WHERE node = ?", (node,)).fetchone()
        if row is None:
            return {"node": node, "state": NodeState.HEALTHY.value, "since": 0.0, "category": "", "reason": "",
                    "drained": 0, "counted_after": 0, "new": True}
        return dict(row)

    def _settled(self, conn: sqlite3.Connection, node: str, now: float) -> dict[str, Any]:
        """The node's row with time-based transitions (probation over, strikes aged out) written back."""
        row = self._row(conn, node)
        view = self._settle_view(conn, row, now)
        if view["state"] != row["state"]:
            reason = "probation passed" if row["state"] == NodeState.PROBATION.value else "strikes aged out"
            self._move(conn, node, row, NodeState(view["state"]), now, actor="policy", reason=reason)
            return self._row(conn, node)
        return row

    def _settle_view(self, conn: sqlite3.Connection, row: dict[str, Any], now: float) -> dict[str, Any]:
        state = NodeState(row["state"])
        if state is NodeState.PROBATION and now - row["since"] >= self.config.probation_s:
            return {**row, "state": NodeState.HEALTHY.value}
        if state is NodeState.SUSPECT and self._recent_soft(conn, row["node"], row, now) < self.config.suspect_after:
            return {**row, "state": NodeState.HEALTHY.value}
        return row

    def _recent_soft(self, conn: sqlite3.Connection, node: str, row: dict[str, Any], now: float) -> int:
        marks = ",".join("?" * len(self.config.soft_categories)) or "''"
        sql = f"SELECT COUNT(*) FROM strikes WHERE node = ? AND time >= ? AND id > ? AND category IN ({marks})"
        args = (node, now - self.config.strike_window_s, row["counted_after"], *self.config.soft_categories)
        return int(conn.execute(sql, args).fetchone()[0])

    def _record(self, conn: sqlite3.Connection, row: dict[str, Any], now: float) -> NodeRecord:
        return NodeRecord(node=row["node"], state=NodeState(row["state"]), since=row["since"],
                          category=row["category"], reason=row["reason"], drained=bool(row["drained"]),
                          recent_strikes=self._recent_soft(conn, row["node"], row, now))

    @staticmethod
    def _move(conn: sqlite3.Connection, node: str, row: dict[str, Any], new: NodeState, now: float, *,
              actor: str, reason: str, category: str = "", reset: bool = False) -> None:
        counted_after = row["counted_after"]
        if reset:
            counted_after = conn.execute("SELECT COALESCE(MAX(id), 0) FROM strikes").fetchone()[0]
        keep = new is NodeState.QUARANTINED
        conn.execute(
            "INSERT INTO nodes (node, state, since, category, reason, drained, counted_after) VALUES (?,?,?,?,?,0,?) "
            "ON CONFLICT(node) DO UPDATE SET state=excluded.state, since=excluded.since, category=excluded.category, "
            "reason=excluded.reason, drained=excluded.drained, counted_after=excluded.counted_after",
            (node, new.value, now, category if keep else "", reason if keep else "", counted_after))
        conn.execute("INSERT INTO history (node, time, from_state, to_state, actor, reason) VALUES (?,?,?,?,?,?)",
                     (node, now, row["state"], new.value, actor, reason))

    def _note(self, node: str, reason: str, *, drained: bool | None = None) -> None:
        with self.store.connect(write=True) as conn:
            row = self._row(conn, node)
            if drained is not None and not row.get("new"):
                conn.execute("UPDATE nodes SET drained = ? WHERE node = ?", (int(drained), node))
            conn.execute("INSERT INTO history (node, time, from_state, to_state, actor, reason) VALUES (?,?,?,?,?,?)",
                         (node, self.clock(), row["state"], row["state"], "slurm", reason))

    def _adopt(self, node: str, info: NodeInfo) -> None:
        now = self.clock()
        with self.store.connect(write=True) as conn:
            row = self._settled(conn, node, now)
            self._move(conn, node, row, NodeState.QUARANTINED, now, actor="slurm", reason=info.reason,
                       category=category_of_reason(info.reason))
            conn.execute("UPDATE nodes SET drained = 1 WHERE node = ?", (node,))

    # --- Slurm side effects (after commit) ---------------------------------------------------------------
    def _live(self, node: str) -> NodeInfo | None:
        return next((n for n in self.client.nodes() if n.name == node), None) if self.client else None

    def _apply_drain(self, node: str, reason: str, *, live: NodeInfo | None = None) -> bool:
        """Drain ``node`` with ``reason`` unless someone else's drain is in place; True when our drain holds."""
        if self.client is None:
            return False
        try:
            outcome = drain_tagged(self.client, node, reason, live=live)
        except SlurmFtError as exc:
            log.error("quarantine: could not drain %s: %s", node, exc)
            self._note(node, f"drain failed: {exc}")
            return False
        held = outcome in (DrainOutcome.DRAINED, DrainOutcome.ALREADY_OURS)
        self._note(node, f"{outcome.value}: {reason}" if held else f"drain skipped: {outcome.value}",
                   drained=True if held else None)
        return held

    def _apply_resume(self, node: str) -> bool:
        """Resume ``node`` if its drain is ours; a foreign drain reason stays as it is."""
        if self.client is None:
            return False
        try:
            info = self._live(node)
            if info is None or not (info.drained or info.down):
                return False
            if not info.reason.startswith(TAG):
                self._note(node, f"resume skipped: foreign reason {info.reason!r}")
                return False
            self.client.resume(node)
        except SlurmFtError as exc:
            log.error("quarantine: could not resume %s: %s", node, exc)
            self._note(node, f"resume failed: {exc}")
            return False
        self._note(node, "resumed")
        return True


class DrainOutcome(str, enum.Enum):
    """What ``drain_tagged`` did."""

    DRAINED = "drained"
    ALREADY_OURS = "already drained by slurm-ft"
    FOREIGN = "keeps a drain reason slurm-ft did not set"
    UNKNOWN_NODE = "node unknown to Slurm"


def drain_tagged(client: SlurmClient, node: str, reason: str, *, live: NodeInfo | None = None) -> DrainOutcome:
    """Drain ``node`` with a ``slurm-ft:`` reason, never over a reason someone else set. Raises SlurmFtError."""
    if not reason.startswith(TAG):
        raise ValueError(f"drain reason must start with {TAG!r}: {reason!r}")
    info = live or next((n for n in client.nodes() if n.name == node), None)
    if info is None:
        return DrainOutcome.UNKNOWN_NODE
    if (info.drained or info.down) and info.reason and not info.reason.startswith(TAG):
        return DrainOutcome.FOREIGN
    if info.drained and info.reason.startswith(TAG):
        return DrainOutcome.ALREADY_OURS
    client.drain(node, reason)
    return DrainOutcome.DRAINED


def default_db_path(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / DB_NAME


def parse_slurm_user(show_config: str) -> str | None:
    """``SlurmUser`` from ``scontrol show config`` text (``SlurmUser = slurm(64030)``), or None."""
    for line in show_config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "SlurmUser" and value.strip():
            return value.strip().split("(", 1)[0].strip()
    return None


def require_privileged(slurm_user: str | None, *, euid: int | None = None, action: str = "changing quarantine",
                       hint: str = "") -> None:
    """Raise unless the caller is root or ``slurm_user``: only they may drain, resume or requeue."""
    uid = os.geteuid() if euid is None else euid
    if uid == 0:
        return
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    if slurm_user and name == slurm_user:
        return
    who = f"root or SlurmUser {slurm_user!r}" if slurm_user else "root or the SlurmUser"
    raise SlurmFtError(f"{action} needs {who}; you are {name!r}{hint}", exit_code=77)
