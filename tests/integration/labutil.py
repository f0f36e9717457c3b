"""Helpers for tests that use the lab cluster (import as ``from labutil import submit, wait_for``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from slurm_ft.lab.cluster import LabCluster
from slurm_ft.slurm.types import JobInfo, JobState

T = TypeVar("T")


def lab_env(lab: LabCluster, **extra: str) -> dict[str, str]:
    """``os.environ`` with the lab's SLURM_CONF (and ``extra``) on top."""
    return {**os.environ, **lab.env(), **extra}


def jobs_dir(lab: LabCluster) -> Path:
    """Where submitted scripts and their slurm-%j.out files go (world-readable, inside the lab dir)."""
    path = lab.dir / "jobs"
    path.mkdir(mode=0o755, exist_ok=True)
    return path


def submit(lab: LabCluster, script_text: str, *sbatch_args: str, cwd: Path | None = None,
           env: dict[str, str] | None = None) -> int:
    """``sbatch --parsable`` a script (a ``#!/bin/bash`` line is added when it has none); return the job id."""
    text = script_text if script_text.startswith("#!") else "#!/bin/bash\n" + script_text
    workdir = cwd or jobs_dir(lab)
    fd, name = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=jobs_dir(lab))
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(name, 0o755)
    done = subprocess.run(["sbatch", "--parsable", *sbatch_args, name], cwd=workdir, env=env or lab_env(lab),
                          capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"sbatch {' '.join(sbatch_args)} failed: {done.stderr.strip()}")
    return int(done.stdout.strip().split(";")[0])


def wait_for(predicate: Callable[[], T], timeout: float, *, interval: float = 0.25, message: str = "") -> T:
    """Poll ``predicate`` until it returns something truthy and return that; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {message or predicate}")
        time.sleep(interval)


def wait_job(lab: LabCluster, job_id: int, states: Iterable[JobState | str], timeout: float = 30) -> JobInfo:
    """Wait until job ``job_id`` is in one of ``states``; return its JobInfo."""
    wanted = {JobState(s) for s in states}
    client = lab.client()
    last: list[JobInfo | None] = [None]

    def reached() -> JobInfo | None:
        last[0] = client.job(job_id)
        return last[0] if last[0] is not None and last[0].state in wanted else None

    try:
        return wait_for(reached, timeout, message=f"job {job_id} to reach {sorted(s.value for s in wanted)}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen: {last[0]}") from None


def cancel(lab: LabCluster, *job_ids: int) -> None:
    """scancel jobs (ignores ones already gone)."""
    if job_ids:
        subprocess.run(["scancel", *map(str, job_ids)], env=lab_env(lab), capture_output=True, timeout=30,
                       check=False)


def output_of(lab: LabCluster, job_id: int) -> str:
    """The text of ``slurm-<id>.out`` in the jobs dir ('' when not written yet)."""
    try:
        return (jobs_dir(lab) / f"slurm-{job_id}.out").read_text()
    except FileNotFoundError:
        return ""


def result_line(text: str) -> dict:
    """The example trainer's last JSON result line (``param_sha256``, ``step`` ...) in a job's output."""
    for line in reversed(text.splitlines()):
        if line.startswith("{") and "param_sha256" in line:
            return json.loads(line)
    raise AssertionError(f"no result line in:\n{text[-3000:]}")


def torchrun_reference_sha(ckpt: Path, trainer_args: list[str]) -> str:
    """The parameters after an uninterrupted 2-rank run of the example trainer under torchrun, outside Slurm."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "-m", "slurm_ft.train.example", *trainer_args, "--ckpt-dir", str(ckpt)],
                          capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return result_line(done.stdout)["param_sha256"]
