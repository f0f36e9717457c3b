"""The CLI backend: reads with one ``squeue --json`` / ``sinfo --json`` per poll, acts with ``scontrol``.

The running Slurm's version is asked once per client (``scontrol --version``); it picks the JSON generation
(``formats.for_version``): 22.05's openapi v0.0.38, or ``--json=v0.0.42`` pinned on 24.11 and later.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence

from slurm_ft.core.errors import SlurmCommandError
from slurm_ft.slurm import formats, parsers
from slurm_ft.slurm.runner import CommandResult, Runner, merged_env, run_command
from slurm_ft.slurm.types import JobInfo, NodeInfo

log = logging.getLogger(__name__)

_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-\[\],]*$")


class CliSlurmClient:
    """SlurmClient over the Slurm command-line tools. ``env`` overrides ``os.environ`` (e.g. ``SLURM_CONF``)."""

    name = "cli"

    def __init__(self, *, env: Mapping[str, str] | None = None, runner: Runner = run_command,
                 timeout: float = 30.0) -> None:
        self._env = dict(env or {})
        self._runner = runner
        self._timeout = timeout
        self._version: str | None = None
        self._format: formats.JsonFormat | None = None

    # --- reads: one call each -----------------------------------------------------------------------------------
    def jobs(self) -> list[JobInfo]:
        fmt = self.json_format()
        return fmt.parse_jobs(self._read(fmt, fmt.squeue_args), self.version())

    def job(self, job_id: int) -> JobInfo | None:
        wanted = _job_id(job_id)
        return next((j for j in self.jobs() if j.job_id == wanted), None)

    def nodes(self) -> list[NodeInfo]:
        fmt = self.json_format()
        return fmt.parse_nodes(self._read(fmt, fmt.sinfo_args), self.version())

    def version(self) -> str:
        """The Slurm version the tools report (``22.05.8``), asked once per client."""
        if self._version is None:
            self._version = parsers.parse_version(self._run(["scontrol", "--version"]).stdout)
        return self._version

    def json_format(self) -> formats.JsonFormat:
        """The JSON generation this client reads (chosen once, from ``version()``)."""
        if self._format is None:
            self._format = formats.for_version(self.version())
            log.debug("Slurm %s: JSON %s", self._version, self._format.name)
        return self._format

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
    def _read(self, fmt: formats.JsonFormat, argv: Sequence[str]) -> str:
        """``argv``'s output; a pinned format the release no longer ships falls back once to its newest."""
        result = self._runner(argv, env=merged_env(self._env), timeout=self._timeout)
        if result.returncode == 0 or fmt is not formats.V0042 or "data_parser" not in result.stderr:
            return result.check().stdout
        listing = self._run(["squeue", "--json=list"])
        newest = formats.newest_listed(listing.stdout + listing.stderr)
        if newest is None:
            raise SlurmCommandError(f"Slurm {self.version()} offers no --json={fmt.name} and lists no "
                                    f"data_parser: {result.stderr.strip()[-200:]}")
        log.warning("Slurm %s lacks --json=%s; reading %s with the %s adapter", self.version(), fmt.name, newest,
                    fmt.name)
        self._format = formats.with_version(fmt, newest)
        return self._run(list(self._format.squeue_args if argv == fmt.squeue_args
                              else self._format.sinfo_args)).stdout

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
