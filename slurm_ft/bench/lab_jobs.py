"""The systems the lab benchmark compares, as the ``sbatch`` request and batch script each one submits.

All three run the same workload (``slurm_ft.train.example`` with the same model, data, steps and process-group
timeout) and write the same timeline; they differ only in how a fault is survived:

- ``slurm-ft``: ``sbatch --ft ...`` with ``slurm-ft launch``: asynchronous checkpoints, heartbeat hang detection,
  in-allocation restarts, a spare node swapped in for a dead one (``--no-kill``), and the monitor requeueing with
  the bad node excluded when the allocation cannot recover.
- ``slurm --requeue``: what a user builds from Slurm alone: synchronous checkpoints, ``sbatch --requeue`` (Slurm
  requeues a job whose node fails) and ``scontrol requeue`` of its own job when the training step fails, up to
  the restart budget; no node exclusion; a hang lasts until the collective timeout.
- ``torchrun --max-restarts``: torchrun on every node under ``srun`` (c10d rendezvous), restarting all workers in
  place after a worker fails, synchronous checkpoints, ``sbatch --requeue`` for node failures.

Pure: from a :class:`JobSpec` to an argv and a script text; nothing here runs anything.
"""

from __future__ import annotations

import dataclasses
import enum
import shlex
import sys
from pathlib import Path


class System(str, enum.Enum):
    SLURM_FT = "slurm-ft"
    SLURM_REQUEUE = "slurm --requeue"
    TORCHRUN = "torchrun --max-restarts"

    @property
    def slug(self) -> str:
        return {"slurm-ft": "ft", "slurm --requeue": "requeue", "torchrun --max-restarts": "torchrun"}[self.value]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """What every system trains: ``model`` (a size preset of the example trainer), ``steps``, ``step_time_s``
    (sleep per step, standing in for GPU compute), ``batch_per_rank`` (the same work per rank at any size),
    ``ckpt_every`` (steps, or ``auto``: slurm-ft only), ``collective_timeout_s`` (how long a collective waits
    for a stuck peer: the only hang detection the baselines have), ``seed``."""

    model: str = "medium"
    steps: int = 40
    step_time_s: float = 0.2
    batch_per_rank: int = 12
    ckpt_every: int | str = 10
    collective_timeout_s: float = 60.0
    seed: int = 3

    def __post_init__(self) -> None:
        from slurm_ft.train.example import MODEL_SIZES

        if self.model not in MODEL_SIZES:
            raise ValueError(f"model: unknown {self.model!r} (known: {', '.join(sorted(MODEL_SIZES))})")
        if self.steps < 1 or self.batch_per_rank < 1:
            raise ValueError(f"steps, batch_per_rank: must be >= 1, got {self.steps}, {self.batch_per_rank}")
        if self.step_time_s < 0 or not self.collective_timeout_s > 0:
            raise ValueError(f"step_time_s must be >= 0 and collective_timeout_s > 0, got {self.step_time_s}, "
                             f"{self.collective_timeout_s}")
        if self.ckpt_every != "auto" and not (isinstance(self.ckpt_every, int) and self.ckpt_every >= 1):
            raise ValueError(f"ckpt_every: an integer >= 1 or 'auto', got {self.ckpt_every!r}")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SlurmFtKnobs:
    """slurm-ft's own settings: hang timeout, launcher probe and node-fail wait, spares, restart budget, the
    adaptive interval's bounds (``--ft-ckpt-every=auto``)."""

    hang_timeout_s: float = 10.0
    startup_grace_s: float = 40.0
    probe_timeout_s: float = 5.0
    node_fail_wait_s: float = 40.0
    spare_nodes: int = 1
    max_restarts: int = 5
    min_interval_s: float | None = None
    mtbf_prior_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("hang_timeout_s", "startup_grace_s", "probe_timeout_s", "node_fail_wait_s",
                     "min_interval_s", "mtbf_prior_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name}: must be > 0, got {value!r}")
        if self.spare_nodes < 0 or self.max_restarts < 0:
            raise ValueError(f"spare_nodes, max_restarts: must be >= 0, got {self.spare_nodes}, {self.max_restarts}")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """One job to submit: ``system`` training ``workload`` on ``nodes`` nodes, files under ``dir``.
    ``checkpoint``: False for the fault-free reference run without any checkpoint."""

    system: System
    workload: Workload
    nodes: int
    dir: Path
    name: str
    checkpoint: bool = True
    knobs: SlurmFtKnobs = SlurmFtKnobs()
    max_restarts: int = 5  # the baselines' budget (slurm-ft's is knobs.max_restarts)

    @property
    def ckpt_dir(self) -> Path:
        return self.dir / "ckpt"

    @property
    def timeline(self) -> Path:
        return self.dir / "timeline.jsonl"

    @property
    def script_path(self) -> Path:
        return self.dir / "job.sh"

    @property
    def allocated_nodes(self) -> int:
        return self.nodes + (self.knobs.spare_nodes if self.system is System.SLURM_FT else 0)


