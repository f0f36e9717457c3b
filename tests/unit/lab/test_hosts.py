"""Hosts mode's pure parts: the address plan from a lab dir, the hosts file, slurm.conf lines, the commands."""

from __future__ import annotations

import argparse
import ipaddress
from pathlib import Path

import pytest

from slurm_ft.lab import faults, hosts
from slurm_ft.lab.cli import mode_line, register
from slurm_ft.lab.cluster import LabCluster, LabConfig, LabError, Mode, check_host_tools, choose_mode
from slurm_ft.lab.slurmconf import LabLayout, render_slurm_conf
from slurm_ft.slurm.types import NodeInfo

NODES = ("n1", "n2", "n3")


def test_plan_is_a_slash_24_of_ten_derived_from_the_lab_dir():
    plan = hosts.plan_for(Path("/work/lab30b"), NODES)
    assert plan == hosts.plan_for(Path("/work/lab30b"), NODES)  # a pure function of the dir
    net = ipaddress.ip_network(plan.subnet)
    assert net.prefixlen == 24 and net.subnet_of(ipaddress.ip_network("10.0.0.0/8"))
    assert plan.bridge_addr == str(net.network_address + 1)
    assert [h.addr for h in plan.nodes] == [str(net.network_address + k) for k in (11, 12, 13)]
    assert [h.name for h in plan.nodes] == list(NODES)


def test_two_labs_get_different_names_and_subnets():
    one, two = hosts.plan_for(Path("/tmp/lab-a"), NODES), hosts.plan_for(Path("/tmp/lab-b"), NODES)
    assert one.subnet != two.subnet and one.bridge != two.bridge
    assert not {h.netns for h in one.nodes} & {h.netns for h in two.nodes}


def test_interface_names_fit_the_kernel_limit_and_carry_the_lab_tag():
    plan = hosts.plan_for(Path("/tmp/lab-a"), [f"n{i}" for i in range(1, 65)])
    tag = hosts.lab_tag(Path("/tmp/lab-a"))
    for name in (plan.bridge, *(h.veth for h in plan.nodes)):
        assert len(name) <= 15 and name.startswith(f"sft{tag}")
    assert plan.node("n2").netns == f"sft-{tag}-n2"
    with pytest.raises(KeyError, match="n9"):
        hosts.plan_for(Path("/tmp/lab-a"), NODES).node("n9")


def test_hosts_file_names_the_controller_and_every_node():
    plan = hosts.plan_for(Path("/tmp/lab-a"), NODES)
    lines = hosts.hosts_file(plan, "vm").splitlines()
    assert lines[0] == "127.0.0.1\tlocalhost"
    assert lines[1] == f"{plan.bridge_addr}\tvm"
    assert lines[2:] == [f"{h.addr}\t{h.name}" for h in plan.nodes]


def test_subnet_in_use_names_the_interface_that_holds_it():
    plan = hosts.plan_for(Path("/tmp/lab-a"), NODES)
    other = str(ipaddress.ip_network(plan.subnet).network_address + 200)
    text = ("1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n"
            "4: eth0    inet 172.17.0.2/16 brd 172.17.255.255 scope global eth0\n")
    assert hosts.subnet_in_use(plan, text) is None
    mine = f"7: {plan.bridge}    inet {plan.bridge_addr}/24 scope global {plan.bridge}\n"
    assert hosts.subnet_in_use(plan, text + mine) is None  # our own leftover bridge is not a conflict
    taken = f"9: br-x    inet {other}/24 scope global br-x\n"
    assert hosts.subnet_in_use(plan, text + taken) == f"{other} on br-x"


