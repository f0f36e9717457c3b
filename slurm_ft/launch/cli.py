"""``slurm-ft launch``: its flags, the settings from the job's environment, and the wiring of one ``Launcher``
(``slurm_ft.launch.launcher``) to Slurm, the probe step, the hang evidence, the store keeper and the fault bell."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_ft.classify import classify
from slurm_ft.core import comment as job_comment
from slurm_ft.core import config as ft_config
from slurm_ft.core import env as ft_env
from slurm_ft.core.errors import ConfigError, SlurmFtError
from slurm_ft.core.registry import FtJob, registry_path, write_registration
from slurm_ft.core.rundir import run_dir_for
from slurm_ft.launch import bell as fault_bell
from slurm_ft.launch import checks as launch_checks
from slurm_ft.launch import launcher
from slurm_ft.launch import preempt as launch_preempt
from slurm_ft.launch.hang import gather_on_nodes
from slurm_ft.launch.launcher import LaunchConfig, Launcher, StoreHost, Waker, command_python
from slurm_ft.launch.links import probe_command
from slurm_ft.launch.probe import ProbeConfig, probe_nodes
from slurm_ft.launch.rank_env import is_torchrun
from slurm_ft.launch.reclaim import ReclaimConfig, Reclaimed, reclaim_on_nodes
from slurm_ft.launch.store import StoreKeeper
from slurm_ft.launch.traces import DEFAULT_ENTRIES, TraceRequest
from slurm_ft.slurm.address import master_addr, node_addr
from slurm_ft.slurm.backend import make_client
from slurm_ft.slurm.parsers import expand_hostlist
from slurm_ft.slurm.types import NodeInfo

log = logging.getLogger("slurm_ft.launch")


def register(subparsers: argparse._SubParsersAction, name: str = "launch") -> None:
    parser = subparsers.add_parser(name, help="run the training command over the allocation, restarting on faults",
                                   description=launcher.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, help="nodes per attempt (default: allocation minus spares)")
    parser.add_argument("--ntasks-per-node", type=int, default=1, help="ranks per node (default 1)")
    parser.add_argument("--hang-timeout", type=float, help="seconds without heartbeat progress = hang (0 off)")
    parser.add_argument("--startup-grace", type=float, default=60.0, help="seconds before hang checks start")
    parser.add_argument("--max-restarts", type=int, help="the job's restart budget: in-place restarts and requeues "
                                                         "together (default $SLURM_FT_MAX_RESTARTS or 3)")
    parser.add_argument("--spare-nodes", type=int, help="allocation nodes held back as spares")
    parser.add_argument("--run-dir", help="heartbeats/error files (default $SLURM_FT_RUN_DIR or <ckpt>/.slurm-ft)")
    parser.add_argument("--probe-timeout", type=float, default=10.0,
                        help="seconds a node may take to run a probe step after a failure (0 off; default 10)")
    parser.add_argument("--node-fail-wait", type=float, default=60.0,
                        help="seconds to wait for Slurm to declare a bad node before exiting 75 (default 60)")
    parser.add_argument("--no-rank-records", action="store_true",
                        help="run CMD without the per-rank wrapper that records how each rank ended")
    parser.add_argument("--no-standby", action="store_true",
                        help="restart ranks cold instead of from warm standby processes that imported torch "
                             "while the first attempt trained")
    parser.add_argument("--no-launcher-store", action="store_true",
                        help="let rank 0 host each restart's rendezvous store (as torch does) instead of a store "
                             "the launcher holds open before the ranks start; for scripts that make their own "
                             "TCPStore server at MASTER_PORT")
    parser.add_argument("--no-gpu-bind", action="store_true",
                        help="leave every rank the step's whole CUDA_VISIBLE_DEVICES instead of its own share by "
                             "SLURM_LOCALID")
    parser.add_argument("--gpu-reclaim-timeout", type=float,
                        help="after a failed attempt, seconds its nodes' GPUs get to let go of its processes before "
                             "the next attempt (a GPU still held is a bad GPU; 0 off; default "
                             "$SLURM_FT_GPU_RECLAIM_TIMEOUT or 30)")
    parser.add_argument("--preempt-deadline", type=float,
                        help="seconds the ranks get to save after SIGUSR1/SIGTERM (default $SLURM_FT_PREEMPT_DEADLINE "
                             "or 25; on SIGTERM at most KillWait - 5)")
    parser.add_argument("--flight-recorder", type=int, default=DEFAULT_ENTRIES, metavar="ENTRIES",
                        help="entries of torch's flight recorder per rank (TORCH_FR_BUFFER_SIZE, unless the job sets "
                             f"it); the ranks dump it before a hung or failed attempt is killed (0 off; default "
                             f"{DEFAULT_ENTRIES})")
    parser.add_argument("--mem-every", metavar="N|auto|off",
                        help="the checkpoint manager's memory tier: a snapshot in the job's /dev/shm dir every N steps, "
                             "auto (as often as its stall allows) or off; the ranks get it as SLURM_FT_MEM_EVERY "
                             "(default: the job's --ft-mem-every, else auto)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ...")
    parser.set_defaults(func=_main)


def _int_setting(value: int | None, name: str, default: int, environ: Mapping[str, str]) -> int:
    if value is not None:
        return value
    text = ft_env.job_setting(name, environ)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise SlurmFtError(f"launch: {ft_env.PREFIX}{name} must be an integer, got {text!r}") from None


def _float_setting(value: float | None, name: str, default: float, environ: Mapping[str, str]) -> float:
    if value is not None:
        return value
    text = ft_env.job_setting(name, environ)
    if text is None:
        return default
    try:
        return float(text)
    except ValueError:
        raise SlurmFtError(f"launch: {ft_env.PREFIX}{name} must be a number, got {text!r}") from None


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> LaunchConfig:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    hang = args.hang_timeout
    if hang is None:
        text = ft_env.job_setting(ft_env.HANG_TIMEOUT, environ)
        try:
            hang = float(text) if text else 300.0
        except ValueError:
            raise SlurmFtError(f"launch: {ft_env.PREFIX}{ft_env.HANG_TIMEOUT} must be a number, got {text!r}") from None
    reclaim = _float_setting(getattr(args, "gpu_reclaim_timeout", None), ft_env.GPU_RECLAIM_TIMEOUT, 30.0, environ)
    ckpt = ft_env.job_setting(ft_env.CKPT_DIR, environ)
    run_dir = args.run_dir or ft_env.job_setting(ft_env.RUN_DIR, environ) or (
        str(run_dir_for(ckpt)) if ckpt else f".slurm-ft-{environ.get('SLURM_JOB_ID', 'local')}")
    try:
        return LaunchConfig(command=tuple(command), nodes=args.nodes, ntasks_per_node=args.ntasks_per_node,
                            hang_timeout_s=hang, startup_grace_s=args.startup_grace,
                            max_restarts=_int_setting(args.max_restarts, ft_env.MAX_RESTARTS, 3, environ),
                            spare_nodes=_int_setting(args.spare_nodes, ft_env.SPARE_NODES, 0, environ),
                            run_dir=Path(run_dir).absolute(), probe_timeout_s=args.probe_timeout,
                            node_fail_wait_s=args.node_fail_wait,
                            rank_records=not getattr(args, "no_rank_records", False),
                            standby=not getattr(args, "no_standby", False),
                            launcher_store=not getattr(args, "no_launcher_store", False),
                            gpu_bind=not getattr(args, "no_gpu_bind", False), gpu_reclaim_timeout_s=reclaim,
                            flight_recorder=getattr(args, "flight_recorder", DEFAULT_ENTRIES),
                            mem_every=getattr(args, "mem_every", None))
    except ValueError as exc:
        raise SlurmFtError(f"launch: {exc}") from exc


def _register_with_monitor(config: LaunchConfig, environ: Mapping[str, str]) -> None:
    """Write ``<state_dir>/jobs/<job_id>.json`` so the monitor watches this job, unless it was submitted with the
    SPANK options (the prolog registers those, as root, where the site config says); skipped when the state dir is
    not writable (the usual case for users)."""
    job_id = environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit() or environ.get(ft_env.SPANK_JOB_PREFIX + ft_env.ENABLED):
        return  # submitted with --ft: the prolog registered it, in the state dir of the site (or lab) config
    try:
        state = ft_config.state_dir(ft_config.load_site_config())
    except ConfigError as exc:
        log.info("not registered with the monitor (%s)", exc)
        return
    if os.path.lexists(registry_path(state, int(job_id))):
        return
    try:
        write_registration(state, FtJob.from_settings(int(job_id), ft_env.job_settings(environ),
                                                      run_dir=str(config.run_dir), max_restarts=config.max_restarts,
                                                      user_id=os.getuid()))
    except OSError as exc:
        log.info("not registered with the monitor (%s)", exc)


def _main(args: argparse.Namespace) -> int:
    latch = launch_preempt.SignalLatch()
    latch.install()  # from the start: a SIGUSR1 while starting up must not kill the launcher
    environ = dict(os.environ)
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise SlurmFtError("launch: not inside a Slurm allocation (SLURM_JOB_NODELIST is unset)")
    allocation = expand_hostlist(nodelist)
    client = _client()
    job_id = environ.get("SLURM_JOB_ID", "")

    def set_comment(text: str) -> None:
        if client is not None and job_id.isdigit():
            client.update_job(int(job_id), comment=text)

    try:  # a configuration mistake fails every attempt alike: stop now, say what works
        config = config_from_args(args, environ)
        launch_checks.preflight(config.command, allocation=allocation, nodes=config.nodes,
                                spare_nodes=config.spare_nodes, ntasks_per_node=config.ntasks_per_node,
                                run_dir=config.run_dir, environ=environ)
        here = launcher_addr(allocation, environ, wanted=launch_checks.check_nodes(
            allocation, nodes=config.nodes, spare_nodes=config.spare_nodes))
        preempt = launch_preempt.PreemptConfig(
            deadline_s=launch_preempt.deadline_setting(getattr(args, "preempt_deadline", None), environ),
            kill_wait_s=launch_preempt.kill_wait(environ))
    except SlurmFtError as exc:
        return launch_checks.refuse(str(exc), set_comment=set_comment, environ=environ)
    _register_with_monitor(config, environ)
    comment = _job_comment(client, job_id)
    resume = ft_env.job_setting(ft_env.RESUME_STEP, environ)
    resume_step = int(resume) if resume and resume.isdigit() else job_comment.parse_resume_step(comment)
    restart_cause = job_comment.parse_restart_cause(comment)

    def node_states() -> dict[str, NodeInfo]:
        return {n.name: n for n in client.nodes()} if client is not None else {}

    def probe(nodes: Sequence[str], since: float | None) -> dict[str, str]:
        return probe_nodes(nodes, environ, ProbeConfig(timeout_s=config.probe_timeout_s,  # + link counters
                                                       node_command=probe_command(sys.executable, config.run_dir)),
                           since=since)

    def requeue() -> None:
        if client is None or not job_id.isdigit():
            raise SlurmFtError("launch: no Slurm client or job id to requeue")
        client.requeue(int(job_id))

    requeues = environ.get("SLURM_RESTART_COUNT", "0")
    def gather_hang(nodes: Sequence[str], run_dir: Path) -> str:
        return gather_on_nodes(nodes, run_dir, environ)

    def reclaim(nodes: Sequence[str], run_dir: Path, attempt: int) -> Reclaimed:
        return reclaim_on_nodes(nodes, run_dir, attempt, environ,
                                ReclaimConfig(timeout_s=config.gpu_reclaim_timeout_s))

    launcher = Launcher(config, allocation=allocation, environ=environ, node_states=node_states,
                        classify_fn=classify, resume_step=resume_step, probe=probe, set_comment=set_comment,
                        requeues=int(requeues) if requeues.isdigit() else 0, restart_cause=restart_cause,
                        latch=latch, preempt=preempt, requeue=requeue, comment=comment, gather_hang=gather_hang,
                        store=store_keeper(config, allocation, environ, addr=here), bell=bell_for(here),
                        reclaim=reclaim, request_traces=lambda nodes, run_dir: TraceRequest(nodes, run_dir, environ))
    return launcher.run()


def launcher_addr(allocation: Sequence[str], environ: Mapping[str, str], *, wanted: int) -> str:
    """The address of this node (the fault bell's and the store's), checked before the first attempt together with
    the first attempt's ``MASTER_ADDR`` (``slurm_ft.slurm.address``): in a multi-node job a node with no address
    is a configuration mistake (NodeAddressError), never a silent 127.0.0.1."""
    if not environ.get("MASTER_ADDR") and allocation:
        master_addr(allocation[0], environ, nodes=wanted)
    return node_addr(launcher_node(environ), nodes=len(allocation))


def launcher_node(environ: Mapping[str, str]) -> str:
    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def bell_for(addr: str) -> Waker | None:
    """The fault bell (``slurm_ft.launch.bell``) at ``addr`` (this node's), or None where no socket can be had."""
    try:
        return fault_bell.Bell(addr)
    except OSError as exc:
        log.info("no fault bell (failures seen at the next poll): %s", exc)
        return None


def store_keeper(config: LaunchConfig, allocation: Sequence[str], environ: Mapping[str, str], *, addr: str
                 ) -> StoreHost | None:
    """The keeper of the restarts' rendezvous stores (``slurm_ft.launch.store``) at ``addr`` (this node's), or None
    where rank 0 keeps hosting them: turned off, a torchrun command (its agent holds its own store), a
    ``$MASTER_ADDR`` of the user's, or a launcher outside the allocation's nodes (the ranks may not reach it). It
    admits only the allocation's nodes."""
    node = environ.get("SLURMD_NODENAME", "")
    if (not config.launcher_store or is_torchrun(config.command) or environ.get("MASTER_ADDR")
            or node not in allocation):
        return None
    peers = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ",".join(allocation)
    return StoreKeeper(command_python(config.command) or sys.executable, addr, peers=peers, environ=environ)


def _job_comment(client: Any, job_id: str) -> str:
    """This job's Comment (where the monitor leaves the resume hint and the requeue's cause), or ""."""
    if client is None or not job_id.isdigit():
        return ""
    try:
        job = client.job(int(job_id))
    except SlurmFtError as exc:
        log.info("job Comment not read (no resume hint or restart cause): %s", exc)
        return ""
    return job.comment if job is not None else ""


def _client():
    try:
        return make_client()
    except (SlurmFtError, OSError) as exc:
        log.info("no Slurm client: %s", exc)
        return None
