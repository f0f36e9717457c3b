"""The SPANK plugin in the real lab cluster: options listed, bad values refused, values reach job and steps."""

from __future__ import annotations

import subprocess
import sys

import pytest
from labutil import jobs_dir, lab_env, output_of, submit, wait_job

from slurm_ft.core import env
from slurm_ft.slurm.types import JobState

pytestmark = pytest.mark.lab

OPTIONS = ("--ft ", "--ft-ckpt-dir=path", "--ft-ckpt-every=steps", "--ft-max-restarts=n",
           "--ft-hang-timeout=seconds", "--ft-spare-nodes=n", "--ft-no-requeue", "--ft-mem-every=steps|auto|off")


def sbatch(lab, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sbatch", *args], env=lab_env(lab), cwd=jobs_dir(lab), capture_output=True, text=True,
                          timeout=30, check=False)


def test_sbatch_help_lists_the_ft_options(lab) -> None:
    done = sbatch(lab, "--help")
    assert done.returncode == 0
    plugins = done.stdout.split("Options provided by plugins:", 1)[1]
    for option in OPTIONS:
        assert option in plugins, f"{option} missing from sbatch --help"


@pytest.mark.parametrize(("arg", "message"), [
    ("--ft-max-restarts=x", "slurm-ft: --ft-max-restarts: 'x' is not a non-negative integer"),
    ("--ft-hang-timeout=-5", "slurm-ft: --ft-hang-timeout: '-5' is not a non-negative integer"),
    ("--ft-ckpt-dir=relative/dir", "slurm-ft: --ft-ckpt-dir: 'relative/dir' is not an absolute path"),
    ("--ft-spare-nodes=-1", "slurm-ft: --ft-spare-nodes: '-1' is not a non-negative integer"),
    ("--ft-ckpt-every=AUTO", "slurm-ft: --ft-ckpt-every: 'AUTO' is not a positive integer or 'auto'"),
    ("--ft-mem-every=0", "slurm-ft: --ft-mem-every: '0' is not a positive integer, 'auto' or 'off'"),
])
def test_bad_values_are_refused_naming_the_option(lab, arg: str, message: str) -> None:
    before = {j.job_id for j in lab.client().jobs()}
    done = sbatch(lab, arg, "--wrap", "true")
    assert done.returncode != 0 and message in done.stderr, done.stderr
    assert {j.job_id for j in lab.client().jobs()} == before  # nothing was queued


@pytest.mark.parametrize(("args", "message"), [
    (("--ft",), "slurm-ft: --ft needs --ft-ckpt-dir=PATH (absolute, on a file system all nodes share)"),
    (("-N2", "--ft-ckpt-dir=/tmp/ckpt", "--ft-spare-nodes=2"),
     "slurm-ft: --ft-spare-nodes=2 leaves none of the job's 2 node(s) to train on: ask for -N3 or more"),
])
def test_what_cannot_work_is_refused_at_submit(lab, args, message) -> None:
    before = {j.job_id for j in lab.client().jobs()}
    done = sbatch(lab, *args, "--wrap", "true")
    assert done.returncode != 0 and message in done.stderr, done.stderr
    assert {j.job_id for j in lab.client().jobs()} == before  # nothing was queued


def test_hang_timeout_zero_turns_hang_detection_off_as_launch_says(lab) -> None:
    job = submit(lab, "srun -N1 -n1 printenv SLURM_FT_HANG_TIMEOUT\n", "-N1", "--ft-hang-timeout=0",
                 "--ft-ckpt-dir=/tmp/ckpt")
    wait_job(lab, job, [JobState.COMPLETED], timeout=60)
    assert output_of(lab, job).strip() == "0"
    launch_help = subprocess.run([sys.executable, "-m", "slurm_ft.cli", "launch", "--help"], capture_output=True,
                                 text=True, check=True).stdout
    assert "(0 off)" in " ".join(launch_help.split())


def test_job_and_its_steps_see_the_values(lab) -> None:
    script = ("env | grep -E '^(SLURM_FT_|SLURM_SPANK_FT_)' | sort | sed 's/^/batch: /'\n"
              "srun -N1 -n1 env | grep -E '^SLURM_FT_' | sort | sed 's/^/step: /'\n")
    job = submit(lab, script, "-N1", "--ft-ckpt-dir=/tmp/ckpt dir", "--ft-max-restarts=4", "--ft-hang-timeout=90",
                 "--ft-ckpt-every=50", "--ft-spare-nodes=0")
    wait_job(lab, job, [JobState.COMPLETED], timeout=60)
    lines = set(output_of(lab, job).splitlines())
    for name, value in [("ENABLED", "1"), ("CKPT_DIR", "/tmp/ckpt dir"), ("MAX_RESTARTS", "4"),
                        ("HANG_TIMEOUT", "90"), ("CKPT_EVERY", "50"), ("SPARE_NODES", "0")]:
        assert f"batch: SLURM_SPANK_FT_{name}={value}" in lines
        assert f"batch: SLURM_FT_{name}={value}" in lines
        assert f"step: SLURM_FT_{name}={value}" in lines


def test_ckpt_every_auto_reaches_the_trainer_setting(lab) -> None:
    job = submit(lab, "srun -N1 -n1 printenv SLURM_FT_CKPT_EVERY\n", "-N1", "--ft-ckpt-every=auto",
                 "--ft-ckpt-dir=/tmp/ckpt")
    wait_job(lab, job, [JobState.COMPLETED], timeout=60)
    assert output_of(lab, job).strip() == "auto"


def test_a_job_without_ft_options_gets_none(lab) -> None:
    names = "|".join(env.JOB_SETTINGS)
    job = submit(lab, f"env | grep -E '^(SLURM_FT_|SLURM_SPANK_FT_)({names})=' || echo none\n", "-N1")
    wait_job(lab, job, [JobState.COMPLETED], timeout=60)
    assert output_of(lab, job).strip() == "none"