def test_network_up_builds_bridge_then_one_namespace_and_veth_per_node():
    plan = hosts.plan_for(Path("/tmp/lab-a"), NODES[:1])
    n1 = plan.nodes[0]
    assert hosts.network_up_commands(plan) == [
        ["ip", "link", "add", plan.bridge, "type", "bridge"],
        ["ip", "addr", "add", f"{plan.bridge_addr}/24", "dev", plan.bridge],
        ["ip", "link", "set", plan.bridge, "up"],
        ["ip", "netns", "add", n1.netns],
        ["ip", "link", "add", n1.veth, "type", "veth", "peer", "name", "eth0", "netns", n1.netns],
        ["ip", "link", "set", n1.veth, "master", plan.bridge, "up"],
        ["ip", "-n", n1.netns, "addr", "add", f"{n1.addr}/24", "dev", "eth0"],
        ["ip", "-n", n1.netns, "link", "set", "eth0", "up"],
        ["ip", "-n", n1.netns, "link", "set", "lo", "up"],
    ]
    assert not any("route" in argv for argv in hosts.network_up_commands(plan))  # no way out of the /24


IP_LINK = "".join(f"{line}\\    link/ether 0a:1b brd ff:ff:ff:ff:ff:ff\n" for line in (
    "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen 1000",
    "4: eth0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1400 qdisc pfifo_fast state UP mode DEFAULT group default",
    "7: sftab12cd34: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP mode DEFAULT group default",
    "9: sftab12cd341@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue master sftab12cd34 state UP",
    "10: sftab12cd3410@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue master sftab12cd34 state UP",
    "11: sftffffffff1@if2: <BROADCAST,MULTICAST> mtu 1500 qdisc noop state DOWN"))
IP_NETNS = "sft-ab12cd34-n1 (id: 0)\nsft-ab12cd34-n10 (id: 1)\nsft-ffffffff-n1 (id: 2)\nsomeone-elses\n"


def test_parsers_read_ip_link_and_ip_netns_listings():
    assert hosts.link_names(IP_LINK) == ["lo", "eth0", "sftab12cd34", "sftab12cd341", "sftab12cd3410",
                                         "sftffffffff1"]
    assert hosts.netns_names(IP_NETNS) == ["sft-ab12cd34-n1", "sft-ab12cd34-n10", "sft-ffffffff-n1",
                                           "someone-elses"]


def test_network_down_removes_only_what_carries_this_labs_tag():
    commands = hosts.network_down_commands("ab12cd34", hosts.link_names(IP_LINK), hosts.netns_names(IP_NETNS))
    assert commands == [["ip", "link", "del", "sftab12cd341"], ["ip", "link", "del", "sftab12cd3410"],
                        ["ip", "netns", "del", "sft-ab12cd34-n1"], ["ip", "netns", "del", "sft-ab12cd34-n10"],
                        ["ip", "link", "del", "sftab12cd34"]]
    assert hosts.network_down_commands("00000000", hosts.link_names(IP_LINK), hosts.netns_names(IP_NETNS)) == []


def test_holder_script_covers_tmp_run_shm_and_brings_shared_dirs_back():
    node = hosts.plan_for(Path("/tmp/lab a"), NODES).nodes[1]
    script = hosts.holder_script(node, shared=[Path("/tmp/lab a"), Path("/run/slurm-ft/x")],
                                 hosts_path=Path("/tmp/lab a/hosts"), final_argv=["python3", "-c", "pass"])
    lines = script.splitlines()
    assert lines[0] == "set -e"
    parked = lines.index("mount --bind '/tmp/lab a' /mnt/s0")
    covered = [lines.index(f"mount -t tmpfs -o mode={mode} n2-{d.strip('/').replace('/', '-')} {d}")
               for d, mode in (("/tmp", "1777"), ("/dev/shm", "1777"), ("/run", "755"))]
    moved = lines.index("mount --move /mnt/s0 '/tmp/lab a'")
    assert parked < min(covered) and max(covered) < moved
    assert "mount --move /mnt/s1 /run/slurm-ft/x" in lines
    sysfs = lines.index("mount -t sysfs sft-sysfs /sys")  # its own network namespace's /sys/class/net
    assert lines.index("mount --rbind /sys/fs/cgroup /mnt/cgroup") < sysfs < lines.index(
        "mount --move /mnt/cgroup /sys/fs/cgroup") < lines.index("umount /mnt")
    assert lines[-4:] == ["umount /mnt", "mount --bind '/tmp/lab a/hosts' /etc/hosts", "hostname n2",
                          "exec python3 -c pass"]


