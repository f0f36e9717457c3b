"""The monitor's job registry entry, ``<state_dir>/jobs/<job_id>.json``: marks a job as --ft for the monitor.

Written by the prolog (root, from the SPANK options; preferred) or else by ``slurm-ft launch``; read by
``slurm_ft.cluster.monitor.read_registration``. Kept apart from the monitor so the prolog can build the entry without
importing the monitor (slow, and it loads the classification rules).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path

from slurm_ft.core import env


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FtJob:
    """A job registered as --ft: where its checkpoints and run files are, and its restart budget."""

    job_id: int
    ckpt_dir: str = ""
    run_dir: str = ""
    max_restarts: int | None = None
    user_id: int | None = None
    no_requeue: bool = False  # --ft-no-requeue: the launcher restarts in place; the monitor never requeues

    @classmethod
    def from_settings(cls, job_id: int, settings: Mapping[str, str], *, run_dir: str, max_restarts: int | None,
                      user_id: int | None) -> "FtJob":
        """The entry for job ``job_id`` from its per-job ``settings`` (``env.job_settings()``: the checkpoint dir
        and ``--ft-no-requeue``); the caller resolves the run dir, the budget and the uid its own way."""
        return cls(job_id=int(job_id), ckpt_dir=settings.get(env.CKPT_DIR) or "", run_dir=run_dir,
                   max_restarts=max_restarts, user_id=user_id, no_requeue=settings.get(env.NO_REQUEUE) == "1")


def registry_path(state_dir: Path, job_id: int) -> Path:
    return Path(state_dir) / "jobs" / f"{int(job_id)}.json"


def write_registration(state_dir: Path, job: FtJob) -> Path:
    """Register ``job`` (the launcher side; the prolog writes its entry as root, cluster.hooks._write_json): an
    atomic write of the registry file."""
    path = registry_path(state_dir, job.job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(job)))
    os.replace(tmp, path)
    return path
