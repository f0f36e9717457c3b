"""The ML engineer's path on the lab: the README's minimal trainer (examples/minimal_train.py) under
``slurm-ft launch`` as written (env://, no rank mapping), torchrun under the launcher as users write it, and
configuration mistakes that stop at once as ``config`` instead of burning the restart budget."""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

import pytest
from labutil import cancel, jobs_dir, output_of, submit, wait_job

from slurm_ft.health.jobfiles import latest_step
from slurm_ft.slurm.types import JobState

pytestmark = pytest.mark.lab

TRAINER = Path(__file__).resolve().parents[2] / "examples" / "minimal_train.py"
TERMINAL = [JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT]
LAUNCH = f"exec {sys.executable} -m slurm_ft.cli launch --hang-timeout 60 --startup-grace 60"


def _fresh(lab, prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=jobs_dir(lab)))
    path.chmod(0o755)
    return path


def _done(lab, job: int) -> str:
    found = re.findall(r"^done at step (\d+), weights (\S+)$", output_of(lab, job), re.M)
    assert found, output_of(lab, job)[-3000:]
    return found[-1]


def _events(ckpt: Path) -> list[dict]:
    return [json.loads(line) for line in (ckpt / ".slurm-ft" / "events.jsonl").read_text().splitlines()]


def test_the_readme_trainer_runs_and_recovers_under_the_launcher(lab):
    crash, clean = _fresh(lab, "ck-min-crash-"), _fresh(lab, "ck-min-clean-")
    # TEST-ONLY: rank 1 is SIGKILLed in the middle of the step-20 save, on the first attempt only
    inject = ('if [ "$SLURM_FT_ATTEMPT" = 1 ] && [ "$RANK" = 1 ]; then export SLURM_FT_TEST_CRASH_AT=after_shards@20;'
              f' fi; exec {sys.executable} {TRAINER}')
    flags = ["-N2", "--ft-ckpt-every=10", "--export=ALL,STEPS=40"]
    a = submit(lab, f"{LAUNCH} -- /bin/bash -c '{inject}'\n", *flags, f"--ft-ckpt-dir={crash}", "-J", "min-crash")
    b = submit(lab, f"{LAUNCH} -- {sys.executable} {TRAINER}\n", *flags, f"--ft-ckpt-dir={clean}", "-J", "min-clean")
    try:
        for job in (a, b):
            assert wait_job(lab, job, TERMINAL, timeout=240).state is JobState.COMPLETED, output_of(lab, job)[-3000:]
        assert _done(lab, a) == _done(lab, b) and _done(lab, b)[0] == "40"
        assert latest_step(str(clean)) == 40
        kinds = [e["event"] for e in _events(crash)]
        assert kinds.count("attempt_start") == 2 and "restart_in_place" in kinds
    finally:
        cancel(lab, a, b)


def test_torchrun_under_the_launcher_as_users_write_it(lab):
    ckpt = _fresh(lab, "ck-torchrun-")
    torchrun = f"{sys.executable} -m torch.distributed.run --nnodes=2 --nproc-per-node=1 {TRAINER}"
    job = submit(lab, f"{LAUNCH} -- {torchrun}\n", "-N2", f"--ft-ckpt-dir={ckpt}", "--ft-ckpt-every=10",
                 "--export=ALL,STEPS=30", "-J", "torchrun")
    try:
        assert wait_job(lab, job, TERMINAL, timeout=240).state is JobState.COMPLETED, output_of(lab, job)[-3000:]
        assert _done(lab, job)[0] == "30" and latest_step(str(ckpt)) == 30
    finally:
        cancel(lab, job)


def test_spare_nodes_leaving_no_node_to_train_on_stop_at_once_as_config(lab):
    ckpt = _fresh(lab, "ck-spares-")
    # -N2 in the script: sbatch's plugin sees only the command line (a -N2 there is refused at submit, test_spank)
    job = submit(lab, f"#!/bin/bash\n#SBATCH -N2\n{LAUNCH} -- {sys.executable} {TRAINER}\n", f"--ft-ckpt-dir={ckpt}",
                 "--ft-spare-nodes=2", "-J", "spares")
    try:
        info = wait_job(lab, job, TERMINAL, timeout=120)
        assert info.state is JobState.FAILED and info.restart_count == 0
        assert "slurm-ft: config: launch: --ft-spare-nodes=2 leaves none of the allocation's 2 node(s)" in \
            output_of(lab, job)
        assert lab.client().job(job).comment.startswith("slurm-ft: stopped cause=config by=launch launch: "
                                                        "--ft-spare-nodes=2 leaves none")
        assert [e["event"] for e in _events(ckpt)] == ["exit"]  # no attempt started
    finally:
        cancel(lab, job)


def test_a_lab_job_registers_inside_the_lab(lab):
    """``slurm-ft lab env`` covers slurm-ft too: a job submitted from a shell that ran it registers in
    ``<lab>/state``, not in the host-wide default state dir (where another lab's job ids would collide)."""
    import os
    import shlex
    import subprocess
    import time

    from slurm_ft.core.env import DEFAULT_STATE_DIR

    exported = subprocess.run([sys.executable, "-m", "slurm_ft.cli", "lab", "env", "--dir", str(lab.dir)],
                              capture_output=True, text=True, check=True).stdout
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}  # a fresh login shell
    env.update(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in exported.splitlines())
    assert env["SLURM_FT_STATE_DIR"] == str(lab.dir / "state")
    assert env["SLURM_FT_CONFIG"] == str(lab.dir / "etc" / "slurm-ft" / "config.toml")
    ckpt = _fresh(lab, "ck-register-")
    submitted = time.time()
    job = submit(lab, f"{LAUNCH} -- {sys.executable} {TRAINER}\n", "-N2", f"--ft-ckpt-dir={ckpt}",
                 "--export=ALL,STEPS=3", env=env)
    try:
        assert wait_job(lab, job, TERMINAL, timeout=120).state is JobState.COMPLETED, output_of(lab, job)[-2000:]
        assert (lab.dir / "state" / "jobs" / f"{job}.json").is_file()
        host_wide = Path(DEFAULT_STATE_DIR) / "jobs" / f"{job}.json"
        assert not host_wide.exists() or host_wide.stat().st_mtime < submitted
    finally:
        cancel(lab, job)
