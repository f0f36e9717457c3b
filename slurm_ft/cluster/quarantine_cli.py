"""``slurm-ft quarantine list|show NODE|add NODE --reason TEXT|release NODE`` (``--json`` for machines).

Reading is open to everyone who can read the store; ``add`` and ``release`` need root or the SlurmUser
(``[quarantine] slurm_user`` in the site config, else what ``scontrol show config`` says).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import pwd
from typing import Any

from slurm_ft.cluster.quarantine import (
    NodeRecord,
    Quarantine,
    QuarantineConfig,
    QuarantineStore,
    default_db_path,
    parse_slurm_user,
    require_privileged,
)
from slurm_ft.core.config import load_site_config, state_dir
from slurm_ft.core.errors import SlurmFtError
from slurm_ft.core.taxonomy import Category


def register(subparsers: Any, name: str) -> None:
    parser = subparsers.add_parser(name, help="list, inspect, add or release quarantined nodes",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="site config (default $SLURM_FT_CONFIG or /etc/slurm-ft/config.toml)")
    sub = parser.add_subparsers(dest="quarantine_command", metavar="ACTION", required=True)
    cmd = sub.add_parser("list", help="every node slurm-ft has a state for")
    cmd.add_argument("--json", action="store_true")
    cmd.set_defaults(func=_list)
    cmd = sub.add_parser("show", help="one node: state, strikes, history, Slurm's view")
    cmd.add_argument("node")
    cmd.add_argument("--json", action="store_true")
    cmd.set_defaults(func=_show)
    cmd = sub.add_parser("add", help="quarantine a node now (drains it with a slurm-ft: reason)")
    cmd.add_argument("node")
    cmd.add_argument("--reason", required=True, help="evidence, shown in the drain reason")
    cmd.add_argument("--category", default=Category.UNKNOWN.value, choices=[c.value for c in Category])
    cmd.add_argument("--json", action="store_true")
    cmd.set_defaults(func=_add)
    cmd = sub.add_parser("release", help="put a node back in service (resumes a slurm-ft drain, never another)")
    cmd.add_argument("node")
    cmd.add_argument("--json", action="store_true")
    cmd.set_defaults(func=_release)


def _quarantine(args: argparse.Namespace, *, with_client: bool) -> Quarantine:
    site = load_site_config(args.config)
    config = site.build("quarantine", QuarantineConfig)
    client = None
    if with_client:
        from slurm_ft.slurm.cli_backend import CliSlurmClient

        client = CliSlurmClient()
    return Quarantine(QuarantineStore(default_db_path(state_dir(site))), config, client)


def _require_change_rights(q: Quarantine) -> str:
    """The caller's name, after checking they are root or the SlurmUser."""
    slurm_user = q.config.slurm_user or _slurm_user_from_scontrol()
    require_privileged(slurm_user)
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _slurm_user_from_scontrol() -> str | None:
    from slurm_ft.slurm.runner import run_command

    result = run_command(["scontrol", "show", "config"], timeout=15)
    return parse_slurm_user(result.stdout) if result.ok else None


def _node(name: str) -> str:
    if not name or len(name) > 128 or not all(c.isalnum() or c in "._-" for c in name):
        raise SlurmFtError(f"not a node name: {name!r}")
    return name


def _when(stamp: float) -> str:
    return dt.datetime.fromtimestamp(stamp).astimezone().isoformat(timespec="seconds") if stamp else "-"


def _list(args: argparse.Namespace) -> int:
    records = _quarantine(args, with_client=False).list()
    if args.json:
        print(json.dumps([r.to_dict() for r in records], indent=2))
        return 0
    if not records:
        print("no nodes in quarantine records")
        return 0
    print(f"{'NODE':<16} {'STATE':<12} {'SINCE':<26} {'STRIKES':>7}  REASON")
    for r in records:
        print(f"{r.node:<16} {r.state.value:<12} {_when(r.since):<26} {r.recent_strikes:>7}  {r.reason}")
    return 0


def _show(args: argparse.Namespace) -> int:
    node = _node(args.node)
    q = _quarantine(args, with_client=True)
    record = q.record(node)
    live = _slurm_view(q, node)
    data = {"record": record.to_dict(), "slurm": live,
            "strikes": [dataclasses.asdict(s) for s in q.strikes(node)],
            "history": [dataclasses.asdict(h) for h in q.history(node)]}
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    _print_record(record)
    if live:
        print(f"slurm:    {'+'.join(live['state'])}" + (f"  reason: {live['reason']}" if live["reason"] else ""))
    print("strikes (newest first):" if data["strikes"] else "strikes:  none")
    for s in data["strikes"]:
        job = f" job {s['job_id']}" if s["job_id"] else ""
        print(f"  {_when(s['time'])}  {s['category']:<13} {s['source']}{job}: {s['evidence']}")
    print("history (newest first):" if data["history"] else "history:  none")
    for h in data["history"]:
        print(f"  {_when(h['time'])}  {h['from_state']} -> {h['to_state']}  by {h['actor']}: {h['reason']}")
    return 0


def _slurm_view(q: Quarantine, node: str) -> dict[str, Any] | None:
    try:
        info = next((n for n in q.client.nodes() if n.name == node), None) if q.client else None
    except SlurmFtError as exc:
        return {"state": ["?"], "reason": f"(sinfo failed: {exc})"}
    return {"state": sorted(info.state), "reason": info.reason} if info else None


def _print_record(r: NodeRecord) -> None:
    print(f"node:     {r.node}")
    print(f"state:    {r.state.value} since {_when(r.since)}" + ("" if r.since else " (never struck)"))
    if r.reason:
        print(f"reason:   {r.reason}" + ("" if r.drained else "  (drain not in place)"))
    print(f"strikes:  {r.recent_strikes} soft strikes in the window")


def _add(args: argparse.Namespace) -> int:
    node = _node(args.node)
    q = _quarantine(args, with_client=True)
    who = _require_change_rights(q)
    q.add(node, args.reason, category=args.category, by=who)
    return _report(q, node, args.json)


def _release(args: argparse.Namespace) -> int:
    node = _node(args.node)
    q = _quarantine(args, with_client=True)
    who = _require_change_rights(q)
    q.release(node, by=who)
    return _report(q, node, args.json)


def _report(q: Quarantine, node: str, as_json: bool) -> int:
    record = q.record(node)
    last = q.history(node, limit=1)
    if as_json:
        print(json.dumps({"record": record.to_dict(), "slurm": _slurm_view(q, node)}, indent=2))
    else:
        _print_record(record)
        if last:
            print(f"slurm:    {last[0].reason}")
    return 0
