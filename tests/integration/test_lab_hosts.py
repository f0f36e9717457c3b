"""The lab in hosts mode (``lab up --hosts``): every node a host of its own, real network faults (link down and
up, a throttled link, the death of a whole host, its reboot), and ``down`` leaves nothing behind.

Its own 3-node lab (not the session ``lab``): three hosts with their own hostname, address, /tmp and PID space,
seen from ``srun -N3`` run on the controller's host, as a user of a real cluster would.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from labutil import wait_for

from slurm_ft.cluster.quarantine import Quarantine, QuarantineStore, default_db_path
from slurm_ft.lab import faults, hosts, ports, procs
from slurm_ft.lab.cluster import LabCluster, LabConfig
from slurm_ft.launch import links
from slurm_ft.launch.probe import ProbeConfig, probe_nodes

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def hosts_lab(hosts_possible) -> Iterator[LabCluster]:
    lab_dir = Path(tempfile.mkdtemp(prefix="sft-hosts-", dir="/tmp"))
    cluster = LabCluster(LabConfig(dir=lab_dir, nodes=3, hosts=True))
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()
        shutil.rmtree(lab_dir, ignore_errors=True)


def _srun(lab: LabCluster, *args: str) -> list[tuple[str, str]]:
    """``srun -l ARGS`` from the controller's host (cwd: the shared lab dir); (task, line) pairs."""
    done = subprocess.run(["srun", "-l", *args], env={**os.environ, **lab.env()}, cwd=lab.dir, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [tuple(part.strip() for part in line.split(":", 1)) for line in done.stdout.splitlines() if ":" in line]


def test_three_hosts_have_their_own_names_and_addresses(hosts_lab):
    names = _srun(hosts_lab, "-N3", "hostname")
    assert sorted(name for _, name in names) == ["n1", "n2", "n3"]
    by_node = dict(_srun(hosts_lab, "-N3", "sh", "-c", "echo $(hostname) $(hostname -I)"))
    addrs = dict(line.split(maxsplit=1) for line in by_node.values())
    assert {name: addr.split() for name, addr in addrs.items()} == {
        h.name: [h.addr] for h in hosts_lab.host_plan.nodes}
    subnet = ipaddress.ip_network(hosts_lab.host_plan.subnet)
    assert all(ipaddress.ip_address(a.strip()) in subnet for a in addrs.values())
    resolved = _srun(hosts_lab, "-w", "n1", "getent", "hosts", "n3")
    assert resolved[0][1].split() == [hosts_lab.host_plan.node("n3").addr, "n3"]


def test_tmp_is_private_to_each_host(hosts_lab):
    probe = f"/tmp/sft-probe-{uuid.uuid4().hex}"
    _srun(hosts_lab, "-w", "n1", "sh", "-c", f"echo here > {probe}")
    seen = dict(_srun(hosts_lab, "-N3", "sh", "-c", f"echo $(hostname) $(cat {probe} 2>/dev/null || echo absent)"))
    assert sorted(seen.values()) == ["n1 here", "n2 absent", "n3 absent"]
    assert not Path(probe).exists()  # nor on the controller's host
    shared = hosts_lab.dir / f"probe-{uuid.uuid4().hex}"
    _srun(hosts_lab, "-w", "n2", "sh", "-c", f"echo shared > {shared}")
    assert shared.read_text() == "shared\n"  # the lab dir is the shared filesystem


def test_each_host_sees_only_its_own_processes(hosts_lab):
    listing = ("for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done | "
               "sed -n 's/.*slurmd -D -N \\(n[0-9]*\\).*/\\1/p' | sort -u | tr '\\n' ' '; hostname")
    seen = [line.split() for _, line in _srun(hosts_lab, "-N3", "sh", "-c", listing)]
    assert sorted(seen) == [["n1", "n1"], ["n2", "n2"], ["n3", "n3"]]  # each sees its own slurmd only
    state = procs.Daemon.from_dict(next(d for d in _daemons(hosts_lab) if d["name"] == "slurmd-n1"))
    pids = dict(_srun(hosts_lab, "-w", "n2", "sh", "-c", f"test -e /proc/{state.pid} && echo seen || echo unseen"))
    assert list(pids.values()) == ["unseen"]  # n1's slurmd, by the controller's pid, is not on n2


def test_status_says_hosts_mode(hosts_lab):
    done = subprocess.run([sys.executable, "-m", "slurm_ft.cli", "lab", "status", "--dir", str(hosts_lab.dir)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].startswith(f"mode: hosts ({hosts_lab.host_plan.subnet}")


def _reaches(lab: LabCluster, src: str, dst: str) -> bool:
    """Whether node ``src`` can open a TCP connection to node ``dst``'s slurmd."""
    addr = lab.host_plan.node(dst).addr
    line = _srun(lab, "-w", src, "bash", "-c", f"timeout 1 bash -c '</dev/tcp/{addr}/6818' && echo reach || echo cut")
    return line[0][1] == "reach"


def _carrier_changes(lab: LabCluster) -> dict[str, int]:
    """Each node's ``/sys/class/net/eth0/carrier_changes``, read on the node itself."""
    lines = _srun(lab, "-N3", "sh", "-c", "echo $(hostname) $(cat /sys/class/net/eth0/carrier_changes)")
    return {name: int(count) for name, count in (line.split() for _, line in lines)}


def test_link_down_cuts_the_node_off_until_link_up(hosts_lab):
    n3 = hosts_lab.host_plan.node("n3").addr
    assert ports.can_connect(hosts.SLURMD_PORT, n3) and _reaches(hosts_lab, "n1", "n3")
    before = _carrier_changes(hosts_lab)
    faults.link_down(hosts_lab, "n3")
    try:
        assert not ports.can_connect(hosts.SLURMD_PORT, n3)  # not from the controller's host
        assert not _reaches(hosts_lab, "n1", "n3")  # nor from another node
        assert _reaches(hosts_lab, "n1", "n2")  # the others are unharmed
    finally:
        faults.link_up(hosts_lab, "n3")
    wait_for(lambda: ports.can_connect(hosts.SLURMD_PORT, n3), 15, message="n3 reachable after link-up")
    # n1's neighbour entry for n3 failed while the cable was out: it is re-learnt on a later try, not at once
    wait_for(lambda: _reaches(hosts_lab, "n1", "n3"), 15, interval=1.0, message="n3 reachable from n1 after link-up")
    # each node sees its own interface's counters (a sysfs of its own): the pulled cable is counted on n3 alone
    after = _carrier_changes(hosts_lab)
    assert after == {**before, "n3": before["n3"] + 2}


def test_a_flap_is_named_by_the_jobs_link_counters_and_struck_once_by_the_epilog(hosts_lab):
    """The pieces a link-flap verdict rests on, on real hosts: the rank wrapper's start reading, the probe step's
    reading after the cable came back (n3's counter grew, no other node's), and the epilog's own: one network
    strike for n3, no drain."""
    run_dir = hosts_lab.dir / f"run-{uuid.uuid4().hex}"
    run_dir.mkdir()
    env = {**os.environ, **hosts_lab.env(), "SLURM_FT_RUN_DIR": str(run_dir)}
    nodes = ["n1", "n2", "n3"]
    task = f"echo $SLURM_JOB_ID; exec {sys.executable} -m slurm_ft.launch.rank -- sleep 6"
    job = subprocess.Popen(["srun", "-N3", "--ntasks-per-node=1", "sh", "-c", task], env=env, cwd=hosts_lab.dir,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        wait_for(lambda: all(links.read(run_dir, links.START, n) for n in nodes), 30, message="start readings")
        faults.link_down(hosts_lab, "n3")
        time.sleep(2)  # shorter than SlurmdTimeout: Slurm does not notice
    finally:
        faults.link_up(hosts_lab, "n3")
        out, _ = job.communicate(timeout=60)
    job_id = int(out.split()[0])
    config = ProbeConfig(timeout_s=20, node_command=links.probe_command(sys.executable, run_dir))
    assert wait_for(lambda: probe_nodes(nodes, env, config) == {}, 30, interval=1.0, message="n3 answers again")
    (loss,) = links.losses(run_dir, nodes)
    assert (loss.node, loss.interface, loss.counter, loss.after - loss.before) == ("n3", "eth0", "carrier_down_count",
                                                                                   1)
    store = Quarantine(QuarantineStore(default_db_path(hosts_lab.state_dir)))
    def strikes(node: str) -> list:  # this job's (a job of an earlier test may have been ending on n3 then)
        return [s for s in store.strikes(node) if s.job_id == job_id]

    (strike,) = wait_for(lambda: strikes("n3"), 30, message="the epilog's strike")
    assert (strike.category, strike.source) == ("network", "epilog") and "link eth0 went down" in strike.evidence
    assert not store.is_quarantined("n3") and strikes("n1") == strikes("n2") == []


def test_slow_link_throttles_both_ends_of_the_cable_until_lifted(hosts_lab):
    node = hosts_lab.host_plan.node("n2")
    outside = ["tc", "qdisc", "show", "dev", node.veth]
    inside = ["ip", "netns", "exec", node.netns, "tc", "qdisc", "show", "dev", "eth0"]
    with pytest.raises(ValueError, match="rate: 'fast'"):
        faults.slow_link(hosts_lab, "n2", "fast")
    faults.slow_link(hosts_lab, "n2", "2mbit")
    try:
        for argv in (outside, inside):
            shown = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
            assert "tbf" in shown and "rate 2Mbit" in shown, shown
        assert _reaches(hosts_lab, "n1", "n2")  # slow, not cut
    finally:
        faults.slow_link(hosts_lab, "n2", None)
    assert all("tbf" not in subprocess.run(a, capture_output=True, text=True, check=True).stdout
               for a in (outside, inside))


def test_node_death_kills_the_whole_host_which_comes_back_empty(hosts_lab):
    _srun(hosts_lab, "-w", "n3", "sh", "-c", "echo held > /tmp/sft-held")
    # Idle first: a host that dies while its job completes leaves it COMPLETING in slurmctld (as on a real cluster).
    wait_for(lambda: _idle(hosts_lab, "n3"), 30, message="n3 idle")
    holder = procs.Daemon.from_dict(next(d for d in _daemons(hosts_lab) if d["name"] == "host-n3"))
    pid_ns = os.readlink(f"/proc/{holder.pid}/ns/pid")
    on_host = procs.in_pid_namespace(pid_ns)
    assert len(on_host) >= 2  # the holder and slurmd at least
    killed = faults.crash_node(hosts_lab, "n3")
    assert set(on_host) <= set(killed)
    assert not [pid for pid in procs.in_pid_namespace(pid_ns) if faults.alive(pid)]
    assert not ports.can_connect(hosts.SLURMD_PORT, hosts_lab.host_plan.node("n3").addr)  # and its link is down
    hosts_lab.start_node("n3")
    held = "echo $(hostname) $(cat /tmp/sft-held 2>/dev/null || echo gone)"
    after = dict(_srun(hosts_lab, "-w", "n3", "sh", "-c", held))
    assert list(after.values()) == ["n3 gone"]


def test_node_reboot_brings_the_host_back_empty_with_a_new_boot_time(hosts_lab):
    store = "echo held > /tmp/sft-reboot && echo held > /dev/shm/sft-reboot && echo held > /run/sft-reboot"
    _srun(hosts_lab, "-w", "n2", "sh", "-c", store)
    wait_for(lambda: _idle(hosts_lab, "n2"), 30, message="n2 idle")
    holder = procs.Daemon.from_dict(next(d for d in _daemons(hosts_lab) if d["name"] == "host-n2"))
    on_host = procs.in_pid_namespace(os.readlink(f"/proc/{holder.pid}/ns/pid"))
    assert {"/tmp/sft-reboot", "/dev/shm/sft-reboot"} <= set(faults.node_local_files(hosts_lab, "n2"))
    before = time.time()
    done = subprocess.run([sys.executable, "-m", "slurm_ft.cli", "lab", "fault", "--dir", str(hosts_lab.dir),
                           "node-reboot", "n2", "--down-s", "1"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "node-reboot n2: done" in done.stdout
    assert len(on_host) >= 2 and not [pid for pid in on_host if faults.alive(pid)]  # the old host is gone
    assert ports.can_connect(hosts.SLURMD_PORT, hosts_lab.host_plan.node("n2").addr)  # slurmd answers again
    look = ("echo $(hostname) $(cat /tmp/sft-reboot /dev/shm/sft-reboot /run/sft-reboot 2>/dev/null || echo gone) "
            "$(cut -d. -f1 /proc/uptime)")
    [(_, line)] = _srun(hosts_lab, "-w", "n2", "sh", "-c", look)
    name, held, uptime = line.split()
    assert (name, held) == ("n2", "gone")
    assert not {"/tmp/sft-reboot", "/dev/shm/sft-reboot"} & set(faults.node_local_files(hosts_lab, "n2"))
    if hosts.time_namespaces():  # Linux 5.6+: the node's boot clock is its own
        assert int(uptime) <= time.time() - before  # its clock counts from its boot, not the machine's
        shown = subprocess.run(["scontrol", "-o", "show", "node", "n2"], env={**os.environ, **hosts_lab.env()},
                               capture_output=True, text=True, timeout=30, check=True).stdout
        boot = next(f.split("=", 1)[1] for f in shown.split() if f.startswith("BootTime="))
        assert datetime.datetime.fromisoformat(boot).timestamp() >= int(before)  # slurmctld saw a reboot
    node = next(n for n in hosts_lab.client().nodes() if n.name == "n2")
    assert not node.state & {"DOWN", "DRAIN", "NOT_RESPONDING"}, node.state  # in service: ReturnToService=2


def test_node_reboot_refuses_a_bad_downtime(hosts_lab):
    done = subprocess.run([sys.executable, "-m", "slurm_ft.cli", "lab", "fault", "--dir", str(hosts_lab.dir),
                           "node-reboot", "n2", "--down-s", "-3"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode != 0 and "down_s" in done.stderr and "-3" in done.stderr, done.stderr


def _idle(lab: LabCluster, name: str) -> bool:
    node = next(n for n in lab.client().nodes() if n.name == name)
    return "IDLE" in node.state and "COMPLETING" not in node.state


def _daemons(lab: LabCluster) -> list[dict]:
    return json.loads((lab.dir / "lab.json").read_text())["daemons"]


def test_down_leaves_no_namespace_interface_or_process(hosts_lab):
    daemons = [procs.Daemon.from_dict(d) for d in _daemons(hosts_lab)]
    assert sorted(d.name for d in daemons) == sorted(
        ["munged", "slurmctld", *(f"{kind}-n{i}" for kind in ("host", "slurmd") for i in (1, 2, 3))])
    tag = hosts.lab_tag(hosts_lab.dir)
    hosts_lab.down()
    netns = hosts.netns_names(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                             check=True).stdout)
    links = hosts.link_names(subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                                            check=True).stdout)
    assert not [n for n in netns if tag in n]
    assert not [n for n in links if tag in n]
    assert not [d.name for d in daemons if procs.is_running(d)]
    lab_dir = str(hosts_lab.dir)
    left = [pid for pid in procs.all_pids()
            if faults.alive(pid) and (any(lab_dir in arg for arg in procs.cmdline(pid))
                                or procs.environ_value(pid, "SLURM_CLUSTER_NAME") == hosts_lab.cluster_name)]
    assert left == [], [procs.cmdline(pid) for pid in left]
