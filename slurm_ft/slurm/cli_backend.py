"""The CLI backend: reads with one ``squeue --json`` / ``sinfo --json`` per poll, acts with ``scontrol``."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from slurm_ft.slurm import parsers
from slurm_ft.slurm.runner import CommandResult, Runner, merged_env, run_command
from slurm_ft.slurm.types import JobInfo, NodeInfo

_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-\[\],]*$")


class CliSlurmClient:
    """SlurmClient over the Slurm command-line tools. ``env`` overrides ``os.environ`` (e.g. ``SLURM_CONF``)."""

    name = "cli"

    def __init__(self, *, env: Mapping[str, str] | None = None, runner: Runner = run_command,
                 timeout: float = 30.0) -> None:
        self._env = dict(env or {})
        self._runner = runner
        self._timeout = timeout

    # --- reads: one call each -----------------------------------------------------------------------------------
    def jobs(self) -> list[JobInfo]:
        return parsers.parse_squeue_json(self._run(["squeue", "--all", "--json"]).stdout)

    def job(self, job_id: int) -> JobInfo | None:
        wanted = _job_id(job_id)
        return next((j for j in self.jobs() if j.job_id == wanted), None)

    def nodes(self) -> list[NodeInfo]:
        return parsers.parse_sinfo_json(self._run(["sinfo", "--all", "--json"]).stdout)

    def version(self) -> str:
        """The Slurm version the tools report (``22.05.8``)."""
        return parsers.parse_version(self._run(["scontrol", "--version"]).stdout)

    # --- actions ------------------------------------------------------------------------------------------------
    def drain(self, node: str, reason: str) -> None:
        self._scontrol("update", f"NodeName={_node(node)}", "State=DRAIN", f"Reason={_text('reason', reason)}")

    def resume(self, node: str) -> None:
        self._scontrol("update", f"NodeName={_node(node)}", "State=RESUME")

    def requeue(self, job_id: int, *, hold: bool = False) -> None:
        self._scontrol("requeuehold" if hold else "requeue", str(_job_id(job_id)))

    def release(self, job_id: int) -> None:
        self._scontrol("release", str(_job_id(job_id)))

    def cancel(self, job_id: int) -> None:
        self._run(["scancel", str(_job_id(job_id))])

    def update_job(self, job_id: int, *, comment: str | None = None,
                   excluded_nodes: tuple[str, ...] | None = None) -> None:
        fields = []
        if comment is not None:
            fields.append(f"Comment={_text('comment', comment)}")
        if excluded_nodes is not None:
            fields.append(f"ExcNodeList={parsers.compress_hostlist([_node(n) for n in excluded_nodes])}")
        if fields:
            self._scontrol("update", f"JobId={_job_id(job_id)}", *fields)

    # --- plumbing -----------------------------------------------------------------------------------------------
    def _scontrol(self, *args: str) -> None:
        self._run(["scontrol", *args])

    def _run(self, argv: Sequence[str]) -> CommandResult:
        return self._runner(argv, env=merged_env(self._env), timeout=self._timeout).check()


def _job_id(job_id: int) -> int:
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
        raise ValueError(f"job_id: must be a positive integer, got {job_id!r}")
    return job_id


def _node(name: str) -> str:
    if not isinstance(name, str) or not _NODE_NAME.match(name):
        raise ValueError(f"node: not a valid Slurm node name: {name!r}")
    return name


def _text(field: str, value: str) -> str:
    if any(ch in value for ch in "\n\r\0"):
        raise ValueError(f"{field}: must be one line, got {value!r}")
    return value
