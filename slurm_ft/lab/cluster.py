"""A real Slurm cluster on this host: its own munged, one slurmctld and N ``slurmd -N nK``.

Two modes. Hosts (the default wherever this machine allows namespaces, ``hosts.refusal``; ``hosts=True``,
``lab up --hosts`` insists): every node is a host of its own (``slurm_ft.lab.hosts``: network, UTS, PID and mount
namespaces on a lab bridge), slurmctld stays in the root namespace on the bridge's address. Single-address (the
fallback where namespaces are refused; ``hosts=False``, ``lab up --single-address`` forces it): every node is
127.0.0.1 with this host's name, one slurmd port each. The mode and why it was chosen are recorded in the lab's
state (``lab status`` prints them).
Everything lives in one lab directory (config, munge key and socket, state, spool, logs, pids), so several labs
run side by side on one host. ``up`` is idempotent; ``down`` stops exactly the daemons ``up`` started (and in hosts
mode removes its namespaces, interfaces and bridge).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import logging
import os
import shutil
import socket
import stat
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_ft.cluster import admin
from slurm_ft.core import env as ft_env
from slurm_ft.core.errors import SlurmFtError
from slurm_ft.lab import hosts, ports, procs, slurmconf
from slurm_ft.lab.slurmconf import LabLayout, render_slurm_conf
from slurm_ft.slurm.cli_backend import CliSlurmClient
from slurm_ft.slurm.parsers import parse_version
from slurm_ft.slurm.runner import run_command
from slurm_ft.slurm.types import JobInfo, NodeInfo

LAB_DAEMONS = ("slurmctld", "slurmd", "munged")  # what `down` stops by its arguments when the state missed it
log = logging.getLogger(__name__)

Progress = Callable[[str], None]

REQUIRED_PROGRAMS = {  # program -> Debian package
    "munged": "munge", "mungekey": "munge", "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm",
    "scontrol": "slurm-wlm", "sinfo": "slurm-wlm", "squeue": "slurm-wlm", "sbatch": "slurm-wlm",
}
MAX_DIR_LENGTH = 72  # unix socket paths (munge, slurmstepd) must stay under 108 bytes
STATE_FILE = "lab.json"
LAB_STATE_DIR = "state"  # slurm-ft's state dir inside the lab (hook_lines writes its site config so)
LAB_SITE_CONFIG = "etc/slurm-ft/config.toml"
HOSTS_FILE = "hosts"  # the lab's /etc/hosts in hosts mode (bound over /etc/hosts on every node and for slurmctld)


class Mode(str, enum.Enum):
    """How the lab's nodes exist: all on one address, or each a host of its own."""

    SINGLE_ADDRESS = "single-address"
    HOSTS = "hosts"


class LabError(SlurmFtError):
    """The lab cluster could not be started, inspected or stopped."""


def choose_mode(requested: bool | None, refused: str | None) -> tuple[Mode, str]:
    """The lab's mode and why, from what was asked (True: ``--hosts``, False: ``--single-address``, None: hosts
    where this machine allows namespaces) and ``hosts.refusal()`` (None: allowed; not consulted when False).
    ``--hosts`` where namespaces are refused is a LabError naming the reason."""
    if requested is False:
        return Mode.SINGLE_ADDRESS, "forced: --single-address"
    if refused is None:
        return Mode.HOSTS, "insisted: --hosts" if requested else "namespaces allowed"
    if requested:
        raise LabError(f"--hosts: this machine refuses the namespaces hosts mode needs ({refused}); "
                       "run `slurm-ft lab up` without --hosts for single-address mode")
    return Mode.SINGLE_ADDRESS, f"namespaces refused: {refused}"


