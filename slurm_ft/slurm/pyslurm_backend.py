"""The pyslurm backend: the same SlurmClient over pyslurm's object API (pyslurm >= 23.2, written for 25.11).

pyslurm builds only against the Slurm release it is versioned for (pyslurm 25.11 needs Slurm 25.11), so this
backend is picked only when pyslurm imports and matches the running Slurm (see ``slurm_ft.slurm.backend``).
The contract suite (tests/integration/test_slurm_client.py) runs it against the real 25.11 lab in CI; the unit
tests check the mapping against a stand-in module.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from slurm_ft.core.errors import SlurmCommandError
from slurm_ft.slurm import parsers
from slurm_ft.slurm.types import JobInfo, JobState, NodeInfo


class PyslurmClient:
    """SlurmClient over pyslurm. It talks to the cluster of the process's own ``SLURM_CONF``."""

    name = "pyslurm"

    def __init__(self, module: ModuleType | Any | None = None) -> None:
        self._py = module if module is not None else importlib.import_module("pyslurm")

    # --- reads ------------------------------------------------------------------------------------------------
    def jobs(self) -> list[JobInfo]:
        loaded = self._call("load jobs", lambda: self._py.Jobs.load())
        return [job_from_pyslurm(job) for job in loaded.values()]

    def job(self, job_id: int) -> JobInfo | None:
        return next((j for j in self.jobs() if j.job_id == job_id), None)

    def nodes(self) -> list[NodeInfo]:
        loaded = self._call("load nodes", lambda: self._py.Nodes.load())
        return [node_from_pyslurm(node) for node in loaded.values()]

    def version(self) -> str:
        """The running slurmctld's version (``25.11.7``), not pyslurm's own ``__version__`` (``25.11.2``)."""
        config = self._call("load config", lambda: self._py.slurmctld.Config.load())
        return parsers.parse_version(str(getattr(config, "version", "") or ""))

    # --- actions ----------------------------------------------------------------------------------------------
    def drain(self, node: str, reason: str) -> None:
        self._modify_node(node, state="DRAIN", reason=reason)

    def resume(self, node: str) -> None:
        self._modify_node(node, state="RESUME")

    def requeue(self, job_id: int, *, hold: bool = False) -> None:
        self._call(f"requeue job {job_id}", lambda: self._py.Job(job_id).requeue(hold=hold))

    def release(self, job_id: int) -> None:
        self._call(f"release job {job_id}", lambda: self._py.Job(job_id).release())

    def cancel(self, job_id: int) -> None:
        self._call(f"cancel job {job_id}", lambda: self._py.Job(job_id).cancel())

    def update_job(self, job_id: int, *, comment: str | None = None,
                   excluded_nodes: tuple[str, ...] | None = None) -> None:
        changes: dict[str, Any] = {}
        if comment is not None:
            changes["comment"] = comment
        if excluded_nodes == ():  # pyslurm reads "" as "unchanged": only scontrol can clear the list
            self._clear_excluded(job_id)
        elif excluded_nodes is not None:
            changes["excluded_nodes"] = parsers.compress_hostlist(excluded_nodes)
        if changes:
            description = self._py.JobSubmitDescription(**changes)
            self._call(f"update job {job_id}", lambda: self._py.Job(job_id).modify(description))

    # --- plumbing ---------------------------------------------------------------------------------------------
    def _clear_excluded(self, job_id: int) -> None:
        from slurm_ft.slurm.cli_backend import CliSlurmClient

        CliSlurmClient().update_job(job_id, excluded_nodes=())

    def _modify_node(self, node: str, **changes: str) -> None:
        self._call(f"update node {node}", lambda: self._py.Node(node).modify(self._py.Node(**changes)))

    def _call(self, what: str, func: Any) -> Any:
        try:
            return func()
        except Exception as exc:  # noqa: BLE001 - the pyslurm boundary: every failure becomes one error type
            raise SlurmCommandError(f"pyslurm {what} failed: {type(exc).__name__}: {exc}") from exc


def job_from_pyslurm(job: Any) -> JobInfo:
    """Map a ``pyslurm.Job`` to JobInfo."""
    state = JobState.parse(str(getattr(job, "state", "") or ""))
    ended = state.finished or state is JobState.COMPLETING
    code = _int(getattr(job, "exit_code", None)) if ended else None
    signal = _int(getattr(job, "exit_code_signal", None)) if ended else None
    reason = str(getattr(job, "state_reason", "") or "")
    return JobInfo(
        job_id=int(job.id),
        name=str(getattr(job, "name", "") or ""),
        user_id=_int(getattr(job, "user_id", None)),
        state=state,
        reason="" if reason == "None" else reason,
        nodes=tuple(parsers.expand_hostlist(_hostlist(getattr(job, "allocated_nodes", None)))),
        batch_host=str(getattr(job, "batch_host", "") or ""),
        exit_code=(code if code is not None else 0) if ended else None,
        exit_signal=signal or None,
        restart_count=_int(getattr(job, "requeue_count", None)) or 0,
        comment=str(getattr(job, "comment", "") or ""),
        excluded_nodes=tuple(parsers.expand_hostlist(_hostlist(getattr(job, "excluded_nodes", None)))),
        requeue=bool(getattr(job, "is_requeueable", False)),
        work_dir=str(getattr(job, "working_directory", "") or ""),
        std_err=str(getattr(job, "standard_error", "") or ""),
        std_out=str(getattr(job, "standard_output", "") or ""),
    )


def node_from_pyslurm(node: Any) -> NodeInfo:
    """Map a ``pyslurm.Node`` to NodeInfo (pyslurm gives the state as ``IDLE+DRAIN``)."""
    state = str(getattr(node, "state", "") or "")
    return NodeInfo(
        name=str(node.name),
        state=frozenset(part.strip().upper() for part in state.split("+") if part.strip()),
        reason=str(getattr(node, "reason", "") or ""),
    )


def _hostlist(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
