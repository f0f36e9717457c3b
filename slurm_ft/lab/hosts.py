"""Lab nodes as hosts: each node its own network, UTS, PID, mount and time namespace, joined to a lab bridge.

The plan (names, addresses, the /24) is a pure function of the lab directory, so two labs never pick the same
names and rarely the same subnet (``subnet_in_use`` refuses a taken one). Each node is a *holder* process: the
init of the node's PID namespace, started by ``ip netns exec NS unshare --pid --mount --uts --time`` after a
setup script that gives the node private tmpfs ``/tmp``, ``/dev/shm`` and ``/run``, the lab's hosts file over
``/etc/hosts``, its hostname, and the shared directories (the lab dir: the cluster's shared filesystem) bound back
in; its boot clock starts at zero. Daemons run on a node through ``nsenter`` into its holder. Killing the holder
kills everything on the node (a host death); a new holder for the same node is its reboot: empty /tmp, /dev/shm
and /run, an uptime counted from then.

Nodes route only their own /24 (no default route), so they reach the lab's other nodes and the controller's
bridge address, nothing else. Who may talk to a node: anything on this machine's root network namespace (root
owns the bridge); munge authenticates every Slurm message as before. Unlike single-address mode, slurm.conf has
no ``NoInAddrAny`` (srun must listen where the nodes call back), so slurmctld's port is bound on every address of
the root namespace, not only 127.0.0.1: still munge-authenticated with the lab's own key (root-only, 0600).

Hosts mode is the lab's default wherever this machine allows it: ``refusal`` tries, in a throwaway namespace that
dies with the probe, what ``up`` will do (fresh network, PID, mount and UTS namespaces, a veth pair, a bridge) and
says in one line why not, or None.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import ipaddress
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

NETNS_DIR = "/run/netns"  # where ``ip netns add`` pins named namespaces
NODE_IF = "eth0"  # the node's end of its veth, inside its namespace
SLURMD_PORT = 6818  # every node is its own host: slurmd on Slurm's standard port
HOST_OCTET_BASE = 10  # node nK gets .(10 + K); the bridge (the controller's side) gets .1
STAGE = "/mnt"  # where the setup script parks shared dirs while it covers /tmp, /run, /dev/shm (FHS: exists)
PRIVATE_TMPFS = ("/tmp", "/dev/shm", "/run")
HOLDER_TAG = "slurm-ft-node"
HOST_TOOLS = {"ip": "iproute2", "unshare": "util-linux", "nsenter": "util-linux", "tc": "iproute2"}  # -> package
# The probe: what ``up`` does, inside namespaces of its own (nothing it makes outlives it; nothing on the machine's
# own network changes): unshare's namespaces, then a veth pair and a bridge in the fresh network namespace.
PROBE_ARGV = ("unshare", "--net", "--pid", "--fork", "--mount", "--uts", "/bin/sh", "-c",
              "ip link add sftprobe0 type veth peer name sftprobe1 && ip link add sftprobebr type bridge")
PROBE_TIMEOUT_S = 10.0

# The node's init: reaps the orphans (slurmstepd double-forks) and exits on SIGTERM, which ends the PID namespace.
HOLDER_CODE = ("import os,signal,sys,time\n"
               "signal.signal(signal.SIGTERM, lambda *a: os._exit(0))\n"
               "while True:\n"
               "    try:\n"
               "        os.wait()\n"
               "    except ChildProcessError:\n"
               "        time.sleep(1)\n")


@dataclasses.dataclass(frozen=True, slots=True)
class NodeHost:
    """One node's host: its network namespace, the host-side veth on the bridge, its address."""

    name: str
    netns: str
    veth: str
    addr: str


