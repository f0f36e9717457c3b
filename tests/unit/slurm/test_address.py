"""A node's address: by its name, else by Slurm's NodeAddr, and never a silent loopback in a multi-node job."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys

import pytest

from slurm_ft.core.errors import ConfigError
from slurm_ft.slurm.address import (
    NodeAddressError,
    main,
    master_addr,
    node_addr,
    node_addrs,
    parse_node_addr,
    scontrol_show_node,
)
from slurm_ft.slurm.runner import CommandResult

# scontrol show node -o n1 on the lab (Slurm 22.05.8), as it prints it
SHOW_22_05 = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.89 AvailableFeatures=(null) "
    "ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=vm Port=31134 Version=22.05.8 OS=Linux "
    "6.18.44-fc-v1272 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 FreeMem=22421 Sockets=2 Boards=1 "
    "State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=lab  "
    "BootTime=2026-12-06T23:24:29 SlurmdStartTime=2026-12-06T23:28:06 LastBusyTime=2026-12-06T23:28:06 "
    "CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s "
    "ExtSensorsWatts=0 ExtSensorsTemp=n/s\n")
# two nodes of a cluster whose NodeName is not a DNS name (25.11 layout); a Reason with free text after NodeAddr
SHOW_TWO = (
    "NodeName=gpu-a01 Arch=x86_64 CoresPerSocket=32 CPUAlloc=0 CPUEfctv=64 CPUTot=64 CPULoad=0.01 "
    "AvailableFeatures=a100 ActiveFeatures=a100 Gres=gpu:a100:8 NodeAddr=10.4.0.11 NodeHostName=hpc-r1-n11 "
    "Version=25.11.0 OS=Linux 5.14.0 #1 SMP RealMemory=1000000 State=DRAIN Reason=bad NodeAddr=10.9.9.9 [root@now]\n"
    "NodeName=gpu-a02 Arch=x86_64 CoresPerSocket=32 NodeAddr=hpc-r1-n12 NodeHostName=hpc-r1-n12 Version=25.11.0\n")


def table(**names):
    """A resolver that knows ``names`` (name -> [(family, addr)]) and nothing else."""
    def resolve(name, port, family=0, type=0):
        if name not in names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(fam, socket.SOCK_STREAM, 6, "", (addr, 0)) for fam, addr in names[name] if family in (0, fam)]
    return resolve


def slurm_says(text):
    asked = []

    def show(node):
        asked.append(node)
        return text
    show.asked = asked
    return show


NOWHERE = table()
V4, V6 = socket.AF_INET, socket.AF_INET6


def test_nodeaddr_is_read_from_scontrols_one_line_per_node_text():
    assert parse_node_addr(SHOW_22_05, "n1") == "127.0.0.1"
    assert parse_node_addr(SHOW_TWO, "gpu-a01") == "10.4.0.11"  # not the Reason's text
    assert parse_node_addr(SHOW_TWO, "gpu-a02") == "hpc-r1-n12"
    assert parse_node_addr(SHOW_TWO, "gpu-a0") is None  # the whole name, not a prefix
    assert parse_node_addr("Node n9 not found\n", "n9") is None
    assert parse_node_addr("", "n1") is None
    assert parse_node_addr("NodeName=n1 NodeAddr=(null) State=IDLE\n", "n1") is None


def test_a_name_that_resolves_is_used_and_slurm_is_not_asked():
    show = slurm_says(SHOW_22_05)
    both = table(n7=[(V6, "fd00::7"), (V4, "10.0.0.7")])
    assert node_addr("n7", nodes=4, resolve=both, show_node=show) == "10.0.0.7"  # IPv4 first
    assert node_addr("n7", nodes=4, resolve=table(n7=[(V6, "fd00::7")]), show_node=show) == "fd00::7"
    assert show.asked == []
    assert node_addr("localhost", nodes=1) in ("127.0.0.1", "::1")  # the real resolver


def test_a_name_that_does_not_resolve_gets_slurms_nodeaddr():
    show = slurm_says(SHOW_TWO)
    assert node_addr("gpu-a01", nodes=2, resolve=NOWHERE, show_node=show) == "10.4.0.11"
    assert show.asked == ["gpu-a01"]
    resolves = table(**{"hpc-r1-n12": [(V4, "10.4.0.12")]})
    assert node_addr("gpu-a02", nodes=2, resolve=resolves, show_node=show) == "10.4.0.12"  # NodeAddr is a name
    assert node_addr("n1", nodes=3, resolve=NOWHERE, show_node=slurm_says(SHOW_22_05)) == "127.0.0.1"  # the lab's


def test_no_address_is_loopback_for_one_node_and_a_one_line_error_for_several():
    unknown = slurm_says("Node n7 not found\n")
    assert node_addr("n7", nodes=1, resolve=NOWHERE, show_node=unknown) == "127.0.0.1"  # its ranks share the host
    with pytest.raises(NodeAddressError, match=r"^node 'n7' has no address.*2 nodes") as caught:
        node_addr("n7", nodes=2, resolve=NOWHERE, show_node=unknown)
    assert isinstance(caught.value, ConfigError) and "\n" not in str(caught.value)
    unresolvable = slurm_says("NodeName=n7 NodeAddr=n7 NodeHostName=n7\n")  # NodeAddr unset: Slurm repeats the name
    with pytest.raises(NodeAddressError, match="'n7'"):
        node_addr("n7", nodes=8, resolve=NOWHERE, show_node=unresolvable)


def test_master_addr_keeps_the_users_and_else_asks_with_the_node_count():
    unknown = slurm_says("")
    assert master_addr("n7", {"MASTER_ADDR": "head"}, nodes=2, resolve=NOWHERE, show_node=unknown) == "head"
    with pytest.raises(NodeAddressError):
        master_addr("n7", {}, nodes=2, resolve=NOWHERE, show_node=unknown)


def test_every_address_of_a_family_falls_back_to_the_nodeaddr_of_that_family():
    show = slurm_says(SHOW_TWO)
    assert node_addrs("gpu-a01", V4, resolve=NOWHERE, show_node=show) == ["10.4.0.11"]
    assert node_addrs("gpu-a01", V6, resolve=NOWHERE, show_node=show) is None  # an IPv4 NodeAddr only
    resolves = table(**{"hpc-r1-n12": [(V4, "10.4.0.12"), (V4, "10.5.0.12")]})
    assert node_addrs("gpu-a02", V4, resolve=resolves, show_node=show) == ["10.4.0.12", "10.5.0.12"]
    assert node_addrs("ghost", V4, resolve=NOWHERE, show_node=slurm_says("Node ghost not found\n")) is None


def test_scontrol_is_asked_for_one_node_and_its_failure_is_no_answer():
    calls = []

    def run(argv, timeout):
        calls.append(list(argv))
        return CommandResult(argv=tuple(argv), returncode=1, stderr="Node n9 not found")
    assert scontrol_show_node("n9", run=run) == ""
    assert calls == [["scontrol", "show", "node", "-o", "n9"]]
    ok = CommandResult(argv=(), returncode=0, stdout=SHOW_22_05)
    assert scontrol_show_node("n1", run=lambda argv, timeout: ok) == SHOW_22_05


def test_the_cli_prints_the_address_or_one_line_and_exits_2():
    out, err = io.StringIO(), io.StringIO()
    assert main(["n1", "2"], out, err, resolve=NOWHERE, show_node=slurm_says(SHOW_22_05)) == 0
    assert out.getvalue() == "127.0.0.1\n" and err.getvalue() == ""
    out, err = io.StringIO(), io.StringIO()
    assert main(["n7", "2"], out, err, resolve=NOWHERE, show_node=slurm_says("")) == 2
    assert out.getvalue() == "" and err.getvalue().startswith("slurm-ft: node 'n7' has no address")
    assert err.getvalue().count("\n") == 1
    for bad in (["n7"], ["n7", "two"], ["n7", "0"]):
        err = io.StringIO()
        assert main(bad, io.StringIO(), err) == 2 and err.getvalue().count("\n") == 1


def test_the_module_runs_as_a_command_with_a_scontrol_that_knows_no_such_node(tmp_path):
    """What the benchmark's torchrun batch script runs: ``addr=$(python -m slurm_ft.slurm.address "$head" N)``."""
    fake = tmp_path / "scontrol"
    fake.write_text('#!/bin/sh\necho "Node $5 not found" >&2\nexit 1\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    name = "slurm-ft-no-such-node.invalid"
    one = subprocess.run([sys.executable, "-m", "slurm_ft.slurm.address", name, "1"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert (one.returncode, one.stdout) == (0, "127.0.0.1\n")
    two = subprocess.run([sys.executable, "-m", "slurm_ft.slurm.address", name, "2"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert two.returncode == 2 and two.stdout == "" and "Traceback" not in two.stderr
    assert two.stderr.startswith(f"slurm-ft: node '{name}' has no address")
