"""``hosts.refusal``, the probe that picks the lab's mode, run for real: as root on this machine it lets hosts mode
through (and leaves nothing behind); as another uid, which may not make namespaces, it refuses in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from slurm_ft.lab import hosts


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
