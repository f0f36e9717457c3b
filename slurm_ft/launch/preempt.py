"""The launcher on SIGUSR1 and SIGTERM: the ranks save, then the job comes back from exactly that step.

- ``sbatch --signal=B:USR1@N`` (the batch shell gets SIGUSR1 N seconds before the time limit; the job script must
  ``exec slurm-ft launch ...`` so that the launcher is that shell), or ``scancel --batch --signal=USR1 JOB``
  (an admin or a preemption script): the launcher forwards SIGUSR1 to every rank (through srun), waits for their
  emergency save within ``deadline_s``, puts ``slurm-ft: restart=K resume_step=S cause=preemption by=launch`` in
  the job's Comment and requeues the job itself. The next run resumes from step S, and the trainer does not count
  it as a failure (``SLURM_FT_RESTART_CAUSE=preemption``). The requeue does not use the restart budget.
- SIGTERM (``scancel``, the time limit, preemption with a GraceTime): Slurm is ending the job and will SIGKILL
  what is left KillWait seconds later (30 s by default). The launcher forwards SIGTERM, waits for the ranks within
  ``min(deadline_s, KillWait - margin)`` and exits 143; Slurm's end state (PREEMPTED, TIMEOUT, CANCELLED) tells the
  monitor whether to requeue, and the resume step is the newest committed checkpoint, which the emergency save made.

Deadlines, defaults fitting Slurm's defaults (KillWait 30 s): the ranks' emergency save
(``CheckpointConfig.emergency_deadline_s``) 20 s; the launcher's wait (``--preempt-deadline``,
``SLURM_FT_PREEMPT_DEADLINE``) 25 s, at most KillWait - 5 s for SIGTERM. A site with a longer KillWait or
GraceTime may raise both.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any

from slurm_ft.core.config import require
from slurm_ft.core.errors import ConfigError, SlurmFtError

DEFAULT_DEADLINE_S = 25.0
KILL_WAIT_MARGIN_S = 5.0  # after the ranks: the Comment, the requeue, the launcher's own exit
PREEMPT_DEADLINE = "SLURM_FT_PREEMPT_DEADLINE"  # the launcher's wait, seconds (--preempt-deadline wins)
SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PreemptConfig:
    """The launcher's answer to SIGUSR1 (save and requeue) and SIGTERM (save and end)."""

    deadline_s: float = DEFAULT_DEADLINE_S
    """How long the ranks may take to save and exit after the signal (``--preempt-deadline``,
    ``$SLURM_FT_PREEMPT_DEADLINE``)."""
    kill_wait_s: float | None = None
    """Slurm's KillWait when known: caps the wait on SIGTERM (at most KillWait - 5 s)."""

    def __post_init__(self) -> None:
        require(isinstance(self.deadline_s, (int, float)) and self.deadline_s > 0, "deadline_s",
                f"must be > 0 seconds (--preempt-deadline / {PREEMPT_DEADLINE}), got {self.deadline_s!r}")

    def wait_s(self, signum: int) -> float:
        """The launcher's wait for the ranks after forwarding ``signum``."""
        if signum == signal.SIGTERM and self.kill_wait_s is not None:
            return max(1.0, min(self.deadline_s, self.kill_wait_s - KILL_WAIT_MARGIN_S))
        return self.deadline_s


class SignalLatch:
    """Remembers the first SIGUSR1/SIGTERM the launcher gets; the restart loop acts on it between polls."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.at: float | None = None
        self._old: dict[int, Any] = {}

    def install(self, signals: tuple[int, ...] = SIGNALS) -> None:
        for sig in signals:
            self._old[sig] = signal.signal(sig, self._catch)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}

    def _catch(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum, self.at = signum, time.time()


def parse_kill_wait(show_config: str) -> float | None:
    """``KillWait`` from ``scontrol show config`` text (``KillWait = 30 sec``), or None."""
    for line in show_config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "KillWait":
            word = value.split()[0] if value.split() else ""
            return float(word) if word.isdigit() else None
    return None


def kill_wait(environ: Mapping[str, str],
              run: Callable[..., Any] = subprocess.run) -> float | None:
    """Slurm's KillWait, asked once at the launcher's start; None when scontrol does not answer."""
    try:
        done = run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=20, check=False,
                   env=dict(environ))
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_kill_wait(done.stdout) if done.returncode == 0 else None


def deadline_setting(flag: float | None, environ: Mapping[str, str]) -> float:
    """--preempt-deadline, else $SLURM_FT_PREEMPT_DEADLINE, else the default (a bad value names the variable)."""
    if flag is not None:
        return flag
    text = environ.get(PREEMPT_DEADLINE, "")
    if not text:
        return DEFAULT_DEADLINE_S
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"launch: {PREEMPT_DEADLINE} must be a number of seconds, got {text!r}") from None


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def requeue_job(requeue: Callable[[], None] | None) -> str:
    """Requeue this job; "" when done, else why not (no Slurm client, or Slurm refused: ``--no-requeue``)."""
    if requeue is None:
        return "no Slurm client"
    try:
        requeue()
    except SlurmFtError as exc:
        return str(exc)[-300:]
    return ""
