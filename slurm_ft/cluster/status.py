"""``slurm-ft status``: what the monitor knows, from its SQLite state (read-only; no Slurm calls)."""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path
from typing import Any

from slurm_ft.cluster.monitor import DB_NAME
from slurm_ft.core import config as ft_config
from slurm_ft.core.errors import SlurmFtError


def read_status(state_dir: Path, *, actions: int = 20) -> dict[str, Any]:
    """``{"jobs": [...], "actions": [...]}`` from ``<state_dir>/monitor.db`` (newest first)."""
    path = Path(state_dir) / DB_NAME
    if not path.is_file():
        raise SlurmFtError(f"status: no monitor state at {path} (has `slurm-ft monitor` run with this --state-dir?)")
    try:
        jobs, acts = _read(path, actions, immutable=False)
    except sqlite3.OperationalError as exc:
        # A stopped monitor leaves no -wal/-shm; a reader that may not create them in the root-owned state dir
        # (any non-root user) reads the file as it is: with no -wal nothing is left out.
        if Path(f"{path}-wal").exists() or "readonly" not in str(exc) and "unable to open" not in str(exc):
            raise SlurmFtError(f"status: cannot read {path}: {exc}") from exc
        jobs, acts = _read(path, actions, immutable=True)
    for act in acts:
        act["detail"] = json.loads(act["detail"])
    return {"jobs": jobs, "actions": acts, "quarantine_store": quarantine_store_problem(Path(state_dir))}


def quarantine_store_problem(state_dir: Path) -> str:
    """"" when the quarantine store beside the monitor's state reads (or does not exist yet), else the problem
    and how to repair it (``StoreCorrupt``'s message)."""
    from slurm_ft.cluster.quarantine import StoreCorrupt, default_db_path

    path = default_db_path(state_dir)
    if not path.exists():
        return ""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True, timeout=5.0)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
        finally:
            conn.close()
    except sqlite3.OperationalError:
        return ""  # not readable by this user: not a corrupt store
    except sqlite3.DatabaseError as exc:
        return str(StoreCorrupt(path, exc))
    return ""


def _read(path: Path, actions: int, *, immutable: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The jobs and the newest actions, through a read-only connection (``immutable``: no locks, no -shm)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro{'&immutable=1' if immutable else ''}", uri=True, timeout=5.0)
    conn.row_factory = sqlite3.Row
    try:
        jobs = [dict(r) for r in conn.execute("SELECT * FROM jobs ORDER BY updated DESC")]
        acts = [dict(r) for r in conn.execute("SELECT * FROM actions ORDER BY time DESC LIMIT ?", (actions,))]
    except sqlite3.OperationalError:
        raise
    except sqlite3.DatabaseError as exc:
        raise SlurmFtError(f"status: {path} is not a monitor database: {exc}") from exc
    finally:
        conn.close()
    return jobs, acts


def format_status(status: dict[str, Any]) -> str:
    lines = [f"ERROR: {status['quarantine_store']}", ""] if status.get("quarantine_store") else []
    lines.append(f"{'JOB':>8}  {'STATUS':<9} {'RESTARTS':>8}  {'RESUME_STEP':>11}")
    for job in status["jobs"]:
        step = "-" if job["last_resume_step"] is None else str(job["last_resume_step"])
        lines.append(f"{job['job_id']:>8}  {job['status']:<9} {job['restart_count']:>8}  {step:>11}")
    if status["actions"]:
        lines.append("")
        lines.append("recent actions:")
        for act in status["actions"]:
            note = act["detail"].get("comment") or act["detail"].get("category", "")  # a strike names its category
            lines.append(f"  job {act['job_id']} restart {act['restart_count']}: {act['action']} {act['state']} {note}")
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction, name: str = "status") -> None:
    parser = subparsers.add_parser(name, help="jobs the monitor watches and what it did")
    parser.add_argument("--state-dir", help="state directory (default: $SLURM_FT_STATE_DIR or the site config)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    state = Path(args.state_dir) if args.state_dir else ft_config.state_dir(ft_config.load_site_config())
    status = read_status(state)
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return 0
