"""``slurm-ft status``: what the monitor knows, from its SQLite state (read-only; no Slurm calls)."""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path
from typing import Any

from slurm_ft import config as ft_config
from slurm_ft.errors import SlurmFtError
from slurm_ft.monitor import DB_NAME


def read_status(state_dir: Path, *, actions: int = 20) -> dict[str, Any]:
    """``{"jobs": [...], "actions": [...]}`` from ``<state_dir>/monitor.db`` (newest first)."""
    path = Path(state_dir) / DB_NAME
    if not path.is_file():
        raise SlurmFtError(f"status: no monitor state at {path} (has `slurm-ft monitor` run with this --state-dir?)")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
    conn.row_factory = sqlite3.Row
    try:
        jobs = [dict(r) for r in conn.execute("SELECT * FROM jobs ORDER BY updated DESC")]
        acts = [dict(r) for r in conn.execute("SELECT * FROM actions ORDER BY time DESC LIMIT ?", (actions,))]
    except sqlite3.DatabaseError as exc:
        raise SlurmFtError(f"status: {path} is not a monitor database: {exc}") from exc
    finally:
        conn.close()
    for act in acts:
        act["detail"] = json.loads(act["detail"])
    return {"jobs": jobs, "actions": acts}


def format_status(status: dict[str, Any]) -> str:
    lines = [f"{'JOB':>8}  {'STATUS':<9} {'RESTARTS':>8}  {'RESUME_STEP':>11}"]
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
