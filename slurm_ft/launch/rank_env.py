"""What every rank of an attempt sees: torch.distributed's variables, and torchrun under the launcher.

``slurm-ft launch -- python train.py``: every rank gets ``RANK`` (``SLURM_PROCID``), ``LOCAL_RANK``
(``SLURM_LOCALID``), ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` (a fresh port per
attempt), so ``dist.init_process_group(backend)`` (``env://``) works unchanged. The per-rank values are set by a
``/bin/sh`` line in front of the command (no extra Python start per rank).

GPU binding (``GPU_BIND_LINE``, the same line; ``bind_devices`` is its reference): each rank gets its own share of
the GPUs Slurm gave the step on its node, by ``SLURM_LOCALID``. The step's ``CUDA_VISIBLE_DEVICES`` (from
``--gres=gpu:N``, ``--gpus-per-node``, ``--gpus-per-task``) lists N devices for ``LOCAL_WORLD_SIZE`` ranks: rank L
keeps entries ``L*k .. L*k+k-1`` (k = N // LOCAL_WORLD_SIZE, one GPU each when N equals the ranks), so it sees
its GPU as ``cuda:0``. A task Slurm already bound (one share each: ``--gpus-per-task`` binds per task), fewer
devices than ranks (sharing, on purpose), no list (no GPUs asked of Slurm) and ``--no-gpu-bind`` leave the list
as it is. The step's list stays in ``SLURM_FT_STEP_DEVICES``. The binding is a function of the local id and the
step's list only: the same on every attempt, and on a spare node given the same GPUs. torchrun binds its own
workers (``LOCAL_RANK``), so its agent's line binds nothing.

NCCL's fault settings (``nccl_defaults``): set for the ranks only where the user has not set them.

``slurm-ft launch -- torchrun --nproc-per-node=K train.py``: one torchrun per node, wired by the launcher through
torchrun's own ``PET_*`` defaults: ``--nnodes`` (the attempt's node count), ``--node-rank``, ``--master-addr`` and
``--master-port`` (static rendezvous, a fresh port per attempt), and SIGUSR1 added to the signals torchrun forwards
to its workers (the emergency save). What cannot work is refused before anything starts, with the command that
works: ``--standalone`` or a fixed ``--nnodes`` other than the attempt's node count on a multi-node attempt, a
fixed ``--node-rank``/``--master-addr``/``--master-port``/``--rdzv-endpoint`` (every node would get the same, and
in-place restarts need a fresh port), and ``--ntasks-per-node`` > 1 (torchrun starts the ranks of a node itself).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Mapping, Sequence

from slurm_ft.core.errors import ConfigError

# torchrun's options that take no value (torch.distributed.run: action=check_env); every other option takes one.
TORCHRUN_FLAGS = frozenset({"--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path",
                            "--run_path", "--virtual-local-rank", "--virtual_local_rank"})
# Options the launcher sets per attempt: a fixed value would be the same on every node and every attempt.
WIRED = {"--node-rank": "node rank", "--master-addr": "address", "--master-port": "port",
         "--rdzv-endpoint": "rendezvous endpoint", "--rdzv-backend": "rendezvous backend"}
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"  # torchrun's default set, plus the emergency save's
RANK_LINE = 'export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID"; exec "$@"'
STEP_DEVICES = "SLURM_FT_STEP_DEVICES"  # the step's CUDA_VISIBLE_DEVICES on this node, before the binding
# POSIX sh (dash): bind_devices in shell, so a rank costs no extra process. Loops split the list at commas.
GPU_BIND_LINE = (  # its shell variables are _ft_*: an inherited variable of that name would be exported
    '_ft_d=${CUDA_VISIBLE_DEVICES-}; '
    'if [ -n "$_ft_d" ] && [ "$_ft_d" != NoDevFiles ]; then '
    '_ft_n=0; _ft_r="$_ft_d,"; while [ -n "$_ft_r" ]; do _ft_n=$((_ft_n+1)); _ft_r=${_ft_r#*,}; done; '
    '_ft_k=$((_ft_n / ${LOCAL_WORLD_SIZE:-1})); '
    'if [ "$_ft_k" -ge 1 ] && [ "$_ft_n" -gt "$_ft_k" ]; then '
    '_ft_lo=$((${SLURM_LOCALID:-0} * _ft_k)); _ft_i=0; _ft_o=; _ft_r="$_ft_d,"; '
    'while [ -n "$_ft_r" ]; do _ft_e=${_ft_r%%,*}; _ft_r=${_ft_r#*,}; '
    'if [ "$_ft_i" -ge "$_ft_lo" ] && [ "$_ft_i" -lt $((_ft_lo + _ft_k)) ]; then _ft_o=${_ft_o:+$_ft_o,}$_ft_e; fi; '
    '_ft_i=$((_ft_i+1)); done; '
    f'export {STEP_DEVICES}="$_ft_d" CUDA_VISIBLE_DEVICES="$_ft_o"; fi; fi; ')
NO_DEVICES = "NoDevFiles"  # what some Slurm releases put in CUDA_VISIBLE_DEVICES for a gres without device files
# NCCL's fault settings the flight recorder owns (its buffer, its dump on a timeout): set by that code, never here.
FLIGHT_RECORDER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT")
NODE_RANK_LINE = 'export PET_NODE_RANK="$SLURM_PROCID"; exec "$@"'


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Wiring:
    """One attempt's wiring: ``prefix`` (the per-rank line; srun runs ``*prefix, *command``), ``env`` (the same on
    every rank), ``tasks_per_node`` (srun's), ``ranks_per_node`` (training ranks: torchrun's ``--nproc-per-node``)."""

    prefix: tuple[str, ...]
    env: dict[str, str]
    tasks_per_node: int
    ranks_per_node: int


def bind_devices(visible: str, local_id: int, local_world: int) -> str | None:
    """Pure: the ``CUDA_VISIBLE_DEVICES`` rank ``local_id`` of ``local_world`` gets from the step's ``visible``
    list, or None where the list stays as it is (see the module docstring; ``GPU_BIND_LINE`` does the same)."""
    if not visible or visible == NO_DEVICES:
        return None
    devices = visible.split(",")
    share = len(devices) // max(1, local_world)
    if share < 1 or len(devices) <= share:
        return None
    return ",".join(devices[local_id * share:local_id * share + share])


def nccl_defaults(environ: Mapping[str, str], *, hang_timeout_s: float) -> dict[str, str]:
    """NCCL's fault settings for the ranks, each only where ``environ`` (the user's) has neither it nor its older
    name (docs/ml-engineer.md says why each):

    - ``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``: a failed or timed-out collective ends the rank's process at once,
      without ``ncclCommAbort`` (which can hang on a dead peer): the launcher sees a failure, not a stall;
    - ``TORCH_NCCL_ENABLE_MONITORING=1``: the heartbeat monitor ends a rank whose NCCL watchdog thread is stuck
      (a CUDA call that never returns);
    - ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC``: half the hang timeout (10 to 480 s, torch's default being 480), so a
      stuck watchdog ends its rank with NCCL's own reason before the launcher's hang watch kills the attempt blind;
      not set when the hang watch is off.

    ``NCCL_SOCKET_IFNAME`` is not set: NCCL's own choice (InfiniBand first, never ``lo`` or ``docker*``) is right on
    most clusters, and an interface named on the launcher's node may not exist on the others."""
    wanted = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_NCCL_ENABLE_MONITORING": "1"}
    if hang_timeout_s > 0:
        wanted["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] = str(int(min(480, max(10, hang_timeout_s // 2))))
    older = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "NCCL_ASYNC_ERROR_HANDLING"}
    return {name: value for name, value in wanted.items() if name not in environ and older.get(name) not in environ}


def is_torchrun(command: Sequence[str]) -> bool:
    """``torchrun ...`` or ``python -m torch.distributed.run ...``."""
    if not command:
        return False
    if os.path.basename(command[0]) == "torchrun":
        return True
    return len(command) >= 3 and command[1] == "-m" and command[2] in ("torch.distributed.run",
                                                                       "torch.distributed.launch")


def _torchrun_args(command: Sequence[str]) -> list[str]:
    return list(command[1:] if os.path.basename(command[0]) == "torchrun" else command[3:])


def _split(command: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """torchrun's own options (dashes normalised: ``--nproc_per_node`` -> ``--nproc-per-node``; a flag maps to
    ""), and the script with its arguments."""
    args = _torchrun_args(command)
    found: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "--":
        name, eq, value = args[i].partition("=")
        if name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        if eq or name in TORCHRUN_FLAGS:
            found[name] = value
            i += 1
        else:
            found[name] = args[i + 1] if i + 1 < len(args) else ""
            i += 2
    return found, args[i + 1:] if i < len(args) and args[i] == "--" else args[i:]


def torchrun_options(command: Sequence[str]) -> dict[str, str]:
    """torchrun's own options, before the script (see ``_split``)."""
    return _split(command)[0]


def _works(command: Sequence[str], nodes: int) -> str:
    """The torchrun command that works under the launcher: the user's, without the options it sets itself."""
    options, rest = _split(command)
    per_node = options.get("--nproc-per-node", "1")
    kept = [f"{k}={v}" if v else k for k, v in options.items()
            if k not in WIRED and k not in ("--standalone", "--nnodes", "--nproc-per-node", "--rdzv-id")]
    return shlex.join(["slurm-ft", "launch", "--", "torchrun", f"--nnodes={nodes}", f"--nproc-per-node={per_node}",
                       *kept, *rest])


def check_torchrun(command: Sequence[str], *, nodes: int, ntasks_per_node: int) -> int:
    """Refuse a torchrun command that cannot work on ``nodes`` nodes (ConfigError naming the option and the command
    that works); else its ranks per node (``--nproc-per-node``; 1 when not a number, e.g. ``gpu``)."""
    options = torchrun_options(command)
    works = _works(command, nodes)
    if ntasks_per_node != 1:
        raise ConfigError(f"launch: --ntasks-per-node={ntasks_per_node} with torchrun: torchrun starts the ranks of "
                          f"a node itself (--nproc-per-node); use: {works}")
    for name, what in WIRED.items():
        if name in options:
            raise ConfigError(f"launch: torchrun {name}={options[name]}: slurm-ft launch sets the {what} of every "
                              f"node and attempt itself; use: {works}")
    if "--standalone" in options and nodes > 1:
        raise ConfigError(f"launch: torchrun --standalone runs each of the {nodes} nodes alone; use: {works}")
    wanted = options.get("--nnodes")
    if wanted is not None and not _nnodes_fits(wanted, nodes):
        raise ConfigError(f"launch: torchrun --nnodes={wanted}, but the attempt runs on {nodes} node(s); "
                          f"use: {works}")
    per_node = options.get("--nproc-per-node", os.environ.get("PET_NPROC_PER_NODE", "1"))
    return int(per_node) if per_node.isdigit() and int(per_node) > 0 else 1


def _nnodes_fits(text: str, nodes: int) -> bool:
    low, sep, high = text.partition(":")
    if not low.isdigit() or (sep and not high.isdigit()):
        return False
    return int(low) <= nodes <= int(high if sep else low)


def wire(command: Sequence[str], *, nodes: int, ntasks_per_node: int, addr: str, port: int,
         gpu_bind: bool = True) -> Wiring:
    """The attempt's wiring for ``command`` on ``nodes`` nodes (see the module docstring), each rank bound to its
    GPUs unless ``gpu_bind`` is False. Raises ConfigError."""
    if is_torchrun(command):
        per_node = check_torchrun(command, nodes=nodes, ntasks_per_node=ntasks_per_node)
        env = {"PET_NNODES": str(nodes), "PET_MASTER_ADDR": addr, "PET_MASTER_PORT": str(port),
               "PET_SIGNALS_TO_HANDLE": TORCHRUN_SIGNALS, "MASTER_ADDR": addr, "MASTER_PORT": str(port)}
        if "--standalone" in torchrun_options(command):
            env = {k: v for k, v in env.items() if not k.startswith("PET_MASTER")}
        return Wiring(prefix=("/bin/sh", "-c", NODE_RANK_LINE, "slurm-ft-node"), env=env,
                      tasks_per_node=1, ranks_per_node=per_node)
    env = {"WORLD_SIZE": str(nodes * ntasks_per_node), "LOCAL_WORLD_SIZE": str(ntasks_per_node),
           "MASTER_ADDR": addr, "MASTER_PORT": str(port)}
    line = (GPU_BIND_LINE if gpu_bind else "") + RANK_LINE
    return Wiring(prefix=("/bin/sh", "-c", line, "slurm-ft-rank"), env=env,
                  tasks_per_node=ntasks_per_node, ranks_per_node=ntasks_per_node)
