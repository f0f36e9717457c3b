"""Configuration mistakes the launcher catches before the first attempt: they stop the job at once as ``config``.

A mistake that fails every attempt the same way (too many spare nodes, ``--ft`` without a checkpoint dir, a
checkpoint dir nobody can write, a torchrun command that cannot work on this allocation) would otherwise burn the
whole restart budget. Each is one line naming the value and what to do instead; the job's Comment gets
``slurm-ft: stopped cause=config by=launch ...`` (the monitor then stops it too, and says why), and the launcher
exits 2 without starting a rank.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from slurm_ft.core import comment as job_comment
from slurm_ft.core import env as ft_env
from slurm_ft.core.errors import ConfigError, SlurmFtError
from slurm_ft.core.rundir import EVENTS_FILE, PRIVATE_DIR, RUN_SUBDIR, append_line, make_run_dir
from slurm_ft.launch.rank_env import check_torchrun, is_torchrun

EX_CONFIG = 2


def check_nodes(allocation: Sequence[str], *, nodes: int | None, spare_nodes: int) -> int:
    """The attempt's node count; ConfigError when the allocation cannot give it."""
    have = len(allocation)
    if nodes is not None:
        if nodes > have:
            raise ConfigError(f"launch: --nodes={nodes}, but the allocation has {have} node(s): submit with "
                              f"sbatch -N{nodes} or more")
        return nodes
    if spare_nodes >= have:
        raise ConfigError(f"launch: --ft-spare-nodes={spare_nodes} leaves none of the allocation's {have} node(s) "
                          f"to train on: submit with sbatch -N{spare_nodes + 1} or more, or fewer spares")
    return have - spare_nodes


def check_writable(path: Path, what: str, *, mode: int = 0o777) -> None:
    """``path`` exists or can be made (with ``mode``, less the umask), and a file can be written in it (then
    removed)."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=mode)
        probe = path / f".slurm-ft-write-test.{os.getpid()}"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = "read-only" if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) else "unusable"
        raise ConfigError(f"launch: {what} {str(path)!r} is {reason}: {exc.strerror or exc} "
                          f"(choose a writable directory on a shared file system)") from None


def preflight(command: Sequence[str], *, allocation: Sequence[str], nodes: int | None, spare_nodes: int,
              ntasks_per_node: int, run_dir: Path, environ: Mapping[str, str]) -> None:
    """Every check above, in order; the first failing one raises ConfigError."""
    wanted = check_nodes(allocation, nodes=nodes, spare_nodes=spare_nodes)
    if is_torchrun(command):
        check_torchrun(command, nodes=wanted, ntasks_per_node=ntasks_per_node)
    ckpt = ft_env.job_setting(ft_env.CKPT_DIR, environ)
    if ckpt:
        check_writable(Path(ckpt), "checkpoint dir (--ft-ckpt-dir)")
    elif ft_env.job_setting(ft_env.ENABLED, environ) and not ft_env.job_setting(ft_env.RUN_DIR, environ):
        raise ConfigError("launch: --ft without a checkpoint directory: submit with --ft-ckpt-dir=/shared/path "
                          "(or set SLURM_FT_CKPT_DIR): where checkpoints, heartbeats and error files go")
    check_writable(run_dir, "run dir", mode=PRIVATE_DIR)  # the job's user's alone


def refuse(message: str, *, set_comment: Callable[[str], None], environ: Mapping[str, str]) -> int:
    """Stop the job for a configuration mistake: the message on stderr (the job's output), in the Comment as
    ``stopped cause=config by=launch``, and in the run dir's events when it can be written."""
    print(f"slurm-ft: config: {message}", file=sys.stderr, flush=True)
    try:
        set_comment(job_comment.stopped("config", f"by=launch {message}"))
    except SlurmFtError as exc:
        print(f"slurm-ft: the job's Comment was not set: {exc}", file=sys.stderr, flush=True)
    run_dir = ft_env.job_setting(ft_env.RUN_DIR, environ)
    ckpt = ft_env.job_setting(ft_env.CKPT_DIR, environ)
    target = Path(run_dir) if run_dir else (Path(ckpt) / RUN_SUBDIR if ckpt else None)
    if target is not None:
        record = {"event": "exit", "time": round(time.time(), 3), "code": EX_CONFIG, "why": message,
                  "cause": "config", "attempts": 0}
        try:
            append_line(make_run_dir(target) / EVENTS_FILE, json.dumps(record))
        except OSError as exc:  # the run dir itself may be what is unusable; stderr and the Comment carry it
            print(f"slurm-ft: not recorded in {target / EVENTS_FILE}: {exc.strerror}", file=sys.stderr, flush=True)
    return EX_CONFIG