def test_time_namespaces_where_the_kernel_has_them(tmp_path):
    assert not hosts.time_namespaces(tmp_path)
    (tmp_path / "time").touch()
    assert hosts.time_namespaces(tmp_path)


def test_machine_uptime_from_proc_uptime():
    assert hosts.machine_uptime("12772.47 10380.61\n") == 12772.47
    with pytest.raises(ValueError, match="/proc/uptime: cannot read ''"):
        hosts.machine_uptime("")


def test_holder_and_enter_commands():
    node = hosts.plan_for(Path("/tmp/lab-a"), NODES).nodes[0]
    argv = hosts.holder_argv(node, "SCRIPT", machine_uptime_s=12772.47)
    assert argv[:2] == ["nsenter", f"--net=/run/netns/{node.netns}"]  # not `ip netns exec`: keeps /sys/fs/cgroup
    assert {"--pid", "--fork", "--mount", "--uts", "--time", "--kill-child", "--mount-proc"} <= set(argv)
    assert argv[argv.index("--boottime") + 1] == "-12772"  # the node's uptime counts from its own start
    assert "--time" not in hosts.holder_argv(node, "SCRIPT", machine_uptime_s=None)  # a kernel without them
    assert argv[-3:] == ["-c", "SCRIPT", "slurm-ft-node-setup"]
    final = hosts.holder_final_argv("/usr/bin/python3", node, Path("/tmp/lab-a"))
    assert final[:2] == ["/usr/bin/python3", "-c"] and final[-3:] == ["slurm-ft-node", "/tmp/lab-a", "n1"]
    assert hosts.enter_argv(42, ["slurmd", "-D"]) == ["nsenter", "-t", "42", "--net", "--mount", "--uts", "--pid",
                                                      "--time", "--", "slurmd", "-D"]
    assert "--time" not in hosts.enter_argv(42, ["slurmd"], time_ns=False)
    ctld = hosts.controller_argv(Path("/tmp/lab a/hosts"), ["/usr/sbin/slurmctld", "-D"])
    assert ctld == ["unshare", "--mount", "/bin/sh", "-c",
                    "mount --bind '/tmp/lab a/hosts' /etc/hosts && exec /usr/sbin/slurmctld -D"]


def test_link_and_tbf_commands_act_on_the_nodes_cable():
    node = hosts.plan_for(Path("/tmp/lab-a"), NODES).nodes[2]
    assert hosts.link_command(node, up=False) == ["ip", "link", "set", node.veth, "down"]
    assert hosts.link_command(node, up=True) == ["ip", "link", "set", node.veth, "up"]
    out, into = hosts.tbf_commands(node, "1mbit")
    assert out[:6] == ["tc", "qdisc", "replace", "dev", node.veth, "root"] and "1mbit" in out
    assert into[:4] == ["ip", "netns", "exec", node.netns] and into[4:10] == ["tc", "qdisc", "replace", "dev",
                                                                               "eth0", "root"]
    assert [c[:3] for c in hosts.untbf_commands(node)] == [["tc", "qdisc", "del"], ["ip", "netns", "exec"]]


def _layout(**kw):
    return LabLayout(dir=Path("/tmp/lab-a"), cluster_name="labx", hostname="vm", ctld_port=20000,
                     node_ports=(6818, 6818), cpus_per_node=2, memory_mb=1000, slurm_user="root",
                     slurmd_timeout=10, min_job_age=300, **kw)


def test_slurm_conf_in_hosts_mode_gives_every_node_its_name_and_address():
    conf = render_slurm_conf(_layout(node_addrs=("10.1.2.11", "10.1.2.12"), ctld_addr="10.1.2.1"))
    assert "SlurmctldHost=vm(10.1.2.1)" in conf.splitlines()
    assert "NodeName=n1 NodeHostname=n1 NodeAddr=10.1.2.11 Port=6818 " in conf
    assert "NodeName=n2 NodeHostname=n2 NodeAddr=10.1.2.12 Port=6818 " in conf
    assert "NoInAddrAny" not in conf  # srun listens where the nodes call back: its source address on the bridge


