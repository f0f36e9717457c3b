"""The lab cluster itself: real munged, slurmctld and slurmd processes on this host (in the lab's default mode:
every node a host of its own where this machine allows namespaces, else all on 127.0.0.1)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from labutil import lab_env, output_of, submit, wait_for, wait_job

from slurm_ft.lab import hosts, procs
from slurm_ft.lab.cluster import LabCluster, LabConfig, Mode
from slurm_ft.slurm.types import JobState

pytestmark = pytest.mark.lab


def _daemons(lab: LabCluster) -> list[procs.Daemon]:
    state = json.loads((lab.dir / "lab.json").read_text())
    return [procs.Daemon.from_dict(d) for d in state["daemons"]]


def _slurm_ft(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurm_ft.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env, check=False)


def test_all_nodes_registered_and_daemons_recorded(lab):
    names = sorted(d.name for d in _daemons(lab))
    holders = [f"host-n{i}" for i in range(1, 5)] if lab.mode is Mode.HOSTS else []
    assert names == [*holders, "munged", "slurmctld", *(f"slurmd-n{i}" for i in range(1, 5))]
    assert all(procs.is_running(d) for d in _daemons(lab))
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=lab_env(lab), capture_output=True, text=True,
                         timeout=30, check=True).stdout
    states = dict(line.split() for line in out.splitlines())
    assert sorted(states) == ["n1", "n2", "n3", "n4"]
    assert all(s.rstrip("*") in ("idle", "mixed", "allocated", "completing") for s in states.values()), states


def test_up_again_reuses_the_running_lab(lab):
    before = {d.name: (d.pid, d.start_ticks) for d in _daemons(lab)}
    messages: list[str] = []
    lab.up(progress=messages.append)
    assert {d.name: (d.pid, d.start_ticks) for d in _daemons(lab)} == before
    assert lab.is_up() and any("already up" in m for m in messages)


def test_two_node_job_runs_on_two_nodes(lab):
    job_id = submit(lab, "srun -l hostname\necho nodelist=$SLURM_JOB_NODELIST nnodes=$SLURM_JOB_NUM_NODES\n",
                    "-N2", "-J", "two-node")
    job = wait_job(lab, job_id, [JobState.COMPLETED, JobState.FAILED], timeout=60)
    assert job.state is JobState.COMPLETED, job
    assert len(job.nodes) == 2 and set(job.nodes) <= set(lab.node_names)
    text = output_of(lab, job_id)
    assert "nnodes=2" in text and sorted(line.split(":")[0] for line in text.splitlines() if ": " in line) == ["0", "1"]


def test_cli_env_and_status(lab):
    env_out = _slurm_ft("lab", "env", "--dir", str(lab.dir))
    assert env_out.returncode == 0, env_out.stderr
    assert env_out.stdout.splitlines() == [f"export SLURM_CONF={lab.conf_path}",
                                           f"export SLURM_FT_CONFIG={lab.site_config}",
                                           f"export SLURM_FT_STATE_DIR={lab.state_dir}"]
    status = _slurm_ft("lab", "status", "--dir", str(lab.dir))
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[1].startswith(f"mode: {lab.mode.value} (") and lines[1].endswith(f"{lab.mode_reason})")
    assert lab.mode_reason in ("namespaces allowed", f"namespaces refused: {hosts.refusal()}")
    rows = [line.split()[0] for line in lines[3:7]]
    assert rows == ["n1", "n2", "n3", "n4"]


def test_second_lab_runs_beside_and_down_leaves_nothing(lab):
    other_dir = Path(tempfile.mkdtemp(prefix="slurm-ft-lab2-", dir="/tmp"))
    try:
        up = _slurm_ft("lab", "up", "--dir", str(other_dir), "--nodes", "1", "--no-hooks")
        assert up.returncode == 0, up.stderr
        other = LabCluster.attach(other_dir)
        first_ports = json.loads((lab.dir / "lab.json").read_text())["ports"]
        second_ports = json.loads((other_dir / "lab.json").read_text())["ports"]
        first = set(range(first_ports["base"], first_ports["base"] + first_ports["count"]))
        assert not first & set(range(second_ports["base"], second_ports["base"] + second_ports["count"]))
        job_id = submit(other, "echo hello from the second lab\n", "-N1", "-J", "second-lab-job")
        assert wait_job(other, job_id, [JobState.COMPLETED, JobState.FAILED], timeout=60).state is JobState.COMPLETED
        assert "second-lab-job" not in {j.name for j in lab.client().jobs()}  # separate clusters
        changed = LabCluster(LabConfig(dir=other_dir, nodes=1, hooks=False, extra_conf=("MaxJobCount=4321",)))
        messages: list[str] = []
        changed.up(progress=messages.append)
        assert any("reconfigure" in m for m in messages), messages
        config = subprocess.run(["scontrol", "show", "config"], env=lab_env(other), capture_output=True, text=True,
                                timeout=30, check=True).stdout
        assert any(line.split() == ["MaxJobCount", "=", "4321"] for line in config.splitlines())
        sleeper = submit(other, "echo started\nexec sleep 300\n", "-N1")
        wait_for(lambda: "started" in output_of(other, sleeper), 60, message="sleeper started")
        started = _daemons(other)
        procs.stop([d for d in started if d.name == "slurmctld"])  # so `down` cannot scancel: strays remain
        down = _slurm_ft("lab", "down", "--dir", str(other_dir))
        assert down.returncode == 0, down.stderr
        assert "leftover job processes" in down.stderr
        assert not any(procs.is_running(d) for d in started)
        leftovers = [pid for pid in procs.all_pids()
                     if str(other_dir) in " ".join(procs.cmdline(pid))
                     or procs.environ_value(pid, "SLURM_CONF") == str(other_dir / "slurm.conf")
                     or procs.environ_value(pid, "SLURM_CLUSTER_NAME") == other.cluster_name]
        assert [(pid, procs.cmdline(pid)) for pid in leftovers if procs.cmdline(pid)] == []
        assert lab.is_up()  # the first lab is untouched
    finally:
        _slurm_ft("lab", "down", "--dir", str(other_dir))
        subprocess.run(["rm", "-rf", str(other_dir)], check=False)


def test_where_namespaces_are_refused_the_lab_falls_back_and_says_why(lab):  # `lab`: skipped where none can run
    """Without CAP_SYS_ADMIN (a container's root, say) no namespace can be made: ``lab up`` runs the nodes on one
    address and ``lab status`` says why; ``lab up --hosts`` refuses in one line."""
    drop = ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", sys.executable, "-m", "slurm_ft.cli"]
    lab_dir = Path(tempfile.mkdtemp(prefix="slurm-ft-lab3-", dir="/tmp"))
    try:
        insisted = subprocess.run([*drop, "lab", "up", "--dir", str(lab_dir), "--nodes", "1", "--no-hooks", "--hosts"],
                                  capture_output=True, text=True, timeout=120, check=False)
        assert insisted.returncode != 0 and len(insisted.stderr.strip().splitlines()) == 1, insisted.stderr
        assert insisted.stderr.startswith("slurm-ft: --hosts: this machine refuses the namespaces hosts mode needs (")
        up = subprocess.run([*drop, "lab", "up", "--dir", str(lab_dir), "--nodes", "1", "--no-hooks"],
                            capture_output=True, text=True, timeout=120, check=False)
        assert up.returncode == 0, up.stderr
        status = _slurm_ft("lab", "status", "--dir", str(lab_dir))
        assert status.returncode == 0, status.stderr
        line = status.stdout.splitlines()[1]
        assert line.startswith("mode: single-address (namespaces refused: unshare ")
        assert "Operation not permitted" in line
    finally:
        _slurm_ft("lab", "down", "--dir", str(lab_dir))
        subprocess.run(["rm", "-rf", str(lab_dir)], check=False)
