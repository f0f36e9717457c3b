"""The pyslurm backend and the backend selector, against a stand-in module that follows pyslurm 25.11's API.

pyslurm cannot be built here (it needs Slurm 25.11; the lab runs 22.05), so this checks our mapping, not pyslurm.
"""

from __future__ import annotations

import types

import pytest

from slurm_ft.core.errors import ConfigError, SlurmCommandError
from slurm_ft.slurm import backend
from slurm_ft.slurm.cli_backend import CliSlurmClient
from slurm_ft.slurm.pyslurm_backend import PyslurmClient
from slurm_ft.slurm.types import JobState, SlurmClient


class FakeJob:
    calls: list = []

    def __init__(self, job_id=0, **attrs):
        self.id = job_id
        self.__dict__.update(attrs)

    def requeue(self, hold=False):
        FakeJob.calls.append(("requeue", self.id, hold))

    def release(self):
        FakeJob.calls.append(("release", self.id))

    def cancel(self):
        FakeJob.calls.append(("cancel", self.id))

    def modify(self, changes):
        FakeJob.calls.append(("modify", self.id, dict(changes.values)))


class FakeNode:
    calls: list = []

    def __init__(self, name=None, **attrs):
        self.name = name
        self.__dict__.update(attrs)

    def modify(self, changes):
        FakeNode.calls.append(("modify", self.name, {k: v for k, v in vars(changes).items() if k != "name"}))


class FakeDescription:
    def __init__(self, **values):
        self.values = values


def fake_pyslurm(version="25.11.2", fail=False, daemon="25.11.7"):
    jobs = {
        5: FakeJob(5, name="train", user_id=1000, state="RUNNING", state_reason="None", allocated_nodes="n[1-2]",
                   batch_host="n1", exit_code=0, exit_code_signal=0, requeue_count=1, comment="c", excluded_nodes="n4",
                   is_requeueable=True, working_directory="/w", standard_output="/w/o", standard_error="/w/e"),
        6: FakeJob(6, name="dead", user_id=0, state="FAILED", state_reason="NonZeroExitCode", allocated_nodes="n3",
                   exit_code=0, exit_code_signal=9, requeue_count=0, is_requeueable=False),
    }
    nodes = {"n1": FakeNode("n1", state="IDLE", reason=None), "n3": FakeNode("n3", state="IDLE+DRAIN", reason="r")}

    def load(data):
        def loader():
            if fail:
                raise RuntimeError("slurm_load_jobs: Unable to contact slurm controller")
            return data
        return loader

    return types.SimpleNamespace(
        __version__=version, Job=FakeJob, Node=FakeNode, JobSubmitDescription=FakeDescription,
        Jobs=types.SimpleNamespace(load=load(jobs)), Nodes=types.SimpleNamespace(load=load(nodes)),
        slurmctld=types.SimpleNamespace(Config=types.SimpleNamespace(
            load=load(types.SimpleNamespace(version=daemon)))),
    )


def test_version_is_the_running_daemons_not_pyslurms():
    assert PyslurmClient(fake_pyslurm(version="25.11.2", daemon="25.11.7")).version() == "25.11.7"


def test_reads_map_to_records():
    client = PyslurmClient(fake_pyslurm())
    assert isinstance(client, SlurmClient)
    jobs = {j.job_id: j for j in client.jobs()}
    assert jobs[5].state is JobState.RUNNING and jobs[5].nodes == ("n1", "n2") and jobs[5].reason == ""
    assert jobs[5].restart_count == 1 and jobs[5].excluded_nodes == ("n4",) and jobs[5].requeue
    assert jobs[5].batch_host == "n1" and jobs[6].batch_host == ""
    assert (jobs[5].exit_code, jobs[5].exit_signal) == (None, None)
    assert (jobs[6].exit_code, jobs[6].exit_signal) == (0, 9)
    assert client.job(6).name == "dead" and client.job(7) is None
    nodes = {n.name: n for n in client.nodes()}
    assert nodes["n1"].idle and nodes["n3"].drained and nodes["n3"].reason == "r"


def test_actions_call_pyslurm():
    FakeJob.calls.clear()
    FakeNode.calls.clear()
    client = PyslurmClient(fake_pyslurm())
    client.drain("n3", "slurm-ft: xid 79")
    client.resume("n3")
    client.requeue(5)
    client.requeue(5, hold=True)
    client.release(5)
    client.cancel(5)
    client.update_job(5, comment="x", excluded_nodes=("n2", "n1"))
    assert FakeNode.calls == [("modify", "n3", {"state": "DRAIN", "reason": "slurm-ft: xid 79"}),
                              ("modify", "n3", {"state": "RESUME"})]
    assert FakeJob.calls == [("requeue", 5, False), ("requeue", 5, True), ("release", 5), ("cancel", 5),
                             ("modify", 5, {"comment": "x", "excluded_nodes": "n[1-2]"})]


def test_pyslurm_errors_become_slurm_command_errors():
    with pytest.raises(SlurmCommandError, match="Unable to contact slurm controller"):
        PyslurmClient(fake_pyslurm(fail=True)).jobs()


def _importer(module):
    def import_module(name):
        if module is None:
            raise ModuleNotFoundError("No module named 'pyslurm'")
        return module
    return import_module


def _installed(version):
    def installed_version(name):
        if version is None:
            raise backend.importlib.metadata.PackageNotFoundError(name)
        return version
    return installed_version


@pytest.mark.parametrize(("module", "installed", "slurm", "picked"), [
    (None, None, "22.05.8", "cli"),
    (fake_pyslurm("25.11.2"), "25.11.2", "22.05.8", "cli"),
    (fake_pyslurm("25.11.2"), "25.11.2", "25.11.7", "pyslurm"),
    (fake_pyslurm("25.11.2"), "25.11.2", None, "cli"),
    (None, "25.11.2", "25.11.7", "cli"),  # installed but broken: import fails
])
def test_backend_for(module, installed, slurm, picked):
    chosen, why = backend.backend_for(slurm, import_module=_importer(module), installed_version=_installed(installed))
    assert chosen == picked and why


def test_a_pyslurm_for_another_release_is_never_imported():
    """Importing pyslurm 25.11 next to a 22.05 cluster loads libslurm 25.11, which can end the process."""
    def refuse(name):
        raise AssertionError("imported")
    assert backend.backend_for("22.05.8", import_module=refuse, installed_version=_installed("25.11.2"))[0] == "cli"


def test_make_client_defaults_to_cli_here(monkeypatch):
    monkeypatch.delenv("SLURM_FT_SLURM_BACKEND", raising=False)
    assert isinstance(backend.make_client(backend="cli"), CliSlurmClient)
    monkeypatch.setattr(backend, "backend_for", lambda version: ("cli", "no pyslurm"))
    monkeypatch.setattr(CliSlurmClient, "version", lambda self: "22.05.8")
    assert isinstance(backend.make_client(), CliSlurmClient)
    with pytest.raises(ConfigError, match="pyslurm"):
        backend.make_client(backend="pyslurm")
    with pytest.raises(ConfigError, match="SLURM_FT_SLURM_BACKEND"):
        backend.make_client(backend="rest")
