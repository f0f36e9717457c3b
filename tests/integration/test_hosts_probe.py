"""``hosts.refusal``, the probe that picks the lab's mode, run for real: as root on this machine it lets hosts mode
through (and leaves nothing behind); as another uid, which may not make namespaces, it refuses in one line. And
pids across PID namespaces (``procs.outer_pid``), as the lab's fault tools meet them when the nodes are hosts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_ft.core import rundir
from slurm_ft.lab import faults, hosts, procs


def _links_and_netns() -> tuple[str, str]:
    return (subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout,
            subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout)


@pytest.fixture
def root(hosts_possible) -> None:
    if os.geteuid() != 0:
        pytest.skip("the probe's real test runs as root")


def test_root_may_make_hosts_and_the_probe_leaves_nothing(root):
    before = _links_and_netns()
    hosts.refusal.cache_clear()
    assert hosts.refusal() is None
    after = _links_and_netns()
    assert hosts.link_names(after[0]) == hosts.link_names(before[0]) and after[1] == before[1]
    assert not [name for name in hosts.link_names(after[0]) if name.startswith("sftprobe")]


def test_another_uid_is_refused_in_one_line(root):
    code = "from slurm_ft.lab import hosts; print(hosts.refusal())"
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "not root (euid 65534)\n"


def test_the_probe_itself_is_refused_without_the_right_to_unshare(root):
    """The probe's own command, run without the capabilities namespaces need (as root, all capabilities dropped),
    fails with the kernel's word for it."""
    argv = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", *hosts.PROBE_ARGV]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    reason = hosts.refusal_reason(euid=0, missing=[], returncode=done.returncode, output=done.stderr + done.stdout)
    assert reason is not None and reason.endswith("Operation not permitted"), reason


def test_a_pid_written_on_a_host_is_found_from_the_controllers_side(root):
    """A rank on a lab host writes its pid as its own PID namespace numbers it; the lab's fault tools (which run
    on the controller's side) find that process by it, and not whatever has the same number here; and they name a
    process to the host's own tools (its fake NVML) by that number."""
    holder = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c",
                               "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    try:
        inner = int(holder.stdout.readline())
        namespace = procs.pid_namespace(holder.pid)
        sleeper = next(pid for pid in procs.descendants(holder.pid) if procs.cmdline(pid)[:1] == ("sleep",))
        assert procs.pid_namespace(sleeper) != namespace  # unshare's own pid is outside; its children inside
        inside = procs.pid_namespace(sleeper)
        assert inner != sleeper and procs.outer_pid(inner, inside) == sleeper
        assert procs.nspids(Path(f"/proc/{sleeper}/status").read_text()) == (sleeper, inner)
        assert procs.outer_pid(os.getpid(), procs.pid_namespace(os.getpid())) == os.getpid()  # ours: the same
        assert procs.outer_pid(inner + 1000, inside) is None
        assert procs.inner_pid(sleeper) == inner and procs.inner_pid(os.getpid()) == os.getpid()
    finally:
        holder.kill()  # --kill-child: the namespace's init, and so everything in it, dies with it
        holder.wait()


def test_a_standby_that_became_a_rank_on_a_host_is_found_by_its_heartbeat(root, tmp_path):
    """``faults.standby_rank_pid``: the rank's heartbeat names its pid on its host; the fault tools must signal
    that process, found through the wrapper's PID namespace (not the unrelated one numbered so here)."""
    spare = ("import subprocess, sys; p = subprocess.Popen(['sleep', '60']); print(p.pid, flush=True); p.wait()")
    host = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c",
                             f"{sys.executable} -c \"{spare}\" {faults.STANDBY_MODULE}; true"],
                            stdout=subprocess.PIPE, text=True)
    try:
        inner = int(host.stdout.readline())
        sleeper = next(pid for pid in procs.descendants(host.pid) if procs.cmdline(pid)[:1] == ("sleep",))
        wrapper = procs.parent(procs.parent(sleeper))  # the host's sh, standing in for the rank's wrapper
        rundir.write_heartbeat(tmp_path, rundir.Heartbeat(rank=1, step=3, time=1.0, host="n2", pid=inner))
        env = {"SLURM_FT_RUN_DIR": str(tmp_path)}
        assert faults.standby_rank_pid(env, 1, wrapper) == sleeper
        assert faults.standby_rank_pid(env, 0, wrapper) is None  # no heartbeat of rank 0
    finally:
        host.kill()
        host.wait()
