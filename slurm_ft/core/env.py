"""Environment variables, named once.

Per-job settings reach the job from the SPANK plugin (``sbatch --ft-ckpt-dir=...``) and may be set by hand.
Precedence for a setting ``X``, first found wins:

1. ``SLURM_FT_X``        set explicitly by the user, or by the SPANK plugin in the job's own environment
2. ``SLURM_SPANK_FT_X``  what ``spank_job_control_setenv`` gives the job in an sbatch allocation
3. ``SPANK_FT_X``        what the prolog/epilog see for the same option
4. the site config (``/etc/slurm-ft/config.toml``), then the built-in default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

PREFIX = "SLURM_FT_"
SPANK_JOB_PREFIX = "SLURM_SPANK_FT_"
SPANK_HOOK_PREFIX = "SPANK_FT_"

# Per-job settings (the suffix after the prefix). The SPANK option --ft-ckpt-dir maps to CKPT_DIR, and so on.
ENABLED = "ENABLED"            # "1" when the job was submitted with --ft
CKPT_DIR = "CKPT_DIR"          # checkpoint directory
CKPT_EVERY = "CKPT_EVERY"      # checkpoint interval: steps, or "auto" (Young/Daly)
MAX_RESTARTS = "MAX_RESTARTS"  # restart budget across requeues and in-place restarts
HANG_TIMEOUT = "HANG_TIMEOUT"  # seconds without a heartbeat before a rank counts as hung
SPARE_NODES = "SPARE_NODES"    # nodes in the allocation held back to replace a bad one
RESUME_STEP = "RESUME_STEP"    # resume hint: the step to resume from (set by the monitor / launcher)
RUN_DIR = "RUN_DIR"            # per-job directory for heartbeats and error files
EXCLUDED_NODES = "EXCLUDED_NODES"  # hostlist the job must not run on (topology check)
NO_REQUEUE = "NO_REQUEUE"      # "1" (--ft-no-requeue): restart in place or stop, never requeue
RESTART_CAUSE = "RESTART_CAUSE"  # why this run is a restart: the failure category (set by the launcher)
RUN_ID = "RUN_ID"              # run identity that owns the checkpoint dir (default: the Slurm job id)
CKPT_ADOPT = "CKPT_ADOPT"      # "1": take over a checkpoint dir another run owns
GPU_RECLAIM_TIMEOUT = "GPU_RECLAIM_TIMEOUT"  # seconds the launcher waits for a failed attempt's GPUs to be free
MEM_EVERY = "MEM_EVERY"        # memory-tier snapshots: steps, "auto" or "off" (slurm_ft.train.memory)

JOB_SETTINGS = (ENABLED, CKPT_DIR, CKPT_EVERY, MAX_RESTARTS, HANG_TIMEOUT, SPARE_NODES, RESUME_STEP, RUN_DIR,
                EXCLUDED_NODES, NO_REQUEUE, RESTART_CAUSE, RUN_ID, CKPT_ADOPT, GPU_RECLAIM_TIMEOUT, MEM_EVERY)

# torch's flight recorder (the ranks' collectives, slurm_ft.train.traces): ``slurm-ft launch`` sets each one the job's
# environment does not already set (the user's value wins).
FR_BUFFER_SIZE = "TORCH_FR_BUFFER_SIZE"        # entries in each rank's ring buffer (0: off)
FR_BUFFER_SIZE_OLD = "TORCH_NCCL_TRACE_BUFFER_SIZE"  # its older name, still read by torch when the new one is unset
FR_DUMP_FILE = "TORCH_FR_DUMP_TEMP_FILE"       # where NCCL's own dumps go (the rank is appended)
NCCL_DUMP_ON_TIMEOUT = "TORCH_NCCL_DUMP_ON_TIMEOUT"  # "1": NCCL's watchdog dumps the recorder on a timeout

# Process-wide settings.
SITE_CONFIG = "SLURM_FT_CONFIG"            # path of the site config; default DEFAULT_SITE_CONFIG
DEFAULT_SITE_CONFIG = "/etc/slurm-ft/config.toml"
STATE_DIR = "SLURM_FT_STATE_DIR"           # where the monitor/quarantine keep SQLite state
DEFAULT_STATE_DIR = "/var/lib/slurm-ft"
SLURM_BACKEND = "SLURM_FT_SLURM_BACKEND"   # SlurmClient backend: auto (default), cli or pyslurm
MEM_ROOT = "SLURM_FT_MEM_ROOT"             # the memory tier's root (default /dev/shm; tests point it elsewhere)
SLURM_RESTART_COUNT = "SLURM_RESTART_COUNT"  # Slurm's requeue count: with the job id, names the allocation
LAB_DIR = "SLURM_FT_LAB_DIR"               # the lab cluster directory (`slurm-ft lab`, integration tests)
TEST_NVML_SNAPSHOT = "SLURM_FT_TEST_NVML_SNAPSHOT"  # TEST-ONLY: read NVML records from this JSON file
SLURM_JOB_ID = "SLURM_JOB_ID"              # Slurm's job id: a requeued job keeps it (the default run identity)
STANDBY = "SLURM_FT_STANDBY"               # set by the launcher: the ranks' interpreter, whose warm standby may run them
STANDBY_PRELOAD = "SLURM_FT_STANDBY_PRELOAD"  # extra modules the warm standby ranks import (comma separated)
LAUNCH_ID = "SLURM_FT_LAUNCH_ID"           # set by the launcher: a random token per launch, in the memory tier's tag
STANDBY_KEY = "SLURM_FT_STANDBY_KEY"       # set by the launcher for its own steps: the random part of the standby names


def job_setting(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Return per-job setting ``name`` by the precedence above, or None when unset."""
    env = os.environ if environ is None else environ
    for prefix in (PREFIX, SPANK_JOB_PREFIX, SPANK_HOOK_PREFIX):
        value = env.get(prefix + name)
        if value not in (None, ""):
            return value
    return None


def run_identity(environ: Mapping[str, str] | None = None) -> str | None:
    """The run identity: setting ``RUN_ID`` (above), else ``SLURM_JOB_ID``; None outside Slurm."""
    env = os.environ if environ is None else environ
    return job_setting(RUN_ID, env) or env.get(SLURM_JOB_ID) or None


def job_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """All per-job settings that are set, keyed by suffix (``CKPT_DIR`` ...)."""
    found = {}
    for name in JOB_SETTINGS:
        value = job_setting(name, environ)
        if value is not None:
            found[name] = value
    return found