def test_slurm_conf_in_single_address_mode_is_unchanged():
    conf = render_slurm_conf(_layout())
    assert "SlurmctldHost=vm(127.0.0.1)" in conf.splitlines()
    assert "CommunicationParameters=NoInAddrAny" in conf.splitlines()
    assert "NodeName=n1 NodeHostname=vm NodeAddr=127.0.0.1 Port=6818 " in conf


def test_missing_host_tools_are_named_with_their_package():
    with pytest.raises(LabError, match=r"hosts mode needs nsenter, unshare: .*util-linux"):
        check_host_tools(which=lambda p: None if p in ("nsenter", "unshare") else f"/usr/bin/{p}")
    check_host_tools(which=lambda p: f"/usr/bin/{p}")


class _FakeLab:
    """Records the fault calls a LabCluster in hosts mode would get."""

    def __init__(self, mode: str = "hosts") -> None:
        self.calls: list[tuple] = []
        self.mode = Mode(mode)

    def set_link(self, name, *, up):
        self.calls.append(("link", name, up))

    def throttle_link(self, name, rate):
        self.calls.append(("tbf", name, rate))

    def kill_host(self, name):
        self.calls.append(("kill_host", name))
        return [7, 8]

    def stop_node(self, name):
        self.calls.append(("stop_node", name))

    def start_node(self, name):
        self.calls.append(("start_node", name))

    def client(self):
        lab = self

        class _Client:
            def nodes(self):  # Slurm sees the booted node respond on its second look
                lab.calls.append(("nodes",))
                looks = sum(call == ("nodes",) for call in lab.calls)
                return [NodeInfo(name="n2", state=frozenset({"IDLE"} if looks > 1 else {"IDLE", "NOT_RESPONDING"}))]

        return _Client()


@pytest.mark.parametrize("rate", ["10mbit", "500kbit", "1.5mbps", "64bit"])
def test_check_rate_accepts_tc_rates(rate):
    assert faults.check_rate(rate) == rate


@pytest.mark.parametrize("rate", ["fast", "10", "10 mbit", "-1mbit", "10mbit;reboot"])
def test_check_rate_names_a_bad_rate(rate):
    with pytest.raises(ValueError, match=r"^rate: "):
        faults.check_rate(rate)


def test_inject_maps_each_network_fault_to_the_lab():
    lab = _FakeLab()
    faults.inject(lab, "link-down", "n2")
    faults.inject(lab, "link-up", "n2")
    faults.inject(lab, "slow-link", "n3", "2mbit")
    faults.inject(lab, "fast-link", "n3")
    assert faults.inject(lab, "host-death", "n1") == [7, 8]
    assert lab.calls == [("link", "n2", False), ("link", "n2", True), ("tbf", "n3", "2mbit"), ("tbf", "n3", None),
                         ("kill_host", "n1")]
    with pytest.raises(ValueError, match="rate: slow-link needs a rate"):
        faults.inject(lab, "slow-link", "n3")
    with pytest.raises(ValueError, match="'unplug'"):
        faults.inject(lab, "unplug", "n3")


def test_reboot_node_kills_the_host_waits_and_boots_it_until_slurm_has_it_back():
    lab, slept = _FakeLab(), []
    assert faults.reboot_node(lab, "n2", 3.0, sleep=slept.append) == [7, 8]
    assert slept == [3.0]
    assert lab.calls == [("kill_host", "n2"), ("start_node", "n2"), ("nodes",), ("nodes",)]


def test_inject_node_reboot_checks_its_downtime_before_touching_the_node():
    lab = _FakeLab()
    with pytest.raises(ValueError, match=r"^down_s: .*got -1"):
        faults.inject(lab, "node-reboot", "n2", down_s=-1)
    assert lab.calls == []


def test_crash_node_is_the_death_of_the_host_in_hosts_mode():
    lab = _FakeLab()
    assert faults.crash_node(lab, "n2") == [7, 8]
    assert lab.calls == [("kill_host", "n2")]


