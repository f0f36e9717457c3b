"""``slurm-ft quarantine`` in-process, with the Slurm client replaced by an in-memory one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_ft import cli
from slurm_ft.slurm.types import NodeInfo


class FakeSlurm:
    instances: list["FakeSlurm"] = []

    def __init__(self, **_: object) -> None:
        self.info = {n: NodeInfo(name=n, state=frozenset({"IDLE"})) for n in ("n1", "n2")}
        self.calls: list[tuple[str, ...]] = []
        FakeSlurm.instances.append(self)

    def nodes(self) -> list[NodeInfo]:
        return list(self.info.values())

    def drain(self, node: str, reason: str) -> None:
        self.calls.append(("drain", node, reason))
        self.info[node] = NodeInfo(name=node, state=frozenset({"IDLE", "DRAIN"}), reason=reason)

    def resume(self, node: str) -> None:
        self.calls.append(("resume", node))
        self.info[node] = NodeInfo(name=node, state=frozenset({"IDLE"}))


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    config = tmp_path / "config.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[quarantine]\nslurm_user = "slurm"\n')
    monkeypatch.setattr("slurm_ft.slurm.cli_backend.CliSlurmClient", FakeSlurm)
    FakeSlurm.instances.clear()

    def invoke(*args: str) -> tuple[int, str, str]:
        code = cli.main(["quarantine", "--config", str(config), *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    return invoke


def test_empty_list(run) -> None:
    assert run("list") == (0, "no nodes in quarantine records\n", "")
    code, out, _ = run("list", "--json")
    assert code == 0 and json.loads(out) == []


def test_add_show_release(run) -> None:
    code, out, _ = run("add", "n1", "--reason", "flaky NVLink", "--category", "hardware_gpu", "--json")
    assert code == 0 and json.loads(out)["record"]["state"] == "quarantined"
    assert FakeSlurm.instances[-1].calls == [("drain", "n1", "slurm-ft: hardware_gpu: flaky NVLink")]
    code, out, _ = run("list")
    assert code == 0 and "n1" in out and "quarantined" in out and "slurm-ft: hardware_gpu: flaky NVLink" in out
    code, out, _ = run("show", "n1", "--json")
    shown = json.loads(out)
    assert shown["strikes"][0]["evidence"] == "flaky NVLink" and shown["strikes"][0]["source"] == "root"
    assert shown["slurm"] == {"state": ["IDLE"], "reason": ""}  # a fresh fake: Slurm's view is per call here
    code, out, _ = run("show", "n1")
    assert "state:    quarantined" in out and "history (newest first):" in out
    code, out, _ = run("release", "n1")
    assert code == 0 and "state:    healthy" in out


@pytest.mark.skipif(os.geteuid() != 0, reason="runs as root to compare with an unprivileged caller")
def test_changes_need_root_or_the_slurm_user(run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 65534)
    code, _, err = run("add", "n1", "--reason", "x")
    assert code == 77 and err.strip() == "slurm-ft: changing quarantine needs root or SlurmUser 'slurm'; you are 'nobody'"
    assert run("release", "n1")[0] == 77
    assert run("list")[0] == 0  # reading is open


def test_bad_node_name(run) -> None:
    code, _, err = run("show", "../etc")
    assert code == 2 and err.strip() == "slurm-ft: not a node name: '../etc'"
