"""A memory cgroup's counters: how often the OOM killer killed in the cgroup of this process.

Read by the rank wrapper (``slurm_ft.launch.rank``) and the warm standby (``slurm_ft.launch.standby``) before and
after a rank runs, so that a rank killed by the kernel's OOM killer is told from one killed by a signal.
"""

from __future__ import annotations

from pathlib import Path


def oom_kills(proc_root: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The OOM killer's kill count of this process's memory cgroup (v2 ``memory.events``, v1
    ``memory.oom_control``); None when there is none to read (no memory cgroup, the root cgroup)."""
    try:
        lines = (proc_root / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if controllers == "" and path:  # v2: "0::/path"
            count = _counter(cgroup_root / path.lstrip("/") / "memory.events", "oom_kill")
        elif "memory" in controllers.split(","):
            count = _counter(cgroup_root / "memory" / path.lstrip("/") / "memory.oom_control", "oom_kill")
        else:
            continue
        if count is not None:
            return count
    return None


def _counter(path: Path, key: str) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None
