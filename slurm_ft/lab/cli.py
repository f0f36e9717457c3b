"""``slurm-ft lab up|down|status|env``: a real local Slurm cluster for tests and the demo."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from slurm_ft.lab.cluster import LabCluster, LabConfig, LabError, Mode, default_lab_dir
from slurm_ft.lab.faults import REBOOT_DOWN_S, NetFault, inject
from slurm_ft.lab.hosts import HostPlan
from slurm_ft.slurm.types import JobInfo, NodeInfo


def register(subparsers: argparse._SubParsersAction, name: str) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(name, help="start, inspect or stop a real local Slurm cluster (needs root)",
                                   description="A real Slurm cluster on this host: munged, slurmctld and N slurmd, "
                                               "every node a host of its own (network, hostname, PID and mount "
                                               "namespaces) where this machine allows it, else all on 127.0.0.1; "
                                               "everything in one lab directory.")
    sub = parser.add_subparsers(dest="lab_command", metavar="ACTION", required=True)

    up = sub.add_parser("up", help="start the lab (idempotent) and wait until all nodes are ready")
    _add_dir(up)
    up.add_argument("--nodes", type=int, default=4, help="number of slurmd nodes n1..nN (default 4)")
    up.add_argument("--cpus", type=int, default=2, help="CPUs per node (default 2)")
    up.add_argument("--base-port", type=int, default=None,
                    help="first of nodes+1 ports (default: a free block, kept across restarts)")
    up.add_argument("--no-hooks", action="store_true",
                    help="do not wire in slurm-ft's prolog/epilog/SPANK plugin")
    mode = up.add_mutually_exclusive_group()
    mode.add_argument("--hosts", action="store_const", const=True, dest="hosts", default=None,
                      help="insist that every node be a host of its own (network, hostname, PID and mount "
                           "namespaces on a lab bridge): fail where namespaces are refused (default: hosts where "
                           "this machine allows them, else single-address, said so in `lab status`)")
    mode.add_argument("--single-address", action="store_const", const=False, dest="hosts",
                      help="all nodes on 127.0.0.1 with this host's name (the mode before hosts)")
    up.add_argument("--fresh", action="store_true", help="stop the lab and clear its Slurm state first")
    up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the nodes (default 60)")
    up.set_defaults(func=_up)

    fault = sub.add_parser("fault", help="hosts mode: pull, plug or throttle a node's link, kill or reboot its host",
                           description="Network and host faults on a lab whose nodes are hosts (`lab status`: mode: "
                                       "hosts).")
    _add_dir(fault)
    fault.add_argument("fault", choices=[f.value for f in NetFault], help="what happens to the node")
    fault.add_argument("node", help="node name (n1..nN)")
    fault.add_argument("rate", nargs="?", default=None, help="slow-link: tc rate such as 10mbit")
    fault.add_argument("--down-s", type=float, default=REBOOT_DOWN_S,
                       help=f"node-reboot: seconds the host stays down before it boots again, empty (default "
                            f"{REBOOT_DOWN_S:g}: long enough for Slurm to count the jobs on it lost)")
    fault.set_defaults(func=_fault)

    for action, func, text in (("down", _down, "stop exactly the daemons `up` started"),
                               ("status", _status, "show the lab's nodes and jobs"),
                               ("env", _env, "print `export SLURM_CONF=...` for eval")):
        cmd = sub.add_parser(action, help=text)
        _add_dir(cmd)
        cmd.set_defaults(func=func)


def _add_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, default=None,
                        help=f"lab directory (default $SLURM_FT_LAB_DIR or {default_lab_dir()})")


def _cluster(args: argparse.Namespace) -> LabCluster:
    try:
        config = LabConfig(
            dir=args.dir or default_lab_dir(), nodes=getattr(args, "nodes", 4), cpus_per_node=getattr(args, "cpus", 2),
            base_port=getattr(args, "base_port", None), hooks=not getattr(args, "no_hooks", False),
            start_timeout=getattr(args, "timeout", 60.0), hosts=getattr(args, "hosts", None),
        )
    except ValueError as exc:
        raise LabError(str(exc)) from exc
    return LabCluster(config)


def _progress(message: str) -> None:
    print(f"lab: {message}", file=sys.stderr, flush=True)


def _up(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    cluster.up(progress=_progress, fresh=args.fresh)
    print(f"lab up in {cluster.dir}: {len(cluster.node_names)} nodes; run: eval $(slurm-ft lab env"
          f"{'' if args.dir is None else ' --dir ' + shlex.quote(str(cluster.dir))})", file=sys.stderr)
    return 0


def _down(args: argparse.Namespace) -> int:
    _cluster(args).down(progress=_progress)
    return 0


def _status(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    nodes, jobs = cluster.status()
    print(f"lab {cluster.dir} (SLURM_CONF={cluster.conf_path})")
    print(mode_line(cluster.mode, cluster.mode_reason,
                    cluster.host_plan if cluster.mode is Mode.HOSTS else None))
    print(format_nodes(nodes))
    print()
    print(format_jobs(jobs))
    return 0


def _fault(args: argparse.Namespace) -> int:
    cluster = LabCluster.attach(args.dir or default_lab_dir())
    try:
        killed = inject(cluster, args.fault, args.node, args.rate, down_s=args.down_s)
    except ValueError as exc:
        raise LabError(str(exc)) from exc
    detail = f" ({len(killed)} processes killed)" if args.fault == NetFault.HOST_DEATH.value else ""
    if args.fault == NetFault.NODE_REBOOT.value:
        detail = f" ({len(killed)} processes killed, down {args.down_s:g} s, booted empty, slurmd registered)"
    print(f"{args.fault} {args.node}{' ' + args.rate if args.rate else ''}: done{detail}")
    return 0


def _env(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    if not cluster.conf_path.exists():
        raise LabError(f"no lab in {cluster.dir} (start it with `slurm-ft lab up --dir {cluster.dir}`)")
    for key, value in cluster.env().items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


def mode_line(mode: Mode, reason: str, plan: HostPlan | None) -> str:
    """``mode: hosts (10.1.2.0/24, bridge sft..; namespaces allowed)``, ``mode: single-address (namespaces
    refused: ...)``."""
    where = [f"{plan.subnet}, bridge {plan.bridge}"] if plan is not None else []
    return f"mode: {mode.value} ({'; '.join([*where, reason or 'reason not recorded'])})"


def format_nodes(nodes: Sequence[NodeInfo]) -> str:
    rows = [(n.name, "+".join(sorted(n.state)) or "?", n.reason) for n in nodes]
    return _table(("NODE", "STATE", "REASON"), rows)


def format_jobs(jobs: Sequence[JobInfo]) -> str:
    if not jobs:
        return "no jobs"
    rows = [(str(j.job_id), j.name, j.state.value, ",".join(j.nodes) or "-", str(j.restart_count),
             _exit_text(j), j.reason if j.reason != "None" else "") for j in jobs]
    return _table(("JOBID", "NAME", "STATE", "NODES", "RESTARTS", "EXIT", "REASON"), rows)


def _exit_text(job: JobInfo) -> str:
    if job.exit_code is None and job.exit_signal is None:
        return "-"
    return f"{job.exit_code if job.exit_code is not None else 0}:{job.exit_signal or 0}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in (header, *rows)]
    return "\n".join(lines)