def default_lab_dir() -> Path:
    """``$SLURM_FT_LAB_DIR``, else ``$XDG_STATE_HOME/slurm-ft/lab``, else ``~/.local/state/slurm-ft/lab``."""
    explicit = os.environ.get(ft_env.LAB_DIR)
    if explicit:
        return Path(explicit)
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "slurm-ft" / "lab"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LabConfig:
    """One lab cluster. ``base_port=None`` picks a free block of ``nodes + 1`` ports on first ``up``."""

    dir: Path = dataclasses.field(default_factory=default_lab_dir)
    nodes: int = 4
    cpus_per_node: int = 2
    memory_mb: int = 1000
    base_port: int | None = None
    slurmd_timeout: int = 10
    min_job_age: int = 300
    hooks: bool = True  # install slurm-ft (prolog, epilog, plugstack: hook_lines) and append its slurm.conf lines
    slurm_user: str = "root"
    extra_conf: tuple[str, ...] = ()  # more slurm.conf lines, appended last
    start_timeout: float = 60.0
    # Each node a host of its own (namespaces on a lab bridge, see slurm_ft.lab.hosts): None, where this machine
    # allows namespaces (else single-address, said so); True insists (LabError where refused); False: single-address.
    hosts: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", Path(self.dir).expanduser().absolute())
        object.__setattr__(self, "extra_conf", tuple(self.extra_conf))
        if len(str(self.dir)) > MAX_DIR_LENGTH:
            raise ValueError(f"dir: {str(self.dir)!r} is longer than {MAX_DIR_LENGTH} characters "
                             "(unix socket paths inside it would be too long); choose a shorter --dir")
        if not 1 <= self.nodes <= 64:
            raise ValueError(f"nodes: must be within 1..64 (--nodes), got {self.nodes}")
        if not 1 <= self.cpus_per_node <= 256:
            raise ValueError(f"cpus_per_node: must be within 1..256 (--cpus), got {self.cpus_per_node}")
        if self.memory_mb < 100:
            raise ValueError(f"memory_mb: must be at least 100, got {self.memory_mb}")
        if self.base_port is not None and not 1024 <= self.base_port <= 65535 - self.nodes:
            raise ValueError(f"base_port: must be within 1024..{65535 - self.nodes} (--base-port), "
                             f"got {self.base_port}")
        if not 3 <= self.slurmd_timeout <= 3600:
            raise ValueError(f"slurmd_timeout: must be within 3..3600 seconds, got {self.slurmd_timeout}")
        if self.min_job_age < 2:
            raise ValueError(f"min_job_age: must be at least 2 seconds, got {self.min_job_age}")
        if self.start_timeout <= 0:
            raise ValueError(f"start_timeout: must be positive, got {self.start_timeout}")
        for line in self.extra_conf:
            if "\n" in line:
                raise ValueError(f"extra_conf: one line per item, got {line!r}")


