"""A quick health probe of the allocation's nodes, for the launcher to tell a dead node from a dead rank.

After a failed attempt Slurm may not know yet that a node is gone (it notices after ``SlurmdTimeout``, 300 s by
default). The probe asks every node at once to run ``true`` as a one-task step (``srun --overlap``): a healthy
node answers in a fraction of a second, a node whose slurmd is gone fails or does not answer within
``timeout_s``. One subprocess per node, all in parallel, argument lists only.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from slurm_ft.config import require


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProbeConfig:
    """``timeout_s`` (--probe-timeout, 0 = no probe): how long a node may take to run one ``true`` step."""

    timeout_s: float = 10.0
    poll_s: float = 0.05

    def __post_init__(self) -> None:
        require(isinstance(self.timeout_s, (int, float)) and 0 <= self.timeout_s <= 600, "timeout_s",
                f"must be within [0, 600] seconds (--probe-timeout), got {self.timeout_s!r}")
        require(self.poll_s > 0, "poll_s", f"must be > 0, got {self.poll_s!r}")


class ProbeProcess(Protocol):
    def poll(self) -> int | None: ...

    def kill(self) -> None: ...


Spawn = Callable[[Sequence[str], Mapping[str, str]], ProbeProcess]


def probe_argv(node: str) -> list[str]:
    """One task on ``node``, sharing the allocation with whatever still runs there."""
    return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap", "--quiet",
            "--kill-on-bad-exit=1", "true"]


def _spawn(argv: Sequence[str], env: Mapping[str, str]) -> ProbeProcess:
    return subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def probe_nodes(nodes: Sequence[str], env: Mapping[str, str], config: ProbeConfig = ProbeConfig(), *,
                spawn: Spawn = _spawn, clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> dict[str, str]:
    """Probe ``nodes`` in parallel; return ``{node: why}`` for each one that failed (empty: all healthy)."""
    if config.timeout_s <= 0 or not nodes:
        return {}
    bad: dict[str, str] = {}
    running: dict[str, ProbeProcess] = {}
    for node in nodes:
        try:
            running[node] = spawn(probe_argv(node), env)
        except OSError:  # no srun here: the probe cannot judge, so it blames nobody
            return {}
    deadline = clock() + config.timeout_s
    while running:
        for node, proc in list(running.items()):
            code = proc.poll()
            if code is not None:
                del running[node]
                if code != 0:
                    bad[node] = f"probe step failed (exit {code})"
        if not running:
            break
        if clock() >= deadline:
            for node, proc in running.items():
                proc.kill()
                bad[node] = f"probe step did not finish within {config.timeout_s:g}s"
            break
        sleep(config.poll_s)
    return bad