# torchrun's rendezvous port: below the lab's daemon ports (slurm_ft.lab.ports.PORT_RANGE, 20000-32000; a job
# once drew slurmd's port and its rendezvous failed) and below the ephemeral range.
TORCHRUN_PORT_BASE = 15000


def trainer_argv(spec: JobSpec) -> list[str]:
    """The example trainer's command line for ``spec`` (asynchronous saves for slurm-ft only)."""
    w = spec.workload
    every = w.ckpt_every if spec.checkpoint else 10**9
    if every == "auto" and spec.system is not System.SLURM_FT:
        raise ValueError(f"ckpt_every: 'auto' is slurm-ft's (--ft-ckpt-every=auto), not {spec.system.value}'s")
    argv = [sys.executable, "-m", "slurm_ft.train.example", "--steps", str(w.steps), "--seed", str(w.seed),
            "--model-size", w.model, "--batch-per-rank", str(w.batch_per_rank), "--step-time", f"{w.step_time_s:g}",
            "--ckpt-dir", str(spec.ckpt_dir), "--ckpt-every", str(every), "--pg-timeout",
            f"{w.collective_timeout_s:g}", "--timeline", str(spec.timeline)]
    if spec.system is not System.SLURM_FT:
        argv.append("--sync")
    if spec.system is System.SLURM_FT and every == "auto":
        if spec.knobs.min_interval_s is not None:
            argv += ["--ckpt-min-interval", f"{spec.knobs.min_interval_s:g}"]
        if spec.knobs.mtbf_prior_s is not None:
            argv += ["--mtbf-prior", f"{spec.knobs.mtbf_prior_s:g}"]
    return argv


def sbatch_argv(spec: JobSpec) -> list[str]:
    """``sbatch`` and its options (the script path last). Every job has its nodes to itself (a dead node takes
    down only the job under test)."""
    argv = ["sbatch", "--parsable", f"--nodes={spec.allocated_nodes}", "--ntasks-per-node=1", "--exclusive",
            f"--job-name={spec.name}", f"--output={spec.dir / 'slurm-%j.out'}", f"--chdir={spec.dir}"]
    if spec.system is System.SLURM_FT:
        k = spec.knobs
        argv += ["--ft", f"--ft-ckpt-dir={spec.ckpt_dir}", f"--ft-ckpt-every={spec.workload.ckpt_every}",
                 f"--ft-max-restarts={k.max_restarts}", f"--ft-hang-timeout={k.hang_timeout_s:g}"]
        if k.spare_nodes:
            argv += [f"--ft-spare-nodes={k.spare_nodes}", "--no-kill"]  # the allocation survives a dead node
    else:
        argv.append("--requeue")
    return [*argv, str(spec.script_path)]


def batch_script(spec: JobSpec) -> str:
    """The batch script ``spec``'s system submits."""
    trainer = " ".join(shlex.quote(a) for a in trainer_argv(spec))
    py = shlex.quote(sys.executable)
    if spec.system is System.SLURM_FT:
        k = spec.knobs
        return (f"#!/bin/bash\nexec {py} -m slurm_ft.cli launch --startup-grace {k.startup_grace_s:g} "
                f"--probe-timeout {k.probe_timeout_s:g} --node-fail-wait {k.node_fail_wait_s:g} -- {trainer}\n")
    if spec.system is System.SLURM_REQUEUE:
        return ("#!/bin/bash\n"
                f"srun --kill-on-bad-exit=1 --nodes={spec.nodes} --ntasks-per-node=1 {trainer}\n"
                "rc=$?\n"
                f'if [ "$rc" -ne 0 ] && [ "${{SLURM_RESTART_COUNT:-0}}" -lt {spec.max_restarts} ]; then\n'
                '    scontrol requeue "$SLURM_JOB_ID"\n'
                "fi\n"
                'exit "$rc"\n')
    torchrun = trainer.replace(f"{py} -m slurm_ft.train.example",
                               f"{py} -m torch.distributed.run --nnodes={spec.nodes} --nproc-per-node=1 "
                               "--rdzv-backend=c10d --rdzv-endpoint=\"$addr:$port\" --rdzv-id=\"$SLURM_JOB_ID\" "
                               f"--max-restarts={spec.max_restarts} -m slurm_ft.train.example", 1)
    return ("#!/bin/bash\n"
            'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
            f'addr=$({py} -m slurm_ft.slurm.address "$head" {spec.nodes}) || exit 2\n'
            f"port=$(({TORCHRUN_PORT_BASE} + SLURM_JOB_ID % 1000))\n"
            "# torch 2.13 shares the agent's TCPStore across in-place restarts without a per-attempt key prefix:\n"
            "# a process group created after a restart reads the dead attempt's addresses and hangs. Not sharing\n"
            "# it gives torchrun its best case.\n"
            "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1\n"
            f"exec srun --kill-on-bad-exit=1 --nodes={spec.nodes} --ntasks-per-node=1 {torchrun}\n")