@dataclasses.dataclass(frozen=True, slots=True)
class HostPlan:
    """Every name and address of one lab in hosts mode."""

    subnet: str  # 10.A.B.0/24
    bridge: str
    bridge_addr: str  # the controller's address on the lab network
    nodes: tuple[NodeHost, ...]

    def node(self, name: str) -> NodeHost:
        for host in self.nodes:
            if host.name == name:
                return host
        raise KeyError(f"no node {name!r} in the host plan (nodes: {', '.join(h.name for h in self.nodes)})")

    @property
    def prefix_len(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen


def lab_tag(lab_dir: Path) -> str:
    """8 hex digits naming this lab's interfaces and namespaces (the cluster name's hash)."""
    return hashlib.sha256(str(lab_dir).encode()).hexdigest()[:8]


def plan_for(lab_dir: Path, node_names: Sequence[str]) -> HostPlan:
    """The plan of lab ``lab_dir``: a /24 of 10/8 from the hash of its path, bridge ``sft<tag>``, node nK's
    namespace ``sft-<tag>-nK`` with veth ``sft<tag><K>`` and address .(10+K)."""
    if len(node_names) > 200:
        raise ValueError(f"nodes: a /24 holds at most 200 lab nodes, got {len(node_names)}")
    digest = hashlib.sha256(str(lab_dir).encode()).digest()
    second, third = digest[8], digest[9]
    net = ipaddress.ip_network(f"10.{second}.{third}.0/24")
    tag = lab_tag(lab_dir)
    hosts = tuple(NodeHost(name=name, netns=f"sft-{tag}-{name}", veth=f"sft{tag}{i + 1}",
                           addr=str(net.network_address + HOST_OCTET_BASE + i + 1))
                  for i, name in enumerate(node_names))
    return HostPlan(subnet=str(net), bridge=f"sft{tag}", bridge_addr=str(net.network_address + 1), nodes=hosts)


def hosts_file(plan: HostPlan, controller: str) -> str:
    """The lab's /etc/hosts: localhost, the controller's name at its bridge address, every node."""
    lines = ["127.0.0.1\tlocalhost", f"{plan.bridge_addr}\t{controller}"]
    lines += [f"{h.addr}\t{h.name}" for h in plan.nodes]
    return "\n".join(lines) + "\n"


def subnet_in_use(plan: HostPlan, ip_addr_output: str) -> str | None:
    """The first address of ``ip -o -4 addr`` output (one interface a line) inside the plan's /24 that is not the
    plan's own bridge, or None."""
    net = ipaddress.ip_network(plan.subnet)
    for line in ip_addr_output.splitlines():
        fields = line.split()
        if "inet" not in fields or fields[1].rstrip(":").split("@")[0] == plan.bridge:
            continue
        addr = ipaddress.ip_interface(fields[fields.index("inet") + 1]).ip
        if addr in net:
            return f"{addr} on {fields[1].rstrip(':')}"
    return None


# --- may this machine make hosts? ---------------------------------------------------------------------------
def missing_tools(which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """The programs hosts mode needs that are not installed (on PATH or in /usr/sbin)."""
    return sorted(p for p in HOST_TOOLS if which(p) is None and not Path("/usr/sbin", p).exists())


def refusal_reason(*, euid: int, missing: Sequence[str], returncode: int | None, output: str) -> str | None:
    """Why namespaces are refused, in one line, from the probe's facts (``returncode`` None: not run, or it timed
    out), or None when the probe went through."""
    if euid != 0:
        return f"not root (euid {euid})"
    if missing:
        return f"missing {', '.join(missing)} (apt-get install -y {' '.join(sorted({HOST_TOOLS[p] for p in missing}))})"
    if returncode == 0:
        return None
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    detail = lines[-1] if lines else ("timed out" if returncode is None else f"exit status {returncode}")
    return f"{' '.join(PROBE_ARGV[:6])} ... failed: {detail}"


@functools.cache
def refusal() -> str | None:
    """Why this machine refuses the namespaces hosts mode needs (one line), or None when it allows them. Tries them
    for real, in a throwaway network namespace (a few milliseconds); asked once per process."""
    euid, missing = os.geteuid(), missing_tools()
    if euid != 0 or missing:
        return refusal_reason(euid=euid, missing=missing, returncode=None, output="")
    try:
        done = subprocess.run(PROBE_ARGV, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return refusal_reason(euid=euid, missing=[], returncode=None, output="")
    except OSError as exc:
        return refusal_reason(euid=euid, missing=[], returncode=None, output=str(exc))
    return refusal_reason(euid=euid, missing=[], returncode=done.returncode, output=done.stderr + done.stdout)


# --- commands (argument lists; nothing here runs them) ----------------------------------------------------------
def network_up_commands(plan: HostPlan) -> list[list[str]]:
    """Bridge with the controller's address, then per node: netns, veth pair (the peer moved in as eth0),
    addresses, links up. No default route inside: a node reaches its /24 only."""
    cidr = f"/{plan.prefix_len}"
    cmds = [["ip", "link", "add", plan.bridge, "type", "bridge"],
            ["ip", "addr", "add", plan.bridge_addr + cidr, "dev", plan.bridge],
            ["ip", "link", "set", plan.bridge, "up"]]
    for h in plan.nodes:
        cmds += [["ip", "netns", "add", h.netns],
                 ["ip", "link", "add", h.veth, "type", "veth", "peer", "name", NODE_IF, "netns", h.netns],
                 ["ip", "link", "set", h.veth, "master", plan.bridge, "up"],
                 ["ip", "-n", h.netns, "addr", "add", h.addr + cidr, "dev", NODE_IF],
                 ["ip", "-n", h.netns, "link", "set", NODE_IF, "up"],
                 ["ip", "-n", h.netns, "link", "set", "lo", "up"]]
    return cmds


def network_down_commands(tag: str, links: Sequence[str], netns: Sequence[str]) -> list[list[str]]:
    """Remove what a lab with ``tag`` made, as found in ``links`` (interface names) and ``netns`` (namespace
    names): its veths, then its namespaces, then its bridge. Nothing without the lab's tag in its name."""
    bridge = f"sft{tag}"
    veths = sorted(name for name in links if name.startswith(bridge) and name != bridge)
    spaces = sorted(name for name in netns if name.startswith(f"sft-{tag}-"))
    return ([["ip", "link", "del", name] for name in veths] + [["ip", "netns", "del", name] for name in spaces]
            + ([["ip", "link", "del", bridge]] if bridge in links else []))


def link_names(ip_link_output: str) -> list[str]:
    """Interface names from ``ip -o link show`` (``9: sftab12cd341@if2: <...`` -> ``sftab12cd341``)."""
    names = []
    for line in ip_link_output.splitlines():
        fields = line.split(":", 2)
        if len(fields) == 3 and fields[0].strip().isdigit():
            names.append(fields[1].strip().split("@")[0])
    return names


def netns_names(ip_netns_output: str) -> list[str]:
    """Namespace names from ``ip netns list`` (``sft-ab12cd34-n1 (id: 0)`` -> ``sft-ab12cd34-n1``)."""
    return [line.split()[0] for line in ip_netns_output.splitlines() if line.strip()]


def link_command(node: NodeHost, up: bool) -> list[str]:
    """The node's cable: its host-side veth on the bridge, up or down."""
    return ["ip", "link", "set", node.veth, "up" if up else "down"]


def tbf_commands(node: NodeHost, rate: str) -> list[list[str]]:
    """Throttle the node's link both ways to ``rate`` (tc syntax: 10mbit, 500kbit) with a token bucket filter."""
    tbf = ["root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]
    return [["tc", "qdisc", "replace", "dev", node.veth, *tbf],
            ["ip", "netns", "exec", node.netns, "tc", "qdisc", "replace", "dev", NODE_IF, *tbf]]


def untbf_commands(node: NodeHost) -> list[list[str]]:
    return [["tc", "qdisc", "del", "dev", node.veth, "root"],
            ["ip", "netns", "exec", node.netns, "tc", "qdisc", "del", "dev", NODE_IF, "root"]]


def holder_script(node: NodeHost, *, shared: Sequence[Path], hosts_path: Path, final_argv: Sequence[str]) -> str:
    """The node's setup, run as pid 1 of its fresh PID/mount/UTS namespaces: park the shared dirs under a tmpfs
    on ``/mnt``, cover ``/tmp``, ``/dev/shm`` and ``/run`` with private tmpfs, move the shared dirs back to their
    paths, mount the node's own sysfs (``own_sysfs_lines``), bind the lab hosts file over ``/etc/hosts``, set the
    hostname, exec ``final_argv``."""
    q = shlex.quote
    lines = ["set -e", f"mount -t tmpfs -o size=1m,mode=700 sft-stage {STAGE}"]
    for i, path in enumerate(shared):
        lines += [f"mkdir {STAGE}/s{i}", f"mount --bind {q(str(path))} {STAGE}/s{i}"]
    lines += [f"mount -t tmpfs -o mode={'1777' if d != '/run' else '755'} {node.name}{d.replace('/', '-')} {d}"
              for d in PRIVATE_TMPFS]
    for i, path in enumerate(shared):
        lines += [f"mkdir -p {q(str(path))}", f"mount --move {STAGE}/s{i} {q(str(path))}"]
    lines += own_sysfs_lines()
    lines += [f"umount {STAGE}", f"mount --bind {q(str(hosts_path))} /etc/hosts", f"hostname {q(node.name)}",
              "exec " + " ".join(q(a) for a in final_argv)]
    return "\n".join(lines) + "\n"


def own_sysfs_lines() -> list[str]:
    """A sysfs of the node's own network namespace over ``/sys`` (as ``ip netns exec`` mounts one), so
    ``/sys/class/net`` lists the node's interfaces and their link counters (``slurm_ft.health.links``), not the
    machine's; the machine's cgroup tree (slurmd needs it) is parked on the stage and moved back on top."""
    return [f"mkdir {STAGE}/cgroup", f"mount --rbind /sys/fs/cgroup {STAGE}/cgroup",
            "mount -t sysfs sft-sysfs /sys", f"mount --move {STAGE}/cgroup /sys/fs/cgroup"]


def holder_final_argv(python: str, node: NodeHost, lab_dir: Path) -> list[str]:
    """What the holder is once set up (``procs`` recognizes it by this argv)."""
    return [python, "-c", HOLDER_CODE, HOLDER_TAG, str(lab_dir), node.name]


def is_holder_of(argv: Sequence[str], lab_dir: Path) -> bool:
    """Whether ``argv`` is one of lab ``lab_dir``'s node holders (``holder_final_argv``), or the ``unshare`` or
    setup shell that is becoming one (``holder_argv``): what ``down`` must stop even where the lab's state does not
    record it (a signal that came while it started)."""
    if len(argv) >= 5 and tuple(argv[3:5]) == (HOLDER_TAG, str(lab_dir)):
        return True
    mark = f" {HOLDER_TAG} {shlex.quote(str(lab_dir))} "
    return len(argv) >= 2 and argv[-1] == f"{HOLDER_TAG}-setup" and mark in argv[-2]


def holder_argv(node: NodeHost, script: str, *, machine_uptime_s: float | None) -> list[str]:
    """Start a node: its network namespace (entered with nsenter, not ``ip netns exec``, whose fresh /sys hides
    /sys/fs/cgroup, which slurmd needs; the setup script mounts a sysfs that keeps it), then fresh PID (the script is
    its pid 1), mount, UTS and time namespaces, a fresh /proc; ``--kill-child``: the node dies with the unshare that
    started it.

    The time namespace's boot clock starts at this start (offset: minus the machine's uptime, whole seconds), so
    the node's uptime (sysinfo, /proc/uptime) counts from its own boot: slurmd reports it, and slurmctld tells a
    rebooted node (a boot time after its last response) from one whose slurmd merely restarted. None: no time
    namespace (a kernel without them, ``time_namespaces``): the node's uptime is the machine's."""
    boot = [] if machine_uptime_s is None else ["--time", "--boottime", str(-int(machine_uptime_s))]
    return ["nsenter", f"--net={NETNS_DIR}/{node.netns}", "unshare", "--pid", "--fork", "--mount", "--uts", *boot,
            "--kill-child", "--mount-proc", "/bin/sh", "-c", script, f"{HOLDER_TAG}-setup"]


def machine_uptime(proc_uptime: str) -> float:
    """Seconds since the machine booted, from the text of ``/proc/uptime`` (``12772.47 10380.61``)."""
    try:
        return float(proc_uptime.split()[0])
    except (IndexError, ValueError):
        raise ValueError(f"/proc/uptime: cannot read {proc_uptime!r}") from None


def time_namespaces(proc_self_ns: Path = Path("/proc/self/ns")) -> bool:
    """Whether this kernel has time namespaces (Linux 5.6+), so each node's boot clock can start at its boot."""
    return (proc_self_ns / "time").exists()


def enter_argv(holder_pid: int, argv: Sequence[str], *, time_ns: bool = True) -> list[str]:
    """Run ``argv`` on the node whose holder is ``holder_pid`` (all its namespaces, its boot clock too where
    ``time_ns``; nsenter forks into the PID namespace, so the program is nsenter's child)."""
    clock = ["--time"] if time_ns else []
    return ["nsenter", "-t", str(holder_pid), "--net", "--mount", "--uts", "--pid", *clock, "--", *argv]


def controller_argv(hosts_path: Path, argv: Sequence[str]) -> list[str]:
    """slurmctld in the root network namespace but a mount namespace of its own that sees the lab's hosts file
    as /etc/hosts (so node names resolve there too; the machine's /etc/hosts stays untouched)."""
    script = f"mount --bind {shlex.quote(str(hosts_path))} /etc/hosts && exec " + " ".join(map(shlex.quote, argv))
    return ["unshare", "--mount", "/bin/sh", "-c", script]
