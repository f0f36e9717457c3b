"""``slurm-ft demo``: a real local Slurm lab, the monitor in a thread, and faults injected into 2-node jobs.

Scenarios (the example trainer under ``slurm-ft launch``): a clean run, ``kill-rank`` (SIGKILL of rank 1),
``hang`` (rank 1 stops progressing) and ``user-error`` (an exception). Prints a table
``fault | detection | recovery | steps lost | attempts | ETTR | monitor`` where ETTR is the clean run's wall time
over the faulted run's. Node failure (a slurmd killed) is exercised by tests/integration/test_recovery_monitor.py;
it is not in the demo because Slurm holds a requeued job ~120 s before it may start again.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from slurm_ft.errors import SlurmFtError
from slurm_ft.faults import Fault, ettr, first_attempt_only, summarize, trainer_flags

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def _script(ckpt: Path, steps: int, fault: Fault | None, hang_timeout: int) -> str:
    trainer = " ".join([shlex.quote(sys.executable), "-m", "slurm_ft.train.example", "--steps", str(steps),
                        "--ckpt-every", "4", "--seed", "3", "--sync", "--step-time", "0.05"])
    if fault is Fault.USER_ERROR:  # deterministic: it fails on every attempt
        trainer += " " + trainer_flags(fault, 1, steps // 2 + 3)
    elif fault is not None:  # a transient fault: first attempt only
        trainer = first_attempt_only(trainer, trainer_flags(fault, 1, steps // 2 + 3))
    return (f"#!/bin/bash\nexport SLURM_FT_CKPT_DIR={shlex.quote(str(ckpt))}\n"
            f"exec {shlex.quote(sys.executable)} -m slurm_ft.cli launch --hang-timeout {hang_timeout}"
            f" --startup-grace 15 --max-restarts 2 -- {trainer}\n")


def _submit(lab, env: dict[str, str], workdir: Path, name: str, text: str) -> int:
    path = workdir / f"{name}.sh"
    path.write_text(text)
    done = subprocess.run(["sbatch", "--parsable", "-N2", "-J", name, str(path)], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise SlurmFtError(f"demo: sbatch failed: {done.stderr.strip()}")
    return int(done.stdout.strip().split(";")[0])


def _wait(client, job_ids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [getattr(client.job(j), "state", None) for j in job_ids]
        if all(s is not None and s.value in TERMINAL for s in states):
            return
        time.sleep(1.0)
    raise SlurmFtError(f"demo: jobs {job_ids} did not finish within {timeout:g}s")


def _verdict(client, state: Path, job_id: int) -> str:
    """The monitor's word on a job: its Comment, else its last recorded action (Slurm 22.05 refuses Comment
    updates on finished jobs)."""
    from slurm_ft.status import read_status

    comment = getattr(client.job(job_id), "comment", "")
    if comment:
        return comment
    try:
        acts = [a for a in read_status(state)["actions"] if a["job_id"] == job_id]
    except SlurmFtError:
        return "-"
    return acts[0]["detail"].get("comment", "-")[:120] if acts else "-"


def _fmt(value: float | int | None, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.1f}{unit}" if isinstance(value, float) else f"{value}{unit}"


def run_demo(workdir: Path, steps: int, hang_timeout: int) -> str:
    from slurm_ft.classify import classify
    from slurm_ft.lab.cluster import LabCluster, LabConfig
    from slurm_ft.monitor import Monitor, MonitorConfig

    lab = LabCluster(LabConfig(dir=workdir / "lab", nodes=4))
    lab.up()
    stop = threading.Event()
    try:
        state = workdir / "state"
        env = {**__import__("os").environ, **lab.env(), "SLURM_FT_STATE_DIR": str(state)}
        monitor = Monitor(MonitorConfig(state_dir=state, poll_interval_s=2.0), lab.client(), classify)
        thread = threading.Thread(target=monitor.run, kwargs={"stop": stop.is_set, "sleep": stop.wait}, daemon=True)
        thread.start()
        jobs_dir = workdir / "jobs"
        jobs_dir.mkdir(parents=True, exist_ok=True)
        scenarios: list[tuple[str, Fault | None]] = [("clean", None), ("kill-rank", Fault.KILL_RANK),
                                                     ("hang", Fault.HANG), ("user-error", Fault.USER_ERROR)]
        ids: dict[str, int] = {}
        for batch in (scenarios[:2], scenarios[2:]):
            batch_ids = [ids.setdefault(name, _submit(lab, env, jobs_dir, name, _script(
                jobs_dir / f"ck-{name}", steps, fault, hang_timeout))) for name, fault in batch]
            _wait(lab.client(), batch_ids, timeout=300)
        time.sleep(3)  # one more monitor poll over the ended jobs
        stop.set()
        thread.join(timeout=30)
        monitor.close()
        clean = summarize(jobs_dir / "ck-clean" / ".slurm-ft")
        rows = ["fault       | detection | recovery | steps lost | attempts | exit | ETTR | monitor comment"]
        for name, _ in scenarios:
            rec = summarize(jobs_dir / f"ck-{name}" / ".slurm-ft")
            comment = _verdict(lab.client(), state, ids[name])
            ratio = ettr(rec, clean.wall_s or 0.0)
            rows.append(f"{name:<11} | {_fmt(rec.detection_s, ' s'):>9} | {_fmt(rec.recovery_s, ' s'):>8} | "
                        f"{_fmt(rec.steps_lost):>10} | {rec.attempts:>8} | {_fmt(rec.exit_code):>4} | "
                        f"{'-' if ratio is None else f'{ratio:.2f}':>4} | {comment}")
        return "\n".join(rows)
    finally:
        stop.set()
        lab.down()


def register(subparsers: argparse._SubParsersAction, name: str = "demo") -> None:
    parser = subparsers.add_parser(name, help="lab cluster + monitor + injected faults, with a summary table")
    parser.add_argument("--dir", help="working directory (default: a new one under /tmp)")
    parser.add_argument("--steps", type=int, default=24, help="training steps per job (default 24)")
    parser.add_argument("--hang-timeout", type=int, default=8, help="launcher hang timeout in seconds (default 8)")
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    if args.steps < 8:
        raise SlurmFtError(f"demo: --steps must be >= 8, got {args.steps}")
    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="slurm-ft-demo-", dir="/tmp"))
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o755)
    print(run_demo(workdir, args.steps, args.hang_timeout))
    print(f"(evidence in {workdir})")
    return 0
