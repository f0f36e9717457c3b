"""``slurm-ft quarantine`` against the real lab cluster: tagged drains, foreign drains left alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from labutil import lab_env, wait_for

pytestmark = pytest.mark.lab


def cli(lab, *args: str) -> subprocess.CompletedProcess[str]:
    config = lab.dir / "etc" / "slurm-ft" / "config.toml"
    return subprocess.run([sys.executable, "-m", "slurm_ft.cli", "quarantine", "--config", str(config), *args],
                          env=lab_env(lab), capture_output=True, text=True, timeout=60, check=False)


def scontrol(lab, *args: str) -> None:
    subprocess.run(["scontrol", *args], env=lab_env(lab), check=True, capture_output=True, timeout=30)


def node(lab, name: str):
    return next(n for n in lab.client().nodes() if n.name == name)


def test_add_drains_with_a_tagged_reason_and_release_resumes(lab) -> None:
    target = sorted(n.name for n in lab.client().nodes() if n.idle)[-1]
    added = cli(lab, "add", target, "--reason", "ECC storm seen by hand", "--category", "hardware_gpu", "--json")
    try:
        assert added.returncode == 0, added.stderr
        assert json.loads(added.stdout)["record"]["state"] == "quarantined"
        info = wait_for(lambda: node(lab, target) if node(lab, target).drained else None, 20, message="drain")
        assert info.reason == "slurm-ft: hardware_gpu: ECC storm seen by hand"
        shown = json.loads(cli(lab, "show", target, "--json").stdout)
        assert shown["strikes"][0]["evidence"] == "ECC storm seen by hand" and shown["record"]["drained"] is True
        assert "DRAIN" in shown["slurm"]["state"]
    finally:
        released = cli(lab, "release", target)
    assert released.returncode == 0, released.stderr
    assert wait_for(lambda: not node(lab, target).drained, 20, message="resume")


def test_a_drain_reason_slurm_ft_did_not_set_is_never_overwritten_or_lifted(lab) -> None:
    target = sorted(n.name for n in lab.client().nodes() if n.idle)[-1]
    scontrol(lab, "update", f"NodeName={target}", "State=DRAIN", "Reason=admin: replacing a fan")
    try:
        assert cli(lab, "add", target, "--reason", "x").returncode == 0
        assert node(lab, target).reason == "admin: replacing a fan"
        assert cli(lab, "release", target).returncode == 0
        info = node(lab, target)
        assert info.drained and info.reason == "admin: replacing a fan"
    finally:
        scontrol(lab, "update", f"NodeName={target}", "State=RESUME")


def test_unknown_node_name_is_a_one_line_error(lab) -> None:
    done = cli(lab, "show", "n1;rm -rf /")
    assert done.returncode == 2 and done.stderr.strip() == "slurm-ft: not a node name: 'n1;rm -rf /'"