class LabCluster:
    """Start, inspect and stop one lab cluster. Public methods check; ``_`` methods do the work."""

    def __init__(self, config: LabConfig | None = None) -> None:
        self.config = config or LabConfig()

    @classmethod
    def attach(cls, lab_dir: str | os.PathLike[str], **overrides: Any) -> "LabCluster":
        """The lab recorded in ``lab_dir``, with the node count and CPUs it was started with."""
        probe = cls(LabConfig(dir=Path(lab_dir)))
        state = probe._read_state()
        recorded: dict[str, Any] = {}
        if state.get("nodes"):
            recorded["nodes"] = len(state["nodes"])
        if state.get("cpus_per_node"):
            recorded["cpus_per_node"] = int(state["cpus_per_node"])
        if state.get("mode"):
            recorded["hosts"] = state["mode"] == Mode.HOSTS.value
        return cls(LabConfig(dir=Path(lab_dir), **{**recorded, **overrides}))

    # --- paths and identity ----------------------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return self.config.dir

    @property
    def conf_path(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(f"n{i + 1}" for i in range(self.config.nodes))

    @property
    def cluster_name(self) -> str:
        return "lab" + hashlib.sha256(str(self.dir).encode()).hexdigest()[:8]

    @property
    def state_dir(self) -> Path:
        """slurm-ft's state in this lab (registrations, node reports, monitor and quarantine databases)."""
        return self.dir / LAB_STATE_DIR

    @property
    def site_config(self) -> Path:
        return self.dir / LAB_SITE_CONFIG

    @property
    def mode(self) -> Mode:
        """The mode of the running lab as recorded, else the one ``up`` would choose."""
        recorded = self._read_state().get("mode")
        return Mode(recorded) if recorded else self.chosen_mode()[0]

    @property
    def mode_reason(self) -> str:
        """Why the lab runs in its mode (``namespaces refused: ...``, ``forced: --single-address``, ...)."""
        state = self._read_state()
        return str(state.get("mode_reason", "")) if state.get("mode") else self.chosen_mode()[1]

    def chosen_mode(self) -> tuple[Mode, str]:
        """The mode ``up`` starts the lab in and why (``choose_mode``; probes the machine only when asked to)."""
        return choose_mode(self.config.hosts, None if self.config.hosts is False else hosts.refusal())

    @property
    def host_plan(self) -> hosts.HostPlan:
        """Names and addresses of this lab's hosts (hosts mode): its recorded nodes, else the configured ones."""
        return hosts.plan_for(self.dir, self._recorded_nodes(self._read_state()) or self.node_names)

    @property
    def hosts_path(self) -> Path:
        return self.dir / HOSTS_FILE

    def env(self) -> dict[str, str]:
        """Environment for Slurm and slurm-ft commands against this lab (merge into ``os.environ``): its
        slurm.conf, its slurm-ft site config and state dir, so nothing of the lab lands outside its directory
        (jobs submitted with it register there too)."""
        return {"SLURM_CONF": str(self.conf_path), ft_env.SITE_CONFIG: str(self.site_config),
                ft_env.STATE_DIR: str(self.state_dir)}

    def client(self) -> CliSlurmClient:
        return CliSlurmClient(env=self.env())

    # --- public operations -----------------------------------------------------------------------------------
    def is_up(self) -> bool:
        """True when every daemon this lab recorded is still running."""
        state = self._read_state()
        daemons = state.get("daemons", [])
        expected = {"munged", "slurmctld", *(f"slurmd-{n}" for n in self._recorded_nodes(state))}
        if state.get("mode") == Mode.HOSTS.value:
            expected |= {f"host-{n}" for n in self._recorded_nodes(state)}
        recorded = {procs.Daemon.from_dict(d).name for d in daemons}
        return bool(daemons) and expected <= recorded and all(
            procs.is_running(procs.Daemon.from_dict(d)) for d in daemons)

    def up(self, progress: Progress | None = None, *, fresh: bool = False) -> None:
        """Start the lab (or reuse it when already up with the same config) and wait until all nodes are ready."""
        say = progress or (lambda _msg: None)
        check_prerequisites()
        mode, why = self.chosen_mode()
        if mode is Mode.HOSTS:
            check_host_tools()
        if fresh:
            self.down(progress=progress)
            self._clear_state()
        self._make_dirs()
        with ports.host_lock():
            state = self._read_state()
            layout = self._layout(state, mode)
            extra = self._extra_lines(say)
            conf = render_slurm_conf(layout, extra)
            running = self.is_up()
            if running and self._same_nodes(state, layout):
                if conf != self._read_conf():
                    say("slurm.conf changed: scontrol reconfigure")
                    self._write_conf(conf)
                    self._scontrol("reconfigure")
                else:
                    say(f"lab already up in {self.dir}")
            else:
                if running or state.get("daemons"):
                    say("lab config changed or partly down: restarting it")
                    self._stop_daemons(say)
                    self._network_down(say)  # hosts mode's network, also when the new config has none
                    if self._ports_taken(layout):
                        layout = self._layout({}, mode)
                        conf = render_slurm_conf(layout, extra)
                self._write_conf(conf)
                say(f"mode: {mode.value} ({why})")
                self._start(layout, why, say)
        self._wait_ready(say)

    def down(self, progress: Progress | None = None) -> None:
        """Cancel the lab's jobs, stop exactly the daemons ``up`` started (by pid), leave nothing running."""
        say = progress or (lambda _msg: None)
        state = self._read_state()
        if not state.get("daemons"):
            self._stop_unrecorded(say)
            self._network_down(say)
            say(f"no lab running in {self.dir}")
            return
        self._stop_daemons(say)
        self._network_down(say)
        runtime = self._munge_socket_dir()
        if runtime != self.dir / "munge":
            shutil.rmtree(runtime, ignore_errors=True)
        say("lab down")

    def stop_node(self, name: str) -> None:
        """Fault injection: kill node ``name``'s slurmd (its jobs' slurmstepd keep running, as on a real crash)."""
        daemon = self._find_daemon(f"slurmd-{self._known_node(name)}")
        if daemon is None or not procs.is_running(daemon):
            raise LabError(f"slurmd of {name} is not running")
        procs.stop([daemon], timeout=0.0)

    def start_node(self, name: str) -> None:
        """Start node ``name``'s slurmd again (after ``stop_node``); it re-registers and returns to service."""
        name = self._known_node(name)
        existing = self._find_daemon(f"slurmd-{name}")
        if existing is not None and procs.is_running(existing):
            return
        state = self._read_state()
        state["daemons"] = [d for d in state.get("daemons", []) if d.get("name") != f"slurmd-{name}"]
        hosted = state.get("mode") == Mode.HOSTS.value
        with ports.host_lock():
            if hosted:
                self._ensure_host(state, name)
            self._spawn_slurmd(state, name, self._daemon_env())
        host, port = self._slurmd_address(state, name)
        self._wait_for(lambda: ports.can_connect(port, host), f"slurmd {name} port", f"slurmd-{name}")

    def kill_host(self, name: str) -> list[int]:
        """Fault injection (hosts mode): node ``name`` dies as a host: its cable goes down and every process in
        its namespaces is SIGKILLed (its PID namespace's init first: the kernel kills the rest). Returns the pids
        that were on it. ``start_node`` brings it back, empty (fresh /tmp, /dev/shm, /run)."""
        holder = self._host_holder(name)
        self.set_link(name, up=False)
        if holder is None:
            return []
        namespace = procs.pid_namespace(holder.pid)
        victims = procs.in_pid_namespace(namespace)
        procs.stop([holder], timeout=0.0)
        deadline = time.monotonic() + 10.0  # the kernel kills the rest of the namespace after its init
        while procs.in_pid_namespace(namespace) and time.monotonic() < deadline:
            time.sleep(0.05)
        return victims

    def set_link(self, name: str, *, up: bool) -> None:
        """Fault injection (hosts mode): node ``name``'s cable (its veth on the lab bridge) up or down."""
        self._require_hosts()
        _run(hosts.link_command(self.host_plan.node(self._known_node(name)), up))

    def throttle_link(self, name: str, rate: str | None) -> None:
        """Fault injection (hosts mode): limit node ``name``'s link to ``rate`` both ways (tbf), None: lift it."""
        self._require_hosts()
        node = self.host_plan.node(self._known_node(name))
        if rate is None:
            for argv in hosts.untbf_commands(node):
                run_command(argv, timeout=15)  # absent when never throttled: fine
            return
        for argv in hosts.tbf_commands(node, rate):
            _run(argv)

    def _require_hosts(self) -> None:
        if self.mode is not Mode.HOSTS:
            raise LabError(f"the lab in {self.dir} runs in {self.mode.value} mode ({self.mode_reason}); network "
                           "faults need its nodes to be hosts (`slurm-ft lab up --hosts`)")

    def host_pid(self, name: str) -> int | None:
        """The pid (in ours) of node ``name``'s host holder, the init of its namespaces; None when it is not up."""
        holder = self._host_holder(name)
        return holder.pid if holder is not None else None

    def _host_holder(self, name: str) -> procs.Daemon | None:
        self._require_hosts()
        holder = self._find_daemon(f"host-{self._known_node(name)}")
        return holder if holder is not None and procs.is_running(holder) else None

    def status(self) -> tuple[list[NodeInfo], list[JobInfo]]:
        """Nodes and jobs of the running lab (one sinfo and one squeue call)."""
        ctld = self._find_daemon("slurmctld")
        if ctld is None or not procs.is_running(ctld):
            raise LabError(f"no lab running in {self.dir} (start it with `slurm-ft lab up --dir {self.dir}`)")
        client = self.client()
        return client.nodes(), client.jobs()

    # --- starting ---------------------------------------------------------------------------------------------
    def _layout(self, state: Mapping[str, Any], mode: Mode) -> LabLayout:
        recorded = state.get("ports") or {}
        count = self.config.nodes
        if self.config.base_port is not None:
            base = self.config.base_port
        elif recorded.get("base") and int(recorded.get("count", 0)) == count + 1:
            base = int(recorded["base"])
        else:
            base = ports.pick_block(count + 1)
        placed: dict[str, Any] = {"node_ports": tuple(base + 1 + i for i in range(count))}
        if mode is Mode.HOSTS:
            plan = hosts.plan_for(self.dir, self.node_names)
            placed = {"node_ports": (hosts.SLURMD_PORT,) * count, "node_addrs": tuple(h.addr for h in plan.nodes),
                      "ctld_addr": plan.bridge_addr}
        return LabLayout(
            dir=self.dir, cluster_name=self.cluster_name, hostname=socket.gethostname(), ctld_port=base,
            **placed, cpus_per_node=self.config.cpus_per_node,
            memory_mb=self.config.memory_mb, slurm_user=self.config.slurm_user,
            slurmd_timeout=self.config.slurmd_timeout, min_job_age=self.config.min_job_age,
            munge_socket_dir=self._munge_socket_dir(), slurm_version=daemon_version(),
        )

    def _munge_socket_dir(self) -> Path:
        """``<dir>/munge`` when every user can reach it (munged insists), else a runtime dir of this lab's own."""
        if all_traversable(self.dir):
            return self.dir / "munge"
        base = Path("/run") if os.access("/run", os.W_OK) else Path("/tmp")
        return base / "slurm-ft" / self.cluster_name

    def _ports_taken(self, layout: LabLayout) -> bool:
        mine = (layout.ctld_port,) if layout.hosts_mode else (layout.ctld_port, *layout.node_ports)
        return not all(ports.port_is_free(p) for p in mine)

    def _extra_lines(self, say: Progress) -> list[str]:
        lines = list(hook_lines(self.dir, slurm_user=self.config.slurm_user)) if self.config.hooks else []
        if lines:
            say(f"hooks from slurm_ft.cluster.admin: {len(lines)} slurm.conf lines")
        return lines + list(self.config.extra_conf)

    def _start(self, layout: LabLayout, why: str, say: Progress) -> None:
        self._ensure_munge_key(layout)
        for stale in layout.run_dir.glob("*.pid"):
            stale.unlink()
        daemon_env = self._daemon_env()
        mode = Mode.HOSTS if layout.hosts_mode else Mode.SINGLE_ADDRESS
        state: dict[str, Any] = {
            "version": 1, "mode": mode.value, "mode_reason": why,
            "ports": {"base": layout.ctld_port, "count": len(layout.node_ports) + 1},
            "nodes": list(layout.node_names), "cpus_per_node": layout.cpus_per_node, "daemons": [],
        }
        try:
            if mode is Mode.HOSTS:
                self._network_up(layout, say)
            say("starting munged")
            self._spawn(state, "munged", munged_argv(layout), daemon_env)
            self._wait_for(lambda: layout.munge_socket.exists(), "munged socket", "munged")
            say(f"starting slurmctld on port {layout.ctld_port}")
            ctld = [_program("slurmctld"), "-D", "-f", str(self.conf_path)]
            wrapped = hosts.controller_argv(self.hosts_path, ctld) if mode is Mode.HOSTS else None
            self._spawn(state, "slurmctld", wrapped or ctld, daemon_env, final_argv=ctld if wrapped else None)
            self._wait_for(lambda: ports.can_connect(layout.ctld_port), "slurmctld port", "slurmctld")
            if mode is Mode.HOSTS:
                say(f"starting {len(layout.node_names)} hosts on {self.host_plan.subnet}")
                for name in layout.node_names:
                    self._start_host(state, name, layout)
            say(f"starting {len(layout.node_names)} slurmd ({', '.join(layout.node_names)})")
            for name in layout.node_names:
                self._spawn_slurmd(state, name, daemon_env)
            for name in layout.node_names:
                host, port = self._slurmd_address(state, name)
                self._wait_for(lambda h=host, p=port: ports.can_connect(p, h), f"slurmd {name} port",
                               f"slurmd-{name}")
        except BaseException:
            self._write_state(state)
            self._stop_daemons(say)
            self._network_down(say)
            raise
        self._write_state(state)

    def _spawn_slurmd(self, state: dict[str, Any], name: str, env: Mapping[str, str]) -> None:
        """slurmd of ``name``: a process on this host, or (hosts mode) entered into the node's namespaces."""
        argv = self._slurmd_argv(name)
        if state.get("mode") != Mode.HOSTS.value:
            self._spawn(state, f"slurmd-{name}", argv, env)
            return
        holder = next((procs.Daemon.from_dict(d) for d in state["daemons"] if d["name"] == f"host-{name}"), None)
        if holder is None or not procs.is_running(holder):
            raise LabError(f"host {name} is not running; {self._log_tail(f'host-{name}')}")
        entered = hosts.enter_argv(holder.pid, argv, time_ns=hosts.time_namespaces())
        self._spawn(state, f"slurmd-{name}", entered, env, final_argv=argv)

    def _slurmd_address(self, state: Mapping[str, Any], name: str) -> tuple[str, int]:
        if state.get("mode") == Mode.HOSTS.value:
            return self.host_plan.node(name).addr, hosts.SLURMD_PORT
        return "127.0.0.1", int(state["ports"]["base"]) + self.node_names.index(name) + 1

    # --- hosts mode: network, node hosts ----------------------------------------------------------------------
    def _network_up(self, layout: LabLayout, say: Progress) -> None:
        """The bridge, every node's namespace and veth (after clearing leftovers of an earlier run of this lab),
        and the lab's hosts file."""
        plan = hosts.plan_for(self.dir, layout.node_names)
        self._network_down(lambda _m: None)
        taken = hosts.subnet_in_use(plan, run_command(["ip", "-o", "-4", "addr", "show"], timeout=15).stdout)
        if taken:
            raise LabError(f"the lab's subnet {plan.subnet} (from its dir {self.dir}) is in use here ({taken}); "
                           "choose another --dir")
        _atomic_write(self.hosts_path, hosts.hosts_file(plan, layout.hostname), mode=0o644)
        say(f"network: bridge {plan.bridge} {plan.bridge_addr}/{plan.prefix_len}, "
            f"{len(plan.nodes)} namespaces ({plan.nodes[0].netns} ...)")
        for argv in hosts.network_up_commands(plan):
            _run(argv)

    def _network_down(self, say: Progress) -> None:
        """Remove this lab's veths, namespaces and bridge, whichever exist (found by the lab's tag in their
        names, so a node count changed since ``up`` leaves nothing behind; nothing else is touched)."""
        links = hosts.link_names(run_command(["ip", "-o", "link", "show"], timeout=15).stdout)
        spaces = hosts.netns_names(run_command(["ip", "netns", "list"], timeout=15).stdout)
        commands = hosts.network_down_commands(hosts.lab_tag(self.dir), links, spaces)
        for argv in commands:
            run_command(argv, timeout=15)
        if commands:
            say(f"removed the lab network: {sum(a[1] == 'netns' for a in commands)} namespaces, "
                f"{sum(a[1] == 'link' for a in commands)} interfaces")

    def _start_host(self, state: dict[str, Any], name: str, layout: LabLayout | None = None) -> None:
        node = self.host_plan.node(name)
        shared = [self.dir]
        socket_dir = self._munge_socket_dir()
        if not socket_dir.is_relative_to(self.dir):
            shared.append(socket_dir)
        final = hosts.holder_final_argv(sys.executable, node, self.dir)
        script = hosts.holder_script(node, shared=shared, hosts_path=self.hosts_path, final_argv=final)
        uptime = hosts.machine_uptime(Path("/proc/uptime").read_text()) if hosts.time_namespaces() else None
        argv = hosts.holder_argv(node, script, machine_uptime_s=uptime)
        self._spawn(state, f"host-{name}", argv, self._daemon_env(), final_argv=final)
        holder = self._find_daemon(f"host-{name}")
        if holder is None or not procs.is_running(holder):
            raise LabError(f"host {name} did not start; {self._log_tail(f'host-{name}')}")

    def _ensure_host(self, state: dict[str, Any], name: str) -> None:
        """Bring node ``name``'s host back after ``kill_host``: a fresh holder (empty /tmp), its cable up."""
        holder = self._find_daemon(f"host-{name}")
        if holder is not None and procs.is_running(holder):
            return
        state["daemons"] = [d for d in state["daemons"] if d.get("name") != f"host-{name}"]
        self._start_host(state, name)
        self.set_link(name, up=True)

    def _slurmd_argv(self, name: str) -> list[str]:
        # Invoked under their real names: Slurm disables PrologSlurmctld & co. for renamed daemons.
        return [_program("slurmd"), "-D", "-N", name, "-f", str(self.conf_path)]

    def _known_node(self, name: str) -> str:
        if name not in self.node_names:
            raise LabError(f"no node {name!r} in this lab (nodes: {', '.join(self.node_names)})")
        return name

    def _spawn(self, state: dict[str, Any], name: str, argv: list[str], env: Mapping[str, str],
               final_argv: list[str] | None = None) -> None:
        log_path = self.dir / "log" / f"{name}.out"
        daemon = (procs.spawn(name, argv, env=env, log_path=log_path) if final_argv is None else
                  procs.spawn_via(name, argv, final_argv, env=env, log_path=log_path))
        state["daemons"].append(daemon.to_dict())
        self._write_state(state)  # recorded at once, so a crash between starts still lets `down` find it

    def _wait_for(self, ready: Callable[[], bool], what: str, daemon_name: str) -> None:
        deadline = time.monotonic() + self.config.start_timeout
        while time.monotonic() < deadline:
            if ready():
                return
            daemon = self._find_daemon(daemon_name)
            if daemon is not None and not procs.is_running(daemon):
                raise LabError(f"{daemon_name} exited during start; {self._log_tail(daemon_name)}")
            time.sleep(0.1)
        raise LabError(f"timed out after {self.config.start_timeout:g}s waiting for {what}; "
                       f"{self._log_tail(daemon_name)}")

    def _wait_ready(self, say: Progress) -> None:
        """Wait until every node has registered (idle, or busy/drained from recovered state)."""
        client = self.client()
        deadline = time.monotonic() + self.config.start_timeout
        wanted = set(self.node_names)
        last = ""
        while True:
            try:
                nodes = {n.name: n for n in client.nodes() if n.name in wanted}
            except SlurmFtError:
                nodes = {}
            ready = sorted(name for name, node in nodes.items() if node_ready(node))
            line = f"nodes ready: {len(ready)}/{len(wanted)}"
            if line != last:
                say(line)
                last = line
            if len(ready) == len(wanted):
                drained = sorted(n for n in ready if nodes[n].drained)
                if drained:
                    say(f"note: drained: {', '.join(drained)} (resume with scontrol update NodeName=... "
                        "State=RESUME, or restart with `lab up --fresh`)")
                return
            if time.monotonic() > deadline:
                states = ", ".join(f"{n}={'+'.join(sorted(nodes[n].state)) if n in nodes else '?'}"
                                   for n in sorted(wanted))
                raise LabError(f"timed out after {self.config.start_timeout:g}s waiting for nodes ({states}); "
                               f"see {self.dir / 'log'}")
            time.sleep(0.5)

    # --- stopping ---------------------------------------------------------------------------------------------
    def _stop_daemons(self, say: Progress) -> None:
        state = self._read_state()
        daemons = [procs.Daemon.from_dict(d) for d in state.get("daemons", [])]
        ctld = next((d for d in daemons if d.name == "slurmctld"), None)
        if ctld is not None and procs.is_running(ctld):
            self._cancel_jobs(say)
        first = [d for d in daemons if d.name.startswith("slurmd") or d.name == "slurmctld"]
        stopped = procs.stop(first) + procs.stop([d for d in daemons if d.name == "munged"])
        if stopped:
            say(f"stopped {', '.join(f'{d.name} ({d.pid})' for d in stopped)}")
        leftovers = self._strays()
        if leftovers:
            listed = ", ".join(f"{d.pid} ({d.argv[0]})" for d in leftovers)
            say(f"stopping {len(leftovers)} leftover job processes: {listed}")
            procs.stop(leftovers, timeout=3.0)
        holders = procs.stop([d for d in daemons if d.name.startswith("host-")], timeout=3.0)
        if holders:
            say(f"stopped hosts {', '.join(f'{d.name} ({d.pid})' for d in holders)}")
        self._stop_unrecorded(say)
        state["daemons"] = []
        self._write_state(state)

    def _stop_unrecorded(self, say: Progress) -> None:
        """Kill this lab's daemons and node holders that its state does not record (a signal came while one
        started, after its spawn and before ``_spawn`` wrote it down): a holder takes everything in its namespaces
        with it; a daemon is known by an argument inside the lab dir (``slurmctld -f <lab>/slurm.conf``)."""
        spared = procs.ancestors(os.getpid())
        found = [procs.identify(pid, name="unrecorded") for pid in procs.all_pids()
                 if pid not in spared and self._started_here(procs.cmdline(pid))]
        stopped = procs.stop([d for d in found if d is not None], timeout=0.0)
        if stopped:
            say(f"stopped {len(stopped)} unrecorded lab processes: {', '.join(str(d.pid) for d in stopped)}")

    def _started_here(self, argv: Sequence[str]) -> bool:
        """A node holder of this lab, or one of its daemons (a Slurm or munge daemon given a path inside it)."""
        if hosts.is_holder_of(argv, self.dir):
            return True
        marker = f"{self.dir}/"
        return bool(argv) and os.path.basename(argv[0]) in LAB_DAEMONS and any(marker in a for a in argv[1:])

    def _cancel_jobs(self, say: Progress) -> None:
        try:
            jobs = [j for j in self.client().jobs() if not j.state.finished]
        except SlurmFtError as exc:
            log.warning("could not list lab jobs before stopping: %s", exc)
            return
        if not jobs:
            return
        say(f"cancelling {len(jobs)} jobs")
        run_command(["scancel", *(str(j.job_id) for j in jobs)], env=self._client_env(), timeout=15)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if all(j.state.finished for j in self.client().jobs()):
                    return
            except SlurmFtError:
                return
            time.sleep(0.3)

    def _strays(self) -> list[procs.Daemon]:
        """Processes this lab's slurmd left behind: slurmstepd (they carry its SLURM_CONF) and job processes
        (slurmstepd gives them this cluster's SLURM_CLUSTER_NAME). Never this process or its ancestors."""
        spared = procs.ancestors(os.getpid())
        strays = []
        for pid in procs.all_pids():
            if pid in spared:
                continue
            stepd = procs.comm(pid) == "slurmstepd" and procs.environ_value(pid, "SLURM_CONF") == str(self.conf_path)
            if stepd or procs.environ_value(pid, "SLURM_CLUSTER_NAME") == self.cluster_name:
                daemon = procs.identify(pid, name="stray")
                if daemon is not None:
                    strays.append(daemon)
        return strays

    # --- files -----------------------------------------------------------------------------------------------
    def _make_dirs(self) -> None:
        for sub in ("", "munge", slurmconf.CTLD_STATE, "spool", "log", "run", *(f"spool/{n}" for n in self.node_names)):
            path = self.dir / sub
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o755)  # munged wants its socket dir reachable by every user; jobs run as any user

    def _ensure_munge_key(self, layout: LabLayout) -> None:
        socket_dir = layout.munge_socket.parent
        if socket_dir != layout.munge_dir:  # the runtime dir /run/slurm-ft/<cluster>
            _own_dir(socket_dir.parent)
        _own_dir(socket_dir)
        if layout.munge_key.exists():
            return
        result = run_command(["mungekey", "--create", "--bits=1024", f"--keyfile={layout.munge_key}"], timeout=30)
        if not result.ok:
            raise LabError(f"mungekey failed: {result.stderr.strip()}")
        layout.munge_key.chmod(0o600)

    def _clear_state(self) -> None:
        for sub in (slurmconf.CTLD_STATE, "spool"):
            shutil.rmtree(self.dir / sub, ignore_errors=True)

    def _read_state(self) -> dict[str, Any]:
        try:
            return json.loads((self.dir / STATE_FILE).read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise LabError(f"{self.dir / STATE_FILE} is unreadable ({exc}); stop its daemons by hand") from exc

    def _write_state(self, state: Mapping[str, Any]) -> None:
        _atomic_write(self.dir / STATE_FILE, json.dumps(state, indent=1) + "\n")

    def _read_conf(self) -> str:
        try:
            return self.conf_path.read_text()
        except FileNotFoundError:
            return ""

    def _write_conf(self, text: str) -> None:
        _atomic_write(self.conf_path, text, mode=0o644)

    def _find_daemon(self, name: str) -> procs.Daemon | None:
        for data in self._read_state().get("daemons", []):
            if data.get("name") == name:
                return procs.Daemon.from_dict(data)
        return None

    def _log_tail(self, name: str, lines: int = 5) -> str:
        path = self.dir / "log" / f"{name}.out"
        candidates = [path]
        if name == "slurmctld":
            candidates.append(self.dir / "log" / "slurmctld.log")
        elif name.startswith("slurmd-"):
            candidates.append(self.dir / "log" / f"slurmd-{name.split('-', 1)[1]}.log")
        text = ""
        for candidate in candidates:
            try:
                text += candidate.read_text(errors="replace")
            except OSError:
                continue
        tail = " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])
        return f"log: {tail}" if tail else f"no log output (see {self.dir / 'log'})"

    # --- helpers ---------------------------------------------------------------------------------------------
    def _daemon_env(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SPANK_"))}
        base["SLURM_CONF"] = str(self.conf_path)
        return base

    def _client_env(self) -> dict[str, str]:
        return {**os.environ, **self.env()}

    def _scontrol(self, *args: str) -> None:
        run_command(["scontrol", *args], env=self._client_env(), timeout=30).check()

    def _recorded_nodes(self, state: Mapping[str, Any]) -> list[str]:
        return [str(n) for n in state.get("nodes", [])]

    def _same_nodes(self, state: Mapping[str, Any], layout: LabLayout) -> bool:
        ports_state = state.get("ports") or {}
        mode = Mode.HOSTS if layout.hosts_mode else Mode.SINGLE_ADDRESS
        return (self._recorded_nodes(state) == list(layout.node_names)
                and state.get("mode", Mode.SINGLE_ADDRESS.value) == mode.value
                and int(ports_state.get("base", -1)) == layout.ctld_port
                and int(state.get("cpus_per_node", -1)) == layout.cpus_per_node)


def _program(name: str) -> str:
    """Absolute path of a daemon (``/usr/sbin`` is often not on a user's PATH)."""
    found = shutil.which(name) or (f"/usr/sbin/{name}" if Path("/usr/sbin", name).exists() else None)
    return found or name


def daemon_version() -> str:
    """The version of the slurmctld the lab would start (the first on PATH): ``slurmctld -V`` -> ``25.11.7``."""
    done = run_command([_program("slurmctld"), "-V"], timeout=30)
    try:
        return parse_version(done.stdout or done.stderr)
    except ValueError as exc:
        raise LabError(f"slurmctld -V: {exc}") from exc


def munged_argv(layout: LabLayout) -> list[str]:
    m = layout.munge_dir
    return [_program("munged"), "-F", f"--socket={layout.munge_socket}", f"--key-file={layout.munge_key}",
            f"--pid-file={m / 'munged.pid'}", f"--log-file={layout.log_dir / 'munged.log'}",
            f"--seed-file={m / 'munged.seed'}"]


def _own_dir(path: Path) -> None:
    """Create ``path`` (mode 0755); refuse one that is a symlink or belongs to someone else."""
    path.mkdir(mode=0o755, exist_ok=True)
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise LabError(f"{path} is not a directory of our own (symlink or owned by uid {info.st_uid}); remove it")
    path.chmod(0o755)


def all_traversable(path: Path) -> bool:
    """True when every existing ancestor of ``path`` (and ``path``) is searchable by all users."""
    for part in (path, *path.parents):
        try:
            if not part.stat().st_mode & 0o001:
                return False
        except FileNotFoundError:
            continue
    return True


def node_ready(node: NodeInfo) -> bool:
    """A node that registered and can take (or is running) jobs, or was drained on purpose."""
    bad = {"UNKNOWN", "DOWN", "NOT_RESPONDING", "FUTURE", "POWERED_DOWN", "INVALID_REG", "NO_RESPOND"}
    return bool(node.state) and not (node.state & bad)


def hook_lines(lab_dir: Path, *, slurm_user: str) -> list[str]:
    """Install slurm-ft into the lab (``slurm_ft.cluster.admin.install_in_dir``: prolog, epilog, SPANK plugin, site
    config with the TEST-ONLY knobs on); the slurm.conf lines it needs."""
    lab_dir = Path(lab_dir).absolute()
    return admin.install_in_dir(lab_dir, config_dir=(lab_dir / LAB_SITE_CONFIG).parent,
                                state_dir=lab_dir / LAB_STATE_DIR, slurm_user=slurm_user)


def check_prerequisites(which: Callable[[str], str | None] = shutil.which,
                        euid: Callable[[], int] = os.geteuid,
                        exists: Callable[[Path], bool] = Path.exists) -> None:
    """Raise LabError with the apt command when Slurm or munge is missing, or when not root."""
    missing = sorted(prog for prog in REQUIRED_PROGRAMS if which(prog) is None and
                     not exists(Path("/usr/sbin", prog)))
    if missing:
        packages = " ".join(sorted({REQUIRED_PROGRAMS[p] for p in missing}))
        raise LabError(f"missing {', '.join(missing)}: install with "
                       f"`apt-get install -y {packages}` (Debian/Ubuntu)")
    if euid() != 0:
        raise LabError("the lab cluster must run as root (slurmd starts jobs as their users); "
                       "run `sudo slurm-ft lab up` or use a container")


def check_host_tools(which: Callable[[str], str | None] = shutil.which) -> None:
    """Raise LabError naming the package when a program hosts mode needs is missing."""
    missing = hosts.missing_tools(which)
    if missing:
        raise LabError(f"hosts mode needs {', '.join(missing)}: install with "
                       f"`apt-get install -y {' '.join(sorted({hosts.HOST_TOOLS[p] for p in missing}))}`")


def _run(argv: list[str]) -> None:
    result = run_command(argv, timeout=30)
    if not result.ok:
        raise LabError(f"{' '.join(argv)} failed: {result.stderr.strip() or result.stdout.strip()}")


def _atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
