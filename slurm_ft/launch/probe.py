"""A quick health probe of the allocation's nodes, for the launcher to tell a dead node from a dead rank.

After a failed attempt Slurm may not know yet that a node is gone (it notices after ``SlurmdTimeout``, 300 s by
default). The probe asks every node to run one task that prints the node's name, first as one step across all
of them (one srun, one step for slurmctld to create however large the job: the common case, every node healthy,
in one round trip). Each node whose name did not come back is then asked alone (``srun --overlap`` per node, in
parallel): a healthy node answers in a fraction of a second, a node whose slurmd is gone fails or does not answer
within ``timeout_s``. Argument lists only.

The step across all nodes also reports each node's uptime: a node that booted after the failed attempt started
(``since``) fails the probe too, though it answers: it rebooted under the attempt, and everything it held (the
attempt's ranks, the warm standbys, its ``/tmp`` and ``/dev/shm``) is gone; nothing may count on it.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from slurm_ft.core.config import require

REBOOTED = "rebooted"  # how the reason of a node that booted after the attempt started begins
CLOCK_SLACK_S = 5.0  # how far two nodes' clocks may differ when a boot time is set against the attempt's start
UPTIME_COMMAND = 'echo "$SLURMD_NODENAME $(cut -d" " -f1 /proc/uptime)"'
NODE_COMMAND = ("/bin/sh", "-c", UPTIME_COMMAND)  # the probe step's task on each node: prints its name and uptime


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProbeConfig:
    """The probe step run on the nodes after a failed attempt."""

    timeout_s: float = 10.0
    """How long a node may take to run one ``true`` step (``--probe-timeout``); 0: no probe."""
    poll_s: float = 0.05
    """Seconds between two looks at the probe steps."""
    node_command: tuple[str, ...] = NODE_COMMAND
    """What each node runs in the step across all of them; it prints the node's name and uptime (``n3 1234.56``;
    the launcher's also records the node's link counters, ``slurm_ft.launch.links``)."""

    def __post_init__(self) -> None:
        require(isinstance(self.timeout_s, (int, float)) and 0 <= self.timeout_s <= 600, "timeout_s",
                f"must be within [0, 600] seconds (--probe-timeout), got {self.timeout_s!r}")
        require(self.poll_s > 0, "poll_s", f"must be > 0, got {self.poll_s!r}")
        require(bool(self.node_command) and all(isinstance(a, str) for a in self.node_command), "node_command",
                f"must be a non-empty argument list, got {self.node_command!r}")


class ProbeProcess(Protocol):
    def poll(self) -> int | None: ...

    def kill(self) -> None: ...


Spawn = Callable[[Sequence[str], Mapping[str, str]], ProbeProcess]
Run = Callable[[Sequence[str], Mapping[str, str], float], str]  # argv, env, timeout -> stdout (raises OSError)


def fan_out_argv(nodes: Sequence[str], command: Sequence[str] = NODE_COMMAND) -> list[str]:
    """One task on each of ``nodes`` in one step, running ``command`` (it prints its node's name and uptime,
    ``n3 1234.56``); a failed task does not end the rest."""
    return ["srun", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
            f"--nodelist={','.join(nodes)}", "--overlap", "--quiet", "--kill-on-bad-exit=0", *command]


def boot_times(out: str, nodes: Sequence[str], now: float) -> dict[str, float | None]:
    """``{node: boot time}`` (``now`` minus its uptime) from the fan-out's lines (``n3 1234.56``), for the nodes of
    ``nodes`` that answered; None for one that answered without a readable uptime."""
    found: dict[str, float | None] = {}
    for line in out.splitlines():
        fields = line.split()
        if not fields or fields[0] not in nodes:
            continue
        try:
            found[fields[0]] = now - float(fields[1])
        except (IndexError, ValueError):
            found[fields[0]] = None
    return found


def rebooted_since(boots: Mapping[str, float | None], since: float | None) -> dict[str, str]:
    """``{node: why}`` for each node that booted after ``since`` (more than ``CLOCK_SLACK_S`` later)."""
    if since is None:
        return {}
    return {node: f"{REBOOTED} {boot - since:.0f} s after the attempt started: nothing it held survived"
            for node, boot in sorted(boots.items()) if boot is not None and boot > since + CLOCK_SLACK_S}


def probe_argv(node: str) -> list[str]:
    """One task on ``node``, sharing the allocation with whatever still runs there."""
    return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap", "--quiet",
            "--kill-on-bad-exit=1", "true"]


def _spawn(argv: Sequence[str], env: Mapping[str, str]) -> ProbeProcess:
    return subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _run(argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> str:
    try:
        done = subprocess.run(list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, timeout=timeout_s, start_new_session=True,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        return out.decode(errors="replace") if isinstance(out, bytes) else out
    return done.stdout


def answered(nodes: Sequence[str], env: Mapping[str, str], timeout_s: float, run: Run = _run,
             now: Callable[[], float] = time.time, command: Sequence[str] = NODE_COMMAND) -> dict[str, float | None]:
    """The nodes that ran a task of one step across all of them within ``timeout_s`` (none when srun fails), with
    their boot times (``boot_times``)."""
    try:
        out = run(fan_out_argv(nodes, command), env, timeout_s)
    except OSError:
        return {}
    return boot_times(out, nodes, now())


def probe_nodes(nodes: Sequence[str], env: Mapping[str, str], config: ProbeConfig = ProbeConfig(), *,
                since: float | None = None, spawn: Spawn = _spawn, run: Run = _run,
                clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                now: Callable[[], float] = time.time) -> dict[str, str]:
    """Probe ``nodes`` within ``timeout_s``: one step across all of them (at most half of it), then each node
    that did not answer on its own, in parallel, for the rest; return ``{node: why}`` for each one that failed
    (empty: all healthy), a node that rebooted after ``since`` (wall time: the failed attempt's start) too."""
    if config.timeout_s <= 0 or not nodes:
        return {}
    deadline = clock() + config.timeout_s
    boots = answered(nodes, env, config.timeout_s / 2, run, now, config.node_command) if len(nodes) > 1 else {}
    missed = _probe_each([n for n in nodes if n not in boots], env, deadline, config, spawn, clock, sleep)
    return {**rebooted_since(boots, since), **missed}


def _probe_each(nodes: Sequence[str], env: Mapping[str, str], deadline: float, config: ProbeConfig, spawn: Spawn,
                clock: Callable[[], float], sleep: Callable[[float], None]) -> dict[str, str]:
    """A one-task step per node, all in parallel, until ``deadline``."""
    bad: dict[str, str] = {}
    running: dict[str, ProbeProcess] = {}
    for node in nodes:
        try:
            running[node] = spawn(probe_argv(node), env)
        except OSError:  # no srun here: the probe cannot judge, so it blames nobody
            return {}
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
