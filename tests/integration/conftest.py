"""The real lab cluster for integration tests.

The session fixture ``lab`` starts a 4-node lab (own munged, slurmctld, 4 x slurmd) in a fresh directory under
/tmp and stops it at the end, also when SIGTERM, SIGHUP or SIGINT ends the session (``slurm_ft.lab.interrupt``).
Its nodes are hosts of their own (the lab's default: own address, hostname, PID space and /tmp) wherever this
machine allows namespaces, else all on 127.0.0.1. So what a job or a rank reads goes in ``shared_path`` (the lab
dir, the cluster's shared filesystem), never in pytest's ``tmp_path`` (this host's /tmp, which no node sees).
With ``SLURM_FT_LAB_DIR`` set it reuses (or starts) that lab and leaves it running, which makes re-runs fast
during development. Without root or without Slurm installed the lab tests are skipped,
except under ``CI=true``, where they must run: the fixture then fails loudly instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# ``from labutil import ...`` works under any --import-mode (importlib mode does not put test dirs on sys.path).
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from slurm_ft.core import env as ft_env  # noqa: E402
from slurm_ft.lab import hosts  # noqa: E402
from slurm_ft.lab.cluster import (  # noqa: E402
    LabCluster, LabConfig, LabError, check_host_tools, check_prerequisites)
from slurm_ft.lab.interrupt import signals_end_the_run, teardown  # noqa: E402
from labutil import jobs_dir  # noqa: E402

LAB_NODES = 4


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _unavailable(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"lab cluster required in CI but unavailable: {reason}", pytrace=False)
    pytest.skip(f"lab cluster unavailable: {reason}")


@pytest.fixture(scope="session")
def lab(request: pytest.FixtureRequest) -> Iterator[LabCluster]:
    """A running LabCluster with 4 idle-ready nodes (n1..n4)."""
    try:
        check_prerequisites()
    except LabError as exc:
        _unavailable(str(exc))
    reuse = os.environ.get(ft_env.LAB_DIR)
    if reuse:
        cluster = LabCluster.attach(reuse)
        if not cluster.is_up():
            _start(LabCluster(LabConfig(dir=Path(reuse), nodes=LAB_NODES)))
            cluster = LabCluster.attach(reuse)
        yield cluster
        return
    lab_dir = Path(tempfile.mkdtemp(prefix="slurm-ft-lab-", dir="/tmp"))
    cluster = LabCluster(LabConfig(dir=lab_dir, nodes=LAB_NODES))
    with signals_end_the_run():  # SIGTERM/SIGHUP (a CI timeout, a closed terminal) end the session as Ctrl-C does
        try:
            _start(cluster)
            yield cluster
        finally:
            with teardown():  # the lab goes down whatever ended the session
                cluster.down()
                if request.session.testsfailed:
                    print(f"\nlab logs kept in {lab_dir / 'log'}", file=sys.stderr)
                else:
                    shutil.rmtree(lab_dir, ignore_errors=True)


def _start(cluster: LabCluster) -> None:
    try:
        cluster.up()
    except LabError as exc:
        cluster.down()
        _unavailable(f"lab up failed: {exc}")


@pytest.fixture(scope="session")
def lab_env(lab: LabCluster) -> dict[str, str]:
    """``os.environ`` plus the lab's SLURM_CONF, for subprocess calls to Slurm tools."""
    return {**os.environ, **lab.env()}


@pytest.fixture(scope="session")
def hosts_possible() -> None:
    """Whether the lab can make its nodes hosts (Slurm, root, namespaces): a skip where not, a failure under CI."""
    try:
        check_prerequisites()
        check_host_tools()
    except LabError as exc:
        _unavailable(str(exc))
    refused = hosts.refusal()
    if refused:
        _unavailable(f"namespaces refused: {refused}")


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs mounted for one test (root only; skipped elsewhere): a real ENOSPC, a real full /dev/shm."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root and tmpfs mounts")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


@pytest.fixture
def shared_path(lab: LabCluster, request: pytest.FixtureRequest) -> Path:
    """A fresh world-readable directory on the lab's shared filesystem (inside its dir), for the files a job or a
    rank reads or writes: pytest's ``tmp_path`` lies in this host's /tmp, which no lab host sees."""
    path = Path(tempfile.mkdtemp(prefix=f"{request.node.name[:40]}-", dir=jobs_dir(lab)))
    path.chmod(0o755)
    return path
