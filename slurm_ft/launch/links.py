"""The job's own readings of its nodes' link counters: at an attempt's start and in the probe after it failed.

A link that went down during an attempt and came back before the launcher's probe leaves the probe nothing to
find; the node's kernel counted it (``slurm_ft.health.links``). So each node's counters are read twice, as the
job's user, on the node itself:

- ``links.start.<node>.json``: by the per-rank wrapper (``slurm_ft.launch.rank``) as the attempt's ranks start
  (the first rank of the node to get there writes it);
- ``links.probe.<node>.json``: by the probe step after a failed or hung attempt (``slurm_ft.launch.probe``: each
  node runs ``python -m slurm_ft.launch.links --run-dir DIR``, which writes it and prints the node's name and uptime,
  the probe's answer).

``losses`` compares the two for each of the attempt's nodes: a counter that grew names the node whose link went
down (the launcher's verdict: ``network``, a restart in place). Both files move to ``attempt-<N>/`` with the rest
of the attempt's evidence. They are the job's word: they may name the job's own nodes, never strike one (the
epilog's own reading does that, as root: ``slurm_ft.cluster.hooks``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from slurm_ft.core import env as ft_env
from slurm_ft.core import rundir as records
from slurm_ft.health.links import LinkLoss, LinkReader, LinkSnapshot, SysfsLinks, link_losses

LINKS_GLOB = "links.*.json"
START, PROBE = "start", "probe"
MAX_BYTES = 262_144
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def links_path(run_dir: str | os.PathLike[str], when: str, node: str) -> Path:
    if when not in (START, PROBE) or not _NODE.match(node):
        raise ValueError(f"links: no file for reading {when!r} of node {node!r}")
    return Path(run_dir) / f"links.{when}.{node}.json"


def record(run_dir: str | os.PathLike[str], when: str, node: str, reader: LinkReader | None = None, *,
           keep: bool = False) -> Path:
    """Read ``node``'s counters (this node's) and write them as reading ``when``; ``keep``: leave a reading that is
    there already (another rank of the node wrote it)."""
    path = links_path(run_dir, when, node)
    if keep and path.exists():
        return path
    snap = (reader or SysfsLinks()).read(node)
    records.write_json_atomic(path, snap.to_dict())
    return path


def record_start(environ: Mapping[str, str]) -> None:
    """The wrapper's reading at its rank's start; one line on stderr when it cannot be made, never a failure."""
    run_dir = ft_env.job_setting(ft_env.RUN_DIR, environ)
    node = records.node_name(environ)
    if not run_dir or not _NODE.match(node):
        return
    try:
        record(run_dir, START, node, keep=True)
    except (OSError, ValueError) as exc:
        print(f"slurm-ft: {node}: link counters not recorded in {run_dir}: {exc}", file=sys.stderr)


def read(run_dir: str | os.PathLike[str], when: str, node: str) -> LinkSnapshot | None:
    """A reading of ``node``, or None when there is none or it is not one (a torn or foreign file)."""
    try:
        path = links_path(run_dir, when, node)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd) as fh:
            snap = LinkSnapshot.from_dict(json.loads(fh.read(MAX_BYTES)))
    except (OSError, ValueError):
        return None
    return snap if snap is not None and snap.node == node else None


def losses(run_dir: str | os.PathLike[str], nodes: Iterable[str]) -> tuple[LinkLoss, ...]:
    """Every link of ``nodes`` that went down between the attempt's start and the probe after it."""
    found: list[LinkLoss] = []
    for node in sorted(set(nodes)):
        before, after = read(run_dir, START, node), read(run_dir, PROBE, node)
        if before is not None and after is not None:
            found += link_losses(before, after)
    return tuple(found)


def probe_command(python: str, run_dir: Path) -> tuple[str, ...]:
    """What each node runs in the probe's step across the nodes: records its reading, prints its name."""
    return (python, "-m", "slurm_ft.launch.links", "--run-dir", str(run_dir))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_ft.launch.links", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    node = records.node_name()
    try:
        record(args.run_dir, PROBE, node)
    except (OSError, ValueError) as exc:
        print(f"slurm-ft: {node}: link counters not recorded: {exc}", file=sys.stderr)
    print(node, _uptime(), flush=True)  # the probe's answer: this node ran a task, booted that long ago
    return 0


def _uptime() -> str:
    """The node's uptime in seconds as ``/proc/uptime`` says (the probe tells a rebooted node by it); "?" unread."""
    try:
        return Path("/proc/uptime").read_text().split()[0]
    except (OSError, IndexError):
        return "?"


if __name__ == "__main__":
    sys.exit(main())