# --- the mode: hosts where this machine allows namespaces -------------------------------------------------------
def test_refusal_reason_from_the_probes_facts():
    assert hosts.refusal_reason(euid=0, missing=[], returncode=0, output="") is None
    assert hosts.refusal_reason(euid=1000, missing=[], returncode=None, output="") == "not root (euid 1000)"
    assert hosts.refusal_reason(euid=0, missing=["nsenter", "tc"], returncode=None, output="") == \
        "missing nsenter, tc (apt-get install -y iproute2 util-linux)"
    denied = "unshare: unshare failed: Operation not permitted\n"
    assert hosts.refusal_reason(euid=0, missing=[], returncode=1, output=denied) == \
        "unshare --net --pid --fork --mount --uts ... failed: unshare: unshare failed: Operation not permitted"
    no_veth = "Error: Unknown device type.\n"
    assert hosts.refusal_reason(euid=0, missing=[], returncode=2, output=no_veth).endswith(
        "failed: Error: Unknown device type.")
    assert hosts.refusal_reason(euid=0, missing=[], returncode=None, output="").endswith("failed: timed out")
    assert hosts.refusal_reason(euid=0, missing=[], returncode=3, output="").endswith("failed: exit status 3")


def test_choose_mode_hosts_unless_refused_or_forced():
    assert choose_mode(None, None) == (Mode.HOSTS, "namespaces allowed")
    assert choose_mode(None, "not root (euid 5)") == (Mode.SINGLE_ADDRESS, "namespaces refused: not root (euid 5)")
    assert choose_mode(True, None) == (Mode.HOSTS, "insisted: --hosts")
    assert choose_mode(False, None) == (Mode.SINGLE_ADDRESS, "forced: --single-address")
    with pytest.raises(LabError, match=r"^--hosts: this machine refuses .* \(not root \(euid 5\)\)"):
        choose_mode(True, "not root (euid 5)")


def test_status_says_the_mode_and_why():
    plan = hosts.plan_for(Path("/tmp/lab-a"), NODES)
    assert mode_line(Mode.HOSTS, "namespaces allowed", plan) == \
        f"mode: hosts ({plan.subnet}, bridge {plan.bridge}; namespaces allowed)"
    assert mode_line(Mode.SINGLE_ADDRESS, "namespaces refused: not root (euid 5)", None) == \
        "mode: single-address (namespaces refused: not root (euid 5))"
    assert mode_line(Mode.SINGLE_ADDRESS, "", None) == "mode: single-address (reason not recorded)"


def test_config_leaves_the_mode_to_the_machine_unless_told():
    assert LabConfig(dir=Path("/tmp/lab-a")).hosts is None
    forced = LabCluster(LabConfig(dir=Path("/tmp/slurm-ft-unit-never-started"), hosts=False))
    assert forced.chosen_mode() == (Mode.SINGLE_ADDRESS, "forced: --single-address")
    assert forced.mode is Mode.SINGLE_ADDRESS


def test_cli_hosts_and_single_address_exclude_each_other(capsys):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(), "lab")
    assert parser.parse_args(["lab", "up"]).hosts is None
    assert parser.parse_args(["lab", "up", "--hosts"]).hosts is True
    assert parser.parse_args(["lab", "up", "--single-address"]).hosts is False
    with pytest.raises(SystemExit):
        parser.parse_args(["lab", "up", "--hosts", "--single-address"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_holder_of_the_lab_is_known_by_its_argv_also_while_it_starts():
    lab_dir = Path("/tmp/lab a")
    node = hosts.plan_for(lab_dir, NODES).nodes[0]
    final = hosts.holder_final_argv("/usr/bin/python3", node, lab_dir)
    script = hosts.holder_script(node, shared=[lab_dir], hosts_path=lab_dir / "hosts", final_argv=final)
    wrapper = hosts.holder_argv(node, script, machine_uptime_s=1234.5)
    assert hosts.is_holder_of(final, lab_dir)
    assert hosts.is_holder_of(wrapper, lab_dir)  # unshare, before its shell execs the holder
    assert hosts.is_holder_of(wrapper[wrapper.index("/bin/sh"):], lab_dir)  # the setup shell
    other = Path("/tmp/lab")
    assert not hosts.is_holder_of(final, other) and not hosts.is_holder_of(wrapper, other)
    assert not hosts.is_holder_of(("sleep", "60"), lab_dir) and not hosts.is_holder_of((), lab_dir)
